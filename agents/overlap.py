"""The update beside the next rollout (``GAGPOConfig.overlap``; docs/overlap.md).

Iteration k's update runs in a worker thread on the trainer's weights while the main thread plays rollout k+1
with a frozen copy of older weights (torch's CPU kernels release the GIL; env steps in async workers run in other
processes). Which weights a rollout acts with is a function of its index alone, never of timing: rollout j acts with
version ``max(j - max_staleness, first)`` (version v = the weights after v updates; ``first``: the oldest version
this run has), so a run is reproducible and resumes exactly. The loss corrects the lag with decoupled PPO: the
recomputed log-probs at the update's start are the proximal policy, and each action's term is weighted by the
truncated ratio of that policy to the one that sampled it (:meth:`agents.update.PolicyUpdate.recompute`).

This module holds the mechanics (the versions, the acting copy, the queue of updates in flight); the loop that
drives them, with callbacks and the logger, is :meth:`agents.gagpo.GAGPOAgent.learn`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from agents.buffer import Row
from agents.policy import LLMPolicy

#: Estimators whose advantages compare rows within (group, state) sets: the overlap logs how many sets mix versions.
STATE_SET_ESTIMATORS = ("gagpo", "gigpo")


def thread_split(threads: int) -> tuple[int, int]:
    """The torch threads of the rollout and of the update out of one budget: half each, at least one."""
    return max(1, threads // 2), max(1, threads - threads // 2)


def mixed_version_sets(rows: list[Row]) -> int:
    """How many (group, state key) sets hold rows sampled by more than one policy version."""
    versions: dict[tuple[int, Any], set[int]] = {}
    for r in rows:
        versions.setdefault((r.group, r.state_key), set()).add(r.version)
    return sum(len(v) > 1 for v in versions.values())


@dataclass
class Pending:
    """An update in flight: the rollout it trains on, its result, and what its iteration logs and ends at."""

    rollout: int
    logs: dict[str, float]  # the rollout's own metrics, recorded when its iteration ends
    boundary: dict[str, Any]  # the counters and numpy RNG of the boundary it ends at (torch RNG added then)
    future: Future = field(default_factory=Future)  # set by UpdatePipeline.submit


class Versions:
    """Frozen copies of the trainer's weights, by version (the number of updates behind them)."""

    def __init__(self) -> None:
        self.states: dict[int, dict[str, torch.Tensor]] = {}
        self.lock = threading.Lock()

    def publish(self, version: int, state: dict[str, torch.Tensor]) -> None:
        """Keep ``state``, whole weights of the trainer's own (:meth:`agents.distributed.Distributed.full_state`,
        taken by the thread that just made them), as ``version``."""
        with self.lock:
            self.states[version] = state

    def get(self, version: int) -> dict[str, torch.Tensor] | None:
        with self.lock:
            return self.states.get(version)

    def first(self) -> int | None:
        with self.lock:
            return min(self.states, default=None)

    def keep_from(self, version: int) -> None:
        """Forget versions older than ``version`` (no rollout will act with them again)."""
        with self.lock:
            for v in [v for v in self.states if v < version]:
                del self.states[v]

    def between(self, low: int, high: int) -> dict[int, dict[str, torch.Tensor]]:
        """The versions in [low, high): what a checkpoint at boundary ``high`` needs to resume exactly."""
        with self.lock:
            return {v: s for v, s in self.states.items() if low <= v < high}

    def clear(self) -> None:
        with self.lock:
            self.states.clear()


class UpdatePipeline:
    """One worker thread running updates in order, the versions they publish and the rollout's acting copy.

    Made before the trainer's weights are wrapped (DDP) or sharded (FSDP2): the acting copy is a whole, plain copy
    of the policy, which loads each version's weights (gathered whole on every rank under FSDP2)."""

    def __init__(self, policy: LLMPolicy, max_staleness: int, threads: int) -> None:
        self.max_staleness = max_staleness
        self.rollout_threads, self.update_threads = thread_split(threads)
        self.versions = Versions()
        self.pending: deque[Pending] = deque()
        self.failed = threading.Event()  # an update raised: the ones queued behind it must not run
        self._executor: ThreadPoolExecutor | None = None
        self._acting = policy.acting_copy()
        self.acting_version: int | None = None
        self.sync_s = 0.0  # the last version change's load into the acting copy (and its engine's sync)

    # ----- versions ----------------------------------------------------------------------------------------
    def behaviour_version(self, rollout: int) -> int:
        """The version rollout ``rollout`` acts with: ``max_staleness`` behind, never before the first kept."""
        first = self.versions.first()
        assert first is not None, "start() publishes the trainer's weights first"
        return max(rollout - self.max_staleness, first)

    def acting(self, version: int) -> LLMPolicy:
        """The rollout's policy holding ``version``'s weights, loaded once per version. A generation engine with
        weights of its own (vLLM) syncs them here, in the rollout's thread, before the rollout's first generation:
        it never generates with half-synced weights, and never syncs twice for one version."""
        state = self.versions.get(version)
        assert state is not None, f"version {version} was not published"
        self.sync_s = 0.0
        if self.acting_version != version:
            t0 = time.perf_counter()
            self._acting.core.load_state_dict(state)
            self._acting.backend.sync_weights(self._acting.model)
            self.acting_version = version
            self.sync_s = time.perf_counter() - t0
        return self._acting

    def hand_back(self, policy: LLMPolicy) -> None:
        """learn() is over: an engine the acting copy shared (vLLM) serves the trainer's weights again (predict,
        evaluate), and the next rollout's version is synced to it afresh."""
        if policy.backend.own_weights:
            policy.backend.serve(policy.model)
            self.acting_version = None

    # ----- the worker ----------------------------------------------------------------------------------------
    def submit(self, job: Callable[[], dict[str, float]], pending: Pending) -> None:
        """Queue an update (it runs after the ones already queued) and remember it as ``pending``."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gagpo-update")
        threads = self.update_threads

        def run() -> dict[str, float]:
            if self.failed.is_set():
                raise RuntimeError("an earlier update failed; this one did not run")
            torch.set_num_threads(threads)  # per thread: the rollout's thread keeps its own count
            t0 = time.perf_counter()
            try:
                logs = job()
            except BaseException:
                self.failed.set()
                raise
            logs["time/update_thread_s"] = time.perf_counter() - t0
            return logs

        pending.future = self._executor.submit(run)
        self.pending.append(pending)

    def close(self) -> None:
        """Stop the worker thread (after the updates queued; learn() has waited for them already)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self.failed.clear()
