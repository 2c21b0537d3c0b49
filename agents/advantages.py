"""Advantage estimators for grouped multi-turn rollouts: GAGPO and its baselines.

Each function is a pure numpy function of flat per-step arrays (one row = one environment step = one LLM
action) and follows ``docs/algorithm.md`` line by line. No torch, no env knowledge, no Python loop
over rows: the only Python loops run over episode positions (at most the longest episode) and back-off levels,
and the cost is O(N log N) from sorting one 64-bit hash per (group, key) pair. The layout checks and the
(group, key) hashing and set statistics they share live in ``agents/state_sets.py``.

``REGISTRY`` declares each estimator once (:class:`Estimator`: its function, the arrays and ``GAGPOConfig``
settings it takes, whether it needs a group of several episodes or a critic): the rollout buffer, the config's
checks and the command line read it, so adding an estimator is one function and one entry.

Data layout (length-N arrays):
    rewards          float  reward of this step's action (penalties included)
    episode_index    int    episode id; an episode's rows are contiguous and in time order
    group_index      int    rollout group id (the episodes sampled for one task)
    state_keys       int64 or str   canonical key of the state the action was taken from
    next_state_keys  int64 or str   key of the state reached after the action
    terminated       bool   True only on the final row of an episode that ended in a terminal state
    success          bool   True only on the final row of an episode that reached the goal (GraphGPO, G2PO)
    penalties        float  the invalid-action penalty inside each step's reward (the rivals and GiGPO; default 0):
                            given, it is charged as the published trainers charge it (see ``_trainer_scores``)
    backoff_keys     L arrays of int64 or str   coarser keys of the same state, finest first (key back-off)
    values           float  a learned value head's V(s_t) (PPO with a critic)
    last_values      float  V of the state reached after a truncated final row (PPO with a critic)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Integral, Real
from types import MappingProxyType
from typing import Any, Literal

import numpy as np

from agents.state_sets import (
    as_keys,
    backoff_levels,
    backward_scan,
    check_layout,
    episode_bounds,
    factorize,
    pair_ids,
    resolve_backoff,
    set_means,
    set_standardize,
)

Normalize = Literal["group", "batch", "none"]

__all__ = [
    "INPUTS",
    "REGISTRY",
    "Estimator",
    "discounted_returns",
    "g2po_advantages",
    "gae_advantages",
    "gagpo_advantages",
    "gigpo_advantages",
    "graphgpo_advantages",
    "grpo_advantages",
    "hgpo_advantages",
    "normalize_advantages",
    "rloo_advantages",
    "step_group_stats",
]

#: An HGPO item whose group-relative return is within this share of its set's RMS return of zero is "zero" (the
#: published code drops items that compare ``!= 0``; rounding alone must not decide that).
ZERO_TOL = 1e-12


def discounted_returns(rewards, episode_index, *, gamma: float = 0.95) -> np.ndarray:
    """R_t = r_t + gamma * R_{t+1} inside each episode, with R = 0 after the final row (no bootstrap)."""
    r, ep, _ = check_layout(rewards, episode_index)
    return backward_scan(r, gamma, ep)


def normalize_advantages(advantages, group_index=None, *, mode: Normalize = "group", eps: float = 1e-6) -> np.ndarray:
    """A <- (A - mean_B) / (std_B + eps) over each set B (a rollout group, or the whole batch).

    Step-weighted (every row counts once), std with ddof=1; a set with a single row gets 0.
    """
    adv = np.asarray(advantages, dtype=np.float64)
    if mode == "none":
        return adv.copy()
    if mode == "batch":
        return set_standardize(adv, np.zeros(adv.size, dtype=np.int64), eps)
    if mode == "group":
        if group_index is None:
            raise ValueError("normalize='group' needs group_index")
        gid, _ = factorize(np.asarray(group_index))
        return set_standardize(adv, gid, eps)
    raise ValueError(f"normalize must be 'group', 'batch' or 'none', got {mode!r}")


def gagpo_advantages(
    rewards,
    episode_index,
    group_index,
    state_keys,
    next_state_keys,
    terminated,
    *,
    gamma: float = 0.95,
    lam: float = 0.8,
    eps: float = 1e-6,
    normalize: Normalize = "group",
    bootstrap_truncated: bool = True,
    backoff_keys: Sequence = (),
    backoff_min_count: int = 2,
    episode_coef: float = 0.0,
) -> np.ndarray:
    """GAGPO: GAE over TD residuals of a non-parametric, grouped state-value proxy (docs/algorithm.md#gagpo).

    ``backoff_keys`` (coarser keys, finest first) give rows whose (group, state) set has fewer than
    ``backoff_min_count`` rows the value of a coarser set (key back-off; none by default). ``episode_coef``
    adds that multiple of the GRPO advantage to the normalised result (0 by default, as the paper advises).
    """
    r, ep, grp = check_layout(
        rewards, episode_index, group_index,
        state_keys=state_keys, next_state_keys=next_state_keys, terminated=terminated,
    )  # fmt: skip
    s = as_keys(state_keys, "state_keys")
    s_next = as_keys(next_state_keys, "next_state_keys")
    if (s.dtype.kind == "i") != (s_next.dtype.kind == "i"):
        raise ValueError("state_keys and next_state_keys must both be int64 hashes or both be strings")
    levels = backoff_levels(backoff_keys, backoff_min_count, r.size)
    if isinstance(episode_coef, bool) or not isinstance(episode_coef, Real) or not np.isfinite(episode_coef):
        raise ValueError(f"episode_coef must be a finite number, got {episode_coef!r}")
    done = np.asarray(terminated, dtype=bool)
    is_last, _, _ = episode_bounds(ep)
    if np.any(done & ~is_last):
        raise ValueError("terminated is True on a row that is not the final row of its episode")
    if r.size == 0:
        return r

    # 1. Discounted return-to-go inside each episode, no bootstrap.
    R = backward_scan(r, gamma, ep)

    # 2. Grouped value proxy: Vbar(g, s) = mean of R_t over the rows of group g taken from state s.
    #    Truncated final rows' next keys are numbered with them so that step 3 can look them up.
    truncated = np.flatnonzero(is_last & ~done) if bootstrap_truncated else np.zeros(0, np.int64)
    pair_id, n_pairs = pair_ids(np.concatenate([grp, grp[truncated]]), np.concatenate([s, s_next[truncated]]))
    set_id, next_set_id = pair_id[: r.size], pair_id[r.size :]
    vbar_set, count_set = set_means(set_id, R, n_pairs)

    #    Key back-off: Vtilde = Vbar(g, s_t) if that set has at least m rows, else Vbar_l(g, key_l[t]) at the
    #    first level l whose set has, else Vbar(g, s_t) after all. No levels: Vtilde = Vbar.
    vtilde = vbar_set[set_id]
    level_of_row, _, level_sets = resolve_backoff(grp, set_id, levels, backoff_min_count)
    for level, (ids, n_sets) in enumerate(level_sets, start=1):
        vbar_level, _ = set_means(ids, R, n_sets)
        rows = level_of_row == level
        vtilde[rows] = vbar_level[ids[rows]]

    # 3. Value of the next state: the next row's Vtilde; 0 after a terminal state; for a truncated final
    #    row, Vbar(g, next key) at level 0 if group g ever acted from that key (bootstrap_truncated), else 0.
    v_next = np.zeros_like(R)
    v_next[:-1] = vtilde[1:]
    v_next[is_last] = 0.0
    found = count_set[next_set_id] > 0
    v_next[truncated[found]] = vbar_set[next_set_id[found]]
    delta = r + gamma * v_next - vtilde

    # 4. GAE recursion backwards through each episode: A_t = delta_t + gamma * lam * A_{t+1}.
    A = backward_scan(delta, gamma * lam, ep)

    # 5. Normalise within the rollout group (or the batch, or not at all).
    A = normalize_advantages(A, grp, mode=normalize, eps=eps)

    # 6. Optional episode-level term (the paper's ablation): episode_coef times the GRPO advantage.
    if episode_coef:
        A += episode_coef * _grpo(r, ep, grp, eps)
    return A


def gigpo_advantages(
    rewards,
    episode_index,
    group_index,
    state_keys,
    *,
    gamma: float = 0.95,
    omega: float = 1.0,
    eps: float = 1e-6,
    std_norm: bool = True,
    episode_stats: Literal["episodes", "rows"] = "episodes",
    penalties=None,
) -> np.ndarray:
    """GiGPO: episode-level group advantage plus omega times a step-level (group, state) advantage.

    ``penalties`` (the invalid-action penalty inside each reward) are charged as verl-agent's trainer charges
    them: each row's episode score and return-to-go are the penalty-free ones minus the row's own penalty.
    """
    r, ep, grp = check_layout(rewards, episode_index, group_index, state_keys=state_keys)
    s = as_keys(state_keys, "state_keys")
    if episode_stats not in ("episodes", "rows"):
        raise ValueError(f"episode_stats must be 'episodes' or 'rows', got {episode_stats!r}")
    pen = _penalties(penalties, r.size)
    if r.size == 0:
        return r
    score, R = _trainer_scores(r, pen, ep, grp, gamma)

    # Episode term: each row's episode score against the other episodes of its group.
    if episode_stats == "episodes":
        episode_term = _episode_standardize(score, ep, grp, eps, scale=std_norm)
    else:  # verl-agent: statistics over rows, each row carrying its own score
        g_of_row, _ = factorize(grp)
        episode_term = set_standardize(score, g_of_row, eps, scale=std_norm)

    # Step term: discounted return-to-go against the other rows of the same (group, state) set.
    set_id, _ = pair_ids(grp, s)
    step_term = set_standardize(R, set_id, eps, scale=std_norm)
    return episode_term + omega * step_term


def grpo_advantages(rewards, episode_index, group_index, *, eps: float = 1e-6) -> np.ndarray:
    """GRPO: (R(tau) - mean) / (std + eps) over the episodes of a group, broadcast to the episode's rows."""
    r, ep, grp = check_layout(rewards, episode_index, group_index)
    if r.size == 0:
        return r
    return _grpo(r, ep, grp, eps)


def rloo_advantages(rewards, episode_index, group_index) -> np.ndarray:
    """RLOO: R(tau_i) minus the mean return of the group's other episodes; 0 for a single-episode group."""
    r, ep, grp = check_layout(rewards, episode_index, group_index)
    if r.size == 0:
        return r
    ep_return, ep_group, ep_id = _episode_returns(r, ep, grp)
    g_of_ep, n_groups = factorize(ep_group)
    n = np.bincount(g_of_ep, minlength=n_groups).astype(np.float64)[g_of_ep]
    total = np.bincount(g_of_ep, weights=ep_return, minlength=n_groups)[g_of_ep]
    leave_one_out_mean = (total - ep_return) / np.maximum(n - 1.0, 1.0)
    return np.where(n > 1, ep_return - leave_one_out_mean, 0.0)[ep_id]


def gae_advantages(
    rewards,
    values,
    episode_index,
    terminated,
    *,
    last_values=None,
    gamma: float = 0.95,
    lam: float = 0.95,
) -> np.ndarray:
    """Standard GAE from a learned value head (the PPO-with-critic baseline); unnormalised.

    ``values[t]`` is V(s_t). ``last_values[t]`` (read on truncated final rows only) is V of the state reached
    after the action; without it a truncated episode bootstraps with 0. Value targets are ``A + values``.
    """
    r, ep, _ = check_layout(rewards, episode_index, values=values, terminated=terminated)
    v = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(v)):
        raise ValueError("values contain NaN or infinite values")
    done = np.asarray(terminated, dtype=bool)
    is_last, _, _ = episode_bounds(ep)
    if np.any(done & ~is_last):
        raise ValueError("terminated is True on a row that is not the final row of its episode")
    if last_values is not None:
        last_values = np.asarray(last_values, dtype=np.float64)
        if last_values.shape != r.shape:
            raise ValueError(f"last_values has length {last_values.size}, expected {r.size}")
        if not np.all(np.isfinite(last_values[is_last & ~done])):
            raise ValueError("last_values contain NaN or infinite values on truncated final rows")
    if r.size == 0:
        return r
    v_next = np.zeros_like(r)
    v_next[:-1] = v[1:]
    v_next[is_last] = 0.0
    if last_values is not None:
        boot = is_last & ~done
        v_next[boot] = last_values[boot]
    delta = r + gamma * v_next - v
    return backward_scan(delta, gamma * lam, ep)


def hgpo_advantages(
    rewards,
    episode_index,
    group_index,
    state_keys,
    *,
    gamma: float = 0.95,
    history: int = 2,
    alpha: float = 1.0,
    std_norm: bool = True,
    base_group: bool = False,
    penalties=None,
    eps: float = 1e-6,
) -> np.ndarray:
    """HGPO (arXiv 2602.22817): group-relative returns in a hierarchy of history groups, weighted by depth.

    Level k = 1 .. history + 1 groups the rows of a rollout group whose last k state keys (the current one and
    the k - 1 before it in the episode) agree. In every set of two or more rows, the discounted return-to-go
    against the set: ``a_k = (R - mean) / (std + eps)`` (std with ddof=0), or ``R - mean``. A row's advantage is
    the weighted mean of its non-zero ``a_k`` with weights ``(k + 1) ** alpha``, normalised by
    ``sum of weights + eps``; ``base_group`` adds the episode-level term as a level k = 0 (weight 1).
    ``penalties`` are charged as GiGPO's are (the published trainer is verl-agent's).
    """
    r, ep, grp = check_layout(rewards, episode_index, group_index, state_keys=state_keys)
    s = as_keys(state_keys, "state_keys")
    _check_int("history", history, low=0)
    _check_real("alpha", alpha, low=0.0)
    pen = _penalties(penalties, r.size)
    if r.size == 0:
        return r
    score, R = _trainer_scores(r, pen, ep, grp, gamma)
    position = _positions(ep)

    weighted_sum = np.zeros_like(R)
    weight_total = np.zeros_like(R)
    if base_group:  # level 0: the episode score against the group's rows (GiGPO's cross-step statistics)
        gid, n_groups = factorize(grp)
        a, keep = _group_relative(score, gid, n_groups, ddof=1, std_norm=std_norm, eps=eps)
        weighted_sum += np.where(keep, a, 0.0)
        weight_total += keep

    level_id, n_sets = pair_ids(grp, s)  # level 1: (group, s_t)
    first_id, n_first = level_id, n_sets
    for k in range(1, history + 2):
        if k > 1:  # (group, s_{t-k+1} .. s_t) = ((group, s_{t-k+1} .. s_{t-1}) of row t - 1, (group, s_t))
            rows = np.flatnonzero(position >= k - 1)
            previous = level_id
            level_id = np.full(r.size, -1, dtype=np.int64)
            codes, n_sets = factorize(previous[rows - 1] * n_first + first_id[rows])
            level_id[rows] = codes
        member = level_id >= 0
        a, keep = _group_relative(R[member], level_id[member], n_sets, ddof=0, std_norm=std_norm, eps=eps)
        weight = (k + 1.0) ** alpha
        weighted_sum[member] += weight * np.where(keep, a, 0.0)
        weight_total[member] += weight * keep
    return np.divide(weighted_sum, weight_total + eps, out=np.zeros_like(R), where=weight_total > 0)


def graphgpo_advantages(
    rewards,
    episode_index,
    group_index,
    state_keys,
    next_state_keys,
    success,
    *,
    graph_gamma: float = 0.1,
    scale: float = 10.0,
    progress: bool = False,
    std_norm: bool = True,
    step_coef: float = 1.0,
    episode_coef: float = 1.0,
    penalties=None,
    eps: float = 1e-6,
) -> np.ndarray:
    """GraphGPO (arXiv 2605.26684): a step's return is its successor's closeness to the goal in the group's graph.

    Each rollout group's transitions s_t -> s_{t+1} form a directed graph whose goal node is reached by the
    successful final rows. ``d(s)`` is the shortest number of transitions from s to the goal; a state with no
    path gets the group's largest finite distance + 1. Step return ``g_t = scale * graph_gamma ** d(s_{t+1})``
    (``progress``: ``** (d(s_{t+1}) - d(s_t) + 1)``) minus the step's penalty, standardised over the
    (group, s_t) set as GiGPO's step term; plus ``episode_coef`` times the episode term over the group's rows,
    on each row's episode score as verl-agent's trainer forms it (penalty-free return minus the row's penalty).
    """
    r, ep, grp = check_layout(
        rewards, episode_index, group_index, state_keys=state_keys, next_state_keys=next_state_keys, success=success
    )
    s, s_next = _state_and_next(state_keys, next_state_keys)
    won = _final_flags(success, ep, "success")
    pen = _penalties(penalties, r.size)
    _check_real("graph_gamma", graph_gamma, low=0.0, high=1.0, open_low=True)
    if r.size == 0:
        return r

    # Nodes: the group's states (acted from, or reached without success), then one goal node per group.
    reached = np.flatnonzero(~won)
    pair_id, n_pairs = pair_ids(np.concatenate([grp, grp[reached]]), np.concatenate([s, s_next[reached]]))
    gid, n_groups = factorize(grp)
    node_group = np.zeros(n_pairs + n_groups, dtype=np.int64)
    node_group[pair_id] = np.concatenate([gid, gid[reached]])
    node_group[n_pairs:] = np.arange(n_groups)
    source = pair_id[: r.size]
    target = n_pairs + gid  # a successful final row leads to its group's goal
    target[reached] = pair_id[r.size :]

    # Shortest distances to the goal: breadth-first search backwards from every goal at once.
    d = _distances_to(n_pairs + np.arange(n_groups), source, target, node_group.size)
    far = np.zeros(n_groups)
    finite = np.isfinite(d)
    np.maximum.at(far, node_group[finite], d[finite])
    d = np.where(finite, d, far[node_group] + 1.0)

    # Step return from the graph, then GiGPO's step term over (group, s_t) and its episode term over the rows.
    exponent = d[target] - d[source] + 1.0 if progress else d[target]
    g = scale * graph_gamma**exponent - pen
    step_term = set_standardize(g, source, eps, scale=std_norm)
    score, _ = _trainer_scores(r, pen, ep, grp, 1.0)
    episode_term = set_standardize(score, gid, eps, scale=std_norm)
    return step_coef * step_term + episode_coef * episode_term


def g2po_advantages(
    rewards,
    episode_index,
    group_index,
    state_keys,
    success,
    *,
    gamma: float = 0.95,
    std_norm: bool = True,
    step_coef: float = 1.0,
    penalties=None,
    eps: float = 1e-6,
) -> np.ndarray:
    """G2PO (arXiv 2606.22995): a value per state group, its successor's value and the value gain as advantages.

    Row t, i steps before its episode's end (i = 1 on the final row), credits ``gamma ** i * R(tau)`` to its
    (group, s_t) node; a node's value V is the mean of its rows' credits. The successor of a final row is a
    terminal node: success (value: the mean return of the group's successful episodes) or failure (0).
    Advantage = the episode term over the group's rows + ``step_coef`` * (node term + edge term): the node
    term standardises ``V(next) - penalty`` within the (group, s_t) set, the edge term standardises the TD
    error ``V(next) - V(s_t)`` over all the group's rows. As in the published trainer, R(tau) is the
    penalty-free return (``rewards + penalties``) and the episode term's score is R(tau) minus the row's penalty.
    """
    r, ep, grp = check_layout(rewards, episode_index, group_index, state_keys=state_keys, success=success)
    s = as_keys(state_keys, "state_keys")
    won = _final_flags(success, ep, "success")
    pen = _penalties(penalties, r.size)
    if r.size == 0:
        return r
    is_last, _, _ = episode_bounds(ep)
    ep_return, _, ep_id = _episode_returns(r + pen, ep, grp)
    score, _ = _trainer_scores(r, pen, ep, grp, 1.0)
    gid, n_groups = factorize(grp)

    # Node values: mean over a node's rows of gamma^(steps to the episode's end, inclusive) * R(tau).
    node, n_nodes = pair_ids(grp, s)
    steps_left = backward_scan(np.ones_like(r), 1.0, ep)
    value, _ = set_means(node, gamma**steps_left * ep_return[ep_id], n_nodes)

    # Successor values: the next row's node; after a final row, the success node or the failure node (0).
    success_value, _ = set_means(gid[won], ep_return[ep_id][won], n_groups)
    v_next = np.zeros_like(r)
    v_next[:-1] = value[node[1:]]
    v_next[is_last] = np.where(won, success_value[gid], 0.0)[is_last]

    node_term = set_standardize(v_next - pen, node, eps, scale=std_norm)
    edge_term = set_standardize(v_next - value[node], gid, eps, scale=std_norm)
    episode_term = set_standardize(score, gid, eps, scale=std_norm)
    return episode_term + step_coef * (node_term + edge_term)


def self_imitation_advantages(episode_index, success, *, penalties=None) -> np.ndarray:
    """Iterated self-imitation (filtered behaviour cloning; LM-BUTLER's IAM): 1 on every step of an episode that
    reached the goal, 0 elsewhere, and 0 on a step that drew the invalid-action penalty.

    No baseline and no negative credit: at ratio 1 the clipped loss's gradient is that of the log-likelihood of the
    successful episodes' actions, so each iteration clones the agent's own successes (the RL-free control every
    reviewer asks for). Episodes stand alone: a group of one learns as well as a group of eight.
    """
    ep = np.asarray(episode_index, dtype=np.int64)
    won = _final_flags(success, ep, "success")
    episode_won = backward_scan(won.astype(np.float64), 1.0, ep) > 0  # only a final row can hold it: carry it back
    return np.where(episode_won & (_penalties(penalties, ep.size) == 0), 1.0, 0.0)


def step_group_stats(
    group_index, state_keys, *, backoff_keys: Sequence = (), backoff_min_count: int = 2
) -> dict[str, float | list[float]]:
    """Size distribution of the (group, state) sets, the share of rows in singleton sets, and where rows resolve.

    A row in a singleton set has no peer to compare with: GAGPO gives a run of such rows delta = 0 and
    GiGPO's step term is 0 there. A high singleton share means the key is too fine for this env.
    ``level_shares[l]`` is the share of rows whose value comes from back-off level l (0: the row's own set
    has at least ``backoff_min_count`` rows); ``unresolved_share`` is the share that no level resolves.
    """
    grp = np.asarray(group_index)
    s = as_keys(state_keys, "state_keys")
    if grp.shape != s.shape:
        raise ValueError(f"group_index and state_keys differ in length: {grp.shape} vs {s.shape}")
    levels = backoff_levels(backoff_keys, backoff_min_count, s.size)
    if s.size == 0:
        return {"rows": 0, "sets": 0, "singleton_row_share": 0.0, "singleton_set_share": 0.0,
                "set_size_mean": 0.0, "set_size_median": 0.0, "set_size_max": 0,
                "level_shares": [0.0] * (len(levels) + 1), "unresolved_share": 0.0}  # fmt: skip
    set_id, _ = pair_ids(grp, s)
    sizes = np.bincount(set_id)
    level_of_row, unresolved, _ = resolve_backoff(grp, set_id, levels, backoff_min_count)
    resolved_rows = np.bincount(level_of_row[~unresolved], minlength=len(levels) + 1)
    return {
        "rows": int(s.size),
        "sets": int(sizes.size),
        "singleton_row_share": float(np.sum(sizes == 1) / s.size),
        "singleton_set_share": float(np.mean(sizes == 1)),
        "set_size_mean": float(sizes.mean()),
        "set_size_median": float(np.median(sizes)),
        "set_size_max": int(sizes.max()),
        "level_shares": (resolved_rows / s.size).tolist(),
        "unresolved_share": float(unresolved.mean()),
    }


# ---------------------------------------------------------------------------------------------------------
# The registry: each estimator declared once, as GAGPOConfig.estimator selects it
# ---------------------------------------------------------------------------------------------------------

#: The per-row arrays an estimator can take, by the parameter names of the functions above (the layout at the top
#: of this module). The rollout buffer hands each estimator the ones its entry lists.
INPUTS = (
    "rewards", "episode_index", "group_index", "state_keys", "next_state_keys", "terminated", "success",
    "penalties", "backoff_keys", "values", "last_values",
)  # fmt: skip


@dataclass(frozen=True)
class Estimator:
    """One estimator as the agent selects it: its function, what it takes, and what it needs to learn.

    The rollout buffer calls ``function`` on each finished group with the arrays named in ``inputs`` and the
    keywords :meth:`settings` reads from ``GAGPOConfig``; the config's checks, the command line's choices and
    the docs' table read the rest. A new estimator is one function above and one entry in ``REGISTRY``.
    """

    name: str
    function: Callable[..., np.ndarray]
    description: str  # one line: what its advantage is (--help, docs/api/estimators.md)
    inputs: tuple[str, ...]  # the per-row arrays it reads (INPUTS), by the function's parameter names
    config: Mapping[str, str] = field(default_factory=dict)  # function keyword -> the GAGPOConfig field it takes
    # keyword -> the GAGPOConfig field it takes instead where its own field is negative ("auto": hgpo_history=-1)
    auto: Mapping[str, str] = field(default_factory=dict)
    # Every advantage is relative to the group's other episodes: a group of one gets 0 on every step, never learns.
    needs_group: bool = False
    # A learned value head: reads ``values``, returns unnormalised GAE (value targets A + V) that the buffer then
    # normalises over the whole batch; a saved agent keeps the head, so it never switches to an estimator without.
    needs_critic: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "config", MappingProxyType(dict(self.config)))
        object.__setattr__(self, "auto", MappingProxyType(dict(self.auto)))
        params = inspect.signature(self.function).parameters
        problems = [f"{self.function.__name__} takes no {k!r}" for k in (*self.inputs, *self.config) if k not in params]
        problems += [f"{k!r} is not a per-row array (INPUTS)" for k in self.inputs if k not in INPUTS]
        problems += [f"auto {k!r} is not a config keyword" for k in self.auto if k not in self.config]
        if self.needs_critic != ("values" in self.inputs):
            problems.append("needs_critic and reading 'values' go together")
        if problems:
            raise ValueError(f"estimator {self.name!r}: " + "; ".join(problems))

    @property
    def needs_success(self) -> bool:
        """It reads which episodes reached the goal (``success``), not only their rewards."""
        return "success" in self.inputs

    @property
    def config_fields(self) -> tuple[str, ...]:
        """The GAGPOConfig fields it reads."""
        return tuple(dict.fromkeys((*self.config.values(), *self.auto.values())))

    def settings(self, config: Any) -> dict[str, Any]:
        """The function's keywords from ``config`` (a GAGPOConfig), each "auto" one resolved."""
        out = {keyword: getattr(config, name) for keyword, name in self.config.items()}
        for keyword, name in self.auto.items():
            if out[keyword] < 0:
                out[keyword] = getattr(config, name)
        return out

    def batch_normalized(self, config: Any) -> bool:
        """Standardised over the whole rollout once every group is in (``GroupRolloutBuffer.finalize``): always
        with a critic (the PPO baseline), and where a ``normalize`` keyword says ``"batch"`` (GAGPO's option)."""
        return self.needs_critic or self.settings(config).get("normalize") == "batch"


_STEP = ("rewards", "episode_index", "group_index", "state_keys")  # what the step-level estimators read

#: Every estimator the agent can train with, by name, in the order the command line and the docs list them.
REGISTRY: dict[str, Estimator] = {
    spec.name: spec
    for spec in (
        Estimator(
            "gagpo", gagpo_advantages,
            "GAGPO (the method): GAE over TD residuals of the group's mean return-to-go from each state",
            inputs=(*_STEP, "next_state_keys", "terminated", "backoff_keys"),
            config={"gamma": "gamma", "lam": "lam", "eps": "adv_eps", "normalize": "normalize",
                    "bootstrap_truncated": "bootstrap_truncated", "backoff_min_count": "backoff_min_count",
                    "episode_coef": "episode_coef"},
        ),
        Estimator(
            "gigpo", gigpo_advantages,
            "GiGPO: the episode's return against its group's, plus omega times the step's against its state's set",
            inputs=(*_STEP, "penalties"),
            config={"gamma": "gamma", "omega": "omega", "eps": "adv_eps", "std_norm": "gigpo_std_norm"},
        ),
        Estimator(
            "grpo", grpo_advantages, "GRPO: the episode's return standardised over its group's episodes",
            inputs=("rewards", "episode_index", "group_index"), config={"eps": "adv_eps"}, needs_group=True,
        ),
        Estimator(
            "rloo", rloo_advantages, "RLOO: the episode's return minus the mean of its group's other episodes",
            inputs=("rewards", "episode_index", "group_index"), needs_group=True,
        ),
        Estimator(
            "ppo", gae_advantages, "PPO with a critic: GAE on a learned value head, normalised over the batch",
            inputs=("rewards", "values", "episode_index", "terminated", "last_values"),
            config={"gamma": "gamma", "lam": "gae_lambda"}, needs_critic=True,
        ),
        Estimator(
            "hgpo", hgpo_advantages,
            "HGPO (2026): group-relative returns in a hierarchy of history groups, weighted by depth",
            inputs=(*_STEP, "penalties"),
            config={"gamma": "gamma", "history": "hgpo_history", "alpha": "hgpo_alpha", "std_norm": "hgpo_std_norm",
                    "base_group": "hgpo_base_group", "eps": "adv_eps"},
            auto={"history": "history_length"},
        ),
        Estimator(
            "graphgpo", graphgpo_advantages,
            "GraphGPO (2026): a step's return from its successor's distance to the goal in the group's graph",
            inputs=(*_STEP, "next_state_keys", "success", "penalties"),
            config={"graph_gamma": "graphgpo_gamma", "progress": "graphgpo_progress", "std_norm": "graphgpo_std_norm",
                    "step_coef": "omega", "episode_coef": "graphgpo_episode_coef", "eps": "adv_eps"},
        ),
        Estimator(
            "g2po", g2po_advantages,
            "G2PO (2026): the value of each state's group, its successor's value and the value gain",
            inputs=(*_STEP, "success", "penalties"),
            config={"gamma": "gamma", "std_norm": "g2po_std_norm", "step_coef": "omega", "eps": "adv_eps"},
        ),
        Estimator(
            "self_imitation", self_imitation_advantages,
            "Self-imitation (filtered BC, RL-free): 1 on each step of a successful episode, 0 elsewhere",
            inputs=("episode_index", "success", "penalties"),
        ),
    )
}  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# Episode-level helpers (used only by the estimators above)
# ---------------------------------------------------------------------------------------------------------


def _episode_returns(rewards: np.ndarray, episode_index: np.ndarray, group_index: np.ndarray):
    """Undiscounted return of each episode, its group, and each row's episode slot."""
    ep_id, n_eps = factorize(episode_index)
    ep_return = np.bincount(ep_id, weights=rewards, minlength=n_eps)
    ep_group = np.zeros(n_eps, dtype=group_index.dtype)
    ep_group[ep_id] = group_index
    return ep_return, ep_group, ep_id


def _grpo(rewards: np.ndarray, episode_index: np.ndarray, group_index: np.ndarray, eps: float) -> np.ndarray:
    """GRPO on validated arrays: each episode's standardised return within its group, on its rows."""
    ep_return, ep_group, ep_id = _episode_returns(rewards, episode_index, group_index)
    g_of_ep, _ = factorize(ep_group)
    return set_standardize(ep_return, g_of_ep, eps)[ep_id]


def _trainer_scores(rewards: np.ndarray, penalties: np.ndarray, episode_index, group_index, gamma: float):
    """Each row's episode score and return-to-go as verl-agent's trainer forms them.

    The trainer scores episodes and discounts returns on the env's rewards, which carry no penalty, and then
    (``apply_invalid_action_penalty``) subtracts the penalty from the invalid row's own score and return only:
    ``S_t = R(tau) + P(tau) - p_t`` and ``R_t + sum_k gamma^(k-t) p_k - p_t``, with P(tau) the episode's
    penalties. Without penalties they are R(tau) and R_t.
    """
    free = rewards + penalties
    ep_return, _, ep_id = _episode_returns(free, episode_index, group_index)
    return ep_return[ep_id] - penalties, backward_scan(free, gamma, episode_index) - penalties


def _episode_standardize(score: np.ndarray, episode_index, group_index, eps: float, *, scale: bool) -> np.ndarray:
    """Each row's score against its group's episodes, every episode one vote (GRPO's statistics).

    A row weighs 1 / (its episode's length), so the mean is over the episodes and the variance has n_episodes - 1
    degrees of freedom; with one score per episode this is GRPO, computed as GRPO is (the same rounding, so an
    all-equal group stays exactly 0). A group of one episode gets 0.
    """
    ep_id, n_eps = factorize(episode_index)
    gid, n_groups = factorize(group_index)
    per_episode = np.zeros(n_eps)
    per_episode[ep_id] = score
    if np.array_equal(per_episode[ep_id], score):
        g_of_ep = np.zeros(n_eps, dtype=np.int64)
        g_of_ep[ep_id] = gid
        return set_standardize(per_episode, g_of_ep, eps, scale=scale)[ep_id]
    weight = 1.0 / np.bincount(ep_id, minlength=n_eps)[ep_id]
    episodes = np.bincount(gid, weights=weight, minlength=n_groups)  # the group's episode count
    mean = np.bincount(gid, weights=weight * score, minlength=n_groups) / episodes
    centred = score - mean[gid]
    if scale:
        var = np.bincount(gid, weights=weight * centred**2, minlength=n_groups) / np.maximum(episodes - 1.0, 1.0)
        centred = centred / (np.sqrt(var)[gid] + eps)
    return np.where(episodes[gid] > 1.5, centred, 0.0)


# ---------------------------------------------------------------------------------------------------------
# Helpers of the 2026 estimators (HGPO, GraphGPO, G2PO)
# ---------------------------------------------------------------------------------------------------------


def _check_int(name: str, value, *, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def _check_real(name: str, value, *, low: float, high: float = np.inf, open_low: bool = False) -> None:
    ok = not isinstance(value, bool) and isinstance(value, Real) and np.isfinite(value) and value <= high
    if not ok or value < low or (open_low and value == low):
        bounds = f"{'(' if open_low else '['}{low:g}, {high:g}]"
        raise ValueError(f"{name} must be a number in {bounds}, got {value!r}")


def _state_and_next(state_keys, next_state_keys) -> tuple[np.ndarray, np.ndarray]:
    s = as_keys(state_keys, "state_keys")
    s_next = as_keys(next_state_keys, "next_state_keys")
    if (s.dtype.kind == "i") != (s_next.dtype.kind == "i"):
        raise ValueError("state_keys and next_state_keys must both be int64 hashes or both be strings")
    return s, s_next


def _final_flags(flags, episode_index: np.ndarray, name: str) -> np.ndarray:
    """A per-row bool that may be True only on an episode's final row."""
    out = np.asarray(flags, dtype=bool)
    is_last, _, _ = episode_bounds(episode_index)
    if np.any(out & ~is_last):
        raise ValueError(f"{name} is True on a row that is not the final row of its episode")
    return out


def _penalties(penalties, n: int) -> np.ndarray:
    if penalties is None:
        return np.zeros(n)
    out = np.asarray(penalties, dtype=np.float64)
    if out.shape != (n,) or not np.all(np.isfinite(out)):
        raise ValueError(f"penalties must be {n} finite numbers (one per row)")
    return out


def _positions(episode_index: np.ndarray) -> np.ndarray:
    """Each row's step number inside its episode (0 on the first row)."""
    rows = np.arange(episode_index.size)
    start = np.r_[True, episode_index[1:] != episode_index[:-1]]
    return rows - np.maximum.accumulate(np.where(start, rows, 0))


def _group_relative(values: np.ndarray, set_id: np.ndarray, n_sets: int, *, ddof: int, std_norm: bool, eps: float):
    """(x - mean_set) [/ (std_set + eps)] and which rows carry a non-zero value (a set of one row carries none)."""
    mean, count = set_means(set_id, values, n_sets)
    centred = values - mean[set_id]
    rms = np.sqrt(np.bincount(set_id, weights=values**2, minlength=n_sets) / np.maximum(count, 1.0))
    keep = (count[set_id] > 1) & (np.abs(centred) > ZERO_TOL * rms[set_id])
    if std_norm:
        sq = np.bincount(set_id, weights=centred**2, minlength=n_sets)
        centred = centred / (np.sqrt(sq / np.maximum(count - ddof, 1.0))[set_id] + eps)
    return centred, keep


def _distances_to(goals: np.ndarray, source: np.ndarray, target: np.ndarray, n_nodes: int) -> np.ndarray:
    """Shortest number of edges source -> target from every node to its nearest goal (inf: no path).

    Breadth-first search backwards: each round takes the edges into the frontier, so each edge is read once.
    """
    order = np.argsort(target, kind="stable")
    first_in = np.searchsorted(target[order], np.arange(n_nodes + 1))
    d = np.full(n_nodes, np.inf)
    d[goals] = 0.0
    frontier, level = goals, 0.0
    while frontier.size:
        lo, count = first_in[frontier], first_in[frontier + 1] - first_in[frontier]
        edge = np.repeat(lo - np.cumsum(count) + count, count) + np.arange(count.sum())
        parents = np.unique(source[order[edge]])
        frontier = parents[np.isinf(d[parents])]
        level += 1.0
        d[frontier] = level
    return d
