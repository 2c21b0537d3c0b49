"""Dynamic sampling (DAPO's group filter, verl-agent's dynamic GiGPO): groups whose advantages are all zero are
dropped and new tasks played until num_groups informative groups are in, within max_extra_rounds."""

from __future__ import annotations

import numpy as np
import pytest
from agent_helpers import capture_logs

from agents import GAGPOAgent

# Random 3x3 lakes without holes, the goal 4 steps away, 5 steps to reach it: the untrained policy reaches it now and
# then, so many groups fail alike (GRPO: all advantages zero) and some do not.
LAKE = {"map_size": 3, "frozen_prob": 1.0, "max_episode_steps": 5}
AGENT = {"num_groups": 2, "group_size": 3, "torch_threads": 1, "verbose": 0, "tiny_hidden_size": 32,
         "estimator": "grpo", "seed": 0}  # fmt: skip


def test_only_informative_groups_are_kept_and_every_played_step_counts() -> None:
    agent = GAGPOAgent("gagpo_gym/FrozenLake-v0", env_kwargs=LAKE, dynamic_sampling=True, max_extra_rounds=6, **AGENT)
    logs = capture_logs(agent)
    agent.learn(1)
    log = logs.dumps[-1]
    groups = {r.group for r in agent.buffer.rows}
    assert log["rollout/groups_kept"] == len(groups) == 2
    assert all(agent.buffer.informative(g) for g in groups)
    assert all(np.any([r.advantage != 0 for r in agent.buffer.rows if r.group == g]) for g in groups)
    played = log["rollout/groups_played"]
    assert played == 2 * log["rollout/rounds"] and played > 2  # this seed's first round has an all-failed group
    assert log["rollout/informative_group_share"] * played == pytest.approx(2)  # stopped at the second one
    assert agent.num_timesteps == log["rollout/env_steps_played"] > len(agent.buffer.rows)  # dropped steps count
    # Same seed, same run: the extra rounds' tasks and actions come from (seed, iteration, round) alone.
    again = GAGPOAgent("gagpo_gym/FrozenLake-v0", env_kwargs=LAKE, dynamic_sampling=True, max_extra_rounds=6, **AGENT)
    again.learn(1)
    assert [(r.group, r.advantage) for r in again.buffer.rows] == [(r.group, r.advantage) for r in agent.buffer.rows]


def test_without_any_informative_group_the_first_round_is_kept_after_the_cap() -> None:
    far = {**LAKE, "max_episode_steps": 1}  # the goal is 4 steps away: every group fails alike
    agent = GAGPOAgent("gagpo_gym/FrozenLake-v0", env_kwargs=far, dynamic_sampling=True, max_extra_rounds=2, **AGENT)
    logs = capture_logs(agent)
    agent.learn(1)
    log = logs.dumps[-1]
    assert log["rollout/rounds"] == 3 and log["rollout/groups_played"] == 6 and log["rollout/groups_kept"] == 2
    assert log["rollout/informative_group_share"] == 0.0
    kept = sorted({r.group for r in agent.buffer.rows})
    assert kept == [0, 1]  # the first round's groups
    assert agent.num_timesteps == 3 * 2 * 3  # three rounds of 2 groups x 3 one-step episodes were played
    assert len(agent.buffer.rows) == 2 * 3


def test_dynamic_sampling_off_plays_one_round() -> None:
    agent = GAGPOAgent("gagpo_gym/FrozenLake-v0", env_kwargs=LAKE, **AGENT)
    logs = capture_logs(agent)
    agent.learn(1)
    assert "rollout/rounds" not in logs.dumps[-1]
    assert agent.num_timesteps == len(agent.buffer.rows) and len({r.group for r in agent.buffer.rows}) == 2
