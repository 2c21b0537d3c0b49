"""The (group, state) sets the advantage estimators are built from, and the checks of their flat layout.

GAGPO, GiGPO and the rivals all compare a row with the other rows of a set: the rows of one rollout group taken
from one state key (or one coarser back-off key, or one episode). This module checks the per-step layout, turns
(group, key) pairs into dense set ids, takes per-set means and standardisation, and runs the backward scan inside
episodes. It is apart from ``agents/advantages.py`` so that the estimators read like ``docs/algorithm.md``; its
names are public because other modules and the tests use them. The layout is the one described at the top of
``agents/advantages.py``.
"""

from __future__ import annotations

from numbers import Integral

import numpy as np

HASH_CHUNK = 16384  # str keys hashed per matmul in key_hash (about 7 MB of uint64 at 55 characters)

__all__ = [
    "HASH_CHUNK",
    "as_keys",
    "backoff_levels",
    "backward_scan",
    "check_layout",
    "episode_bounds",
    "factorize",
    "key_hash",
    "mix",
    "pair_ids",
    "resolve_backoff",
    "set_means",
    "set_standardize",
]


def as_keys(keys: np.ndarray | list, name: str) -> np.ndarray:
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


def backoff_levels(backoff_keys, min_count: int, n: int) -> list[np.ndarray]:
    """The back-off levels as key arrays of length n (a sequence of arrays, not one array of keys)."""
    if isinstance(min_count, bool) or not isinstance(min_count, Integral) or min_count < 1:
        raise ValueError(f"backoff_min_count must be an int >= 1, got {min_count!r}")
    if isinstance(backoff_keys, np.ndarray) and backoff_keys.ndim == 1:
        raise ValueError("backoff_keys must be a sequence of key arrays, one per level (got one array of keys)")
    levels = [as_keys(keys, f"backoff_keys[{i}]") for i, keys in enumerate(backoff_keys)]
    for i, keys in enumerate(levels):
        if keys.size != n:
            raise ValueError(f"backoff_keys[{i}] has length {keys.size}, expected {n} (the length of rewards)")
    return levels


def check_layout(rewards, episode_index, group_index=None, **others) -> tuple[np.ndarray, ...]:
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


def episode_bounds(episode_index: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: is it the final row of its episode; per episode (in row order): its final row and length."""
    n = episode_index.shape[0]
    is_last = np.r_[episode_index[1:] != episode_index[:-1], True] if n else np.zeros(0, bool)
    last_row = np.flatnonzero(is_last)
    return is_last, last_row, np.diff(last_row, prepend=-1)


def backward_scan(x: np.ndarray, decay: float, episode_index: np.ndarray) -> np.ndarray:
    """y_t = x_t + decay * y_{t+1} inside each episode, y = x on an episode's final row.

    Step q of the Python loop updates the row q steps before the end of every episode longer than q, so the
    loop runs over episode positions (at most the longest episode), not rows; row t+1 is the next step
    because episodes are contiguous.
    """
    y = x.astype(np.float64, copy=True)
    if y.size == 0:
        return y
    _, last_row, length = episode_bounds(episode_index)
    longest_first = np.argsort(-length, kind="stable")  # the episodes longer than q are then a prefix
    last_row, neg_length = last_row[longest_first], -length[longest_first]
    for q in range(1, length.max()):
        rows = last_row[: np.searchsorted(neg_length, -q)] - q
        y[rows] += decay * y[rows + 1]
    return y


def factorize(*arrays: np.ndarray) -> tuple[np.ndarray, int]:
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


def set_means(set_id: np.ndarray, values: np.ndarray, n_sets: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean of ``values`` and row count for each set id."""
    count = np.bincount(set_id, minlength=n_sets).astype(np.float64)
    total = np.bincount(set_id, weights=values, minlength=n_sets)
    return total / np.maximum(count, 1.0), count


def set_standardize(values: np.ndarray, set_id: np.ndarray, eps: float, *, scale: bool = True) -> np.ndarray:
    """(x - mean_set) / (std_set + eps) with ddof=1 (or x - mean_set); a single-member set gives 0."""
    if values.size == 0:
        return values.astype(np.float64)
    n_sets = int(set_id.max()) + 1
    mean, count = set_means(set_id, values, n_sets)
    centred = values - mean[set_id]
    if scale:
        sq = np.bincount(set_id, weights=centred**2, minlength=n_sets)
        std = np.sqrt(sq / np.maximum(count - 1.0, 1.0))
        centred = centred / (std[set_id] + eps)
    return np.where(count[set_id] > 1, centred, 0.0)


def key_hash(keys: np.ndarray) -> np.ndarray:
    """One uint64 per key: an int64 key itself; for str keys, the code points dotted with fixed odd weights
    (unicode arrays: padding adds 0, so widths agree) or Python's hash (object arrays).

    Python salts str hashes per process, which is harmless here: a hash only serves to find equal keys within
    one call, and every match is checked (``pair_ids``).
    """
    if keys.dtype.kind == "i":
        return keys.view(np.uint64)
    if keys.dtype.kind == "O":
        return np.fromiter(map(hash, keys), dtype=np.int64, count=keys.size).view(np.uint64)
    width = keys.dtype.itemsize // 4
    code_points = np.ascontiguousarray(keys).view(np.uint32).reshape(keys.size, width)
    weights = mix(np.arange(1, width + 1, dtype=np.uint64)) | np.uint64(1)
    out = np.empty(keys.size, dtype=np.uint64)
    for start in range(0, keys.size, HASH_CHUNK):  # chunks bound the uint64 copy of the code points
        out[start : start + HASH_CHUNK] = code_points[start : start + HASH_CHUNK].astype(np.uint64) @ weights
    return out


def mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: spreads nearby integers (group ids) over all 64 bits."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def pair_ids(group_index: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense ids 0..K-1 of the (group, key) pairs: same pair -> same id, different pairs -> different ids.

    Sorts one 64-bit hash per pair instead of the keys (sorting str keys as text is slow). Hashes can collide,
    so every row's key is compared with the key of a representative row of its id (comparing keys suffices:
    with equal keys, equal hashes mean equal groups, as ``mix`` is a bijection); after a collision the pairs
    are factorised exactly by sorting the keys themselves.
    """
    code = key_hash(keys) ^ mix(group_index.astype(np.uint64))
    uniq, ids = np.unique(code, return_inverse=True)
    ids = ids.reshape(-1)
    rows = np.arange(ids.size)
    representative = np.empty(uniq.size, dtype=np.int64)
    representative[ids] = rows
    same_as = representative[ids]
    others = rows[same_as != rows]  # a representative matches itself
    if np.all(keys[others] == keys[same_as[others]]):
        return ids, uniq.size
    gid, _ = factorize(group_index)
    kid, n_keys = factorize(keys)
    uniq, ids = np.unique(gid * n_keys + kid, return_inverse=True)
    return ids.reshape(-1), uniq.size


def resolve_backoff(
    group_index: np.ndarray, set_id: np.ndarray, levels: list[np.ndarray], min_count: int
) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, int]]]:
    """Key back-off (docs/algorithm.md#key-back-off): the level whose set gives each row its value.

    Level 0 when the row's (group, state) set ``set_id`` has at least ``min_count`` rows, else the first level
    l = 1..L whose (group, key_l) set has; rows no level resolves keep level 0 and are flagged ``unresolved``.
    Also returns each level's (set ids, number of sets).
    """
    level_of_row = np.zeros(set_id.size, dtype=np.int64)
    unresolved = np.bincount(set_id)[set_id] < min_count
    level_sets = []
    for level, keys in enumerate(levels, start=1):
        ids, n_sets = pair_ids(group_index, keys)
        take = unresolved & (np.bincount(ids, minlength=n_sets)[ids] >= min_count)
        level_of_row[take] = level
        unresolved &= ~take
        level_sets.append((ids, n_sets))
    return level_of_row, unresolved, level_sets
