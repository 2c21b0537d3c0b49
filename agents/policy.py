"""LLMPolicy: a Hugging Face causal LM as a policy over text actions.

Two action modes:

* ``"generate"`` (the paper's setting): the model writes free text (``<think>...</think><action>...</action>``);
  the action's log-probability is the sum over its sampled tokens, and the PPO ratio is length-normalised.
* ``"choose"``: the policy is the model's sequence probability renormalised over the admissible actions,
  ``pi(a | s) = softmax_a(score(a) / T)`` with ``score = log p(a + <eos> | prompt)`` (``choose_score="sum"``) or
  that log-prob divided by the candidate's token count (``"mean"``: a model that knows nothing yet then starts
  near uniform over the candidates instead of preferring the shortest). The whole choice is one categorical
  "token", so its ratio is ``pi_new(a) / pi_old(a)``. All candidates of a prompt are scored in one batched
  forward that runs the prompt once and shares its KV cache across the candidates.

Generation sits behind :class:`GenerationBackend` (Hugging Face here; a vLLM engine can implement the same two
methods). Generated tokens' log-probs use ``log_softmax(logits / temperature)``, the sampling distribution;
choose mode applies the temperature once, to the choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
from torch import nn


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in table:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(table)}, got {dtype!r}")
    return table[dtype]


def _pad(rows: Sequence[Sequence[int]], pad_id: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
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


def _unique_slots(prompts: list[list[int]], candidates: list[list[list[int]]]) -> tuple[list[int], list[int]]:
    """Score identical (prompt, candidates) pairs once: the first row of each distinct pair, and each row's pair.

    Group members often share a state and history, so rollouts and updates repeat prompts.
    """
    unique: dict[tuple, int] = {}
    slot = [unique.setdefault((tuple(p), tuple(map(tuple, c))), len(unique)) for p, c in zip(prompts, candidates)]
    first: dict[int, int] = {}
    for row, s in enumerate(slot):
        first.setdefault(s, row)
    return [first[s] for s in range(len(unique))], slot


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


@dataclass
class Evaluation:
    """Differentiable quantities for a batch of stored actions."""

    logp: torch.Tensor  # [B, T] per-token log-probs (choose mode: T = 1)
    mask: torch.Tensor  # [B, T]
    entropy: torch.Tensor  # [B] mean entropy per action
    values: torch.Tensor | None  # [B]


class GenerationBackend(Protocol):
    """What a generation engine provides: sampled response ids with their log-probs, and weight sync."""

    def generate(
        self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, greedy: bool
    ) -> tuple[list[list[int]], list[np.ndarray]]: ...

    def sync_weights(self, model: nn.Module) -> None: ...


class HFGenerationBackend:
    """Generation with ``model.generate`` on the training model itself (no weight copy to sync)."""

    def __init__(self, model: nn.Module, tokenizer) -> None:
        self.model, self.tokenizer = model, tokenizer

    def sync_weights(self, model: nn.Module) -> None:
        self.model = model

    @torch.no_grad()
    def generate(self, prompts, *, max_new_tokens, temperature, greedy):
        from transformers import GenerationConfig

        device = next(self.model.parameters()).device
        ids, mask = _pad(prompts, self.tokenizer.pad_token_id, left=True)
        config = GenerationConfig(
            do_sample=not greedy,
            temperature=temperature if not greedy else None,
            top_k=0 if not greedy else None,  # transformers applies top_k=50 unless told otherwise
            top_p=1.0 if not greedy else None,
            max_new_tokens=max_new_tokens,
            eos_token_id=self.tokenizer.eos_token_id,
            pad_token_id=self.tokenizer.pad_token_id,
            return_dict_in_generate=True,
            output_logits=True,
        )
        out = self.model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=config)
        new = out.sequences[:, ids.shape[1] :].cpu()
        logits = torch.stack(out.logits, dim=1).float().cpu() / temperature  # [B, steps, V]
        token_logp = torch.log_softmax(logits, -1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        responses, logps = [], []
        eos = self.tokenizer.eos_token_id
        for row, lp in zip(new.tolist(), token_logp):
            n = row.index(eos) + 1 if eos in row else len(row)
            responses.append(row[:n])
            logps.append(lp[:n].numpy().astype(np.float64))
        return responses, logps


class LLMPolicy(nn.Module):
    """A causal LM (+ optional value head) acting in text envs.

    Args:
        model: a ``transformers`` causal LM (possibly a peft model).
        tokenizer: its tokenizer (``pad_token_id`` and ``eos_token_id`` set).
        action_mode: ``"generate"`` or ``"choose"``.
        temperature: sampling temperature (also used for every log-prob).
        max_new_tokens: generation limit per action.
        value_head: add a linear value head on the prompt's last hidden state (the PPO baseline).
        choose_score: ``"sum"`` or ``"mean"`` token log-prob of a candidate (choose mode).
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        *,
        action_mode: str = "choose",
        temperature: float = 1.0,
        max_new_tokens: int = 64,
        value_head: bool = False,
        choose_score: str = "sum",
    ) -> None:
        super().__init__()
        if action_mode not in ("generate", "choose"):
            raise ValueError(f"action_mode must be 'generate' or 'choose', got {action_mode!r}")
        if choose_score not in ("sum", "mean"):
            raise ValueError(f"choose_score must be 'sum' or 'mean', got {choose_score!r}")
        self.choose_score = choose_score
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs pad_token_id and eos_token_id")
        self.model, self.tokenizer = model, tokenizer
        self.action_mode, self.temperature, self.max_new_tokens = action_mode, temperature, max_new_tokens
        hidden = model.config.get_text_config().hidden_size
        self.value_head = nn.Linear(hidden, 1) if value_head else None
        if self.value_head is not None:
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)
            self.value_head.to(device=self.device, dtype=next(model.parameters()).dtype)
        self.backend: GenerationBackend = HFGenerationBackend(model, tokenizer)
        self._action_tokens: dict[str, list[int]] = {}

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ----- building blocks ----------------------------------------------------------------------------
    def action_tokens(self, action: str) -> list[int]:
        """Token ids of a candidate action followed by the end-of-turn token (so prefixes differ)."""
        if action not in self._action_tokens:
            ids = self.tokenizer(action, add_special_tokens=False)["input_ids"]
            self._action_tokens[action] = list(ids) + [self.tokenizer.eos_token_id]
        return self._action_tokens[action]

    def _backbone(self, model: nn.Module | None = None) -> nn.Module:
        return (model or self.model).get_decoder()

    def _head(self, model: nn.Module | None, hidden: torch.Tensor) -> torch.Tensor:
        logits = (model or self.model).get_output_embeddings()(hidden).float()
        # Generation samples tokens at the temperature; choose mode applies it once, to the choice.
        return logits / self.temperature if self.action_mode == "generate" else logits

    def _score_candidates(
        self, prompts: list[list[int]], candidates: list[list[list[int]]], model: nn.Module | None = None
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
        """Sequence log-probs of every candidate of every prompt, each prompt run once.

        Prompts are left-padded and run with a KV cache; the cache rows are then gathered once per
        (prompt, candidate) pair and the candidates run on top of it with the right positions.
        Returns per prompt: candidate sequence log-probs [K], per-candidate token counts, and the prompts'
        last hidden states [B, H] (for the value head).
        """
        device = self.device
        backbone = self._backbone(model)
        ids, mask = _pad(prompts, self.tokenizer.pad_token_id, left=True)
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = backbone(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        last_hidden = out.last_hidden_state[:, -1]  # left padding: every prompt ends at the last column
        first_logp = torch.log_softmax(self._head(model, last_hidden), -1)  # [B, V]

        owner = torch.as_tensor([b for b, cands in enumerate(candidates) for _ in cands], device=device)
        flat = [c for cands in candidates for c in cands]
        cand_ids, cand_mask = _pad(flat, self.tokenizer.pad_token_id, left=False)
        cand_ids, cand_mask = cand_ids.to(device), cand_mask.to(device)
        cache = out.past_key_values
        cache.batch_select_indices(owner)
        full_mask = torch.cat([mask[owner], cand_mask], dim=1)
        cand_pos = mask.sum(-1)[owner, None] + torch.arange(cand_ids.shape[1], device=device)[None]
        hidden = backbone(
            input_ids=cand_ids, attention_mask=full_mask, position_ids=cand_pos, past_key_values=cache
        ).last_hidden_state
        # Token j of a candidate is predicted by the prompt's last state (j = 0) or by candidate token j - 1.
        token_logp = torch.empty(cand_ids.shape, device=device)
        token_logp[:, 0] = first_logp[owner].gather(-1, cand_ids[:, :1]).squeeze(-1)
        if cand_ids.shape[1] > 1:
            later = torch.log_softmax(self._head(model, hidden[:, :-1]), -1)
            token_logp[:, 1:] = later.gather(-1, cand_ids[:, 1:, None]).squeeze(-1)
        seq_logp = (token_logp * cand_mask).sum(-1)
        sizes = [len(c) for c in candidates]
        return list(seq_logp.split(sizes)), list(cand_mask.sum(-1).split(sizes)), last_hidden

    def _choice_log_probs(self, seq_logp: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """log pi over one prompt's candidates from their sequence log-probs."""
        score = seq_logp / counts if self.choose_score == "mean" else seq_logp
        return torch.log_softmax(score / self.temperature, -1)

    def _response_logits(
        self, prompts: list[list[int]], responses: list[list[int]], model: nn.Module | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits at the response positions of right-padded (prompt + response) sequences.

        Returns (logits [B, T, V], response ids [B, T], mask [B, T], prompt-end hidden states [B, H]).
        """
        device = self.device
        seqs = [list(p) + list(r) for p, r in zip(prompts, responses)]
        ids, mask = _pad(seqs, self.tokenizer.pad_token_id, left=False)
        ids, mask = ids.to(device), mask.to(device)
        hidden = self._backbone(model)(input_ids=ids, attention_mask=mask).last_hidden_state
        p_len = torch.as_tensor([len(p) for p in prompts], device=device)
        r_ids, r_mask = _pad(responses, self.tokenizer.pad_token_id, left=False)
        r_ids, r_mask = r_ids.to(device), r_mask.to(device)
        # Response token j sits at position p_len + j and is predicted from position p_len + j - 1.
        pos = (p_len[:, None] - 1 + torch.arange(r_ids.shape[1], device=device)[None]).clamp(max=ids.shape[1] - 1)
        picked = hidden.gather(1, pos[..., None].expand(-1, -1, hidden.shape[-1]))
        prompt_end = hidden[torch.arange(len(prompts), device=device), p_len - 1]
        return self._head(model, picked), r_ids, r_mask, prompt_end

    def _value(self, hidden: torch.Tensor) -> torch.Tensor | None:
        return (
            None
            if self.value_head is None
            else self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1).float()
        )

    # ----- acting ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def act(
        self,
        prompts: list[list[int]],
        admissible: list[list[str]],
        *,
        rng: np.random.Generator,
        deterministic: bool = False,
    ) -> Rollout:
        """Choose one action per prompt; identical (prompt, candidates) pairs are scored once."""
        if self.action_mode == "generate":
            responses, logps = self.backend.generate(
                prompts,
                max_new_tokens=self.max_new_tokens,
                temperature=self.temperature,
                greedy=deterministic,
            )
            texts = [self.tokenizer.decode(r, skip_special_tokens=True) for r in responses]
            values = []
            if self.value_head is not None:
                *_, prompt_end = self._response_logits(prompts, responses)
                values = self._value(prompt_end).tolist()
            scored = sum(len(p) + len(r) for p, r in zip(prompts, responses))
            return Rollout(texts, list(prompts), responses, logp=logps, values=values, scored_tokens=scored)

        if any(not a for a in admissible):
            raise ValueError("choose mode needs a non-empty admissible action list for every prompt")
        candidates = [[self.action_tokens(a) for a in acts] for acts in admissible]
        order, slot = _unique_slots(prompts, candidates)
        seq_logp, counts, hidden = self._score_candidates([prompts[i] for i in order], [candidates[i] for i in order])
        values_unique = self._value(hidden)
        rollout = Rollout([], list(prompts), candidate_ids=candidates)
        rollout.scored_tokens = sum(len(prompts[i]) + int(counts[k].sum()) for k, i in enumerate(order))
        for row, s in enumerate(slot):
            log_pi = self._choice_log_probs(seq_logp[s], counts[s]).cpu().numpy().astype(np.float64)
            choice = (
                int(np.argmax(log_pi))
                if deterministic
                else int(rng.choice(len(log_pi), p=np.exp(log_pi) / np.exp(log_pi).sum()))
            )
            rollout.texts.append(admissible[row][choice])
            rollout.chosen.append(choice)
            rollout.logp.append(log_pi[choice : choice + 1])
            if values_unique is not None:
                rollout.values.append(float(values_unique[s]))
        return rollout

    @torch.no_grad()
    def values(self, prompts: list[list[int]]) -> list[float]:
        """Value-head estimates for prompts (used to bootstrap truncated episodes)."""
        if self.value_head is None:
            raise ValueError("this policy has no value head")
        ids, mask = _pad(prompts, self.tokenizer.pad_token_id, left=True)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        hidden = self._backbone()(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
        ).last_hidden_state[:, -1]
        return self._value(hidden).tolist()

    # ----- training -------------------------------------------------------------------------------------
    def evaluate(
        self,
        prompts: list[list[int]],
        *,
        responses: list[list[int]] | None = None,
        candidates: list[list[list[int]]] | None = None,
        chosen: list[int] | None = None,
        model: nn.Module | None = None,
    ) -> Evaluation:
        """Log-probs, entropy and values of stored actions under the current (or a given) model."""
        if self.action_mode == "generate":
            logits, r_ids, mask, prompt_end = self._response_logits(prompts, responses, model)
            log_probs = torch.log_softmax(logits, -1)
            logp = log_probs.gather(-1, r_ids[..., None]).squeeze(-1)
            token_entropy = -(log_probs.exp() * log_probs).sum(-1)
            entropy = (token_entropy * mask).sum(-1) / mask.sum(-1).clamp(min=1)
            return Evaluation(logp, mask.float(), entropy, self._value(prompt_end) if model is None else None)
        order, slot = _unique_slots(prompts, candidates)
        seq_logp, counts, hidden = self._score_candidates(
            [prompts[i] for i in order], [candidates[i] for i in order], model
        )
        logp, entropy = [], []
        for s, c in zip(slot, chosen):
            log_pi = self._choice_log_probs(seq_logp[s], counts[s])
            logp.append(log_pi[c])
            entropy.append(-(log_pi.exp() * log_pi).sum())
        logp_t = torch.stack(logp)[:, None]
        values = None if model is not None or self.value_head is None else self._value(hidden)[slot]
        return Evaluation(logp_t, torch.ones_like(logp_t), torch.stack(entropy), values)
