"""The update beside the next rollout (``overlap``, docs/overlap.md): off is the sequential loop bit for bit (against
the code before the overlap existed), staleness 0 equals it, staleness 1 trains with the decoupled-PPO weights of an
independent computation, and an env error, a dead worker, a failed update or Ctrl-C ends learn() with one error,
no hang, and a boundary that saves and resumes exactly."""

from __future__ import annotations

import copy
import faulthandler
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from agent_helpers import capture_logs
from stable_baselines3.common.callbacks import BaseCallback

from agents import GAGPOAgent
from agents.buffer import Row
from agents.generation import HFGenerationBackend
from agents.overlap import UpdatePipeline, mixed_version_sets, thread_split

ROOT = Path(__file__).resolve().parents[1]
#: The last commit before the overlap: its learn() is the reference the default path must still equal bit for bit.
BEFORE_OVERLAP = "cd5acfc"
MAZE = {"width": 3, "height": 3, "rooms": 0, "loops": 1, "min_path": 2, "max_path": 3, "max_episode_steps": 8}
SMALL = dict(
    env_kwargs=MAZE, num_groups=2, group_size=4, tiny_hidden_size=32, seed=3, torch_threads=1, minibatch_size=16,
    verbose=0,
)  # fmt: skip

#: A short seeded learn() printing a fingerprint of its weights and logs (run under either commit's code).
FINGERPRINT = """
import hashlib, json, sys, torch
from stable_baselines3.common.logger import KVWriter, Logger
from agents import GAGPOAgent
class Keep(KVWriter):
    def __init__(self): self.dumps = []
    def write(self, kv, excluded, step=0): self.dumps.append({k: v for k, v in kv.items() if not k.startswith("time/")})
    def close(self): pass
kwargs = json.loads(sys.argv[1])
agent = GAGPOAgent("gagpo_gym/Maze-v0", **kwargs)
keep = Keep()
agent.set_logger(Logger(folder=None, output_formats=[keep]))
agent.learn(10**6, max_iterations=3)
h = hashlib.sha256()
for name, p in sorted(agent.policy.model.state_dict().items()):
    h.update(name.encode()); h.update(p.detach().cpu().numpy().tobytes())
print(json.dumps({"weights": h.hexdigest(), "logs": keep.dumps, "steps": agent.num_timesteps}, default=float))
"""


@pytest.fixture(autouse=True)
def no_hang() -> Iterator[None]:
    """A deadlock fails the test (with every thread's stack) instead of hanging the run."""
    faulthandler.dump_traceback_later(600, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def fingerprint(code_root: Path, **kwargs: Any) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(code_root)}
    out = subprocess.run(
        [sys.executable, "-c", FINGERPRINT, json.dumps(kwargs)], cwd=code_root, env=env, capture_output=True,
        text=True, check=True, timeout=600,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def weights(agent: GAGPOAgent) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in agent.policy.model.state_dict().items()}


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def learned(**config: Any) -> tuple[GAGPOAgent, list[dict[str, Any]]]:
    agent = GAGPOAgent("gagpo_gym/Maze-v0", **{**SMALL, **config})
    logs = capture_logs(agent)
    agent.learn(10**6, max_iterations=3)
    return agent, logs.dumps


def untimed(dumps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in d.items() if not k.startswith("time/")} for d in dumps]


# ----- off: the code before the overlap, bit for bit -----------------------------------------------------------
@pytest.mark.slow
def test_overlap_off_trains_as_the_code_before_it_did_bit_for_bit(tmp_path: Path) -> None:
    """The default path's weights and logs after 3 iterations equal those of the commit before the overlap (its
    code checked out with ``git worktree``, run in a subprocess of the same interpreter)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the repository's git history")
    before = tmp_path / "before"
    subprocess.run(["git", "worktree", "add", "--detach", str(before), BEFORE_OVERLAP], cwd=ROOT, check=True,
                   capture_output=True)  # fmt: skip
    try:
        kwargs = {**SMALL, "env_kwargs": MAZE}
        old, new = fingerprint(before, **kwargs), fingerprint(ROOT, **kwargs)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT, capture_output=True)
    assert new["steps"] == old["steps"] and len(new["logs"]) == 3
    # Logged since: the share of singleton state sets beside the share of rows in them (issue 60).
    added = {"advantage/singleton_set_share"}
    assert [{k: v for k, v in d.items() if k not in added} for d in new["logs"]] == old["logs"]
    assert all(set(n) - set(o) == added for n, o in zip(new["logs"], old["logs"]))
    assert new["weights"] == old["weights"]


# ----- on, staleness 0: the sequential loop ---------------------------------------------------------------------
def test_overlap_with_staleness_0_equals_the_sequential_loop() -> None:
    """Staleness 0 makes every rollout wait for the update before it: the threaded loop then trains exactly as the
    sequential one (same weights, same per-iteration metrics), and logs staleness 0."""
    sync, sync_logs = learned()
    lagged, lagged_logs = learned(overlap=True, max_staleness=0)
    assert same_weights(weights(sync), weights(lagged))
    assert sync.num_timesteps == lagged.num_timesteps and sync.iteration == lagged.iteration == 3
    overlap_keys = {"overlap/staleness", "overlap/mixed_version_sets"}
    assert [{k: v for k, v in d.items() if k not in overlap_keys} for d in untimed(lagged_logs)] == untimed(sync_logs)
    assert [d["overlap/staleness"] for d in lagged_logs] == [0, 0, 0]


# ----- on, staleness 1: decoupled PPO ---------------------------------------------------------------------------
def test_stale_rollouts_train_with_the_truncated_weights_of_an_independent_computation() -> None:
    """With staleness 1, rollout j acts with the weights of version j-1 and update j starts from version j. Each
    row's sampler log-prob is version j-1's, its recomputed (proximal) log-prob version j's, and its weight
    min(exp(mean(proximal - behaviour)), cap), all checked against forwards of those versions loaded afresh."""
    agent = GAGPOAgent("gagpo_gym/Maze-v0", **{**SMALL, "overlap": True, "max_staleness": 1})
    logs = capture_logs(agent)
    published: dict[int, dict[str, torch.Tensor]] = {}
    pipe = agent.pipeline
    assert pipe is not None
    publish = pipe.versions.publish

    def keep(version: int, core: Any) -> None:
        publish(version, core)
        published[version] = {k: v.clone() for k, v in pipe.versions.get(version).items()}

    seen: list[tuple[int, list[Row]]] = []
    recompute = agent.update.recompute

    def spy(first_epoch: list[list[Row]], stale: bool = False) -> dict[str, float]:
        out = recompute(first_epoch, stale)
        seen.append((int(stale), [r for minibatch in first_epoch for r in minibatch]))
        return out

    pipe.versions.publish = keep  # type: ignore[method-assign]
    agent.update.recompute = spy  # type: ignore[method-assign]
    agent.learn(10**6, max_iterations=3)
    assert [d["overlap/staleness"] for d in logs.dumps] == [0, 1, 1]
    assert [d["overlap/mixed_version_sets"] for d in logs.dumps] == [0, 0, 0]
    assert [stale for stale, _ in seen] == [0, 1, 1]
    cap = agent.config.rollout_is_cap
    probe = GAGPOAgent("gagpo_gym/Maze-v0", **SMALL)  # a separate model to load each version into

    def log_probs(version: int, rows: list[Row]) -> list[np.ndarray]:
        probe.policy.core.load_state_dict(published[version])
        probe.policy.train()  # the update's mode (no dropout in the tiny model either way)
        with torch.no_grad():
            ev = probe.update.evaluate_rows(rows, entropy=False)
        return [ev.logp[k, : len(r.rollout_logp)].double().numpy() for k, r in enumerate(rows)]

    for j, (_, rows) in enumerate(seen[1:], start=1):
        assert {r.version for r in rows} == {j - 1}
        behaviour, proximal = log_probs(j - 1, rows), log_probs(j, rows)
        for r, b, p in zip(rows, behaviour, proximal):
            np.testing.assert_allclose(r.rollout_logp, b, atol=1e-5)
            np.testing.assert_allclose(r.old_logp, p, atol=1e-5)
            assert r.is_weight == min(math.exp(float(np.mean(r.old_logp - r.rollout_logp))), cap)
            assert r.is_weight == pytest.approx(min(math.exp(float(np.mean(p - b))), cap), abs=1e-4)
        assert any(abs(r.is_weight - 1) > 1e-6 for r in rows)  # the versions differ: the correction is at work
    assert all(r.is_weight == 1.0 for r in seen[0][1])  # the first rollout is on-policy


def test_mixed_version_sets_and_thread_split() -> None:
    def row(group: int, key: int, version: int) -> Row:
        return Row(group, 0, [1], np.zeros(1), 0.0, key, key, False, False, False, version=version)

    assert mixed_version_sets([row(0, 1, 0), row(0, 1, 0), row(1, 1, 1)]) == 0
    assert mixed_version_sets([row(0, 1, 0), row(0, 1, 1), row(0, 2, 1)]) == 1
    assert thread_split(2) == (1, 1) and thread_split(1) == (1, 1) and thread_split(5) == (2, 3)


# ----- an engine with weights of its own (vLLM's protocol) ------------------------------------------------------
class CopyEngine(HFGenerationBackend):
    """A generation engine that keeps weights of its own, as vLLM's does (``own_weights``): it samples with a copy
    loaded at each sync, the first generation after ``serve`` or ``release``. It records what each sync loaded.
    (vLLM's own engine under overlap: tests/test_vllm_backend.py, ``make test-vllm``.)"""

    own_weights = True

    def __init__(self, policy: Any) -> None:
        super().__init__(copy.deepcopy(policy.model), policy.tokenizer, policy.precision)
        self.source, self.stale, self.syncs = policy.model, True, []

    def sync_weights(self, model: torch.nn.Module) -> None:
        self.source = model
        self.model.load_state_dict(model.state_dict())
        self.stale = False
        self.syncs.append({k: v.detach().clone() for k, v in model.state_dict().items()})

    def serve(self, model: torch.nn.Module) -> None:
        self.source, self.stale = model, True

    def release(self) -> None:
        self.stale = True

    def generate(self, prompts, **kwargs):
        if self.stale:
            self.sync_weights(self.source)
        return super().generate(prompts, **kwargs)


def test_an_engine_with_weights_of_its_own_syncs_each_version_once_and_trains_as_sampling_on_them() -> None:
    """backend='vllm' with overlap: the acting copy shares the engine, which syncs each version once, in the rollout's
    thread before its first generation, and samples exactly what sampling on that version's weights does; after
    learn() it serves the trainer's weights again (predict). Generate mode, staleness 1, three iterations."""
    config = dict(overlap=True, action_mode="generate", max_new_tokens=6, history_length=1)
    plain, plain_logs = learned(**config)
    agent = GAGPOAgent("gagpo_gym/Maze-v0", **{**SMALL, **config})
    engine = CopyEngine(agent.policy)
    agent.policy.backend = engine
    agent.pipeline = UpdatePipeline(agent.policy, agent.config.max_staleness, 1)  # its acting copy shares the engine
    versions: dict[int, dict[str, torch.Tensor]] = {}
    publish = agent.pipeline.versions.publish
    agent.pipeline.versions.publish = lambda v, state: (versions.setdefault(v, state), publish(v, state))[-1]
    logs = capture_logs(agent)
    agent.learn(10**6, max_iterations=3)
    assert same_weights(weights(plain), weights(agent))  # the same samples, so the same training
    assert untimed(logs.dumps) == untimed(plain_logs)
    # rollouts 0, 1, 2 acted with versions 0, 0, 1: two syncs, each of its version's weights
    assert len(engine.syncs) == 2
    model_of = {v: {k.removeprefix("model."): t for k, t in state.items()} for v, state in versions.items()}
    assert all(same_weights(engine.syncs[i], model_of[v]) for i, v in enumerate([0, 1]))
    assert engine.source is agent.policy.model and engine.stale  # handed back to the trainer
    panel = agent.evaluate(n_tasks=2, episodes=True)  # greedy, through the engine
    assert panel["episodes"] == plain.evaluate(n_tasks=2, episodes=True)["episodes"]
    assert len(engine.syncs) == 3 and same_weights(engine.syncs[-1], weights(agent))


# ----- faults: one error, no hang, a boundary that holds -------------------------------------------------------
class RaiseAt(BaseCallback):
    """Raise ``error`` at the ``at``-th env step of rollout ``rollout`` (counted from the learn() call)."""

    def __init__(self, rollout: int, at: int, error: BaseException) -> None:
        super().__init__()
        self.rollout, self.at, self.error, self.rollouts, self.steps = rollout, at, error, -1, 0

    def _on_rollout_start(self) -> None:
        self.rollouts += 1
        self.steps = 0

    def _on_step(self) -> bool:
        self.steps += 1
        if self.rollouts == self.rollout and self.steps == self.at:
            raise self.error
        return True


def test_an_env_error_mid_overlap_ends_learn_after_the_update_in_flight(tmp_path: Path) -> None:
    """The env raises in rollout 2 while update 1 runs: learn() raises the env's error once update 1 has ended
    (iteration 2 done and logged), and the agent saves that boundary."""
    agent = GAGPOAgent("gagpo_gym/Maze-v0", **{**SMALL, "overlap": True})
    logs = capture_logs(agent)
    env = agent.env
    reset, receive = env.reset, env.step_receive
    resets = {"n": 0}

    def counting_reset(**kwargs: Any) -> Any:
        resets["n"] += 1
        return reset(**kwargs)

    def failing_step(ticket: Any) -> Any:  # the rollout steps its sub-envs by step_send + step_receive
        if resets["n"] == 3:  # rollout 2
            raise RuntimeError("the env broke")
        return receive(ticket)

    env.reset, env.step_receive = counting_reset, failing_step  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="the env broke"):
        agent.learn(10**6, max_iterations=4)
    assert agent.iteration == 2 and len(logs.dumps) == 2
    assert agent.boundary is not None and agent.boundary["iteration"] == 2
    assert agent.num_timesteps == agent.boundary["num_timesteps"]
    agent.save(tmp_path / "saved")


class KillWorker(BaseCallback):
    """Kill the first env worker process at the second step of rollout 1 (while update 0 runs)."""

    def __init__(self) -> None:
        super().__init__()
        self.rollouts, self.steps = -1, 0

    def _on_rollout_start(self) -> None:
        self.rollouts, self.steps = self.rollouts + 1, 0

    def _on_step(self) -> bool:
        self.steps += 1
        if self.rollouts == 1 and self.steps == 2:
            worker = self.model.env.workers.procs[0]
            worker.kill()
            worker.join()
        return True


def test_a_dead_env_worker_mid_overlap_raises_without_hanging() -> None:
    agent = GAGPOAgent("gagpo_gym/Maze-v0", **{**SMALL, "overlap": True, "vec_mode": "async"})
    try:
        with pytest.raises(Exception, match="(?i)worker"):
            agent.learn(10**6, max_iterations=4, callback=KillWorker())
        assert agent.iteration == 1 and agent.boundary is not None and agent.boundary["iteration"] == 1
    finally:
        agent.close()


def test_a_failed_update_raises_one_clear_error_and_no_hang() -> None:
    agent = GAGPOAgent("gagpo_gym/Maze-v0", **{**SMALL, "overlap": True})
    run = agent.update.run
    count = {"n": 0}

    def failing(plan: Any) -> dict[str, float]:
        count["n"] += 1
        if count["n"] == 2:
            raise FloatingPointError("the update broke")
        return run(plan)

    agent.update.run = failing  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="update of iteration 2 failed .*the update broke"):
        agent.learn(10**6, max_iterations=5)
    assert agent.iteration == 1
    with pytest.raises(RuntimeError, match="part-way"):
        agent.save("never-written")


# ----- Ctrl-C and exact resume ------------------------------------------------------------------------------------
@pytest.mark.parametrize("staleness", [1, 2])
def test_resume_after_ctrl_c_mid_overlap_is_exact(tmp_path: Path, staleness: int) -> None:
    """Ctrl-C in rollout 2 while update 1 runs: learn() lets the update end, the save holds iteration 2 and the older
    weights rollouts 2.. act with; load + learn(reset_num_timesteps=False) ends on the uninterrupted run's weights."""
    config = {**SMALL, "overlap": True, "max_staleness": staleness}
    whole = GAGPOAgent("gagpo_gym/Maze-v0", **config)
    whole_logs = capture_logs(whole)
    whole.learn(10**6, max_iterations=4)

    cut = GAGPOAgent("gagpo_gym/Maze-v0", **config)
    with pytest.raises(KeyboardInterrupt):
        cut.learn(10**6, max_iterations=4, callback=RaiseAt(2, 3, KeyboardInterrupt()))
    assert cut.iteration == 2
    cut.save(tmp_path / "cut")
    resumed = GAGPOAgent.load(tmp_path / "cut", verbose=0)
    resumed_logs = capture_logs(resumed)
    resumed.learn(10**6 - resumed.num_timesteps, reset_num_timesteps=False, max_iterations=2)
    assert resumed.iteration == 4 and resumed.num_timesteps == whole.num_timesteps
    assert same_weights(weights(resumed), weights(whole))
    assert untimed(resumed_logs.dumps) == untimed(whole_logs.dumps[2:])


def test_save_mid_rollout_waits_for_the_update_and_names_its_steps(tmp_path: Path) -> None:
    """IterationCheckpoint saves when a rollout starts, while an update runs: the save waits for it and the folder
    is named after the steps that boundary holds."""
    from agents.callbacks import IterationCheckpoint

    agent = GAGPOAgent("gagpo_gym/Maze-v0", **{**SMALL, "overlap": True})
    saver = IterationCheckpoint(1, str(tmp_path))
    agent.learn(10**6, max_iterations=3, callback=saver)
    names = sorted(p.name for p in tmp_path.iterdir())
    steps = sorted(int(n.split("_")[1]) for n in names)
    assert len(steps) == 3  # after updates 1 and 2 (as rollouts 2 and 3 start... and at the end)
    for name in names:
        meta = json.loads((tmp_path / name / "agent.json").read_text())
        assert name == f"agent_{meta['num_timesteps']}_steps"
