"""HGPO, GraphGPO and G2PO against slow re-implementations of their authors' code, plus their properties.

The layouts are those of ``test_advantages.py`` (groups in shuffled order, staggered episode ends, length-1
episodes, revisits, single-episode and single-row groups), with successes and invalid actions drawn per episode
(all-success, all-failure and mixed groups) and, for some, all-equal rewards (zero-variance groups). The
published code runs on the same rows in its own layout (``uid``, ``traj_uid``, ``anchor_obs``).

Invalid actions are fed as each side takes them: this library's rewards carry the penalty (the data layout of
docs/algorithm.md) and ``penalties`` says how much of each reward it is; the published estimators get what their
trainers feed them, the env's penalty-free returns less ``PENALTY`` on each invalid row (verl-agent's
``apply_invalid_action_penalty``). GiGPO is checked the same way against verl-agent's own estimator.

Where this library departs from the published code on purpose, the test says so: a rollout group of a single
row gets no episode-level advantage here (the published statistics give it its raw score, or NaN).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose
from reference_rivals import (
    GOAL,
    SUCCESS_REWARD,
    apply_invalid_action_penalty,
    ref_g2po,
    ref_gigpo,
    ref_graphgpo,
    ref_hgpo,
    step_discounted_returns,
)
from test_advantages import PROFILE, TOL, UNIT, Episode, assemble, examples, layouts, rows_by_episode

from agents.advantages import g2po_advantages, gigpo_advantages, graphgpo_advantages, hgpo_advantages

PENALTY = 0.1  # the published runs' invalid_action_penalty_coef


@st.composite
def rival_layouts(draw, key_kind: str | None = None, g2po: bool = False) -> dict:
    """A layout, each episode's success and invalid steps, in this library's arrays and in the published ones."""
    episodes, container = draw(layouts(key_kind=key_kind))
    outcome = {g: draw(st.sampled_from(["mixed", "all", "none", "flat"])) for g in {e.group for e in episodes}}
    won, invalid = {}, []
    for e in episodes:
        kind = outcome[e.group]
        won[e.episode_id] = draw(st.booleans()) if kind == "mixed" else kind == "all"
        if kind == "flat":  # every reward of the group equal: no variance anywhere
            e.rewards = [0.0] * len(e.rewards)
        if g2po:  # G2PO's success is an episode reward of exactly SUCCESS_REWARD
            if won[e.episode_id]:
                e.rewards = [0.0] * (len(e.rewards) - 1) + [SUCCESS_REWARD]
            won[e.episode_id] = math.isclose(sum(e.rewards), SUCCESS_REWARD, rel_tol=0, abs_tol=0)
        invalid += draw(st.lists(st.booleans(), min_size=len(e.keys), max_size=len(e.keys)))
    d = assemble(episodes, container)
    rows = rows_by_episode(episodes)
    success = np.zeros(d["rewards"].size, dtype=bool)
    for e in episodes:
        success[rows[e.episode_id][-1]] = won[e.episode_id]
    ep_return = {e.episode_id: sum(e.rewards) for e in episodes}
    anchor = list(d["state_keys"])
    invalid = np.array(invalid, dtype=bool)
    published = {
        "anchor_obs": anchor,
        "next_obs": [GOAL if won_ else k for k, won_ in zip(list(d["next_state_keys"]), success, strict=True)],
        "index": d["group_index"],
        "traj_index": d["episode_index"],
        "env_rewards": d["rewards"].copy(),  # the env's rewards: no penalty in them
        "episode_rewards": np.array([ep_return[e] for e in d["episode_index"].tolist()]),
        "invalid": invalid,
    }
    penalties = PENALTY * invalid
    d["rewards"] = d["rewards"] - penalties  # this library's rewards carry the penalty
    return {"ours": d, "penalties": penalties, "success": success, "published": published, "episodes": episodes}


def _trainer_inputs(case: dict, gamma: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Each row's episode score and return-to-go as the published trainers hand them to the estimators."""
    p = case["published"]
    returns = step_discounted_returns(p["env_rewards"], p["traj_index"], gamma)
    return apply_invalid_action_penalty(p["episode_rewards"], returns, p["invalid"], PENALTY)


def _single_row_groups(group_index: np.ndarray) -> np.ndarray:
    """Rows of rollout groups that have a single row (the one intended departure from the published code)."""
    groups, counts = np.unique(group_index, return_counts=True)
    return np.isin(group_index, groups[counts == 1])


def _hgpo_reference(case: dict, gamma: float, **options) -> np.ndarray:
    p = case["published"]
    row_scores, returns = _trainer_inputs(case, gamma)
    return ref_hgpo(returns, row_scores, p["anchor_obs"], p["index"], p["traj_index"], **options)


# ---------------------------------------------------------------------------------------------------------
# Agreement with the published computations
# ---------------------------------------------------------------------------------------------------------


@settings(max_examples=examples(500), **PROFILE)
@given(
    case=rival_layouts(),
    gamma=UNIT,
    history=st.integers(0, 3),
    alpha=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
    std_norm=st.booleans(),
    base_group=st.booleans(),
)
def test_hgpo_matches_published(case, gamma, history, alpha, std_norm, base_group):
    d = case["ours"]
    ours = hgpo_advantages(
        d["rewards"], d["episode_index"], d["group_index"], d["state_keys"],
        gamma=gamma, history=history, alpha=alpha, std_norm=std_norm, base_group=base_group,
        penalties=case["penalties"],
    )  # fmt: skip
    mode = "mean_std_norm" if std_norm else "mean_norm"
    ref = _hgpo_reference(
        case, gamma, history_length=history, mode=mode, length_weight_alpha=alpha, base_group=base_group
    )
    same = ~_single_row_groups(d["group_index"]) if base_group else np.ones(ours.size, dtype=bool)
    assert_allclose(ours[same], ref[same], **TOL)
    assert np.all(ours[~same] == 0.0)


@settings(max_examples=examples(500), **PROFILE)
@given(
    case=rival_layouts(),
    graph_gamma=st.sampled_from([0.1, 0.5, 0.95, 1.0]),
    progress=st.booleans(),
    std_norm=st.booleans(),
    step_coef=st.sampled_from([1.0, 0.5]),
    episode_coef=st.sampled_from([1.0, 0.0, 2.0]),
)
def test_graphgpo_matches_published(case, graph_gamma, progress, std_norm, step_coef, episode_coef):
    d, p = case["ours"], case["published"]
    ours = graphgpo_advantages(
        **d_without(d, "terminated"), success=case["success"], graph_gamma=graph_gamma, progress=progress,
        std_norm=std_norm, step_coef=step_coef, episode_coef=episode_coef, penalties=case["penalties"],
    )  # fmt: skip
    row_scores, _ = _trainer_inputs(case)
    ref = ref_graphgpo(
        p["anchor_obs"], p["next_obs"], p["index"], p["traj_index"], row_scores, p["invalid"],
        gamma=graph_gamma, normalize_distance=progress, invalid_action_penalty_coef=PENALTY,
        step_advantage_w=step_coef, episode_advantage_w=episode_coef,
        mode="mean_std_norm" if std_norm else "mean_norm",
    )  # fmt: skip
    same = ~_single_row_groups(d["group_index"]) if episode_coef else np.ones(ours.size, dtype=bool)
    assert_allclose(ours[same], ref[same], **TOL)


@settings(max_examples=examples(500), **PROFILE)
@given(case=rival_layouts(g2po=True), gamma=UNIT, std_norm=st.booleans(), step_coef=st.sampled_from([1.0, 0.5]))
def test_g2po_matches_published(case, gamma, std_norm, step_coef):
    d, p = case["ours"], case["published"]
    ours = g2po_advantages(
        d["rewards"], d["episode_index"], d["group_index"], d["state_keys"], case["success"],
        gamma=gamma, std_norm=std_norm, step_coef=step_coef, penalties=case["penalties"],
    )  # fmt: skip
    row_scores, _ = _trainer_inputs(case)
    ref = ref_g2po(
        p["episode_rewards"], row_scores, p["anchor_obs"], p["index"], p["traj_index"], p["invalid"],
        gamma=gamma, step_advantage_w=step_coef, mode="mean_std_norm" if std_norm else "mean_norm",
    )  # fmt: skip
    single = _single_row_groups(d["group_index"])
    assert_allclose(ours[~single], ref[~single], **TOL)
    assert np.all(ours[single] == 0.0)  # the published std of one value is NaN (mean_std_norm)


@settings(max_examples=examples(500), **PROFILE)
@given(case=rival_layouts(), gamma=UNIT, std_norm=st.booleans(), omega=st.sampled_from([1.0, 0.5, 0.0]))
def test_gigpo_matches_verl_agent(case, gamma, std_norm, omega):
    """GiGPO with verl-agent's statistics (over rows) against its published estimator and trainer inputs."""
    d, p = case["ours"], case["published"]
    ours = gigpo_advantages(
        d["rewards"], d["episode_index"], d["group_index"], d["state_keys"],
        gamma=gamma, omega=omega, std_norm=std_norm, episode_stats="rows", penalties=case["penalties"],
    )  # fmt: skip
    row_scores, returns = _trainer_inputs(case, gamma)
    mode = "mean_std_norm" if std_norm else "mean_norm"
    ref = ref_gigpo(returns, row_scores, p["anchor_obs"], p["index"], step_advantage_w=omega, mode=mode)
    same = ~_single_row_groups(d["group_index"])
    assert_allclose(ours[same], ref[same], **TOL)


def _one_invalid_step() -> tuple[dict, np.ndarray, np.ndarray]:
    """One group, two failed episodes (a -> b | c), the step from b invalid: its reward is the penalty."""
    d = assemble([Episode(1, 0, ["a", "b"], [0.0, -PENALTY], True, "x"), Episode(2, 0, ["c"], [0.0], True, "y")])
    return d, np.zeros(3, dtype=bool), np.array([0.0, PENALTY, 0.0])


@pytest.mark.parametrize("name", ["gigpo", "hgpo", "graphgpo", "g2po"])
def test_an_invalid_step_is_charged_to_its_own_row(name):
    """The trainers' scores are (0, -0.1, 0): standardised over the three rows, (1, -2, 1) / sqrt(3).

    Every state is visited once, so no step term is non-zero; the invalid row alone is blamed, where penalties
    read as part of the return blame its whole episode (-1, -1, 2) / sqrt(3).
    """
    d, success, penalties = _one_invalid_step()
    args = (d["rewards"], d["episode_index"], d["group_index"], d["state_keys"])
    extra = {
        "gigpo": lambda: gigpo_advantages(*args, episode_stats="rows", penalties=penalties),
        "hgpo": lambda: hgpo_advantages(*args, base_group=True, penalties=penalties),
        "graphgpo": lambda: graphgpo_advantages(*args, d["next_state_keys"], success, penalties=penalties),
        "g2po": lambda: g2po_advantages(*args, success, penalties=penalties),
    }
    third = 1.0 / math.sqrt(3.0)
    assert_allclose(extra[name](), [third, -2 * third, third], atol=1e-4)  # eps = 1e-6 against std 0.058


def _alfworld_like_groups(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """1-3 groups of 2-6 episodes of 1-7 steps over 5 states; reward 10 on success (p 0.4); 30% invalid actions."""
    rows = []
    for g in range(rng.integers(1, 4)):
        for _ in range(rng.integers(2, 7)):
            episode, length, won = len({row[1] for row in rows}), rng.integers(1, 8), rng.random() < 0.4
            for t, key in enumerate(rng.integers(0, 5, size=length)):
                last = t == length - 1
                rows.append((g, episode, int(key), 10.0 * (last and won), rng.random() < 0.3, last and won, last))
    names = ("group", "episode", "key", "env_reward", "invalid", "success", "last")
    out = {name: np.array(column) for name, column in zip(names, zip(*rows, strict=True), strict=True)}
    out["next_key"] = np.where(out["last"], -1, np.r_[out["key"][1:], -1])
    return out


def _agreement(name: str, c: dict[str, np.ndarray], charged: bool) -> float:
    """Largest |ours - published| on one case; ours called as the buffer calls it (rewards carry the penalty)."""
    pen = PENALTY * c["invalid"]
    args = (c["env_reward"] - pen, c["episode"], c["group"], c["key"])
    kw = {"penalties": pen if charged else None}
    anchor, index, traj = list(c["key"]), c["group"], c["episode"]
    returns = {e: c["env_reward"][traj == e].sum() for e in np.unique(traj)}
    episode_rewards = np.array([returns[e] for e in traj])
    step_returns = step_discounted_returns(c["env_reward"], traj, 0.95)
    row_scores, step_returns = apply_invalid_action_penalty(episode_rewards, step_returns, c["invalid"], PENALTY)
    if name == "gigpo":
        ours = gigpo_advantages(*args, episode_stats="rows", **kw)
        ref = ref_gigpo(step_returns, row_scores, anchor, index, mode="mean_std_norm")
    elif name == "hgpo":
        ours = hgpo_advantages(*args, history=2, base_group=True, **kw)
        ref = ref_hgpo(step_returns, row_scores, anchor, index, traj, 2, base_group=True)
    elif name == "graphgpo":
        ours = graphgpo_advantages(*args, c["next_key"], c["success"], **kw)
        next_obs = [GOAL if won else k for k, won in zip(list(c["next_key"]), c["success"], strict=True)]
        ref = ref_graphgpo(anchor, next_obs, index, traj, row_scores, c["invalid"])
    else:
        ours = g2po_advantages(*args, c["success"], **kw)
        ref = ref_g2po(episode_rewards, row_scores, anchor, index, traj, c["invalid"])
    return float(np.max(np.abs(ours - ref)))


@pytest.mark.parametrize("name", ["gigpo", "hgpo", "graphgpo", "g2po"])
def test_agreement_table_with_invalid_actions(name):
    """docs/rivals.md's table: 300 seeded cases (those with an invalid action count), the published trainers'
    inputs against the buffer's call, with the penalties charged (agreement) and read as rewards (the old gap)."""
    rng = np.random.default_rng(59)
    cases = [c for c in (_alfworld_like_groups(rng) for _ in range(300)) if c["invalid"].any()]
    assert (len(cases), sum(c["key"].size for c in cases)) == (295, 9241)
    assert max(_agreement(name, c, charged=True) for c in cases) < 1e-12
    assert max(_agreement(name, c, charged=False) for c in cases) > 1.0


def d_without(d: dict, *names: str) -> dict:
    return {k: v for k, v in d.items() if k not in names}


# ---------------------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------------------


def _all(d: dict, success: np.ndarray, **options) -> dict[str, np.ndarray]:
    """The three estimators on one layout."""
    args = (d["rewards"], d["episode_index"], d["group_index"], d["state_keys"])
    return {
        "hgpo": hgpo_advantages(*args, **options.get("hgpo", {})),
        "graphgpo": graphgpo_advantages(*args, d["next_state_keys"], success, **options.get("graphgpo", {})),
        "g2po": g2po_advantages(*args, success, **options.get("g2po", {})),
    }


@settings(max_examples=examples(150), **PROFILE)
@given(layout=layouts(), base_group=st.booleans(), progress=st.booleans())
def test_no_reward_and_no_success_gives_zero(layout, base_group, progress):
    """Every return equal (0) and no goal reached: nothing to prefer, every advantage is 0."""
    episodes, container = layout
    for e in episodes:
        e.rewards = [0.0] * len(e.rewards)
    d = assemble(episodes, container)
    options = {"hgpo": {"base_group": base_group}, "graphgpo": {"progress": progress}}
    for name, a in _all(d, np.zeros(d["rewards"].size, dtype=bool), **options).items():
        assert_allclose(a, 0.0, atol=1e-9, err_msg=name)


@settings(max_examples=examples(150), **PROFILE)
@given(case=rival_layouts(key_kind="int"), data=st.data())
def test_ignore_order_and_labels(case, data):
    """Reordering episodes, renaming groups and turning int keys into str keys changes no advantage."""
    episodes = case["episodes"]
    won = {e.episode_id: bool(case["success"][rows_by_episode(episodes)[e.episode_id][-1]]) for e in episodes}
    shuffled = data.draw(st.permutations(episodes))
    renamed = [
        Episode(e.episode_id, ~e.group, [f"s{k}" for k in e.keys], e.rewards, e.terminated, f"s{e.final_next_key}")
        for e in shuffled
    ]

    def run(eps: list[Episode], container: str) -> dict:
        d = assemble(eps, container)
        rows = rows_by_episode(eps)
        success = np.zeros(d["rewards"].size, dtype=bool)
        for e in eps:
            success[rows[e.episode_id][-1]] = won[e.episode_id]
        options = {"hgpo": {"base_group": True}}
        return {name: (a, rows) for name, a in _all(d, success, **options).items()}

    first, second = run(episodes, "array"), run(renamed, "object")
    for name in first:
        (a, rows_a), (b, rows_b) = first[name], second[name]
        for e in episodes:
            assert_allclose(b[rows_b[e.episode_id]], a[rows_a[e.episode_id]], **TOL, err_msg=name)


def test_single_row_group_gets_zero():
    d = assemble([Episode(0, 5, ["a"], [10.0], True, "x")])
    for name, a in _all(d, np.array([True]), hgpo={"base_group": True}).items():
        assert a.tolist() == [0.0], name


# ---------------------------------------------------------------------------------------------------------
# Hand-worked examples from the equations
# ---------------------------------------------------------------------------------------------------------


def _two_paths() -> tuple[dict, np.ndarray]:
    """One group: s0 -> s1 -> success (2 rows) and s0 -> s2 -> s1 -> fail (3 rows, reward 0)."""
    episodes = [
        Episode(1, 0, ["s0", "s1"], [0.0, 10.0], True, "done"),
        Episode(2, 0, ["s0", "s2", "s1"], [0.0, 0.0, 0.0], True, "end"),
    ]
    return assemble(episodes), np.array([False, True, False, False, False])


def test_hgpo_worked_example():
    """gamma 0.5: R = (5, 10 | 0, 0, 0). Level 1 sets {s0: 5, 0} and {s1: 10, 0}; level 2 has only singletons."""
    d, _ = _two_paths()
    eps = 1e-6
    A = hgpo_advantages(d["rewards"], d["episode_index"], d["group_index"], d["state_keys"], gamma=0.5, history=1)
    # s0: mean 2.5, ddof-0 std 2.5; s1: mean 5, std 5; s2 alone: no item. Weight 2, divided by 2 + eps.
    a0, a1 = 2.5 / (2.5 + eps) * 2 / (2 + eps), 5 / (5 + eps) * 2 / (2 + eps)
    assert_allclose(A, [a0, a1, -a0, 0.0, -a1], atol=1e-12)
    # mean_norm, alpha 0, the base group added: the rows' episode returns (10, 10, 0, 0, 0), mean 4.
    A = hgpo_advantages(
        d["rewards"], d["episode_index"], d["group_index"], d["state_keys"],
        gamma=0.5, history=1, alpha=0.0, std_norm=False, base_group=True,
    )  # fmt: skip
    expected = [
        (6 + 2.5) / (2 + eps),
        (6 + 5) / (2 + eps),
        (-4 - 2.5) / (2 + eps),
        -4 / (1 + eps),
        (-4 - 5) / (2 + eps),
    ]
    assert_allclose(A, expected, atol=1e-12)


def test_hgpo_history_separates_equal_states_with_different_pasts():
    """Level 2 compares s1 only with the rows that came from the same state: b's group is b alone."""
    episodes = [
        Episode(1, 0, ["a", "s1"], [0.0, 1.0], True, "x"),
        Episode(2, 0, ["a", "s1"], [0.0, 0.0], True, "x"),
        Episode(3, 0, ["b", "s1"], [0.0, 0.5], True, "x"),
    ]
    d = assemble(episodes)
    args = (d["rewards"], d["episode_index"], d["group_index"], d["state_keys"])
    flat = hgpo_advantages(*args, history=0, std_norm=False, eps=0.0)
    deep = hgpo_advantages(*args, history=1, std_norm=False, alpha=0.0, eps=0.0)
    # s1: returns 1, 0, 0.5, mean 0.5; (a, s1): 1, 0, mean 0.5. Row 5 (after b) keeps level 1 only: 0.
    assert_allclose(flat[[1, 3, 5]], [0.5, -0.5, 0.0], atol=1e-12)
    assert_allclose(deep[[1, 3, 5]], [0.5, -0.5, 0.0], atol=1e-12)
    # First rows: level 1 only (no history before them): returns 0.95, 0, mean 0.475.
    assert_allclose(deep[[0, 2]], [0.475, -0.475], atol=1e-12)


def test_graphgpo_worked_example():
    """Distances: s1 -> goal 1, s0 -> s1 -> goal 2, s2 -> s1 2, 'end' (a dead end) far + 1 = 3."""
    d, success = _two_paths()
    g = 0.5
    A = graphgpo_advantages(**d_without(d, "terminated"), success=success, graph_gamma=g, std_norm=False,
                            episode_coef=0.0)  # fmt: skip
    # Step returns 10 g^d(next): rows (s0->s1, s1->goal | s0->s2, s2->s1, s1->end) = (5, 10 | 2.5, 5, 1.25).
    # Centred in the (group, s_t) sets {s0: 5, 2.5}, {s1: 10, 1.25}, {s2: 5}.
    assert_allclose(A, [1.25, 4.375, -1.25, 0.0, -4.375], atol=1e-12)
    progress = graphgpo_advantages(**d_without(d, "terminated"), success=success, graph_gamma=g, progress=True,
                                   std_norm=False, episode_coef=0.0)  # fmt: skip
    # 10 g^(d(next) - d(s) + 1): (s0->s1: 2 - 1 -> g^0 = 10, s1->goal: g^0 = 10 | s0->s2: g^1 = 5, s2->s1: 10,
    # s1->end: g^3 = 1.25).
    assert_allclose(progress, [2.5, 4.375, -2.5, 0.0, -4.375], atol=1e-12)


def test_g2po_worked_example():
    """gamma 0.5, R(tau) = 10 and 0. Credits: s0 10 g^2 = 2.5, s1 10 g = 5 | 0, 0, 0 (g^3, g^2, g)."""
    d, success = _two_paths()
    A = g2po_advantages(d["rewards"], d["episode_index"], d["group_index"], d["state_keys"], success,
                        gamma=0.5, std_norm=False)  # fmt: skip
    # V(s0) = 1.25, V(s1) = 2.5, V(s2) = 0; success node 10, failure node 0.
    v_next = np.array([2.5, 10.0, 0.0, 2.5, 0.0])
    v = np.array([1.25, 2.5, 1.25, 0.0, 2.5])
    node = np.array([(2.5 - 0.0) / 2, (10 - 0) / 2, -(2.5 - 0.0) / 2, 0.0, -(10 - 0) / 2])  # within s0, s1, s2
    gain = v_next - v
    episode = np.array([10, 10, 0, 0, 0]) - 4.0
    assert_allclose(A, episode + node + gain - gain.mean(), atol=1e-12)


# ---------------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda d, s: hgpo_advantages(*_base(d), history=-1), "history must be an int >= 0"),
        (lambda d, s: hgpo_advantages(*_base(d), history=1.5), "history must be an int"),
        (lambda d, s: hgpo_advantages(*_base(d), alpha=-1.0), r"alpha must be a number in \[0, inf\]"),
        (lambda d, s: graphgpo_advantages(*_base(d), d["next_state_keys"], s, graph_gamma=0.0), "graph_gamma"),
        (lambda d, s: graphgpo_advantages(*_base(d), d["next_state_keys"], ~s), "success is True on a row"),
        (lambda d, s: graphgpo_advantages(*_base(d), np.arange(5), s), "both be int64 hashes or both be strings"),
        (lambda d, s: g2po_advantages(*_base(d), s, penalties=np.zeros(4)), "penalties must be 5 finite"),
        (lambda d, s: g2po_advantages(*_base(d), s[:4]), "success has length 4"),
    ],
)
def test_argument_errors(call, message):
    d, success = _two_paths()
    with pytest.raises(ValueError, match=message):
        call(d, success)


def _base(d: dict) -> tuple:
    return d["rewards"], d["episode_index"], d["group_index"], d["state_keys"]


def test_empty_input():
    empty = np.zeros(0, dtype=np.int64)
    rewards, flags = np.zeros(0), np.zeros(0, dtype=bool)
    for a in (
        hgpo_advantages(rewards, empty, empty, empty),
        graphgpo_advantages(rewards, empty, empty, empty, empty, flags),
        g2po_advantages(rewards, empty, empty, empty, flags),
    ):
        assert a.shape == (0,) and a.dtype == np.float64


# ---------------------------------------------------------------------------------------------------------
# The agent's buffer calls them with the configured settings
# ---------------------------------------------------------------------------------------------------------

#: (group, episode) -> [(state key, reward)], the last step successful when its reward is 10; a reward of -0.1 is
#: an invalid action's penalty (config.invalid_action_penalty 0.1 below).
BUFFER_EPISODES = {
    (0, 10): [(1, 0.0), (2, -0.1), (3, 10.0)],
    (0, 11): [(1, 0.0), (4, 0.0)],
    (0, 12): [(1, -0.1), (2, 0.0), (2, 0.0), (3, 10.0)],
    (1, 20): [(5, 0.0), (6, 10.0)],
    (1, 21): [(5, 0.0), (5, -0.1), (7, 0.0)],
}


@pytest.mark.parametrize(
    "settings",
    [
        {"estimator": "hgpo", "hgpo_history": -1, "history_length": 1, "hgpo_alpha": 0.5, "hgpo_base_group": True},
        {"estimator": "hgpo", "hgpo_history": 0, "hgpo_std_norm": False},
        {"estimator": "graphgpo", "graphgpo_gamma": 0.3, "graphgpo_progress": True, "graphgpo_episode_coef": 0.5},
        {"estimator": "graphgpo", "graphgpo_std_norm": False, "omega": 0.7},
        {"estimator": "g2po", "g2po_std_norm": False, "omega": 0.4},
        {"estimator": "g2po"},
        {"estimator": "gigpo", "omega": 0.6},
        {"estimator": "gigpo", "gigpo_std_norm": False},
    ],
)
def test_buffer_passes_the_configured_settings(settings):
    from agents.buffer import GroupRolloutBuffer, Row
    from agents.config import GAGPOConfig

    config = GAGPOConfig(gamma=0.8, adv_eps=0.01, invalid_action_penalty=PENALTY, **settings)
    buffer = GroupRolloutBuffer(config)
    for g in (0, 1):
        buffer.start_group(g, [ep for group, ep in BUFFER_EPISODES if group == g])
    # Rows arrive interleaved, one step of every running episode at a time.
    longest = max(map(len, BUFFER_EPISODES.values()))
    for t in range(longest):
        for (g, ep), steps in BUFFER_EPISODES.items():
            if t < len(steps):
                last = t == len(steps) - 1
                key, reward = steps[t]
                buffer.add(
                    Row(group=g, episode=ep, prompt_ids=[ep, t], rollout_logp=np.zeros(1), reward=reward,
                        state_key=key, next_state_key=-1 if last else steps[t + 1][0], terminated=last, done=last,
                        won=last and reward == 10.0, invalid=reward == -PENALTY)
                )  # fmt: skip
    buffer.finalize()
    got = {(r.episode, r.prompt_ids[1]): r.advantage for r in buffer.rows}

    layout = [(g, ep, t, *step) for (g, ep), steps in BUFFER_EPISODES.items() for t, step in enumerate(steps)]
    rewards = np.array([row[4] for row in layout])
    episodes, groups = np.array([row[1] for row in layout]), np.array([row[0] for row in layout])
    keys = np.array([row[3] for row in layout])
    lengths = {ep: len(steps) for (_, ep), steps in BUFFER_EPISODES.items()}
    last = np.array([t == lengths[ep] - 1 for _, ep, t, *_ in layout])
    next_keys = np.where(last, -1, np.r_[keys[1:], -1])
    success = last & (rewards == 10.0)
    pen = np.where(rewards == -PENALTY, PENALTY, 0.0)
    c, args = config, (rewards, episodes, groups, keys)
    if c.estimator == "hgpo":
        history = c.history_length if c.hgpo_history < 0 else c.hgpo_history
        a = hgpo_advantages(*args, gamma=0.8, history=history, alpha=c.hgpo_alpha, std_norm=c.hgpo_std_norm,
                            base_group=c.hgpo_base_group, penalties=pen, eps=0.01)  # fmt: skip
    elif c.estimator == "graphgpo":
        a = graphgpo_advantages(*args, next_keys, success, graph_gamma=c.graphgpo_gamma, progress=c.graphgpo_progress,
                                std_norm=c.graphgpo_std_norm, step_coef=c.omega, episode_coef=c.graphgpo_episode_coef,
                                penalties=pen, eps=0.01)  # fmt: skip
    elif c.estimator == "gigpo":
        a = gigpo_advantages(*args, gamma=0.8, omega=c.omega, std_norm=c.gigpo_std_norm, penalties=pen, eps=0.01)
    else:
        a = g2po_advantages(*args, success, gamma=0.8, std_norm=c.g2po_std_norm, step_coef=c.omega, penalties=pen,
                            eps=0.01)  # fmt: skip
    expected = {(ep, t): float(x) for (_, ep, t, *_), x in zip(layout, a, strict=True)}
    assert got.keys() == expected.keys()
    for k, v in expected.items():
        assert got[k] == pytest.approx(v, abs=1e-12), k
    assert any(abs(v) > 0.05 for v in got.values())


@pytest.mark.parametrize(
    "settings",
    [
        {"estimator": "graphgpo"},
        {"estimator": "g2po"},
        {"estimator": "hgpo", "hgpo_base_group": True},
    ],
)
def test_buffer_charges_an_invalid_action_as_the_published_trainers(settings):
    """The minimal case through the buffer: the invalid row alone is blamed, (1, -2, 1) / sqrt(3) as published."""
    from agents.buffer import GroupRolloutBuffer, Row
    from agents.config import GAGPOConfig

    buffer = GroupRolloutBuffer(GAGPOConfig(invalid_action_penalty=PENALTY, **settings))
    buffer.start_group(0, [1, 2])
    steps = [(1, "a", "b", 0.0, False), (2, "c", "y", 0.0, True), (1, "b", "x", -PENALTY, True)]
    for episode, key, next_key, reward, done in steps:
        buffer.add(
            Row(group=0, episode=episode, prompt_ids=[], rollout_logp=np.zeros(1), reward=reward, state_key=key,
                next_state_key=next_key, terminated=done, done=done, won=False, invalid=reward < 0)
        )  # fmt: skip
    got = {row.state_key: row.advantage for row in buffer.rows}
    third = 1.0 / math.sqrt(3.0)
    assert_allclose([got["a"], got["b"], got["c"]], [third, -2 * third, third], atol=1e-4)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"estimator": "hgpo_v2"}, "estimator must be one of"),
        ({"hgpo_history": -2}, r"hgpo_history must be in \[-1, 32\]"),
        ({"hgpo_history": 1.5}, "hgpo_history must be a finite int"),
        ({"hgpo_alpha": -0.5}, r"hgpo_alpha must be in \[0, 10\]"),
        ({"graphgpo_gamma": 0.0}, r"graphgpo_gamma must be in \(0, 1\]"),
        ({"graphgpo_gamma": 1.5}, r"graphgpo_gamma must be in \(0, 1\]"),
        ({"graphgpo_episode_coef": -1.0}, "graphgpo_episode_coef must be >= 0"),
        ({"g2po_std_norm": "yes"}, "g2po_std_norm must be True or False"),
    ],
)
def test_config_validates_the_rivals_settings(settings, message):
    from agents.config import GAGPOConfig

    with pytest.raises(ValueError, match=message):
        GAGPOConfig(**settings)
