"""The vectorised estimators against the slow reference of docs/algorithm.md, plus its sanity facts.

Random layouts (hypothesis) cover what breaks vectorised group-by code: several groups with unsorted,
non-contiguous (also negative and int64-extreme) ids, episodes of interleaved groups in shuffled order,
length-1 episodes, revisits inside one episode, small key alphabets shared by the groups, int64 and str
keys, truncated episodes whose next key is or is not bootstrappable, single-episode and single-row groups.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose
from reference_advantages import (
    ref_discounted_returns,
    ref_gae,
    ref_gagpo,
    ref_gigpo,
    ref_group_state_counts,
    ref_group_state_means,
    ref_grpo,
    ref_normalize,
    ref_rloo,
    ref_step_group_stats,
    split_episodes,
)

from agents import state_sets as agent_keys
from agents.advantages import (
    discounted_returns,
    gae_advantages,
    gagpo_advantages,
    gigpo_advantages,
    grpo_advantages,
    normalize_advantages,
    rloo_advantages,
    step_group_stats,
)

# Reproducible in CI (derandomize) and no per-example deadline on a shared 2-core machine.
PROFILE = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def examples(n: int) -> int:
    """``n`` examples, times the share in GAGPO_EXAMPLES (default 1): `make test` runs 0.4 of them to stay within
    CI's time. The draws are derandomized: every run checks the same ones."""
    return max(20, round(n * float(os.environ.get("GAGPO_EXAMPLES", "1"))))


# Rounding differs between the two implementations; normalisation divides it by at least eps = 1e-6.
TOL = dict(rtol=1e-7, atol=1e-7)

INT64 = st.integers(-(2**63), 2**63 - 1)
INT_KEYS = st.one_of(st.integers(-3, 3), INT64)
STR_KEYS = st.text(alphabet="abxyz: 0", min_size=0, max_size=4)
GROUP_IDS = st.one_of(st.integers(-5, 40), INT64)
EPISODE_IDS = st.one_of(st.integers(-50, 50), st.integers(-(2**62), 2**62))
REWARDS = st.one_of(st.sampled_from([0.0, 1.0, -0.1, 10.0]), st.floats(-10.0, 10.0))
UNIT = st.one_of(st.sampled_from([0.0, 0.5, 0.8, 0.95, 1.0]), st.floats(0.0, 1.0))


@dataclass
class Episode:
    """One trajectory of a layout: the keys it acted from, its rewards and how it ended."""

    episode_id: int
    group: int
    keys: list
    rewards: list[float]
    terminated: bool
    final_next_key: object  # key reached after the final action; read only when truncated


@st.composite
def layouts(draw, key_kind: str | None = None, max_len: int = 7) -> tuple[list[Episode], str]:
    """Random groups of episodes in shuffled order, and the container the keys are passed in."""
    kind = key_kind or draw(st.sampled_from(["int", "str"]))
    key_strategy = INT_KEYS if kind == "int" else STR_KEYS
    pool = draw(st.lists(key_strategy, min_size=1, max_size=6, unique=True))
    fresh = key_strategy.filter(lambda k: k not in pool)  # never acted from: not bootstrappable
    groups = draw(st.lists(GROUP_IDS, min_size=1, max_size=4, unique=True))
    specs = []
    for g in groups:
        for _ in range(draw(st.integers(1, 4))):
            length = draw(st.integers(1, max_len))
            keys = draw(st.lists(st.sampled_from(pool), min_size=length, max_size=length))
            rewards = draw(st.lists(REWARDS, min_size=length, max_size=length))
            final_next = draw(st.one_of(st.sampled_from(pool), fresh))
            specs.append((g, keys, rewards, draw(st.booleans()), final_next))
    ids = draw(st.lists(EPISODE_IDS, min_size=len(specs), max_size=len(specs), unique=True))
    episodes = [Episode(i, *spec) for i, spec in zip(ids, specs, strict=True)]
    containers = ["array", "list"] if kind == "int" else ["array", "object", "list"]
    return draw(st.permutations(episodes)), draw(st.sampled_from(containers))


def assemble(episodes: list[Episode], container: str = "array") -> dict:
    """The flat per-step arrays of ``gagpo_advantages`` for these episodes, in this order."""
    keys, next_keys, rewards, ep_index, grp, done = [], [], [], [], [], []
    for e in episodes:
        n = len(e.keys)
        keys += e.keys
        next_keys += e.keys[1:] + [e.final_next_key]
        rewards += e.rewards
        ep_index += [e.episode_id] * n
        grp += [e.group] * n
        done += [False] * (n - 1) + [e.terminated]

    def as_keys(k: list):
        if container == "list":
            return k
        if container == "object":
            return np.array(k, dtype=object)
        return np.array(k, dtype=np.int64) if isinstance(k[0], int) else np.array(k)

    return {
        "rewards": np.array(rewards, dtype=np.float64),
        "episode_index": np.array(ep_index, dtype=np.int64),
        "group_index": np.array(grp, dtype=np.int64),
        "state_keys": as_keys(keys),
        "next_state_keys": as_keys(next_keys),
        "terminated": np.array(done, dtype=bool),
    }


def rows_by_episode(episodes: list[Episode]) -> dict[int, list[int]]:
    """Row indices of each episode id in the assembled arrays."""
    out, start = {}, 0
    for e in episodes:
        out[e.episode_id] = list(range(start, start + len(e.keys)))
        start += len(e.keys)
    return out


def base(d: dict, *names: str) -> dict:
    """The named subset of an assembled layout (baselines take fewer arrays)."""
    return {k: d[k] for k in names}


def draw_levels(data: st.DataObject, n: int) -> list:
    """0-3 back-off levels for n rows: one key per row drawn independently (levels need not nest) from a small
    int64 or str pool, or constant (the group level), each in an array, object array or list."""
    levels = []
    for kind in data.draw(st.lists(st.sampled_from(["int", "str", "constant int", "constant str"]), max_size=3)):
        strategy = INT_KEYS if kind.endswith("int") else STR_KEYS
        if kind.startswith("constant"):
            keys = [data.draw(strategy)] * n
        else:
            pool = data.draw(st.lists(strategy, min_size=1, max_size=4, unique=True))
            keys = data.draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n))
        containers = [np.array(keys), keys] + ([] if kind.endswith("int") else [np.array(keys, dtype=object)])
        levels.append(data.draw(st.sampled_from(containers)))
    return levels


# ---------------------------------------------------------------------------------------------------------
# Fast == reference on random layouts
# ---------------------------------------------------------------------------------------------------------


@settings(max_examples=examples(800), **PROFILE)
@given(
    layout=layouts(),
    gamma=UNIT,
    lam=UNIT,
    normalize=st.sampled_from(["group", "batch", "none"]),
    bootstrap=st.booleans(),
    eps=st.sampled_from([1e-6, 1e-3]),
)
def test_gagpo_matches_reference(layout, gamma, lam, normalize, bootstrap, eps):
    d = assemble(*layout)
    options = dict(gamma=gamma, lam=lam, eps=eps, normalize=normalize, bootstrap_truncated=bootstrap)
    assert_allclose(gagpo_advantages(**d, **options), ref_gagpo(**d, **options), **TOL)


@settings(max_examples=examples(500), **PROFILE)
@given(
    layout=layouts(),
    gamma=UNIT,
    lam=UNIT,
    normalize=st.sampled_from(["group", "batch", "none"]),
    bootstrap=st.booleans(),
    min_count=st.integers(1, 4),
    episode_coef=st.sampled_from([0.0, 0.5, 1.0, -2.0]),
    data=st.data(),
)
def test_gagpo_backoff_matches_reference(layout, gamma, lam, normalize, bootstrap, min_count, episode_coef, data):
    """Key back-off and the episode term: int64 and str levels that need not nest, constant (group) levels."""
    d = assemble(*layout)
    levels = draw_levels(data, d["rewards"].size)
    options = dict(gamma=gamma, lam=lam, normalize=normalize, bootstrap_truncated=bootstrap,
                   backoff_keys=levels, backoff_min_count=min_count, episode_coef=episode_coef)  # fmt: skip
    assert_allclose(gagpo_advantages(**d, **options), ref_gagpo(**d, **options), **TOL)


@settings(max_examples=examples(500), **PROFILE)
@given(
    layout=layouts(),
    gamma=UNIT,
    omega=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
    std_norm=st.booleans(),
    episode_stats=st.sampled_from(["episodes", "rows"]),
)
def test_gigpo_matches_reference(layout, gamma, omega, std_norm, episode_stats):
    d = base(assemble(*layout), "rewards", "episode_index", "group_index", "state_keys")
    options = dict(gamma=gamma, omega=omega, std_norm=std_norm, episode_stats=episode_stats)
    assert_allclose(gigpo_advantages(**d, **options), ref_gigpo(**d, **options), **TOL)


@settings(max_examples=examples(250), **PROFILE)
@given(layout=layouts(), eps=st.sampled_from([1e-6, 1e-2]))
def test_grpo_and_rloo_match_reference(layout, eps):
    d = base(assemble(*layout), "rewards", "episode_index", "group_index")
    assert_allclose(grpo_advantages(**d, eps=eps), ref_grpo(**d, eps=eps), **TOL)
    assert_allclose(rloo_advantages(**d), ref_rloo(**d), **TOL)


@settings(max_examples=examples(250), **PROFILE)
@given(layout=layouts(key_kind="int"), gamma=UNIT, lam=UNIT, data=st.data())
def test_gae_matches_reference(layout, gamma, lam, data):
    d = assemble(*layout)
    n = d["rewards"].size
    values = np.array(data.draw(st.lists(REWARDS, min_size=n, max_size=n)))
    last_values = data.draw(st.one_of(st.none(), st.lists(REWARDS, min_size=n, max_size=n).map(np.array)))
    args = dict(rewards=d["rewards"], values=values, episode_index=d["episode_index"], terminated=d["terminated"])
    fast = gae_advantages(**args, last_values=last_values, gamma=gamma, lam=lam)
    assert_allclose(fast, ref_gae(**args, last_values=last_values, gamma=gamma, lam=lam), **TOL)


@settings(max_examples=examples(250), **PROFILE)
@given(layout=layouts(), gamma=UNIT)
def test_discounted_returns_match_reference(layout, gamma):
    d = base(assemble(*layout), "rewards", "episode_index")
    assert_allclose(discounted_returns(**d, gamma=gamma), ref_discounted_returns(**d, gamma=gamma), **TOL)


@settings(max_examples=examples(250), **PROFILE)
@given(layout=layouts(), min_count=st.integers(1, 4), data=st.data())
def test_step_group_stats_match_reference(layout, min_count, data):
    d = base(assemble(*layout), "group_index", "state_keys")
    d.update(backoff_keys=draw_levels(data, len(d["state_keys"])), backoff_min_count=min_count)
    fast, ref = step_group_stats(**d), ref_step_group_stats(**d)
    assert sum(fast["level_shares"]) + fast["unresolved_share"] == pytest.approx(1.0)
    assert fast.keys() == ref.keys()
    for name, value in ref.items():
        assert fast[name] == pytest.approx(value, rel=1e-12), name


@settings(max_examples=examples(250), **PROFILE)
@given(
    groups=st.lists(st.integers(-3, 3), max_size=30),
    mode=st.sampled_from(["group", "batch", "none"]),
    data=st.data(),
)
def test_normalize_advantages_matches_reference(groups, mode, data):
    advantages = data.draw(st.lists(REWARDS, min_size=len(groups), max_size=len(groups)))
    fast = normalize_advantages(advantages, np.array(groups, dtype=np.int64), mode=mode)
    assert fast.shape == (len(groups),)
    assert_allclose(fast, ref_normalize(advantages, groups, mode, 1e-6), **TOL)


@settings(max_examples=examples(250), **PROFILE)
@given(layout=layouts(key_kind="int"), gamma=UNIT, lam=UNIT, data=st.data())
def test_gagpo_ignores_order_and_labels(layout, gamma, lam, data):
    """Reordering episodes, renaming groups and turning int keys into str keys changes no advantage."""
    episodes, _ = layout
    shuffled = data.draw(st.permutations(episodes))
    renamed = [
        Episode(e.episode_id, ~e.group, [f"s{k}" for k in e.keys], e.rewards, e.terminated,
                f"s{e.final_next_key}")
        for e in shuffled
    ]  # fmt: skip
    first = gagpo_advantages(**assemble(episodes), gamma=gamma, lam=lam)
    second = gagpo_advantages(**assemble(renamed, "object"), gamma=gamma, lam=lam)
    rows_a, rows_b = rows_by_episode(episodes), rows_by_episode(renamed)
    for e in episodes:
        assert_allclose(second[rows_b[e.episode_id]], first[rows_a[e.episode_id]], **TOL)


# ---------------------------------------------------------------------------------------------------------
# Sanity facts of docs/algorithm.md#sanity-facts-the-tests-check
# ---------------------------------------------------------------------------------------------------------


@settings(max_examples=examples(250), **PROFILE)
@given(layout=layouts(), gamma=UNIT, bootstrap=st.booleans())
def test_lam_one_telescopes_to_return_minus_value(layout, gamma, bootstrap):
    """lam=1: A_t = R_t - Vbar(g, s_t), plus gamma^(rows left) * Vbar(g, next key) after a bootstrapped end."""
    d = assemble(*layout)
    A = gagpo_advantages(**d, gamma=gamma, lam=1.0, normalize="none", bootstrap_truncated=bootstrap)
    R = ref_discounted_returns(d["rewards"], d["episode_index"], gamma)
    groups, keys, next_keys = list(d["group_index"]), list(d["state_keys"]), list(d["next_state_keys"])
    vbar = ref_group_state_means(list(R), groups, keys)
    expected = np.array([R[t] - vbar[(groups[t], keys[t])] for t in range(R.size)])
    for rows in split_episodes(d["episode_index"]):
        end = rows[-1]
        tail = vbar.get((groups[end], next_keys[end]), 0.0)
        if bootstrap and not d["terminated"][end]:
            expected[rows] += [gamma ** (end + 1 - t) * tail for t in rows]
    assert_allclose(A, expected, **TOL)
    if not bootstrap:  # the plain statement of the spec
        assert_allclose(A, R - [vbar[(g, s)] for g, s in zip(groups, keys, strict=True)], **TOL)


@settings(max_examples=examples(250), **PROFILE)
@given(layout=layouts(), gamma=UNIT, lam=UNIT, data=st.data())
def test_run_of_singleton_states_has_zero_delta(layout, gamma, lam, data):
    """Replace an episode's tail by states no other row visits: delta = 0 there, hence A = 0 for every lam."""
    episodes, container = layout
    e = data.draw(st.sampled_from(episodes))
    start = data.draw(st.integers(0, len(e.keys) - 1))
    # Never drawn by the layout: str keys have at most 4 characters, int keys avoid this range by chance.
    if isinstance(e.keys[0], str):
        fresh = [f"only{i}" for i in range(len(e.keys) + 1)]
    else:
        fresh = [-(2**62) - 12345 - i for i in range(len(e.keys) + 1)]
    e.keys = e.keys[:start] + fresh[start:-1]
    e.final_next_key = fresh[-1]  # after a truncation: a state the group never acted from, so V = 0
    d = assemble(episodes, container)
    tail = rows_by_episode(episodes)[e.episode_id][start:]
    for lam_ in (0.0, lam):  # lam = 0 gives A = delta
        A = gagpo_advantages(**d, gamma=gamma, lam=lam_, normalize="none")
        assert_allclose(A[tail], 0.0, atol=1e-9)


@pytest.mark.parametrize("lam", [0.0, 0.3, 0.5, 0.8, 0.95, 1.0])
@pytest.mark.parametrize("key_kind", ["int", "str"])
@pytest.mark.parametrize("episode_order", [(0, 1), (1, 0)])
def test_two_episode_toy_case(lam, key_kind, episode_order):
    """s0 -> s1 -> success vs s0 -> s2 -> s1 -> success, reward 10: (+0.2375, 0) and (-0.2375, 0, 0)."""
    s0, s1, s2 = (101, -5, 2**62) if key_kind == "int" else ("s0", "s1", "s2")
    done = "<done>" if key_kind == "str" else 0
    episodes = [
        Episode(7, 3, [s0, s1], [0.0, 10.0], True, done),
        Episode(4, 3, [s0, s2, s1], [0.0, 0.0, 10.0], True, done),
    ]
    ordered = [episodes[i] for i in episode_order]
    d = assemble(ordered)
    rows = rows_by_episode(ordered)
    A = gagpo_advantages(**d, gamma=0.95, lam=lam, normalize="none")
    assert_allclose(A[rows[7]], [0.2375, 0.0], atol=1e-12)
    assert_allclose(A[rows[4]], [-0.2375, 0.0, 0.0], atol=1e-12)
    # Group normalisation: mean 0, ddof=1 std = 0.2375 / sqrt(2), so the two first steps become +-sqrt(2).
    normed = gagpo_advantages(**d, gamma=0.95, lam=lam, normalize="group")
    scale = 0.2375 / (0.2375 / math.sqrt(2) + 1e-6)
    assert_allclose(normed[rows[7]], [scale, 0.0], atol=1e-12)
    assert_allclose(normed[rows[4]], [-scale, 0.0, 0.0], atol=1e-12)


def test_single_row_groups_get_zero_after_normalisation():
    """A normalisation set with one row gets 0, even when its raw advantage is not 0."""
    d = assemble([Episode(0, 1, [5], [3.0], False, 5), Episode(1, 2, [5, 6], [1.0, 0.0], True, 0)])
    raw = gagpo_advantages(**d, normalize="none")
    assert raw[0] != 0.0  # truncated row bootstraps from its own state: delta = r + gamma V - V
    assert gagpo_advantages(**d, normalize="group")[0] == 0.0
    one_row = assemble([Episode(0, 1, [5], [3.0], False, 5)])
    assert gagpo_advantages(**one_row, normalize="batch")[0] == 0.0


# ---------------------------------------------------------------------------------------------------------
# Key back-off and the episode term: docs/algorithm.md#key-back-off
# ---------------------------------------------------------------------------------------------------------


@settings(max_examples=examples(150), **PROFILE)
@given(layout=layouts(), gamma=UNIT, lam=UNIT, min_count=st.integers(1, 5))
def test_backoff_without_levels_is_plain_gagpo(layout, gamma, lam, min_count):
    d = assemble(*layout)
    plain = gagpo_advantages(**d, gamma=gamma, lam=lam)
    np.testing.assert_array_equal(
        gagpo_advantages(**d, gamma=gamma, lam=lam, backoff_keys=(), backoff_min_count=min_count), plain
    )


@settings(max_examples=examples(150), **PROFILE)
@given(layout=layouts(), gamma=UNIT, lam=UNIT, bootstrap=st.booleans(), data=st.data())
def test_backoff_changes_nothing_when_every_state_set_has_m_rows(layout, gamma, lam, bootstrap, data):
    d = assemble(*layout)
    smallest = min(ref_group_state_counts(d["group_index"], d["state_keys"]).values())
    options = dict(gamma=gamma, lam=lam, bootstrap_truncated=bootstrap)
    backed_off = gagpo_advantages(
        **d, **options, backoff_keys=draw_levels(data, d["rewards"].size), backoff_min_count=smallest
    )
    np.testing.assert_array_equal(backed_off, gagpo_advantages(**d, **options))


@settings(max_examples=examples(150), **PROFILE)
@given(layout=layouts(), gamma=UNIT, constant=st.one_of(INT_KEYS, STR_KEYS), data=st.data())
def test_backoff_to_a_constant_level_telescopes_to_return_minus_group_mean(layout, gamma, constant, data):
    """lam=1, terminated episodes, only the last (constant) level has sets of m rows: A_t = R_t - mean_g R."""
    episodes, container = layout
    for e in episodes:
        e.terminated = True
    d = assemble(episodes, container)
    n = d["rewards"].size
    finer = draw_levels(data, n)
    # m above every set of level 0 and of the finer levels: only the constant level can resolve a row.
    m = 1 + max(max(ref_group_state_counts(d["group_index"], keys).values()) for keys in [d["state_keys"], *finer])
    levels = [*finer, [constant] * n]
    A = gagpo_advantages(**d, gamma=gamma, lam=1.0, normalize="none", backoff_keys=levels, backoff_min_count=m)
    R = ref_discounted_returns(d["rewards"], d["episode_index"], gamma)
    groups = d["group_index"]
    for g in np.unique(groups):
        rows = groups == g
        if rows.sum() >= m:  # a smaller group has no set of m rows at any level and keeps plain GAGPO
            assert_allclose(A[rows], R[rows] - R[rows].mean(), **TOL)


@pytest.mark.parametrize(("next_key", "v_next"), [("b", 0.5), ("unseen", 0.0)])
def test_truncated_row_bootstraps_from_level_zero_only(next_key, v_next):
    """The truncated row's own state b backs off to the group mean, but its bootstrap reads Vbar_0(g, b)."""
    episodes = [
        Episode(1, 0, ["a", "b"], [0.0, 0.5], False, next_key),
        Episode(2, 0, ["a", "c"], [0.0, 1.0], True, "<done>"),
    ]
    d = assemble(episodes)
    A = gagpo_advantages(**d, lam=0.0, normalize="none", backoff_keys=[np.zeros(4, dtype=np.int64)])
    # R = (0.475, 0.5 | 0.95, 1.0); b and c are singletons, so Vtilde = the group mean 0.73125 there.
    group_mean = (0.475 + 0.5 + 0.95 + 1.0) / 4
    assert A[1] == pytest.approx(0.5 + 0.95 * v_next - group_mean, abs=1e-12)
    assert A[0] == pytest.approx(0.0 + 0.95 * group_mean - (0.475 + 0.95) / 2, abs=1e-12)
    assert_allclose(A, ref_gagpo(**d, lam=0.0, backoff_keys=[[0] * 4], unnormalized=True), atol=1e-12)


@settings(max_examples=examples(150), **PROFILE)
@given(
    layout=layouts(),
    normalize=st.sampled_from(["group", "batch", "none"]),
    episode_coef=st.sampled_from([0.5, 1.0, -3.0]),
    eps=st.sampled_from([1e-6, 1e-2]),
)
def test_episode_coef_adds_grpo_to_the_normalised_advantage(layout, normalize, episode_coef, eps):
    d = assemble(*layout)
    plain = gagpo_advantages(**d, normalize=normalize, eps=eps)
    grpo = grpo_advantages(**base(d, "rewards", "episode_index", "group_index"), eps=eps)
    both = gagpo_advantages(**d, normalize=normalize, eps=eps, episode_coef=episode_coef)
    assert_allclose(both, plain + episode_coef * grpo, **TOL)


# ---------------------------------------------------------------------------------------------------------
# GiGPO's invalid-action penalties (verl-agent's trainer; the agreement itself is in test_rivals.py)
# ---------------------------------------------------------------------------------------------------------


@settings(max_examples=examples(150), **PROFILE)
@given(layout=layouts(), gamma=UNIT, std_norm=st.booleans(), episode_stats=st.sampled_from(["episodes", "rows"]))
def test_gigpo_zero_penalties_change_nothing(layout, gamma, std_norm, episode_stats):
    d = base(assemble(*layout), "rewards", "episode_index", "group_index", "state_keys")
    options = dict(gamma=gamma, std_norm=std_norm, episode_stats=episode_stats)
    plain = gigpo_advantages(**d, **options)
    assert np.array_equal(gigpo_advantages(**d, **options, penalties=np.zeros(d["rewards"].size)), plain)


@settings(max_examples=examples(150), **PROFILE)
@given(layout=layouts(), gamma=UNIT, data=st.data())
def test_gigpo_penalties_reach_only_their_own_rows(layout, gamma, data):
    """Without division: the step return and episode score lose the row's own penalty, nothing else moves.

    The penalised rewards with their penalties give the same advantages as the penalty-free rewards with the
    penalty subtracted from each row's own scores, so penalising a row shifts its step term by -p against its
    (group, state) set's mean and its episode term by -p against the group's.
    """
    episodes, container = layout
    d = base(assemble(episodes, container), "rewards", "episode_index", "group_index", "state_keys")
    n = d["rewards"].size
    pen = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.1, 0.5]), min_size=n, max_size=n)))
    free = gigpo_advantages(**d, gamma=gamma, std_norm=False, episode_stats="rows")
    charged = gigpo_advantages(
        **(d | {"rewards": d["rewards"] - pen}), gamma=gamma, std_norm=False, episode_stats="rows", penalties=pen
    )
    grp, keys = d["group_index"], np.asarray(d["state_keys"]).astype(str)
    shift = np.zeros(n)
    for i in range(n):
        same_set = (grp == grp[i]) & (keys == keys[i])
        same_group = grp == grp[i]
        if same_set.sum() > 1:
            shift[i] -= pen[i] - pen[same_set].mean()
        if same_group.sum() > 1:
            shift[i] -= pen[i] - pen[same_group].mean()
    assert_allclose(charged, free + shift, **TOL)


def test_gigpo_episode_statistics_give_every_episode_one_vote():
    """Scores (0, -0.1 | 0): rows weigh 1/2, 1/2 | 1; mean -0.025, variance (0.025^2 + 0.075^2) / 2 + 0.025^2."""
    d = assemble([Episode(1, 0, ["a", "b"], [0.0, -0.1], True, "x"), Episode(2, 0, ["c"], [0.0], True, "y")])
    d = base(d, "rewards", "episode_index", "group_index", "state_keys")
    pen = np.array([0.0, 0.1, 0.0])
    std = math.sqrt((0.025**2 + 0.075**2) / 2 + 0.025**2)
    A = gigpo_advantages(**d, penalties=pen, eps=1e-12)  # every state once: no step term
    assert_allclose(A, [0.025 / std, -0.075 / std, 0.025 / std], atol=1e-9)
    # Read as part of the return, the penalty blames episode 1's rows alike: GRPO on (-0.1, 0).
    half = 1 / math.sqrt(2)
    assert_allclose(gigpo_advantages(**d, eps=1e-12), [-half, -half, half], atol=1e-9)


# ---------------------------------------------------------------------------------------------------------
# Hash factorisation of the (group, key) pairs stays exact when hashes collide
# ---------------------------------------------------------------------------------------------------------


def test_colliding_int_pairs_stay_apart():
    """(g1, k1) and (g2, k2) with the same 64-bit pair hash, also through a truncated row's next key."""
    g1, g2, k1 = 3, 8, 12345
    mix = agent_keys.mix(np.array([g1, g2], dtype=np.uint64))
    k2 = int(np.array([np.uint64(k1) ^ mix[0] ^ mix[1]]).view(np.int64)[0])
    code = agent_keys.key_hash(np.array([k1, k2])) ^ agent_keys.mix(np.array([g1, g2], dtype=np.uint64))
    assert code[0] == code[1]
    episodes = [
        Episode(0, g1, [k1, 7], [0.0, 1.0], True, 0),
        Episode(1, g1, [k1], [0.5], False, k2),  # (g1, k2) never occurs: no bootstrap
        Episode(2, g2, [k2, k2], [0.0, 0.3], True, 0),
        Episode(3, g2, [7], [0.2], False, k2),
    ]
    d = assemble(episodes)
    options = dict(lam=0.5, backoff_keys=[d["state_keys"]], episode_coef=0.5)
    assert_allclose(gagpo_advantages(**d, **options), ref_gagpo(**d, **options), **TOL)
    assert step_group_stats(d["group_index"], d["state_keys"])["sets"] == 4


@settings(max_examples=examples(100), **PROFILE)
@given(layout=layouts(key_kind="str"), min_count=st.integers(1, 3), data=st.data())
def test_str_keys_in_unicode_and_object_arrays_agree(layout, min_count, data):
    """Unicode arrays (of any width) and object arrays are hashed differently; the advantages are the same."""
    d = assemble(*layout)
    levels = [np.array(k, dtype=str) for k in draw_levels(data, d["rewards"].size)]
    first = gagpo_advantages(**d, backoff_keys=levels, backoff_min_count=min_count, episode_coef=0.5)
    objects = dict(d, state_keys=np.array(d["state_keys"], dtype=object))
    if data.draw(st.booleans()):
        objects["next_state_keys"] = np.array(d["next_state_keys"], dtype=object)
    wider = [np.array(k, dtype="U12").astype(object) if data.draw(st.booleans()) else k.astype("U12") for k in levels]
    second = gagpo_advantages(**objects, backoff_keys=wider, backoff_min_count=min_count, episode_coef=0.5)
    np.testing.assert_array_equal(first, second)


def _colliding_hash(keys: np.ndarray) -> np.ndarray:
    """The real key hash reduced to 2 bits: most different keys of a group collide."""
    return _real_key_hash(keys) & np.uint64(3)


_real_key_hash = agent_keys.key_hash


@settings(max_examples=examples(100), **PROFILE)
@given(layout=layouts(), lam=UNIT, min_count=st.integers(1, 3), data=st.data())
def test_estimators_stay_exact_under_hash_collisions(layout, lam, min_count, data):
    d = assemble(*layout)
    levels = draw_levels(data, d["rewards"].size)
    options = dict(lam=lam, backoff_keys=levels, backoff_min_count=min_count)
    sets = base(d, "group_index", "state_keys")
    with mock.patch.object(agent_keys, "key_hash", _colliding_hash):
        assert_allclose(gagpo_advantages(**d, **options), ref_gagpo(**d, **options), **TOL)
        gigpo_args = base(d, "rewards", "episode_index", "group_index", "state_keys")
        assert_allclose(gigpo_advantages(**gigpo_args), ref_gigpo(**gigpo_args), **TOL)
        fast = step_group_stats(**sets, backoff_keys=levels, backoff_min_count=min_count)
    for name, value in ref_step_group_stats(**sets, backoff_keys=levels, backoff_min_count=min_count).items():
        assert fast[name] == pytest.approx(value, rel=1e-12), name


# ---------------------------------------------------------------------------------------------------------
# Validation, empty input, determinism
# ---------------------------------------------------------------------------------------------------------


def _toy() -> dict:
    return assemble([Episode(0, 0, [1, 2], [0.0, 1.0], True, 0), Episode(1, 0, [1, 3, 2], [0.0, 0.0, 1.0], False, 9)])


def _call(name: str, d: dict, **options):
    """Call an estimator with the arrays of layout ``d`` it takes."""
    if name == "gagpo":
        return gagpo_advantages(**d, **options)
    if name == "gigpo":
        return gigpo_advantages(**base(d, "rewards", "episode_index", "group_index", "state_keys"), **options)
    if name == "grpo":
        return grpo_advantages(**base(d, "rewards", "episode_index", "group_index"), **options)
    if name == "rloo":
        return rloo_advantages(**base(d, "rewards", "episode_index", "group_index"), **options)
    if name == "gae":
        values = np.linspace(0.0, 1.0, d["rewards"].size)
        return gae_advantages(d["rewards"], values, d["episode_index"], d["terminated"], **options)
    if name == "returns":
        return discounted_returns(**base(d, "rewards", "episode_index"), **options)
    raise AssertionError(name)


ESTIMATORS = ["gagpo", "gigpo", "grpo", "rloo", "gae", "returns"]
GROUPED = ["gagpo", "gigpo", "grpo", "rloo"]


def _with(**changes) -> dict:
    d = _toy()
    d.update(changes)
    return d


@pytest.mark.parametrize("name", ESTIMATORS)
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rewards": np.array([0.0, 1.0, 0.0, 0.0])}, "length|shape"),
        ({"rewards": np.array([0.0, np.nan, 0.0, 0.0, 1.0])}, "NaN"),
        ({"rewards": np.array([0.0, np.inf, 0.0, 0.0, 1.0])}, "NaN or infinite"),
        ({"episode_index": np.array([0.0, 0.0, 1.0, 1.0, 1.0])}, "episode_index must be an integer"),
        ({"episode_index": np.array([0, 1, 1, 0, 1])}, "contiguous"),
        ({"rewards": np.zeros((5, 1))}, "1-D"),
    ],
)
def test_layout_errors(name, changes, message):
    with pytest.raises(ValueError, match=message):
        _call(name, _with(**changes))


@pytest.mark.parametrize("name", GROUPED)
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"group_index": np.array([0, 0, 1, 1])}, "group_index must be an integer array of length 5"),
        ({"group_index": np.array([0.0, 0.0, 1.0, 1.0, 1.0])}, "group_index must be an integer"),
        ({"group_index": np.array([0, 0, 1, 1, 2])}, "group_index changes inside an episode"),
    ],
)
def test_group_errors(name, changes, message):
    with pytest.raises(ValueError, match=message):
        _call(name, _with(**changes))


@pytest.mark.parametrize(
    ("name", "changes", "message"),
    [
        ("gagpo", {"state_keys": np.array([1, 2, 1, 3])}, "state_keys has length 4, expected 5"),
        ("gagpo", {"next_state_keys": np.array([2, 0, 3, 2])}, "next_state_keys has length 4"),
        ("gagpo", {"terminated": np.array([True, True, False, False, False])}, "not the final row"),
        ("gagpo", {"state_keys": ["a", 1, "b", "c", "a"]}, "state_keys mixes"),
        ("gagpo", {"state_keys": np.array(["a", 1, "b", "c", "a"], dtype=object)}, "state_keys mixes"),
        ("gagpo", {"state_keys": np.array(["a", "b", "a", "c", "b"])}, "both be strings"),
        ("gagpo", {"state_keys": np.array([0.5, 1, 0, 2, 3])}, "int64 hashes or strings"),
        ("gagpo", {"backoff_keys": np.array([1, 2, 1, 3, 2])}, "sequence of key arrays, one per level"),
        ("gagpo", {"backoff_keys": [np.array([1, 2, 3])]}, r"backoff_keys\[0\] has length 3, expected 5"),
        ("gagpo", {"backoff_keys": [np.zeros(5, int), ["a", 1, "b", "c", "a"]]}, r"backoff_keys\[1\] mixes"),
        ("gagpo", {"backoff_keys": [np.zeros(5)]}, r"backoff_keys\[0\] must hold int64 hashes or strings"),
        ("gigpo", {"state_keys": [1, 2, "x", 3, 4]}, "state_keys mixes"),
        ("gigpo", {"state_keys": np.array([1, 2, 1, 3])}, "state_keys has length 4"),
        ("gae", {"terminated": np.array([True, True, False, False, False])}, "not the final row"),
    ],
)
def test_argument_errors(name, changes, message):
    with pytest.raises(ValueError, match=message):
        _call(name, _with(**changes))


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("gagpo", {"normalize": "episode"}, "normalize must be 'group', 'batch' or 'none'"),
        ("gagpo", {"backoff_min_count": 0}, "backoff_min_count must be an int >= 1, got 0"),
        ("gagpo", {"backoff_min_count": 2.0}, "backoff_min_count must be an int >= 1, got 2.0"),
        ("gagpo", {"backoff_min_count": True}, "backoff_min_count must be an int >= 1, got True"),
        ("gagpo", {"episode_coef": np.nan}, "episode_coef must be a finite number, got nan"),
        ("gagpo", {"episode_coef": "1"}, "episode_coef must be a finite number"),
        ("gigpo", {"episode_stats": "steps"}, "episode_stats must be 'episodes' or 'rows'"),
        ("gigpo", {"penalties": np.zeros(4)}, "penalties must be 5 finite numbers"),
        ("gigpo", {"penalties": np.full(5, np.nan)}, "penalties must be 5 finite numbers"),
        ("gae", {"last_values": np.zeros(4)}, "last_values has length 4, expected 5"),
        ("gae", {"last_values": np.full(5, np.nan)}, "last_values contain NaN"),
    ],
)
def test_option_errors(name, options, message):
    with pytest.raises(ValueError, match=message):
        _call(name, _toy(), **options)


def test_gae_value_errors():
    d = _toy()
    with pytest.raises(ValueError, match="values has length 3"):
        gae_advantages(d["rewards"], np.zeros(3), d["episode_index"], d["terminated"])
    with pytest.raises(ValueError, match="values contain NaN"):
        gae_advantages(d["rewards"], np.full(5, np.nan), d["episode_index"], d["terminated"])


def test_step_group_stats_errors():
    with pytest.raises(ValueError, match="differ in length"):
        step_group_stats(np.array([0, 0]), np.array([1, 2, 3]))
    with pytest.raises(ValueError, match="mixes"):
        step_group_stats(np.array([0, 0]), ["a", 2])
    with pytest.raises(ValueError, match=r"backoff_keys\[0\] has length 1, expected 2"):
        step_group_stats(np.array([0, 0]), np.array([1, 2]), backoff_keys=[[0]])
    with pytest.raises(ValueError, match="backoff_min_count must be an int >= 1"):
        step_group_stats(np.array([0, 0]), np.array([1, 2]), backoff_min_count=0)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_empty_input_gives_empty_float_array(name):
    empty = {
        "rewards": np.zeros(0),
        "episode_index": np.zeros(0, dtype=np.int64),
        "group_index": np.zeros(0, dtype=np.int64),
        "state_keys": np.zeros(0, dtype=np.int64),
        "next_state_keys": np.zeros(0, dtype=np.int64),
        "terminated": np.zeros(0, dtype=bool),
    }
    out = _call(name, empty)
    assert out.shape == (0,) and out.dtype == np.float64


def test_empty_step_group_stats():
    empty = np.zeros(0, dtype=np.int64)
    stats = step_group_stats(empty, empty, backoff_keys=[empty, empty])
    assert stats == {"rows": 0, "sets": 0, "singleton_row_share": 0.0, "singleton_set_share": 0.0,
                     "set_size_mean": 0.0, "set_size_median": 0.0, "set_size_max": 0, "level_shares": [0.0] * 3,
                     "unresolved_share": 0.0}  # fmt: skip
    groups, keys, level = np.zeros(3, dtype=np.int64), np.array([1, 1, 2]), [np.zeros(3, dtype=np.int64)]
    assert stats.keys() == step_group_stats(groups, keys, backoff_keys=level).keys()
    # The default min count is 2: the pair of key 1 resolves at its own level, key 2 backs off.
    assert step_group_stats(groups, keys, backoff_keys=level)["level_shares"] == pytest.approx([2 / 3, 1 / 3])
    assert step_group_stats(groups, keys, backoff_keys=level, backoff_min_count=3)["level_shares"] == [0.0, 1.0]


@pytest.mark.parametrize("name", ESTIMATORS)
def test_deterministic_and_inputs_untouched(name):
    rng = np.random.default_rng(0)
    n_eps = 40
    lengths = rng.integers(1, 12, n_eps)
    d = {
        "rewards": rng.normal(size=lengths.sum()),
        "episode_index": np.repeat(rng.permutation(1000)[:n_eps], lengths),
        "group_index": np.repeat(rng.integers(-3, 4, n_eps), lengths),
        "state_keys": rng.integers(0, 6, lengths.sum()),
        "terminated": np.zeros(lengths.sum(), dtype=bool),
    }
    d["next_state_keys"] = np.r_[d["state_keys"][1:], 0]
    d["terminated"][np.cumsum(lengths)[::2] - 1] = True
    before = {k: v.copy() for k, v in d.items()}
    first, second = _call(name, d), _call(name, d)
    np.testing.assert_array_equal(first, second)
    assert np.all(np.isfinite(first)) and np.any(first != 0.0)
    for k, v in before.items():
        np.testing.assert_array_equal(d[k], v, err_msg=f"{k} was modified")
    first[:] = 123.0  # the result owns its memory
    np.testing.assert_array_equal(_call(name, d), second)
