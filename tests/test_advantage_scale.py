"""Self-imitation (filtered behaviour cloning) and the one advantage scale (docs/algorithm.md#one-advantage-scale)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from agents import GAGPOAgent
from agents.advantages import REGISTRY, self_imitation_advantages
from agents.buffer import GroupRolloutBuffer, Row
from agents.config import GAGPOConfig


def random_groups(rng: np.random.Generator, n_groups: int = 3, group_size: int = 4) -> list[Row]:
    """Rows of finished groups: episodes of 1-6 steps over a few shared states, some won, a few invalid actions."""
    rows = []
    for g in range(n_groups):
        for e in range(group_size):
            length = int(rng.integers(1, 7))
            won = bool(rng.random() < 0.5)
            states = rng.integers(0, 4, size=length + 1)
            for t in range(length):
                last = t == length - 1
                invalid = bool(rng.random() < 0.15)
                rows.append(
                    Row(group=g, episode=g * group_size + e, prompt_ids=[t], rollout_logp=np.zeros(1),
                        reward=(1.0 if (last and won) else 0.0) - (0.1 if invalid else 0.0),
                        state_key=int(states[t]), next_state_key=int(states[t + 1]), terminated=last and won,
                        done=last, won=last and won, invalid=invalid)
                )  # fmt: skip
    return rows


def filled(config: GAGPOConfig, rows: list[Row]) -> GroupRolloutBuffer:
    buffer = GroupRolloutBuffer(config)
    for g in sorted({r.group for r in rows}):
        buffer.start_group(g, sorted({r.episode for r in rows if r.group == g}))
    for row in rows:
        buffer.add(dataclasses.replace(row))
    buffer.finalize()
    return buffer


def test_self_imitation_is_one_on_the_valid_steps_of_won_episodes():
    rng = np.random.default_rng(0)
    for _ in range(50):
        rows = random_groups(rng)
        ep = np.array([r.episode for r in rows])
        success = np.array([r.won for r in rows])
        penalties = np.array([0.1 * r.invalid for r in rows])
        expected = [float(any(o.won for o in rows if o.episode == r.episode) and not r.invalid) for r in rows]
        assert self_imitation_advantages(ep, success, penalties=penalties).tolist() == expected


def test_self_imitation_refuses_success_on_a_step_that_is_not_final():
    with pytest.raises(ValueError, match="not the final row"):
        self_imitation_advantages(np.array([0, 0]), np.array([True, False]))


@pytest.mark.parametrize("estimator", [name for name, spec in REGISTRY.items() if not spec.needs_critic])
def test_unit_scale_divides_the_estimators_advantages_by_their_rms(estimator):
    rng = np.random.default_rng(1)
    for _ in range(20):
        rows = random_groups(rng)
        own = filled(GAGPOConfig(estimator=estimator, group_size=4), rows).advantages()
        unit = filled(GAGPOConfig(estimator=estimator, group_size=4, advantage_scale="unit"), rows).advantages()
        rms = np.sqrt(np.mean(own**2))
        if rms == 0:
            assert np.array_equal(unit, own)  # a batch of zeros stays zero
        else:
            np.testing.assert_allclose(unit, own / rms, rtol=1e-12, atol=1e-12)
            assert np.sqrt(np.mean(unit**2)) == pytest.approx(1.0)


def test_unit_scale_after_batch_normalisation_and_without_zeroed_groups():
    rng = np.random.default_rng(2)
    rows = random_groups(rng, n_groups=4)
    config = GAGPOConfig(normalize="batch", zero_failed_groups=True, group_size=4)
    own = filled(config, rows).advantages()
    unit = filled(dataclasses.replace(config, advantage_scale="unit"), rows).advantages()
    failed = {g for g in range(4) if not any(r.won for r in rows if r.group == g)}
    kept = np.array([r.group not in failed for r in rows])
    np.testing.assert_allclose(unit, own / np.sqrt(np.mean(own[kept] ** 2)), rtol=1e-12)
    assert not np.any(unit[~kept])


def test_a_bad_scale_is_one_readable_error():
    with pytest.raises(ValueError, match="advantage_scale must be estimator|unit"):
        GAGPOConfig(advantage_scale="batch")


def test_self_imitation_trains_only_on_successes_at_unit_scale(tmp_path):
    """A real learn() iteration: the logged advantages are the rescaled indicator, and the agent saves and loads
    with both settings."""
    agent = GAGPOAgent("gagpo_gym/FrozenLake-v0", estimator="self_imitation", advantage_scale="unit", num_groups=2,
                       group_size=4, seed=0, verbose=0, torch_threads=1)  # fmt: skip
    seen: list[np.ndarray] = []
    finalize = agent.buffer.finalize

    def spy(*args, **kwargs):
        finalize(*args, **kwargs)
        seen.append(agent.buffer.advantages().copy())

    agent.buffer.finalize = spy
    agent.learn(1, max_iterations=1)
    (a,) = seen
    won = {(r.group, r.episode) for r in agent.buffer.rows if r.won}
    on = np.array([(r.group, r.episode) in won and not r.invalid for r in agent.buffer.rows])
    if on.any():
        np.testing.assert_allclose(a[on], 1.0 / np.sqrt(on.mean()))
    assert not np.any(a[~on])
    agent.save(tmp_path / "a")
    loaded = GAGPOAgent.load(tmp_path / "a", verbose=0)
    assert (loaded.config.estimator, loaded.config.advantage_scale) == ("self_imitation", "unit")
