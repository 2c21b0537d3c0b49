"""Key back-off and the episode term outside the estimator: config fields, the key wrapper, the rollout buffer.

The estimator itself is checked against the reference in ``test_advantages.py``; here the question is whether
the keys named in the config reach it: ``StateKey`` puts them in ``info["keys"]``, ``Row.keys_from`` reads them,
the buffer passes them (and ``episode_coef``) to ``gagpo_advantages`` group by group.
"""

from __future__ import annotations

import dataclasses
import functools
import json

import gymnasium as gym
import numpy as np
import pytest

import gagpo_gym
from agents import advantages as adv
from agents.buffer import GroupRolloutBuffer, Row
from agents.config import GAGPOConfig
from agents.evaluation import info_at
from gagpo_gym.core import state_key
from wrappers import GroupedVectorEnv, StateKey, parse_backoff_spec, wrap_text_env

MAZE = "gagpo_gym/Maze-v0"
SMALL_MAZE = {"width": 3, "height": 3, "min_path": 2, "max_path": 4}


# ----- config -------------------------------------------------------------------------------------------
def test_config_defaults_turn_backoff_and_the_episode_term_off() -> None:
    c = GAGPOConfig()
    assert c.key_backoff == () and c.backoff_min_count == 2 and c.episode_coef == 0.0


@pytest.mark.parametrize("names", [("observation", "group"), ["history:3", "state", "group"], ()])
def test_config_key_backoff_survives_a_json_round_trip(names) -> None:
    c = GAGPOConfig(state_key="history:2", key_backoff=names, backoff_min_count=3, episode_coef=0.5)
    assert c.key_backoff == tuple(names)
    loaded = GAGPOConfig.from_dict(json.loads(json.dumps(c.to_dict())))
    assert loaded == c and loaded.key_backoff == tuple(names)
    assert dataclasses.replace(c, lam=0.5).key_backoff == tuple(names)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"key_backoff": "observation"}, "key_backoff must be a tuple or list"),
        ({"key_backoff": ("obs",)}, "key_backoff: a back-off key must be 'group', 'state', 'observation'"),
        ({"key_backoff": ("history:0",)}, "key_backoff: a back-off key must be"),
        ({"key_backoff": (3,)}, "key_backoff: a back-off key must be"),
        ({"key_backoff": ("group", "group")}, "key_backoff repeats a key"),
        ({"backoff_min_count": 0}, "backoff_min_count must be >= 1"),
        ({"backoff_min_count": 2.0}, "backoff_min_count must be a finite int"),
        ({"episode_coef": float("nan")}, "episode_coef must be a finite number"),
        ({"episode_coef": "1"}, "episode_coef must be a finite number"),
    ],
)
def test_config_backoff_errors(changes, message) -> None:
    with pytest.raises(ValueError, match=message):
        GAGPOConfig(**changes)


# ----- the key wrapper ----------------------------------------------------------------------------------
def test_parse_backoff_spec() -> None:
    assert parse_backoff_spec("group") == ("group", 0)
    assert parse_backoff_spec("history:3") == ("history", 3)
    for bad in ("", "groups", "history:0", None):
        with pytest.raises(ValueError, match="a back-off key must be"):
            parse_backoff_spec(bad)


def test_state_key_emits_every_backoff_key() -> None:
    """Each key in info["keys"] is what a StateKey of that granularity alone puts in info["state_key"]."""
    names = ("history:3", "observation", "state", "group")
    base = functools.partial(gagpo_gym.make, MAZE, **SMALL_MAZE)
    env, plain = StateKey(base(), "history:2", backoff=names), StateKey(base(), "history:2")
    singles = {name: StateKey(base(), name) for name in names if name != "group"}
    envs = [env, plain, *singles.values()]
    infos = [e.reset(seed=4)[1] for e in envs]
    for step in range(6):
        info, plain_info, *single_infos = infos
        assert info["state_key"] == plain_info["state_key"] and "keys" not in plain_info  # main key untouched
        expected = {name: i["state_key"] for name, i in zip(singles, single_infos, strict=True)} | {"group": 0}
        assert info["keys"] == expected, step
        action = env.unwrapped.admissible_actions()[step % 2]
        outs = [e.step(action) for e in envs]
        infos = [out[-1] for out in outs]
        if outs[0][2] or outs[0][3]:
            break
    assert step >= 2


def test_state_key_rejects_a_bad_backoff_key() -> None:
    with pytest.raises(ValueError, match="a back-off key must be"):
        StateKey(gagpo_gym.make(MAZE, **SMALL_MAZE), "state", backoff=("state", "room"))


def test_backoff_keys_reach_the_agent_through_the_vector_env() -> None:
    def make() -> gym.Env:
        return wrap_text_env(gagpo_gym.make(MAZE, **SMALL_MAZE), tagged=False, backoff=("observation", "group"))

    venv = GroupedVectorEnv(make, num_groups=2, group_size=2)
    try:
        obs, infos = venv.reset(seed=1)
        for i in range(venv.num_envs):
            info = info_at(infos, i)
            assert Row.keys_from(info, ("observation", "group")) == (state_key(obs[i]), 0)
            assert Row.keys_from(info, ("group",)) == (0,)
    finally:
        venv.close()


def test_the_agent_keys_each_row_by_the_state_it_acted_from() -> None:
    """Each row's back-off keys are those of the state the action was taken in (as its state_key), not of the
    state it led to."""
    from agents import GAGPOAgent

    agent = GAGPOAgent(MAZE, env_kwargs={**SMALL_MAZE, "max_episode_steps": 6}, state_key="observation",
                       key_backoff=("observation", "group"), num_groups=1, group_size=2, tiny_hidden_size=32,
                       n_epochs=1, torch_threads=1, verbose=0, seed=0)  # fmt: skip
    agent.learn(1)
    rows = agent.buffer.rows
    assert any(r.state_key != r.next_state_key for r in rows)  # the agent moved: the two keys differ somewhere
    assert [r.backoff_keys for r in rows] == [(r.state_key, 0) for r in rows]


def test_keys_from_names_the_missing_keys() -> None:
    with pytest.raises(ValueError, match=r"lacks the back-off keys \['state'\].*backoff=\('group', 'state'\)"):
        Row.keys_from({"keys": {"group": 0}}, ("group", "state"))
    with pytest.raises(ValueError, match=r"lacks the back-off keys \['group'\]"):
        Row.keys_from({}, ("group",))  # an env not wrapped for back-off at all
    assert Row.keys_from({}, ()) == ()


# ----- the buffer ---------------------------------------------------------------------------------------
# Two groups; keys rarely repeat, so back-off decides most values. Per step: (state, observation key, reward).
EPISODES = {
    10: (0, [(1, "a", 0.0), (2, "b", 0.0), (3, "b", 1.0)], True),
    11: (0, [(1, "a", 0.0), (4, "c", -0.1), (5, "b", 0.0), (6, "c", 0.0)], False),
    12: (0, [(7, "a", 0.0), (3, "b", 1.0)], True),
    20: (1, [(1, "x", 0.0), (8, "x", -0.1)], True),
    21: (1, [(9, "y", 0.5)], False),
}
NEXT_AFTER_TRUNCATION = {11: 2, 21: 1}


def buffer_rows(with_keys: bool = True) -> list[Row]:
    """The rows in vector-env order: at each step every running episode adds one."""
    rows, t = [], 0
    while any(t < len(steps) for _, steps, _ in EPISODES.values()):
        for ep, (group, steps, terminated) in EPISODES.items():
            if t >= len(steps):
                continue
            last = t == len(steps) - 1
            s, obs_key, reward = steps[t]
            rows.append(
                Row(group=group, episode=ep, prompt_ids=[ep, t], rollout_logp=np.zeros(1), reward=reward,
                    state_key=s, next_state_key=NEXT_AFTER_TRUNCATION.get(ep, -1) if last else steps[t + 1][0],
                    terminated=last and terminated, done=last, won=last and terminated and reward > 0,
                    backoff_keys=(obs_key, 0) if with_keys else ())
            )  # fmt: skip
        t += 1
    return rows


def filled(config: GAGPOConfig) -> GroupRolloutBuffer:
    buffer = GroupRolloutBuffer(config)
    buffer.start_group(0, [10, 11, 12])
    buffer.start_group(1, [20, 21])
    for row in buffer_rows():
        buffer.add(row)
    return buffer


def direct(config: GAGPOConfig, normalize: str | None = None, episode_coef: float | None = None) -> dict:
    """gagpo_advantages called per group on the episode-by-episode layout -> {(episode, t): advantage}."""
    out = {}
    for group in (0, 1):
        layout = [(ep, t, step) for ep, (g, steps, _) in sorted(EPISODES.items()) if g == group
                  for t, step in enumerate(steps)]  # fmt: skip
        episodes = np.array([ep for ep, _, _ in layout])
        last = np.r_[episodes[1:] != episodes[:-1], True]
        a = adv.gagpo_advantages(
            np.array([step[2] for *_, step in layout]), episodes, np.full(len(layout), group),
            np.array([step[0] for *_, step in layout]),
            np.array([NEXT_AFTER_TRUNCATION.get(ep, -1) if last[k] else layout[k + 1][2][0]
                      for k, (ep, _, _) in enumerate(layout)]),
            last & np.array([EPISODES[ep][2] for ep, _, _ in layout]),
            gamma=config.gamma, lam=config.lam, eps=config.adv_eps,
            normalize=normalize or config.normalize,
            backoff_keys=[np.array([step[1] for *_, step in layout]), np.zeros(len(layout), dtype=np.int64)],
            backoff_min_count=config.backoff_min_count, bootstrap_truncated=config.bootstrap_truncated,
            episode_coef=config.episode_coef if episode_coef is None else episode_coef,
        )  # fmt: skip
        out |= {(ep, t): float(x) for (ep, t, _), x in zip(layout, a)}
    return out


def got(buffer: GroupRolloutBuffer) -> dict:
    return {(r.episode, r.prompt_ids[1]): r.advantage for r in buffer.rows}


@pytest.mark.parametrize("min_count", [2, 3])
@pytest.mark.parametrize("episode_coef", [0.0, 0.7])
def test_buffer_passes_backoff_keys_and_episode_coef(min_count: int, episode_coef: float) -> None:
    config = GAGPOConfig(key_backoff=("observation", "group"), backoff_min_count=min_count, episode_coef=episode_coef)
    buffer = filled(config)
    expected = direct(config)
    assert got(buffer) == pytest.approx(expected, abs=1e-12)
    buffer.finalize()  # per-group normalisation: the episode term is in already, not added again
    assert got(buffer) == pytest.approx(expected, abs=1e-12)
    # Back-off matters here: without it the advantages differ.
    plain = GAGPOConfig(episode_coef=episode_coef)
    buffer_plain = GroupRolloutBuffer(plain)
    buffer_plain.start_group(0, [10, 11, 12])
    buffer_plain.start_group(1, [20, 21])
    for row in buffer_rows(with_keys=False):
        buffer_plain.add(row)
    assert max(abs(got(buffer_plain)[k] - v) for k, v in expected.items()) > 0.1


@pytest.mark.parametrize("bootstrap", [True, False])
def test_buffer_passes_bootstrap_truncated(bootstrap: bool) -> None:
    """Episode 11 is cut in state 2, which episode 10 goes on from to a reward: bootstrapping from it or not
    changes the advantages, and the buffer follows the config either way."""
    config = GAGPOConfig(key_backoff=("observation", "group"), bootstrap_truncated=bootstrap)
    expected = direct(config)
    assert got(filled(config)) == pytest.approx(expected, abs=1e-12)
    other = direct(dataclasses.replace(config, bootstrap_truncated=not bootstrap))
    assert max(abs(expected[k] - other[k]) for k in expected) > 0.01


def test_buffer_batch_normalisation_adds_the_episode_term_after_it() -> None:
    config = GAGPOConfig(key_backoff=("observation", "group"), normalize="batch", episode_coef=0.5, adv_eps=0.05)
    buffer = filled(config)
    raw = direct(config, normalize="none", episode_coef=0.0)
    keys = [(r.episode, r.prompt_ids[1]) for r in buffer.rows]
    assert [got(buffer)[k] for k in keys] == pytest.approx([raw[k] for k in keys], abs=1e-12)
    buffer.finalize()
    values = np.array([raw[k] for k in keys])
    normalised = (values - values.mean()) / (values.std(ddof=1) + config.adv_eps)
    grpo = direct(config, normalize="none", episode_coef=1.0)  # raw + GRPO term
    term = np.array([grpo[k] - raw[k] for k in keys])
    np.testing.assert_allclose(buffer.advantages(), normalised + 0.5 * term, atol=1e-12)


def test_buffer_zero_failed_groups_zeroes_the_episode_term_too() -> None:
    config = GAGPOConfig(key_backoff=("observation", "group"), normalize="batch", episode_coef=0.5,
                         zero_failed_groups=True)  # fmt: skip
    buffer = filled(config)
    failed = np.array([r.group == 1 for r in buffer.rows])  # group 1 never wins
    raw = buffer.advantages()[~failed]
    buffer.finalize()
    a = buffer.advantages()
    assert np.all(a[failed] == 0)  # no batch shift (they are left out of the moments), no episode term
    keys = [(r.episode, r.prompt_ids[1]) for r, f in zip(buffer.rows, failed) if not f]
    grpo, plain = direct(config, normalize="none", episode_coef=1.0), direct(config, normalize="none", episode_coef=0.0)
    term = np.array([grpo[k] - plain[k] for k in keys])
    normalised = (raw - raw.mean()) / (raw.std(ddof=1) + config.adv_eps)
    np.testing.assert_allclose(a[~failed], normalised + 0.5 * term, atol=1e-12)
    assert np.abs(a[~failed]).max() > 0.1


def test_buffer_rejects_rows_without_the_configured_keys() -> None:
    buffer = GroupRolloutBuffer(GAGPOConfig(key_backoff=("group",)))
    buffer.start_group(0, [10, 11, 12])
    with pytest.raises(ValueError, match=r"the row has 0 back-off keys, config.key_backoff names 1"):
        buffer.add(buffer_rows(with_keys=False)[0])


@pytest.mark.parametrize("min_count", [2, 3])
def test_buffer_key_stats_report_level_shares(min_count: int) -> None:
    config = GAGPOConfig(key_backoff=("observation", "group"), backoff_min_count=min_count)
    stats = filled(config).key_stats()
    rows = buffer_rows()
    expected = adv.step_group_stats(
        np.array([r.group for r in rows]), np.array([r.state_key for r in rows]),
        backoff_keys=[np.array([r.backoff_keys[0] for r in rows]), np.zeros(len(rows), dtype=np.int64)],
        backoff_min_count=min_count,
    )  # fmt: skip
    assert stats == expected
    assert len(stats["level_shares"]) == 3 and stats["level_shares"][1] > 0 and stats["level_shares"][2] > 0
