"""Time the advantage estimators of ``agents/advantages.py`` on synthetic rollouts of 1e4-1e6 rows.

The data look like a real batch: groups of 8 episodes of 5-50 steps in shuffled order, int64 state keys
drawn from a per-group pool so that most rows share their (group, state) set with other rows, occasional
-0.1 penalties, success rewards on terminated episodes and truncated episodes that can bootstrap. Also
times str keys (about 56 characters, like a canonical state string) at 1e5 and 1e6 rows and the slow
reference of ``tests/reference_advantages.py`` at 1e4 rows.

    python -m lab.bench.advantages [--sizes 10000 100000 1000000] [--str-sizes 100000 1000000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np

from agents.advantages import (
    discounted_returns,
    g2po_advantages,
    gae_advantages,
    gagpo_advantages,
    gigpo_advantages,
    graphgpo_advantages,
    grpo_advantages,
    hgpo_advantages,
    rloo_advantages,
    step_group_stats,
)

ROOT = Path(__file__).resolve().parents[2]


def _reference_module() -> ModuleType:
    """tests/reference_advantages.py, the loop-per-row reference implementations, loaded from its file (tests/ is
    no package)."""
    spec = importlib.util.spec_from_file_location("reference_advantages", ROOT / "tests" / "reference_advantages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ref = _reference_module()
GROUP_SIZE = 8
MIN_LEN, MAX_LEN = 5, 50
POOL_PER_ROW = 1.0  # distinct states per group, relative to the group's rows
TARGET_GAGPO_1M_S = {"int64": 0.25, "str": 0.5}


def synthetic_batch(n_rows: int, *, str_keys: bool = False, seed: int = 0) -> dict[str, np.ndarray]:
    """A rollout batch of exactly ``n_rows`` rows (the last episode is cut short)."""
    rng = np.random.default_rng(seed)
    n_groups = int(1.2 * n_rows / (GROUP_SIZE * (MIN_LEN + MAX_LEN) / 2)) + 1
    lengths = rng.integers(MIN_LEN, MAX_LEN + 1, size=n_groups * GROUP_SIZE)
    group_of_ep = np.repeat(np.arange(n_groups), GROUP_SIZE)
    keep = np.searchsorted(np.cumsum(lengths), n_rows) + 1
    lengths, group_of_ep = lengths[:keep], group_of_ep[:keep]
    lengths[-1] -= lengths.sum() - n_rows
    group_rows = np.bincount(group_of_ep, weights=lengths)
    # Episodes of different groups interleave, as when a vector env's slots finish at different times.
    order = rng.permutation(keep)
    lengths, group_of_ep = lengths[order], group_of_ep[order]

    group = np.repeat(group_of_ep, lengths)
    episode = np.repeat(rng.choice(2**40, size=keep, replace=False), lengths)
    # States: a per-group pool, skewed towards the first (start-like) states, which every episode revisits.
    pool = np.maximum(1, (POOL_PER_ROW * group_rows[group]).astype(np.int64))
    state = (pool * rng.random(n_rows) ** 2).astype(np.int64)
    is_last = np.r_[episode[1:] != episode[:-1], True]
    terminated = is_last & (rng.random(n_rows) < 0.6)
    rewards = np.where(rng.random(n_rows) < 0.1, -0.1, 0.0) + np.where(terminated, 1.0, 0.0)
    next_state = np.r_[state[1:], 0]
    next_state[is_last] = (pool * rng.random(n_rows) ** 2).astype(np.int64)[is_last]

    group_ids = rng.choice(2**62, size=n_groups, replace=False) - 2**61
    if str_keys:
        text = "task{}|location: room {}|holding: nothing|door: open".format
        keys = np.array([text(g, s) for g, s in zip(group, state, strict=True)], dtype=object)
        next_keys = np.array([text(g, s) for g, s in zip(group, next_state, strict=True)], dtype=object)
    else:
        mix = np.uint64(0x9E3779B97F4A7C15)
        keys = ((group.astype(np.uint64) << np.uint64(32)) + state.astype(np.uint64)) * mix
        next_keys = ((group.astype(np.uint64) << np.uint64(32)) + next_state.astype(np.uint64)) * mix
        keys, next_keys = keys.view(np.int64), next_keys.view(np.int64)
    return {
        "rewards": rewards,
        "episode_index": episode,
        "group_index": group_ids[group],
        "state_keys": keys,
        "next_state_keys": next_keys,
        "terminated": terminated,
        "success": terminated,  # a terminated episode ends with the success reward
        "values": rng.normal(size=n_rows),
    }


def as_calls(fns: dict[str, Callable]) -> dict[str, Callable[[dict], object]]:
    """Each estimator as a call on a batch; ``fns`` maps estimator names to functions with the same arguments."""
    arguments = {
        "gagpo": ("rewards", "episode_index", "group_index", "state_keys", "next_state_keys", "terminated"),
        "gigpo": ("rewards", "episode_index", "group_index", "state_keys"),
        "grpo": ("rewards", "episode_index", "group_index"),
        "rloo": ("rewards", "episode_index", "group_index"),
        "hgpo": ("rewards", "episode_index", "group_index", "state_keys"),
        "graphgpo": ("rewards", "episode_index", "group_index", "state_keys", "next_state_keys", "success"),
        "g2po": ("rewards", "episode_index", "group_index", "state_keys", "success"),
        "gae": ("rewards", "values", "episode_index", "terminated"),
        "discounted_returns": ("rewards", "episode_index"),
        "step_group_stats": ("group_index", "state_keys"),
    }
    return {name: (lambda b, f=f, a=arguments[name]: f(*(b[k] for k in a))) for name, f in fns.items()}


FAST = as_calls(
    {
        "gagpo": gagpo_advantages,
        "gigpo": gigpo_advantages,
        "grpo": grpo_advantages,
        "rloo": rloo_advantages,
        "hgpo": hgpo_advantages,
        "graphgpo": graphgpo_advantages,
        "g2po": g2po_advantages,
        "gae": gae_advantages,
        "discounted_returns": discounted_returns,
        "step_group_stats": step_group_stats,
    }
)
SLOW = as_calls(
    {
        "gagpo": ref.ref_gagpo,
        "gigpo": ref.ref_gigpo,
        "grpo": ref.ref_grpo,
        "rloo": ref.ref_rloo,
        "gae": ref.ref_gae,
        "discounted_returns": ref.ref_discounted_returns,
        "step_group_stats": ref.ref_step_group_stats,
    }
)


def median_time(fn: Callable[[dict], object], batch: dict, repeats: int) -> float:
    """Median wall time of ``repeats`` calls, after one warm-up call."""
    fn(batch)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(batch)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def environment_line() -> str:
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    threads = {
        k: os.environ[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS") if k in os.environ
    }
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"Python {platform.python_version()}, numpy {np.__version__}, BLAS {blas.get('name')} "
        f"{blas.get('version')}, usable cores {cores}, thread env {threads or 'unset'} "
        "(the estimators use sorts and bincounts, which run on one thread)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--str-sizes", type=int, nargs="*", default=[100_000, 1_000_000], help="rows of str-key runs")
    parser.add_argument("--ref-size", type=int, default=10_000, help="rows of the slow-reference run (0: skip)")
    args = parser.parse_args()
    print(environment_line(), end="\n\n")

    runs = [(n, False) for n in args.sizes] + [(n, True) for n in args.str_sizes]
    results: dict[tuple[int, bool], dict[str, float]] = {}
    print("| rows | keys | singleton rows | (group, state) sets | mean set size |")
    print("|---:|---|---:|---:|---:|")
    for n, str_keys in runs:
        batch = synthetic_batch(n, str_keys=str_keys)
        stats = step_group_stats(batch["group_index"], batch["state_keys"])
        print(f"| {n:,} | {'str' if str_keys else 'int64'} | {stats['singleton_row_share']:.1%} | "
              f"{stats['sets']:,} | {stats['set_size_mean']:.2f} |")  # fmt: skip
        repeats = max(3, args.repeats if n <= 100_000 else args.repeats // 2)
        results[(n, str_keys)] = {name: median_time(fn, batch, repeats) for name, fn in FAST.items()}

    print("\nMedian time per call (ms) and rows/s:\n")
    header = [f"{n:,} {'str (object array)' if s else 'int64'}" for n, s in runs]
    print("| estimator | " + " | ".join(header) + " |")
    print("|---|" + "---:|" * len(runs))
    for name in FAST:
        cells = [f"{results[run][name] * 1e3:.1f} ms ({run[0] / results[run][name] / 1e6:.1f} M/s)" for run in runs]
        print(f"| {name} | " + " | ".join(cells) + " |")

    if args.ref_size:
        batch = synthetic_batch(args.ref_size)
        print(f"\nSlow reference (tests/reference_advantages.py) at {args.ref_size:,} int64 rows:\n")
        print("| estimator | reference | vectorised | speed-up |")
        print("|---|---:|---:|---:|")
        for name, slow in SLOW.items():
            t_ref = median_time(slow, batch, 1)
            t_fast = median_time(FAST[name], batch, args.repeats)
            print(f"| {name} | {t_ref * 1e3:.1f} ms | {t_fast * 1e3:.2f} ms | {t_ref / t_fast:.0f}x |")

    print()
    for str_keys in (False, True):
        if (1_000_000, str_keys) in results:
            kind = "str" if str_keys else "int64"
            t, target = results[(1_000_000, str_keys)]["gagpo"], TARGET_GAGPO_1M_S[kind]
            print(f"GAGPO on 1M {kind} rows: {t:.3f} s ({'meets' if t <= target else 'MISSES'} the {target} s target)")


if __name__ == "__main__":
    main()
