"""The small tensor helpers the policy, the sampler and the update share: padding and token-budget batches."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pad(rows: Sequence[Sequence[int]], pad_id: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad token lists into (ids, attention mask)."""
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            sl = slice(width - len(r), width) if left else slice(0, len(r))
            ids[i, sl] = torch.as_tensor(r, dtype=torch.long)
            mask[i, sl] = 1
    return ids, mask


def unique_slots(prompts: list[list[int]], candidates: list[list[list[int]]]) -> tuple[list[int], list[int]]:
    """Score identical (prompt, candidates) pairs once: the first row of each distinct pair, and each row's pair.

    Group members often share a state and history, so rollouts and updates repeat prompts.
    """
    unique: dict[tuple, int] = {}
    slot = [unique.setdefault((tuple(p), tuple(map(tuple, c))), len(unique)) for p, c in zip(prompts, candidates)]
    first: dict[int, int] = {}
    for row, s in enumerate(slot):
        first.setdefault(s, row)
    return [first[s] for s in range(len(unique))], slot


def budget_batches(sizes: Sequence[int], budget: int) -> list[list[int]]:
    """Consecutive index batches whose summed sizes stay within ``budget`` (an oversized item goes alone)."""
    batches: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i, n in enumerate(sizes):
        if current and total + n > budget:
            batches.append(current)
            current, total = [], 0
        current.append(i)
        total += n
    return batches + ([current] if current else [])


def padded_batches(sizes: Sequence[int], budget: int) -> list[list[int]]:
    """Index batches, smallest items first, each of whose padded tensor (items x the largest) stays within
    ``budget`` (an oversized item goes alone). Items of similar size share a batch, so little of it is padding.
    Ties keep their order, and the batches list the items in that sorted order."""
    order = sorted(range(len(sizes)), key=sizes.__getitem__)
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:  # sorted: the item added is the batch's largest
        if current and sizes[i] * (len(current) + 1) > budget:
            batches.append(current)
            current = []
        current.append(i)
    return batches + ([current] if current else [])


def as_long(device: torch.device, *lists: Sequence[int]) -> list[torch.Tensor]:
    """Each list as a long tensor on ``device``."""
    return [torch.as_tensor(list(x), dtype=torch.long, device=device) for x in lists]


def candidate_tree(candidates: Sequence[Sequence[int]]) -> tuple[list[int], list[int], list[list[int]]]:
    """The candidates' token lists as a prefix tree: its nodes' tokens, each node's parent (-1: the prompt), and
    each candidate's path of nodes. Parents precede their children.

    A candidate token's log-prob depends only on the prompt and the tokens before it, so candidates that start
    alike ("go to cabinet 1", "go to cabinet 10") share those nodes: MiniHouse's full-size houses pack 78 nodes
    where their candidates hold 139 tokens.
    """
    tokens: list[int] = []
    parents: list[int] = []
    children: dict[tuple[int, int], int] = {}
    paths: list[list[int]] = []
    for cand in candidates:
        node, path = -1, []
        for tok in cand:
            key = (node, tok)
            if key not in children:
                children[key] = len(tokens)
                tokens.append(tok)
                parents.append(node)
            node = children[key]
            path.append(node)
        paths.append(path)
    return tokens, parents, paths


def packed_width(prompt: Sequence[int], candidates: Sequence[Sequence[int]]) -> int:
    """Tokens of the choose mode's packed row: the prompt and its candidates' prefix tree."""
    return len(prompt) + len(candidate_tree(candidates)[0])
