"""Generation: the ``GenerationBackend`` protocol, the HF sampler on the training weights, and stop tokens.

Sampling is this module's own loop (:func:`sample_responses`): the sampling settings are the agent's alone, no
field of a checkpoint's ``generation_config.json`` reaches them, and only each sampled token's log-prob is kept.
:mod:`agents.vllm_backend` is the other implementation of the protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch
from torch import nn

from agents.batching import pad
from agents.precision import Precision

#: Texts that end a response: the action is closed, nothing after it is read.
STOP_TEXTS = ("</action>",)


def eos_token_ids(model: nn.Module, tokenizer) -> list[int]:
    """Every end-of-sequence id the model knows (tokenizer, model config, generation config), in order."""
    found: list[int] = []
    sources = [tokenizer.eos_token_id, getattr(model.config, "eos_token_id", None)]
    generation = getattr(model, "generation_config", None)
    sources.append(getattr(generation, "eos_token_id", None))
    for value in sources:
        for token in value if isinstance(value, (list, tuple)) else [value]:
            if token is not None and int(token) not in found:
                found.append(int(token))
    return found


@torch.no_grad()
def sample_responses(
    model: nn.Module,
    tokenizer,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    temperature: float,
    greedy: bool,
    stop_ids: Sequence[int],
    stop_texts: Sequence[str] = STOP_TEXTS,
    seeds: Sequence[int] | None = None,
) -> tuple[list[list[int]], list[np.ndarray]]:
    """Sample a response per prompt with the model's KV cache; return the tokens and their log-probs.

    The distribution is exactly ``softmax(logits / temperature)`` (no top-k, top-p, repetition penalty or
    minimum length: nothing the checkpoint carries), or its argmax when ``greedy``. Each row draws from its own
    random stream (``seeds``, Gumbel-max), so a response does not depend on the batch it was sampled in: the
    same seeds give the same rollout on one process or split across ranks. A response stops after an eos id
    (kept, so the model learns to stop) or once its text contains a stop text such as ``</action>``. Only the
    sampled tokens' log-probs are kept.
    """
    device = next(model.parameters()).device
    ids, mask = pad(prompts, tokenizer.pad_token_id, left=True)
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    batch = len(prompts)
    stop = set(stop_ids)
    tokens = torch.zeros((batch, max_new_tokens), dtype=torch.long, device=device)
    logps = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device)
    lengths = [max_new_tokens] * batch
    running = torch.ones(batch, dtype=torch.bool, device=device)
    # The stop checks run on the host, on its own copy of the sampled tokens: one device-to-host copy per token.
    alive, sampled = [True] * batch, [[] for _ in range(batch)]
    may_close: dict[int, bool] = {}  # token id -> its text could end a stop text
    generators = []
    if not greedy:
        if seeds is None or len(seeds) != batch:
            raise ValueError("sampling needs one seed per prompt")
        generators = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]
    cache = None
    step_ids, step_pos = ids, positions
    for t in range(max_new_tokens):
        out = model(
            input_ids=step_ids,
            attention_mask=mask,
            position_ids=step_pos,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        cache = out.past_key_values
        logits = out.logits[:, -1].float() / temperature
        log_probs = torch.log_softmax(logits, -1)
        if greedy:
            chosen = log_probs.argmax(-1)
        else:  # Gumbel-max: argmax(log p + Gumbel noise) is a draw from p
            u = torch.stack([torch.rand(log_probs.shape[-1], generator=g, device=device) for g in generators])
            chosen = (log_probs - torch.log(-torch.log(u.clamp(min=1e-20)))).argmax(-1)
        chosen = torch.where(running, chosen, torch.full_like(chosen, tokenizer.pad_token_id))
        tokens[:, t] = chosen
        logps[:, t] = log_probs.gather(-1, chosen[:, None]).squeeze(-1)
        for b, tok in enumerate(chosen.tolist()):
            if not alive[b]:
                continue
            sampled[b].append(tok)
            if tok not in may_close:
                may_close[tok] = any(s[-1] in tokenizer.decode([tok]) for s in stop_texts)
            if tok in stop or (may_close[tok] and any(s in tokenizer.decode(sampled[b]) for s in stop_texts)):
                alive[b], lengths[b] = False, t + 1
        if not any(alive):
            break
        running = torch.tensor(alive, device=device)
        step_ids = chosen[:, None]
        step_pos = step_pos[:, -1:] + 1
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    tokens, logps = tokens.cpu(), logps.cpu()
    responses = [tokens[b, : lengths[b]].tolist() for b in range(batch)]
    return responses, [logps[b, : lengths[b]].numpy().astype(np.float64) for b in range(batch)]


class GenerationBackend(Protocol):
    """What a generation engine provides: sampled response ids with their log-probs, and weight sync.

    An engine with its own copy of the weights (``own_weights``) syncs them at its first ``generate`` after
    ``release`` (the agent calls it once per iteration, between the rollout and the update) and reports the time in
    ``last_sync_s``. ``serve(model)`` names the model whose weights it generates with from then on: the trainer's,
    or the acting copy's under ``overlap``, which shares such an engine rather than starting a second one.
    """

    last_sync_s: float
    own_weights: bool

    def generate(
        self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, greedy: bool, seeds: list[int]
    ) -> tuple[list[list[int]], list[np.ndarray]]: ...

    def sync_weights(self, model: nn.Module) -> None: ...

    def serve(self, model: nn.Module) -> None: ...

    def release(self) -> None: ...


class HFGenerationBackend:
    """Sampling with :func:`sample_responses` on the training model itself (no weight copy to sync)."""

    last_sync_s = 0.0
    own_weights = False

    def __init__(self, model: nn.Module, tokenizer, precision: Precision) -> None:
        self.model, self.tokenizer, self.precision = model, tokenizer, precision
        self.stop_ids = eos_token_ids(model, tokenizer)

    def sync_weights(self, model: nn.Module) -> None:
        self.model = model

    def serve(self, model: nn.Module) -> None:
        self.model = model

    def release(self) -> None:
        """Nothing to free: sampling runs on the training weights themselves."""

    def generate(self, prompts, *, max_new_tokens, temperature, greedy, seeds):
        with self.precision.autocast():
            return sample_responses(
                self.model, self.tokenizer, prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                greedy=greedy, stop_ids=self.stop_ids, seeds=seeds,
            )  # fmt: skip
