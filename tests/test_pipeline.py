"""Env and policy pipelined inside a rollout (``pipeline``, docs/overlap.md): while the policy acts for one lane of
sub-envs, the other lane steps in its worker processes. The same seed plays the same actions and episodes as the
plain loop; a sub-env that raises or a worker that dies mid-flight ends the rollout with one error, no answer is
left in a pipe, and the next reset plays on."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from agent_helpers import capture_logs
from stable_baselines3.common.callbacks import BaseCallback

import gagpo_gym  # noqa: F401  (registers the envs)
from agents import GAGPOAgent
from wrappers import GroupedVectorEnv
from wrappers.grouped_vector_env import SubEnvError

MAZE = {"width": 3, "height": 3, "rooms": 0, "loops": 1, "min_path": 2, "max_path": 3, "max_episode_steps": 8}
SMALL = dict(
    env_kwargs=MAZE, num_groups=2, group_size=4, tiny_hidden_size=32, seed=3, torch_threads=1, minibatch_size=16,
    verbose=0, vec_mode="async",
)  # fmt: skip


class Flaky(gym.Wrapper):
    """Raises at its ``fail_at``-th step (a task it cannot play), so a test can break one lane mid-flight."""

    def __init__(self, env: gym.Env, fail_at: int) -> None:
        super().__init__(env)
        self.fail_at, self.steps = fail_at, 0

    def step(self, action: Any):
        self.steps += 1
        if self.steps == self.fail_at:
            raise ValueError("this sub-env broke")
        return self.env.step(action)


def vector(n_workers: int = 2, fail_at: dict[int, int] | None = None) -> GroupedVectorEnv:
    fns = [lambda i=i: Flaky(gym.make("gagpo_gym/Maze-v0", **MAZE), (fail_at or {}).get(i, -1)) for i in range(4)]
    return GroupedVectorEnv(fns, num_groups=2, group_size=2, mode="async", n_workers=n_workers)


@contextlib.contextmanager
def reset_lanes(fail_at: dict[int, int] | None = None) -> Iterator[tuple[GroupedVectorEnv, np.ndarray, np.ndarray]]:
    """A reset vector env of 2 workers and its two lanes; closed after."""
    env = vector(fail_at=fail_at)
    try:
        env.reset(seed=0)
        yield env, *env.lanes(2)
    finally:
        env.close()


def rows(agent: GAGPOAgent) -> list[tuple]:
    return [(r.group, r.episode, r.chosen, r.reward, r.state_key, r.done, r.won) for r in agent.buffer.rows]


def played(**config: Any) -> tuple[GAGPOAgent, list[list[tuple]], list[dict[str, Any]]]:
    """Two iterations; the rows of each rollout in a canonical order (the lanes interleave the buffer's rows)."""
    agent = GAGPOAgent("gagpo_gym/Maze-v0", **{**SMALL, **config})
    logs = capture_logs(agent)
    seen: list[list[tuple]] = []

    class Keep(BaseCallback):
        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            seen.append(sorted(rows(agent)))

    agent.learn(10**6, max_iterations=2, callback=Keep())
    return agent, seen, logs.dumps


def test_lanes_share_no_worker_and_cover_every_sub_env():
    env = vector(n_workers=2)
    try:
        lanes = env.lanes(2)
        assert sorted(np.concatenate(lanes).tolist()) == list(range(4))
        owners = [{env.workers.worker_of(int(i)) for i in lane} for lane in lanes]
        assert owners[0].isdisjoint(owners[1]) and all(owners)
    finally:
        env.close()


def test_two_lanes_in_flight_answer_as_one_step_does():
    a, b = vector(), vector()
    try:
        a.reset(seed=5)
        b.reset(seed=5)
        for _ in range(3):
            actions = ["go east"] * 4
            whole = b.step(actions)
            lane0, lane1 = (lane[a.active[lane]] for lane in a.lanes(2))
            t0, t1 = a.step_send(lane0, ["go east"] * lane0.size), a.step_send(lane1, ["go east"] * lane1.size)
            r1, r0 = a.step_receive(t1), a.step_receive(t0)  # received out of order: each lane its own answers
            for lane, part in ((lane0, r0), (lane1, r1)):
                for i in lane:
                    assert part[0][i] == whole[0][i] and part[1][i] == whole[1][i] and part[2][i] == whole[2][i]
        lane0 = lane0[a.active[lane0]]
        ticket = a.step_send(lane0, ["go east"] * lane0.size)
        with pytest.raises(ValueError, match="already being stepped"):
            a.step_send(lane0, ["go east"] * lane0.size)
        a.step_receive(ticket)
    finally:
        a.close()
        b.close()


def test_a_call_to_a_busy_worker_is_refused_not_answered_with_a_step():
    with reset_lanes() as (env, lane0, lane1):
        ticket = env.step_send(lane0, ["look"] * lane0.size)
        with pytest.raises(RuntimeError, match="stepping others"):
            env.call("state_string", indices=[int(lane0[0])])
        assert len(env.call("state_string", indices=[int(i) for i in lane1])) == lane1.size  # the idle lane answers
        env.step_receive(ticket)


def test_a_sub_env_that_raises_in_one_lane_leaves_no_stale_answer():
    with reset_lanes(fail_at={1: 2}) as (env, lane0, lane1):  # sub-env 1 (worker 1) raises at its second step
        for _ in range(2):
            t0 = env.step_send(lane0, ["look"] * lane0.size)
            t1 = env.step_send(lane1, ["look"] * lane1.size)
            env.step_receive(t0)
            if 1 in lane1:
                try:
                    env.step_receive(t1)
                except SubEnvError as err:
                    assert err.sub_env == 1 and "this sub-env broke" in str(err)
                    break
        else:
            pytest.fail("sub-env 1 did not raise")
        with pytest.raises(RuntimeError, match="call reset"):
            env.step(["look"] * 4)
        env.reset(seed=1)
        assert env.step(["look"] * 4)[1].shape == (4,)  # the workers answer the new episode, not an old step


def test_a_worker_killed_mid_flight_is_one_error_and_reset_restarts_it():
    with reset_lanes() as (env, lane0, lane1):
        worker = env.workers.worker_of(int(lane1[0]))
        ticket = env.step_send(lane0, ["look"] * lane0.size)
        os.kill(env.workers.procs[worker].pid, signal.SIGKILL)
        env.workers.procs[worker].join(timeout=10)
        env.step_receive(ticket)  # the other lane's worker is alive and answers
        with pytest.raises(RuntimeError, match="died"):
            env.step_receive(env.step_send(lane1, ["look"] * lane1.size))
        env.reset(seed=2)
        assert env.step(["look"] * 4)[1].shape == (4,)


@pytest.fixture(scope="module")
def plain_loop() -> tuple[GAGPOAgent, list[list[tuple]], list[dict[str, Any]]]:
    return played()


@pytest.mark.slow
def test_pipelined_rollouts_play_the_plain_loops_actions_and_train_alike(plain_loop):
    """Same seed: the same rows (actions, rewards, states, episode ends) in both iterations, the same logged
    rollout metrics, and weights equal up to float rounding (a lane's policy batch holds fewer prompts)."""
    plain, plain_rows, plain_logs = plain_loop
    piped, piped_rows, piped_logs = played(pipeline=True)
    assert piped_rows == plain_rows and len(plain_rows) == 2
    keys = [k for k in plain_logs[0] if k.startswith("rollout/") and k != "rollout/logp_gap_max"]
    assert [{k: d[k] for k in keys} for d in piped_logs] == [{k: d[k] for k in keys} for d in plain_logs]
    for name, p in plain.policy.model.state_dict().items():
        torch.testing.assert_close(piped.policy.model.state_dict()[name], p, rtol=1e-4, atol=1e-5)


def test_pipeline_without_worker_processes_is_one_readable_error():
    with pytest.raises(ValueError, match="pipeline needs vec_mode='async'"):
        GAGPOAgent("gagpo_gym/Maze-v0", **{**SMALL, "vec_mode": "sync", "pipeline": True})


def test_a_callback_that_stops_mid_pipeline_leaves_the_env_ready():
    class StopAt(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.steps = 0

        def _on_step(self) -> bool:
            self.steps += 1
            return self.steps < 3

    agent = GAGPOAgent("gagpo_gym/Maze-v0", **{**SMALL, "pipeline": True})
    agent.learn(10**6, max_iterations=1, callback=StopAt())
    assert agent.iteration == 0
    agent.learn(10**6, max_iterations=1)  # the next rollout's reset finds no answer left over
    assert agent.iteration == 1


def test_pipeline_with_the_overlap_at_staleness_0_plays_the_plain_loops_rows(plain_loop):
    """Both at once: staleness 0 makes the overlap sequential, the pipeline changes no action."""
    _, plain_rows, _ = plain_loop
    _, both_rows, logs = played(pipeline=True, overlap=True, max_staleness=0)
    assert both_rows == plain_rows and [d["overlap/staleness"] for d in logs] == [0, 0]
