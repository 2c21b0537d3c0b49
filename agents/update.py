"""The update: behaviour log-probs recomputed with the update's own forward, then clipped-PPO minibatch steps.

The sampler's log-probs come from another computation (cached, batched differently, maybe another engine); the
PPO ratio must start at exactly 1, so the trainer's forward is the source of truth, as in verl and TRL.
:meth:`PolicyUpdate.recompute` scores the rollout in the first epoch's minibatches and micro-batches, so the first
optimiser step sees bit-identical log-probs (same shapes, same kernels: the ratio is exactly 1, in bf16 too).
:meth:`PolicyUpdate.minibatch_step` is one optimiser step, the public seam the GPU check and the clip benchmark
call; :meth:`PolicyUpdate.run` is the whole update over a plan from :meth:`GroupRolloutBuffer.minibatches`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from agents.batching import packed_width, padded_batches
from agents.buffer import Row
from agents.config import GAGPOConfig
from agents.distributed import Distributed
from agents.loss import clipped_policy_loss, k3_kl
from agents.policy import Evaluation, LLMPolicy, PolicyCore

#: A mean sampler/trainer log-prob gap (nats per token) far beyond rounding in the compute dtype: the engine holds
#: other weights than the trainer. Warned about once (rollout/logp_gap_mean). fp32: measured 1e-7 with vLLM on a CPU,
#: 0.025 with one MLP weight of a random tiny model left unsynced; bf16 on an H200: 0.014 between the HF sampler and
#: the recompute on a random-init 1.5B model (max 0.07; results/gpu/check-h200.txt), a stale engine ~0.2.
LOGP_GAP_WARN = {torch.float32: 1e-3, torch.bfloat16: 0.1}

#: The update's logged quantities (means over its minibatches or micro-batches), as ``train/<name>``.
LOGGED = ("policy_loss", "kl", "entropy", "clip_fraction", "approx_kl", "grad_norm", "value_loss")


def padded(values: list[np.ndarray], like: torch.Tensor) -> torch.Tensor:
    """Per-row arrays of log-probs, zero-padded to ``like``'s [B, T]."""
    out = torch.zeros(like.shape, dtype=torch.float32)
    for k, v in enumerate(values):
        out[k, : len(v)] = torch.as_tensor(v, dtype=torch.float32)
    return out.to(like.device)


def lr_factor(schedule: str, progress: float) -> float:
    """The learning rate's multiplier at ``progress`` through a learn() call (0: its start, 1: its total_timesteps).

    Decaying to 0 lets a run end on the policy its last iterations averaged toward instead of wherever its last
    full-size steps left it (a full-house panel moved by up to 6 points between evaluations 2k steps apart).
    """
    progress = min(max(progress, 0.0), 1.0)
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0


@dataclass
class StepResult:
    """One minibatch step: this rank's largest |ratio - 1| before the step, its gradient norm, whether skipped,
    and each of its actions' length-normalised ratio before the step (in minibatch order)."""

    ratio_dev: float
    grad_norm: float
    skipped: bool
    action_ratios: np.ndarray


class PolicyUpdate:
    """The optimiser side of an agent: recompute, then minibatch steps, with every rank in step under a launch.

    In a launch every rank takes the same number of steps and forwards (a rank with fewer rows runs zero-weight
    ones), and each rank's loss is weighted by its share of the global minibatch, so the reduced gradient is
    exactly the one-process gradient.
    """

    def __init__(
        self,
        policy: LLMPolicy,
        optimizer: torch.optim.Optimizer,
        config: GAGPOConfig,
        dist: Distributed,
        reference_core: PolicyCore | None = None,
    ) -> None:
        self.policy, self.optimizer, self.config, self.dist = policy, optimizer, config, dist
        self.reference_core = reference_core
        self.params = [p for p in policy.forward_core.parameters() if p.requires_grad]
        self.gap_warned = False  # the sampler/trainer log-prob gap is warned about once per agent

    # ----- forwards ---------------------------------------------------------------------------------------
    def micro_batches(self, rows: list[Row]) -> list[list[Row]]:
        """Rows by packed length, cut so that each forward's padded batch holds at most ``token_budget`` tokens.

        Rows of similar length share a forward, so little of its attention and matmuls is spent on padding (the
        update's cost: ~2x on MiniHouse full houses against rows in minibatch order). Identical rows, scored
        once per forward, sort next to each other (by prompt, after length). The recompute uses these same
        micro-batches, so the first minibatch's ratio is exactly 1.
        """

        def size(r: Row) -> int:
            return packed_width(r.prompt_ids, r.candidate_ids) + len(r.response_ids)

        sized = sorted(((size(r), r) for r in rows), key=lambda nr: (nr[0], nr[1].prompt_ids))
        sizes = [n for n, _ in sized]  # each row's prefix tree built once, not for the sort and again here
        return [[sized[i][1] for i in batch] for batch in padded_batches(sizes, self.config.token_budget)]

    def evaluate_rows(self, rows: list[Row], core: PolicyCore | None = None, *, entropy: bool = True) -> Evaluation:
        """The stored actions' log-probs (and entropy, values) under the policy, or under ``core``."""
        return self.policy.evaluate(
            [r.prompt_ids for r in rows],
            responses=[r.response_ids for r in rows],
            candidates=[r.candidate_ids for r in rows],
            chosen=[r.chosen for r in rows],
            core=core,
            entropy=entropy,
        )

    def reference_log_probs(self, rows: list[Row]) -> torch.Tensor:
        """The KL reference's log-probs: the frozen initial policy, or with LoRA the adapter-disabled model."""
        if self.reference_core is not None:
            return self.evaluate_rows(rows, self.reference_core, entropy=False).logp
        with self.policy.model.disable_adapter():
            return self.evaluate_rows(rows, entropy=False).logp

    def zero_loss(self) -> torch.Tensor:
        """A zero loss through the whole wrapped model (one token, one prediction): a rank with no rows left
        still runs the forward and backward its peers run, so DDP/FSDP collectives stay matched."""
        policy = self.policy
        one = torch.ones((1, 1), dtype=torch.long, device=policy.device)
        zero = torch.zeros(1, dtype=torch.long, device=policy.device)
        with policy.precision.autocast():
            logp, _, end, values = policy.forward_core(
                one * policy.tokenizer.pad_token_id, one, None, zero, zero, zero, zero,
                temperature=1.0, entropy=False,
            )  # fmt: skip
        loss = logp.sum() + end.float().sum()
        return (loss + values.sum() if values is not None else loss) * 0.0

    # ----- recompute ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def recompute(self, first_epoch: list[list[Row]], stale: bool = False) -> dict[str, float]:
        """Set each row's ``old_logp`` (and ``ref_logp``, ``is_weight``) from the update's own forward, in the
        first epoch's minibatches; returns what to log (the gap to the sampler's ``rollout_logp``, entropy).

        ``stale``: the rows were sampled by older weights (``overlap``); ``old_logp`` is then the proximal policy
        of decoupled PPO and ``is_weight`` the truncated behaviour correction, whatever ``rollout_is`` says."""
        c = self.config
        weighted = c.rollout_is == "on" or stale
        with self.dist.full_params():
            self.policy.train()  # the mode the update runs in (dropout, gradient checkpointing)
            gaps, entropy, weights = [], [], []
            for micro in [m for minibatch in first_epoch for m in self.micro_batches(minibatch)]:
                ev = self.evaluate_rows(micro)
                ref = self.reference_log_probs(micro) if c.kl_coef > 0 else None
                logp = ev.logp.float().cpu().numpy()
                for k, r in enumerate(micro):
                    n = len(r.rollout_logp)
                    r.old_logp = logp[k, :n].astype(np.float64)
                    gaps.append(np.abs(r.old_logp - r.rollout_logp))
                    if weighted:
                        r.is_weight = min(math.exp(float(np.mean(r.old_logp - r.rollout_logp))), c.rollout_is_cap)
                        weights.append(r.is_weight)
                    if ref is not None:
                        r.ref_logp = ref[k, :n].float().cpu().numpy().astype(np.float64)
                entropy += ev.entropy.float().cpu().tolist()
        per_token = np.concatenate(gaps) if gaps else np.zeros(0)
        gap, mean_gap = float(per_token.max(initial=0.0)), float(per_token.mean()) if per_token.size else 0.0
        logs = {"rollout/logp_gap_max": gap, "rollout/logp_gap_mean": mean_gap}
        if weighted:
            w = np.array(weights)
            logs["rollout/is_weight_mean"] = float(w.mean()) if w.size else 1.0
            logs["rollout/is_truncated_share"] = float(np.mean(w >= c.rollout_is_cap))
        # Stale rows differ from the trainer by the updates between: that gap is the overlap's, not an engine's.
        if not stale and mean_gap > LOGP_GAP_WARN.get(self.policy.precision.compute_dtype, 0.1) and not self.gap_warned:
            self.gap_warned = True
            warnings.warn(
                f"the sampler's log-probs differ from the trainer's by {mean_gap:.3f} nats per token on average "
                f"(up to {gap:.2f}; rollout/logp_gap_mean, _max): the engine holds other weights than the trainer "
                f"(a weight its loader did not take?) or computes in a much coarser dtype",
                stacklevel=3,
            )
        logs["rollout/entropy"] = float(np.mean(entropy)) if entropy else 0.0
        return logs

    # ----- minibatch steps ----------------------------------------------------------------------------------
    def micro_loss(self, micro: list[Row], logs: dict[str, list[float]]) -> tuple[torch.Tensor, dict]:
        """The loss of one micro-batch, a mean over its actions (logs its parts), and the loss's ratio statistics
        (``ratio_dev_max``, ``action_ratio``)."""
        c = self.config
        ev = self.evaluate_rows(micro, entropy=c.ent_coef > 0)
        device = ev.logp.device
        old = padded([r.old_logp for r in micro], ev.logp)
        advantage = torch.as_tensor([r.advantage for r in micro], dtype=ev.logp.dtype, device=device)
        weights = torch.as_tensor([r.is_weight for r in micro], dtype=ev.logp.dtype, device=device)
        pg_loss, info = clipped_policy_loss(
            ev.logp, old, ev.mask, advantage, clip_low=c.clip_range_low, clip_high=c.clip_range_high, ratio=c.ratio,
            weights=weights,
        )  # fmt: skip
        loss = pg_loss
        if c.ent_coef > 0:
            loss = loss - c.ent_coef * ev.entropy.mean()
            logs["entropy"].append(float(ev.entropy.mean().detach()))
        if c.kl_coef > 0:
            kl = k3_kl(ev.logp, padded([r.ref_logp for r in micro], ev.logp), ev.mask).mean()
            loss = loss + c.kl_coef * kl
            logs["kl"].append(float(kl.detach()))
        if ev.values is not None:
            target = torch.as_tensor([r.value_target for r in micro], device=ev.values.device)
            value_loss = torch.nn.functional.mse_loss(ev.values, target)
            loss = loss + c.vf_coef * value_loss
            logs["value_loss"].append(float(value_loss.detach()))
        logs["policy_loss"].append(float(pg_loss.detach()))
        logs["clip_fraction"].append(float(info["clip_fraction"]))
        logs["approx_kl"].append(float(info["approx_kl"]))
        return loss, info

    def minibatch_step(self, minibatch: list[Row], logs: dict[str, list[float]] | None = None) -> StepResult:
        """One optimiser step on this rank's rows of a minibatch: its micro-batches (``token_budget``) accumulate
        gradients, a non-finite loss or gradient skips the step. ``logs`` collects the loss's parts."""
        dist = self.dist
        logs = logs if logs is not None else {k: [] for k in LOGGED}
        micros = self.micro_batches(minibatch)
        sizes = dist.gather((len(minibatch), len(micros)))
        global_rows, n_micro = sum(s[0] for s in sizes), max(s[1] for s in sizes)
        self.optimizer.zero_grad(set_to_none=True)
        bad, ratio_dev, ratios = 0, 0.0, []
        for k in range(n_micro):
            micro = micros[k] if k < len(micros) else []
            with dist.no_sync(self.policy.forward_core, skip=k < n_micro - 1):
                loss, info = self.micro_loss(micro, logs) if micro else (None, None)
                if info is not None:
                    ratios.append(info["action_ratio"].float().cpu().numpy())
                if loss is not None and not torch.isfinite(loss):
                    bad, loss = 1, None
                if loss is None:
                    dist.backward(self.zero_loss())  # keeps this rank's collectives in step
                    continue
                dist.backward(loss * (len(micro) / global_rows * dist.world_size))
                ratio_dev = max(ratio_dev, float(info["ratio_dev_max"]))
        grad_norm = dist.clip_grad_norm_(self.params, self.config.max_grad_norm)
        action_ratios = np.concatenate(ratios) if ratios else np.zeros(0, dtype=np.float32)
        if dist.sum([bad])[0] > 0 or not torch.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            return StepResult(ratio_dev, float(grad_norm), True, action_ratios)
        logs["grad_norm"].append(float(grad_norm))
        self.optimizer.step()
        return StepResult(ratio_dev, float(grad_norm), False, action_ratios)

    def set_progress(self, progress: float) -> float:
        """Set the optimiser's learning rate for ``progress`` through learn() (``lr_schedule``); returns it."""
        lr = self.config.learning_rate * lr_factor(self.config.lr_schedule, progress)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def run(self, plan: list[list[list[Row]]]) -> dict[str, float]:
        """Every epoch's minibatch steps; returns what to log (``train/...``)."""
        self.policy.train()
        logs: dict[str, list[float]] = {k: [] for k in LOGGED}
        results = [self.minibatch_step(minibatch, logs) for minibatches in plan for minibatch in minibatches]
        # The last step's gradients would otherwise live until the next update, beside a waking rollout engine.
        self.optimizer.zero_grad(set_to_none=True)
        out = {
            "train/skipped_updates": sum(r.skipped for r in results),
            # Before any step the update is on-policy, so the ratio must be 1 on every rank.
            "train/first_ratio_dev": max(self.dist.gather(results[0].ratio_dev)) if results else 0.0,
        }
        # Each rank logged its own micro-batches: the mean over every rank's (all ranks reduce, rank 0 logs).
        totals = self.dist.sum([x for k in LOGGED for x in (float(np.sum(logs[k])), len(logs[k]))])
        return out | {f"train/{k}": float(totals[2 * i] / totals[2 * i + 1]) for i, k in enumerate(LOGGED)
                      if totals[2 * i + 1]}  # fmt: skip
