"""Advantage estimators for grouped multi-turn rollouts: GAGPO and its baselines.

Each function is a pure numpy function of flat per-step arrays (one row = one environment step = one LLM
action) and follows ``shared/docs/ALGORITHM.md`` line by line. No torch, no env knowledge, no Python loop
over rows: the only Python loops run over episode positions (at most the longest episode) and back-off levels,
and the cost is O(N log N) from sorting one 64-bit hash per (group, key) pair.

Data layout (length-N arrays):
    rewards          float  reward of this step's action (penalties included)
    episode_index    int    episode id; an episode's rows are contiguous and in time order
    group_index      int    rollout group id (the episodes sampled for one task)
    state_keys       int64 or str   canonical key of the state the action was taken from
    next_state_keys  int64 or str   key of the state reached after the action
    terminated       bool   True only on the final row of an episode that ended in a terminal state
    backoff_keys     L arrays of int64 or str   coarser keys of the same state, finest first (key back-off)
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral, Real
from typing import Literal

import numpy as np

Normalize = Literal["group", "batch", "none"]
_HASH_CHUNK = 16384  # str keys hashed per matmul in _key_hash (about 7 MB of uint64 at 55 characters)

__all__ = [
    "discounted_returns",
    "gae_advantages",
    "gagpo_advantages",
    "gigpo_advantages",
    "grpo_advantages",
    "normalize_advantages",
    "rloo_advantages",
    "step_group_stats",
]


# ---------------------------------------------------------------------------------------------------------
# Input checks and small vectorised building blocks
# ---------------------------------------------------------------------------------------------------------


def _as_keys(keys: np.ndarray | list, name: str) -> np.ndarray:
    """Keys as an int64 array or an array of str (unicode, or object holding only str; never re-encoded)."""
    arr = np.asarray(keys)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64, copy=False)
    if arr.dtype.kind == "U" and isinstance(keys, np.ndarray):
        return arr
    if arr.dtype.kind in "UO":
        # numpy silently turns a list like ["a", 1] into strings, so every key must already be a str.
        if not all(issubclass(kind, str) for kind in set(map(type, keys))):
            raise ValueError(f"{name} mixes strings with other values: keys must be all int64 or all str")
        return arr
    raise ValueError(f"{name} must hold int64 hashes or strings, got dtype {arr.dtype}")


def _backoff_levels(backoff_keys, min_count: int, n: int) -> list[np.ndarray]:
    """The back-off levels as key arrays of length n (a sequence of arrays, not one array of keys)."""
    if isinstance(min_count, bool) or not isinstance(min_count, Integral) or min_count < 1:
        raise ValueError(f"backoff_min_count must be an int >= 1, got {min_count!r}")
    if isinstance(backoff_keys, np.ndarray) and backoff_keys.ndim == 1:
        raise ValueError("backoff_keys must be a sequence of key arrays, one per level (got one array of keys)")
    levels = [_as_keys(keys, f"backoff_keys[{i}]") for i, keys in enumerate(backoff_keys)]
    for i, keys in enumerate(levels):
        if keys.size != n:
            raise ValueError(f"backoff_keys[{i}] has length {keys.size}, expected {n} (the length of rewards)")
    return levels


def _check_layout(rewards, episode_index, group_index=None, **others) -> tuple[np.ndarray, ...]:
    """Validate lengths, dtypes and the contiguous-episode layout; return the arrays as numpy."""
    r = np.asarray(rewards, dtype=np.float64)
    ep = np.asarray(episode_index)
    if r.ndim != 1:
        raise ValueError(f"rewards must be 1-D, got shape {r.shape}")
    n = r.shape[0]
    if not np.all(np.isfinite(r)):
        raise ValueError("rewards contain NaN or infinite values")
    if ep.shape != (n,) or ep.dtype.kind not in "iu":
        raise ValueError(f"episode_index must be an integer array of length {n}, got {ep.dtype} {ep.shape}")
    grp = None
    if group_index is not None:
        grp = np.asarray(group_index)
        if grp.shape != (n,) or grp.dtype.kind not in "iu":
            raise ValueError(f"group_index must be an integer array of length {n}, got {grp.dtype} {grp.shape}")
    for name, arr in others.items():
        if len(arr) != n:
            raise ValueError(f"{name} has length {len(arr)}, expected {n} (the length of rewards)")
    if n:
        starts = np.flatnonzero(np.r_[True, ep[1:] != ep[:-1]])
        if np.unique(ep[starts]).size != starts.size:
            raise ValueError("episode_index: an episode's rows must be contiguous (an episode id reappears later)")
        if grp is not None and np.any((ep[1:] == ep[:-1]) & (grp[1:] != grp[:-1])):
            raise ValueError("group_index changes inside an episode: every row of an episode needs the same group")
    return r, ep, grp


def _episode_bounds(episode_index: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: is it the final row of its episode; per episode (in row order): its final row and length."""
    n = episode_index.shape[0]
    is_last = np.r_[episode_index[1:] != episode_index[:-1], True] if n else np.zeros(0, bool)
    last_row = np.flatnonzero(is_last)
    return is_last, last_row, np.diff(last_row, prepend=-1)


def _backward_scan(x: np.ndarray, decay: float, episode_index: np.ndarray) -> np.ndarray:
    """y_t = x_t + decay * y_{t+1} inside each episode, y = x on an episode's final row.

    Step q of the Python loop updates the row q steps before the end of every episode longer than q, so the
    loop runs over episode positions (at most the longest episode), not rows; row t+1 is the next step
    because episodes are contiguous.
    """
    y = x.astype(np.float64, copy=True)
    if y.size == 0:
        return y
    _, last_row, length = _episode_bounds(episode_index)
    longest_first = np.argsort(-length, kind="stable")  # the episodes longer than q are then a prefix
    last_row, neg_length = last_row[longest_first], -length[longest_first]
    for q in range(1, length.max()):
        rows = last_row[: np.searchsorted(neg_length, -q)] - q
        y[rows] += decay * y[rows + 1]
    return y


def _factorize(*arrays: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense ids 0..K-1 for the values of the concatenated arrays (same value -> same id).

    Only the first value of each run of equal values is sorted, which makes ids that come in runs (groups,
    episodes) cheap.
    """
    values = np.concatenate(arrays) if len(arrays) > 1 else arrays[0]
    if values.size == 0:
        return np.zeros(0, dtype=np.int64), 0
    run_start = np.flatnonzero(np.r_[True, values[1:] != values[:-1]])
    uniq, run_id = np.unique(values[run_start], return_inverse=True)
    return np.repeat(run_id.reshape(-1), np.diff(run_start, append=values.size)), uniq.size


def _set_means(set_id: np.ndarray, values: np.ndarray, n_sets: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean of ``values`` and row count for each set id."""
    count = np.bincount(set_id, minlength=n_sets).astype(np.float64)
    total = np.bincount(set_id, weights=values, minlength=n_sets)
    return total / np.maximum(count, 1.0), count


def _set_standardize(values: np.ndarray, set_id: np.ndarray, eps: float, *, scale: bool = True) -> np.ndarray:
    """(x - mean_set) / (std_set + eps) with ddof=1 (or x - mean_set); a single-member set gives 0."""
    if values.size == 0:
        return values.astype(np.float64)
    n_sets = int(set_id.max()) + 1
    mean, count = _set_means(set_id, values, n_sets)
    centred = values - mean[set_id]
    if scale:
        sq = np.bincount(set_id, weights=centred**2, minlength=n_sets)
        std = np.sqrt(sq / np.maximum(count - 1.0, 1.0))
        centred = centred / (std[set_id] + eps)
    return np.where(count[set_id] > 1, centred, 0.0)


def _key_hash(keys: np.ndarray) -> np.ndarray:
    """One uint64 per key: an int64 key itself; for str keys, the code points dotted with fixed odd weights
    (unicode arrays: padding adds 0, so widths agree) or Python's hash (object arrays).

    Python salts str hashes per process, which is harmless here: a hash only serves to find equal keys within
    one call, and every match is checked (``_pair_ids``).
    """
    if keys.dtype.kind == "i":
        return keys.view(np.uint64)
    if keys.dtype.kind == "O":
        return np.fromiter(map(hash, keys), dtype=np.int64, count=keys.size).view(np.uint64)
    width = keys.dtype.itemsize // 4
    code_points = np.ascontiguousarray(keys).view(np.uint32).reshape(keys.size, width)
    weights = _mix(np.arange(1, width + 1, dtype=np.uint64)) | np.uint64(1)
    out = np.empty(keys.size, dtype=np.uint64)
    for start in range(0, keys.size, _HASH_CHUNK):  # chunks bound the uint64 copy of the code points
        out[start : start + _HASH_CHUNK] = code_points[start : start + _HASH_CHUNK].astype(np.uint64) @ weights
    return out


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: spreads nearby integers (group ids) over all 64 bits."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _pair_ids(group_index: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense ids 0..K-1 of the (group, key) pairs: same pair -> same id, different pairs -> different ids.

    Sorts one 64-bit hash per pair instead of the keys (sorting str keys as text is slow). Hashes can collide,
    so every row's key is compared with the key of a representative row of its id (comparing keys suffices:
    with equal keys, equal hashes mean equal groups, as ``_mix`` is a bijection); after a collision the pairs
    are factorised exactly by sorting the keys themselves.
    """
    code = _key_hash(keys) ^ _mix(group_index.astype(np.uint64))
    uniq, ids = np.unique(code, return_inverse=True)
    ids = ids.reshape(-1)
    rows = np.arange(ids.size)
    representative = np.empty(uniq.size, dtype=np.int64)
    representative[ids] = rows
    same_as = representative[ids]
    others = rows[same_as != rows]  # a representative matches itself
    if np.all(keys[others] == keys[same_as[others]]):
        return ids, uniq.size
    gid, _ = _factorize(group_index)
    kid, n_keys = _factorize(keys)
    uniq, ids = np.unique(gid * n_keys + kid, return_inverse=True)
    return ids.reshape(-1), uniq.size


def _resolve_backoff(
    group_index: np.ndarray, set_id: np.ndarray, levels: list[np.ndarray], min_count: int
) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, int]]]:
    """Key back-off (ALGORITHM.md): the level whose set gives each row its value.

    Level 0 when the row's (group, state) set ``set_id`` has at least ``min_count`` rows, else the first level
    l = 1..L whose (group, key_l) set has; rows no level resolves keep level 0 and are flagged ``unresolved``.
    Also returns each level's (set ids, number of sets).
    """
    level_of_row = np.zeros(set_id.size, dtype=np.int64)
    unresolved = np.bincount(set_id)[set_id] < min_count
    level_sets = []
    for level, keys in enumerate(levels, start=1):
        ids, n_sets = _pair_ids(group_index, keys)
        take = unresolved & (np.bincount(ids, minlength=n_sets)[ids] >= min_count)
        level_of_row[take] = level
        unresolved &= ~take
        level_sets.append((ids, n_sets))
    return level_of_row, unresolved, level_sets


def _episode_returns(rewards: np.ndarray, episode_index: np.ndarray, group_index: np.ndarray):
    """Undiscounted return of each episode, its group, and each row's episode slot."""
    ep_id, n_eps = _factorize(episode_index)
    ep_return = np.bincount(ep_id, weights=rewards, minlength=n_eps)
    ep_group = np.zeros(n_eps, dtype=group_index.dtype)
    ep_group[ep_id] = group_index
    return ep_return, ep_group, ep_id


def _grpo(rewards: np.ndarray, episode_index: np.ndarray, group_index: np.ndarray, eps: float) -> np.ndarray:
    """GRPO on validated arrays: each episode's standardised return within its group, on its rows."""
    ep_return, ep_group, ep_id = _episode_returns(rewards, episode_index, group_index)
    g_of_ep, _ = _factorize(ep_group)
    return _set_standardize(ep_return, g_of_ep, eps)[ep_id]


# ---------------------------------------------------------------------------------------------------------
# Public estimators
# ---------------------------------------------------------------------------------------------------------


def discounted_returns(rewards, episode_index, *, gamma: float = 0.95) -> np.ndarray:
    """R_t = r_t + gamma * R_{t+1} inside each episode, with R = 0 after the final row (no bootstrap)."""
    r, ep, _ = _check_layout(rewards, episode_index)
    return _backward_scan(r, gamma, ep)


def normalize_advantages(advantages, group_index=None, *, mode: Normalize = "group", eps: float = 1e-6) -> np.ndarray:
    """A <- (A - mean_B) / (std_B + eps) over each set B (a rollout group, or the whole batch).

    Step-weighted (every row counts once), std with ddof=1; a set with a single row gets 0.
    """
    adv = np.asarray(advantages, dtype=np.float64)
    if mode == "none":
        return adv.copy()
    if mode == "batch":
        return _set_standardize(adv, np.zeros(adv.size, dtype=np.int64), eps)
    if mode == "group":
        if group_index is None:
            raise ValueError("normalize='group' needs group_index")
        gid, _ = _factorize(np.asarray(group_index))
        return _set_standardize(adv, gid, eps)
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
    """GAGPO: GAE over TD residuals of a non-parametric, grouped state-value proxy (ALGORITHM.md).

    ``backoff_keys`` (coarser keys, finest first) give rows whose (group, state) set has fewer than
    ``backoff_min_count`` rows the value of a coarser set (key back-off; none by default). ``episode_coef``
    adds that multiple of the GRPO advantage to the normalised result (0 by default, as the paper advises).
    """
    r, ep, grp = _check_layout(
        rewards, episode_index, group_index,
        state_keys=state_keys, next_state_keys=next_state_keys, terminated=terminated,
    )  # fmt: skip
    s = _as_keys(state_keys, "state_keys")
    s_next = _as_keys(next_state_keys, "next_state_keys")
    if (s.dtype.kind == "i") != (s_next.dtype.kind == "i"):
        raise ValueError("state_keys and next_state_keys must both be int64 hashes or both be strings")
    levels = _backoff_levels(backoff_keys, backoff_min_count, r.size)
    if isinstance(episode_coef, bool) or not isinstance(episode_coef, Real) or not np.isfinite(episode_coef):
        raise ValueError(f"episode_coef must be a finite number, got {episode_coef!r}")
    done = np.asarray(terminated, dtype=bool)
    is_last, _, _ = _episode_bounds(ep)
    if np.any(done & ~is_last):
        raise ValueError("terminated is True on a row that is not the final row of its episode")
    if r.size == 0:
        return r

    # 1. Discounted return-to-go inside each episode, no bootstrap.
    R = _backward_scan(r, gamma, ep)

    # 2. Grouped value proxy: Vbar(g, s) = mean of R_t over the rows of group g taken from state s.
    #    Truncated final rows' next keys are numbered with them so that step 3 can look them up.
    truncated = np.flatnonzero(is_last & ~done) if bootstrap_truncated else np.zeros(0, np.int64)
    pair_id, n_pairs = _pair_ids(np.concatenate([grp, grp[truncated]]), np.concatenate([s, s_next[truncated]]))
    set_id, next_set_id = pair_id[: r.size], pair_id[r.size :]
    vbar_set, count_set = _set_means(set_id, R, n_pairs)

    #    Key back-off: Vtilde = Vbar(g, s_t) if that set has at least m rows, else Vbar_l(g, key_l[t]) at the
    #    first level l whose set has, else Vbar(g, s_t) after all. No levels: Vtilde = Vbar.
    vtilde = vbar_set[set_id]
    level_of_row, _, level_sets = _resolve_backoff(grp, set_id, levels, backoff_min_count)
    for level, (ids, n_sets) in enumerate(level_sets, start=1):
        vbar_level, _ = _set_means(ids, R, n_sets)
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
    A = _backward_scan(delta, gamma * lam, ep)

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
) -> np.ndarray:
    """GiGPO: episode-level group advantage plus omega times a step-level (group, state) advantage."""
    r, ep, grp = _check_layout(rewards, episode_index, group_index, state_keys=state_keys)
    s = _as_keys(state_keys, "state_keys")
    if episode_stats not in ("episodes", "rows"):
        raise ValueError(f"episode_stats must be 'episodes' or 'rows', got {episode_stats!r}")
    if r.size == 0:
        return r

    # Episode term: each episode's return against the other episodes of its group.
    ep_return, ep_group, ep_id = _episode_returns(r, ep, grp)
    if episode_stats == "episodes":
        g_of_ep, _ = _factorize(ep_group)
        episode_term = _set_standardize(ep_return, g_of_ep, eps, scale=std_norm)[ep_id]
    else:  # verl-agent: statistics over rows, each row carrying its episode's return
        g_of_row, _ = _factorize(grp)
        episode_term = _set_standardize(ep_return[ep_id], g_of_row, eps, scale=std_norm)

    # Step term: discounted return-to-go against the other rows of the same (group, state) set.
    R = _backward_scan(r, gamma, ep)
    set_id, _ = _pair_ids(grp, s)
    step_term = _set_standardize(R, set_id, eps, scale=std_norm)
    return episode_term + omega * step_term


def grpo_advantages(rewards, episode_index, group_index, *, eps: float = 1e-6) -> np.ndarray:
    """GRPO: (R(tau) - mean) / (std + eps) over the episodes of a group, broadcast to the episode's rows."""
    r, ep, grp = _check_layout(rewards, episode_index, group_index)
    if r.size == 0:
        return r
    return _grpo(r, ep, grp, eps)


def rloo_advantages(rewards, episode_index, group_index) -> np.ndarray:
    """RLOO: R(tau_i) minus the mean return of the group's other episodes; 0 for a single-episode group."""
    r, ep, grp = _check_layout(rewards, episode_index, group_index)
    if r.size == 0:
        return r
    ep_return, ep_group, ep_id = _episode_returns(r, ep, grp)
    g_of_ep, n_groups = _factorize(ep_group)
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
    r, ep, _ = _check_layout(rewards, episode_index, values=values, terminated=terminated)
    v = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(v)):
        raise ValueError("values contain NaN or infinite values")
    done = np.asarray(terminated, dtype=bool)
    is_last, _, _ = _episode_bounds(ep)
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
    return _backward_scan(delta, gamma * lam, ep)


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
    s = _as_keys(state_keys, "state_keys")
    if grp.shape != s.shape:
        raise ValueError(f"group_index and state_keys differ in length: {grp.shape} vs {s.shape}")
    levels = _backoff_levels(backoff_keys, backoff_min_count, s.size)
    if s.size == 0:
        return {"rows": 0, "sets": 0, "singleton_row_share": 0.0, "singleton_set_share": 0.0,
                "set_size_mean": 0.0, "set_size_median": 0.0, "set_size_max": 0,
                "level_shares": [0.0] * (len(levels) + 1), "unresolved_share": 0.0}  # fmt: skip
    set_id, _ = _pair_ids(grp, s)
    sizes = np.bincount(set_id)
    level_of_row, unresolved, _ = _resolve_backoff(grp, set_id, levels, backoff_min_count)
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
