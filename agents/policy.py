"""LLMPolicy: a Hugging Face causal LM as a policy over text actions.

Two action modes, two small classes behind one interface (:class:`ActionMode`: ``act`` and ``evaluate``):

* :class:`GenerateMode` (the paper's setting): the model writes free text (``<think>...</think><action>...
  </action>``); the action's log-probability is the sum over its sampled tokens, and the PPO ratio is
  length-normalised. Sampling is this module's own loop (:func:`sample_responses`): the sampling settings are
  the agent's alone, no field of a checkpoint's ``generation_config.json`` reaches them, and only each sampled
  token's log-prob is kept, never the batch x steps x vocabulary logits.
* :class:`ChooseMode`: the policy is the model's sequence probability renormalised over the admissible actions,
  ``pi(a | s) = softmax_a(score(a) / T)`` with ``score = log p(a + <eos> | prompt)`` (``choose_score="sum"``) or
  that log-prob divided by the candidate's token count (``"mean"``). All candidates of a prompt are packed
  behind the prompt in one sequence, as a prefix tree whose nodes see the prompt and their own ancestors
  only: the prompt runs once, a shared first word runs once, and rollouts and updates (with or
  without gradient checkpointing) use the same forward.

Every forward runs under the policy's :class:`~agents.models.Precision` (autocast to the compute dtype over fp32
weights). Vocabulary-sized logits are produced a chunk of tokens at a time (recomputed in the backward pass),
so a 150k-token vocabulary costs one chunk of memory, not one row per token.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from agents.batching import as_long, budget_batches, candidate_tree, packed_width, pad, unique_slots
from agents.generation import GenerationBackend, HFGenerationBackend
from agents.precision import Precision
from wrappers import CHOOSE, GENERATE, ActionModeName, check_action_mode

LOGIT_CHUNK_ELEMENTS = 1 << 25  # floats of vocabulary logits alive at once (128 MiB in fp32)
#: Choose mode scores every admissible action: past this many for one prompt, a step says what it costs.
MANY_CANDIDATES = 1000


def warn_many_candidates(counts: list[int], sizes: list[int], prompt_tokens: list[int]) -> None:
    """Warn (once per call site, Python's default) when a prompt has more than :data:`MANY_CANDIDATES` candidates
    (``counts``, with the packed ``sizes`` and the prompts' tokens, one per prompt): choose mode scores each one in
    the forward, so a huge admissible list makes every action cost that many."""
    if not counts or max(counts) <= MANY_CANDIDATES:
        return
    most = counts.index(max(counts))
    warnings.warn(
        f"choose mode scores all {counts[most]} admissible actions of a step: {sizes[most]} tokens in the forward "
        f"for one action (the prompt alone is {prompt_tokens[most]}); use action_mode='generate', or an env that "
        "offers fewer admissible actions",
        stacklevel=3,
    )


def _chunk_log_probs(
    head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    logits = head(hidden).float() / temperature
    lse = logits.logsumexp(-1)
    ent = lse - (torch.softmax(logits, -1) * logits).sum(-1) if entropy else None
    return logits.gather(-1, targets[:, None]).squeeze(-1) - lse, ent


def token_log_probs(
    head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, *, entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(target) (and the entropy) of each of N hidden states [N, H], vocabulary logits a chunk at a time.

    With gradients, each chunk is recomputed in the backward pass, so only one chunk of logits is ever alive.
    """
    vocab = head.weight.shape[0]
    chunk = max(1, LOGIT_CHUNK_ELEMENTS // vocab)
    grad = torch.is_grad_enabled() and hidden.requires_grad and hidden.shape[0] > chunk
    logps, entropies = [], []
    for start in range(0, hidden.shape[0], chunk):
        args = (head, hidden[start : start + chunk], targets[start : start + chunk], temperature, entropy)
        logp, ent = checkpoint(_chunk_log_probs, *args, use_reentrant=False) if grad else _chunk_log_probs(*args)
        logps.append(logp)
        entropies.append(ent)
    if not logps:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, (empty if entropy else None)
    return torch.cat(logps), (torch.cat(entropies) if entropy else None)


class PolicyCore(nn.Module):
    """Every forward that trains (and every scoring forward) as one root module's ``forward``.

    DDP and FSDP hook the root module: its forward is where DDP prepares gradient reduction and where FSDP
    gathers the root's parameters (embeddings, head). So the decoder, the vocabulary head and the value head all
    run inside this forward, and the agent hands this module (wrapped or not) to accelerate.
    """

    def __init__(self, model: nn.Module, value_head: nn.Module | None = None) -> None:
        super().__init__()
        self.model, self.value_head = model, value_head

    def forward(
        self,
        ids: torch.Tensor,
        attention_mask: torch.Tensor,
        positions: torch.Tensor | None,
        pred_rows: torch.Tensor,
        pred_cols: torch.Tensor,
        targets: torch.Tensor,
        end_cols: torch.Tensor,
        *,
        temperature: float,
        entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
        """log p(targets) predicted at (pred_rows, pred_cols), their entropy, and each row's hidden state and
        value estimate at ``end_cols`` (the prompt's last position)."""
        hidden = self.model.get_decoder()(
            input_ids=ids, attention_mask=attention_mask, position_ids=positions, use_cache=False
        ).last_hidden_state
        logp, ent = token_log_probs(
            self.model.get_output_embeddings(), hidden[pred_rows, pred_cols], targets, temperature, entropy=entropy
        )
        end = hidden[torch.arange(hidden.shape[0], device=hidden.device), end_cols]
        values = None if self.value_head is None else self.value_head(end.float()).squeeze(-1)
        return logp, ent, end, values


@dataclass
class Rollout:
    """What the policy did for a batch of prompts (one entry per prompt)."""

    texts: list[str]
    prompt_ids: list[list[int]]
    response_ids: list[list[int]] = field(default_factory=list)  # generate mode: sampled tokens
    candidate_ids: list[list[list[int]]] = field(default_factory=list)  # choose mode: tokens of each candidate
    chosen: list[int] = field(default_factory=list)  # choose mode: index of the chosen candidate
    logp: list[np.ndarray] = field(default_factory=list)  # per-token log-probs (choose: one entry)
    values: list[float] = field(default_factory=list)  # value head, when the policy has one
    scored_tokens: int = 0  # tokens the model processed or produced (for tokens/s)

    @classmethod
    def interleave(cls, parts: list[tuple[list[int], Rollout]]) -> Rollout:
        """One rollout from parts that acted on disjoint rows of a batch (``(rows, rollout)``), in row order."""
        order = [(row, part, k) for rows, part in parts for k, row in enumerate(rows)]
        order.sort(key=lambda item: item[0])
        merged = cls([], [], scored_tokens=sum(part.scored_tokens for _, part in parts))
        for f in fields(cls):
            if f.name != "scored_tokens" and all(getattr(part, f.name) for _, part in parts):
                setattr(merged, f.name, [getattr(part, f.name)[k] for _, part, k in order])
        return merged


@dataclass
class Evaluation:
    """Differentiable quantities for a batch of stored actions."""

    logp: torch.Tensor  # [B, T] per-token log-probs (choose mode: T = 1)
    mask: torch.Tensor  # [B, T]
    entropy: torch.Tensor | None  # [B] mean entropy per action (None when not asked for)
    values: torch.Tensor | None  # [B]


class ActionMode(Protocol):
    """How a policy turns prompts into actions, and scores stored actions for the update."""

    def act(self, prompts: list[list[int]], admissible: list[list[str]], seeds: list[int],
            deterministic: bool) -> Rollout: ...  # fmt: skip

    def evaluate(self, prompts: list[list[int]], responses: list[list[int]], candidates: list[list[list[int]]],
                 chosen: list[int], core: nn.Module, entropy: bool) -> Evaluation: ...  # fmt: skip


class GenerateMode:
    """Free-text actions sampled token by token; every token's log-prob enters the action's ratio."""

    def __init__(self, policy: LLMPolicy) -> None:
        self.policy = policy

    def act(self, prompts, admissible, seeds, deterministic) -> Rollout:
        p = self.policy
        responses, logps = [], []
        sizes = [len(x) + p.max_new_tokens for x in prompts]
        for batch in budget_batches(sizes, p.token_budget):
            r, lp = p.backend.generate(
                [prompts[i] for i in batch], max_new_tokens=p.max_new_tokens, temperature=p.temperature,
                greedy=deterministic, seeds=[seeds[i] for i in batch] if seeds else None,  # greedy: none needed
            )  # fmt: skip
            responses += r
            logps += lp
        texts = [p.tokenizer.decode(r, skip_special_tokens=True) for r in responses]
        values = []
        if p.value_head is not None:
            with p.precision.autocast():
                values = self._forward(prompts, responses, p.core, entropy=False)[3].tolist()
        scored = sum(len(x) + len(r) for x, r in zip(prompts, responses))
        return Rollout(texts, list(prompts), responses, logp=logps, values=values, scored_tokens=scored)

    def _forward(self, prompts, responses, core, entropy: bool):
        """Token log-probs [B, T], mask [B, T], entropy [B] or None, values [B] or None."""
        p = self.policy
        device = p.device
        seqs = [list(x) + list(r) for x, r in zip(prompts, responses)]
        ids, mask = pad(seqs, p.tokenizer.pad_token_id, left=False)
        # Response token j of row b sits at position len(prompt) + j and is predicted from the position before.
        rows = [b for b, r in enumerate(responses) for _ in r]
        cols = [len(x) - 1 + j for x, r in zip(prompts, responses) for j in range(len(r))]
        targets = [t for r in responses for t in r]
        ends = [len(x) - 1 for x in prompts]
        flat_logp, flat_entropy, _, values = core(
            ids.to(device), mask.to(device), None, *as_long(device, rows, cols, targets, ends),
            temperature=p.temperature, entropy=entropy,
        )  # fmt: skip
        r_ids, r_mask = pad(responses, 0, left=False)
        r_mask = r_mask.to(device).bool()
        logp = torch.zeros(r_ids.shape, dtype=torch.float32, device=device).masked_scatter(r_mask, flat_logp)
        ent = None
        if entropy:
            per_token = torch.zeros_like(logp).masked_scatter(r_mask, flat_entropy)
            ent = per_token.sum(-1) / r_mask.sum(-1).clamp(min=1)
        return logp, r_mask.float(), ent, values

    def evaluate(self, prompts, responses, candidates, chosen, core, entropy) -> Evaluation:
        return Evaluation(*self._forward(prompts, responses, core, entropy))


def distinct_actions(actions: Sequence[str]) -> list[str]:
    """Each action once, in first-listed order: the candidates choose mode scores. An env that lists an action twice
    would otherwise give it twice its probability (and its duplicates' rows twice the gradient)."""
    return list(dict.fromkeys(actions))


class ChooseMode:
    """A categorical choice among the distinct admissible actions, scored by their sequence log-probs; ``chosen``
    indexes the distinct list (:func:`distinct_actions`)."""

    def __init__(self, policy: LLMPolicy, score: str) -> None:
        if score not in ("sum", "mean"):
            raise ValueError(f"choose_score must be 'sum' or 'mean', got {score!r}")
        self.policy, self.score = policy, score

    def score_candidates(
        self, prompts: list[list[int]], candidates: list[list[list[int]]], core: nn.Module | None = None
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor | None]:
        """Sequence log-probs of every candidate of every prompt, in one packed forward.

        Row b holds prompt b followed by its candidates as a prefix tree (:func:`candidate_tree`: shared first
        tokens once); a node attends to the prompt, its ancestors and itself, and its position continues the
        prompt's, so each candidate is scored exactly as if it followed the prompt alone. Returns per prompt the
        candidates' sequence log-probs [K] and token counts [K], and the value head's estimates [B] (None without
        one).
        """
        p = self.policy
        core = core or p.core
        device = p.device
        if len(prompts) != len(candidates):
            raise ValueError(f"{len(prompts)} prompts but {len(candidates)} candidate lists")
        trees = [candidate_tree(cands) for cands in candidates]
        rows = [list(prompt) + tokens for prompt, (tokens, _, _) in zip(prompts, trees)]
        width = max(map(len, rows))
        allowed = np.zeros((len(rows), width, width), dtype=bool)
        allowed[:, np.arange(width), np.arange(width)] = True  # padding attends to itself
        positions = np.zeros((len(rows), width), dtype=np.int64)
        # A node is predicted at its parent's position (the prompt's last for a first token); a candidate's
        # sequence log-prob is the sum over its path.
        pred_rows, pred_cols, targets, path_nodes, owner, counts, sizes = [], [], [], [], [], [], []
        for b, (prompt, (tokens, parents, paths)) in enumerate(zip(prompts, trees)):
            n_prompt, n_nodes = len(prompt), len(tokens)
            sees = np.zeros((n_nodes, n_nodes), dtype=bool)  # a node sees its ancestors and itself
            depth = np.zeros(n_nodes, dtype=np.int64)
            for n, parent in enumerate(parents):
                if parent >= 0:
                    sees[n], depth[n] = sees[parent], depth[parent] + 1
                sees[n, n] = True
            nodes = slice(n_prompt, n_prompt + n_nodes)
            allowed[b, :n_prompt, :n_prompt] = np.tri(n_prompt, dtype=bool)
            allowed[b, nodes, :n_prompt] = True
            allowed[b, nodes, nodes] = sees
            positions[b, :n_prompt] = np.arange(n_prompt)
            positions[b, nodes] = n_prompt + depth
            for path in paths:
                path_nodes += [len(targets) + n for n in path]
                owner += [len(counts)] * len(path)
                counts.append(len(path))
            pred_rows += [b] * n_nodes
            pred_cols += [n_prompt - 1 if parent < 0 else n_prompt + parent for parent in parents]
            targets += tokens
            sizes.append(len(paths))
        ids, _ = pad(rows, p.tokenizer.pad_token_id, left=False)
        mask = p.attention_mask(torch.from_numpy(allowed).to(device)[:, None])
        ends = [len(x) - 1 for x in prompts]
        token_logp, _, _, values = core(
            ids.to(device), mask, torch.from_numpy(positions).to(device),
            *as_long(device, pred_rows, pred_cols, targets, ends), temperature=1.0, entropy=False,
        )  # fmt: skip
        path_t, owner_t, counts_t = as_long(device, path_nodes, owner, counts)
        seq_logp = torch.zeros(len(counts), device=device).index_add(0, owner_t, token_logp[path_t])
        return list(seq_logp.split(sizes)), list(counts_t.split(sizes)), values

    def choice_log_probs(self, seq_logp: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """log pi over one prompt's candidates from their sequence log-probs."""
        score = seq_logp / counts if self.score == "mean" else seq_logp
        return torch.log_softmax(score / self.policy.temperature, -1)

    def act(self, prompts, admissible, seeds, deterministic, choices: Sequence[int] | None = None) -> Rollout:
        p = self.policy
        if any(not a for a in admissible):
            raise ValueError("choose mode needs a non-empty admissible action list for every prompt")
        if choices is not None:  # indices into the lists as given: the same actions in the distinct lists
            choices = [distinct_actions(acts).index(acts[c]) for acts, c in zip(admissible, choices)]
        admissible = [distinct_actions(acts) for acts in admissible]
        candidates = [[p.action_tokens(a) for a in acts] for acts in admissible]
        order, slot = unique_slots(prompts, candidates)
        log_pis: list[np.ndarray] = []
        values: list[float] = []
        sizes = [packed_width(prompts[i], candidates[i]) for i in order]
        warn_many_candidates([len(candidates[i]) for i in order], sizes, [len(prompts[i]) for i in order])
        with p.precision.autocast():
            for batch in budget_batches(sizes, p.token_budget):
                rows = [order[i] for i in batch]
                seq, counts, value = self.score_candidates([prompts[i] for i in rows], [candidates[i] for i in rows])
                log_pis += [self.choice_log_probs(s, n).cpu().numpy().astype(np.float64) for s, n in zip(seq, counts)]
                if value is not None:
                    values += value.tolist()
        rollout = Rollout([], list(prompts), candidate_ids=candidates, scored_tokens=sum(sizes))
        for row, s in enumerate(slot):
            log_pi = log_pis[s]
            if choices is not None:
                choice = int(choices[row])
            elif deterministic:
                choice = int(np.argmax(log_pi))
            else:  # inverse CDF with the row's own uniform draw: independent of how rows were batched
                cdf = np.cumsum(np.exp(log_pi))
                u = np.random.default_rng(seeds[row]).random() * cdf[-1]
                choice = int(min(np.searchsorted(cdf, u, side="right"), len(log_pi) - 1))
            rollout.texts.append(admissible[row][choice])
            rollout.chosen.append(choice)
            rollout.logp.append(log_pi[choice : choice + 1])
            if values:
                rollout.values.append(float(values[s]))
        return rollout

    def evaluate(self, prompts, responses, candidates, chosen, core, entropy) -> Evaluation:
        order, slot = unique_slots(prompts, candidates)
        seq_logp, counts, value = self.score_candidates(
            [prompts[i] for i in order], [candidates[i] for i in order], core
        )
        logp, ent = [], []
        for s, c in zip(slot, chosen):
            log_pi = self.choice_log_probs(seq_logp[s], counts[s])
            logp.append(log_pi[c])
            ent.append(-(log_pi.exp() * log_pi).sum())
        logp_t = torch.stack(logp)[:, None]
        values = None if value is None else value[slot]
        return Evaluation(logp_t, torch.ones_like(logp_t), torch.stack(ent), values)


class LLMPolicy(nn.Module):
    """A causal LM (+ optional value head) acting in text envs.

    Args:
        model: a ``transformers`` causal LM (possibly a peft model).
        tokenizer: its tokenizer (``pad_token_id`` and ``eos_token_id`` set).
        action_mode: :data:`~wrappers.prompt.GENERATE` or :data:`~wrappers.prompt.CHOOSE`.
        temperature: sampling temperature (also used for every log-prob).
        max_new_tokens: generation limit per action.
        value_head: add a linear value head on the prompt's last hidden state (the PPO baseline).
        choose_score: ``"sum"`` or ``"mean"`` token log-prob of a candidate (choose mode).
        precision: device and compute dtype (default: the model's device, fp32).
        token_budget: tokens per forward when acting (prompts are batched under it).
        backend: the generation engine of generate mode (default: sampling on this model, :class:`HFGenerationBackend`).
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        *,
        action_mode: ActionModeName = CHOOSE,
        temperature: float = 1.0,
        max_new_tokens: int = 64,
        value_head: bool = False,
        choose_score: str = "sum",
        precision: Precision | None = None,
        token_budget: int = 16384,
        backend: GenerationBackend | None = None,
    ) -> None:
        super().__init__()
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs pad_token_id and eos_token_id")
        self.tokenizer = tokenizer
        self.precision = precision or Precision(next(model.parameters()).device, torch.float32)
        self.action_mode, self.temperature, self.max_new_tokens = action_mode, temperature, max_new_tokens
        self.token_budget = token_budget
        check_action_mode(action_mode)
        self.actions: ActionMode = GenerateMode(self) if action_mode == GENERATE else ChooseMode(self, choose_score)
        head = None
        if value_head:
            head = nn.Linear(model.config.get_text_config().hidden_size, 1)
            nn.init.zeros_(head.weight)
            nn.init.zeros_(head.bias)
            head.to(device=next(model.parameters()).device, dtype=torch.float32)
        self.core = PolicyCore(model, head)
        # Forwards with gradients go through the engine's wrapper (DDP/FSDP) once the agent prepares it; forwards
        # without (rollouts, recomputed log-probs) use the plain core: replicated weights, no collectives.
        self.forward_core: nn.Module = self.core
        self.backend: GenerationBackend = backend or HFGenerationBackend(model, tokenizer, self.precision)
        self._action_tokens: dict[str, list[int]] = {}

    @contextlib.contextmanager
    def sampling_at(self, temperature: float | None):
        """Sample (and score) at ``temperature`` inside the block, the policy's own outside it (None: unchanged)."""
        own = self.temperature
        self.temperature = own if temperature is None else float(temperature)
        try:
            yield
        finally:
            self.temperature = own

    @property
    def model(self) -> nn.Module:
        return self.core.model

    @property
    def value_head(self) -> nn.Module | None:
        return self.core.value_head

    @property
    def device(self) -> torch.device:
        return self.precision.device

    # ----- building blocks ----------------------------------------------------------------------------
    def action_tokens(self, action: str) -> list[int]:
        """Token ids of a candidate action followed by the end-of-turn token (so prefixes differ)."""
        if action not in self._action_tokens:
            ids = self.tokenizer(action, add_special_tokens=False)["input_ids"]
            self._action_tokens[action] = list(ids) + [self.tokenizer.eos_token_id]
        return self._action_tokens[action]

    def backbone(self) -> nn.Module:
        return self.model.get_decoder()

    def attention_mask(self, allowed: torch.Tensor) -> torch.Tensor:
        """A 4D mask in the form the model's attention expects: boolean, or additive for eager attention."""
        if getattr(self.model.config, "_attn_implementation", None) == "eager":
            return torch.zeros(allowed.shape, device=allowed.device).masked_fill(~allowed, torch.finfo().min)
        return allowed

    # ----- acting and scoring ---------------------------------------------------------------------------
    @torch.no_grad()
    def act(
        self,
        prompts: list[list[int]],
        admissible: list[list[str]],
        *,
        seeds: Sequence[int] | None = None,
        rng: np.random.Generator | None = None,
        deterministic: bool = False,
        choices: Sequence[int] | None = None,
    ) -> Rollout:
        """Choose one action per prompt (identical prompts are scored once in choose mode).

        Each prompt samples from its own random stream: ``seeds`` (one per prompt), or seeds drawn from ``rng``.
        ``choices`` (choose mode): play these candidates (an index into each prompt's admissible actions) instead,
        with the policy's own log-probs of them: a demonstrator's actions, recorded as if the policy had chosen them.
        """
        if choices is not None:
            if not isinstance(self.actions, ChooseMode):
                raise ValueError("act(choices=...) plays given admissible actions: it needs action_mode='choose'")
            if len(choices) != len(prompts):
                raise ValueError(f"{len(prompts)} prompts but {len(choices)} choices")
            return self.actions.act(prompts, admissible, [], False, choices=choices)
        if seeds is None:
            if rng is None and not deterministic:
                raise ValueError("act() needs seeds or an rng to sample")
            seeds = [] if rng is None else rng.integers(2**63 - 1, size=len(prompts)).tolist()
        return self.actions.act(prompts, admissible, list(seeds), deterministic)

    def acting_copy(self) -> LLMPolicy:
        """A policy to act with beside the trainer (``overlap``): weights, caches and sampler of its own, on the
        policy's device; the tokenizer is shared, and so is a generation engine that keeps its own weights (vLLM):
        one engine, which syncs the copy's weights when a rollout first acts with them
        (:meth:`agents.overlap.UpdatePipeline.acting`) and serves the trainer's until then."""
        memo: dict[int, Any] = {id(self.tokenizer): self.tokenizer}
        if self.forward_core is not self.core:  # the trainer's DDP wrapper: not the copy's
            memo[id(self.forward_core)] = None
        if self.backend.own_weights:
            memo[id(self.backend)] = self.backend
        twin = copy.deepcopy(self, memo=memo)
        twin.forward_core = twin.core
        twin.core.to(self.device)  # built on the CPU for FSDP2 (which moves each unit as it shards it)
        return twin

    @torch.no_grad()
    def release_engine(self) -> float:
        """The rollout is over: a separate engine's weights are stale from here (on CUDA it sleeps until the next
        sync). Returns the seconds the engine's last weight sync took (0 for sampling on the training weights)."""
        synced = self.backend.last_sync_s
        self.backend.release()
        return synced

    def values(self, prompts: list[list[int]]) -> list[float]:
        """Value-head estimates for prompts (used to bootstrap truncated episodes)."""
        if self.value_head is None:
            raise ValueError("this policy has no value head")
        ids, mask = pad(prompts, self.tokenizer.pad_token_id, left=True)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        ends = [ids.shape[1] - 1] * len(prompts)  # left padding: every prompt ends in the last column
        with self.precision.autocast():
            *_, values = self.core(
                ids.to(self.device), mask.to(self.device), positions.to(self.device),
                *as_long(self.device, [], [], [], ends), temperature=1.0, entropy=False,
            )  # fmt: skip
        return values.float().tolist()

    def evaluate(
        self,
        prompts: list[list[int]],
        *,
        responses: list[list[int]] | None = None,
        candidates: list[list[list[int]]] | None = None,
        chosen: list[int] | None = None,
        core: nn.Module | None = None,
        entropy: bool = True,
    ) -> Evaluation:
        """Log-probs, entropy (when asked) and values of stored actions under the policy (or another core, e.g.
        the KL reference's). This is the one forward behind the update, the recomputed behaviour log-probs and
        the reference's. Without ``core``: the engine-wrapped core when gradients are on, the plain one if not."""
        with self.precision.autocast():
            core = core or (self.forward_core if torch.is_grad_enabled() else self.core)
            return self.actions.evaluate(prompts, responses, candidates, chosen, core, entropy)
