"""Fingerprint the numbers a checkout computes, to prove that a refactor or a speed change is exact.

Prints one line per entry, ``name  sha256-hex``, and nothing else on stdout (no times, no paths, nothing random):

* ``estimators/...``: every estimator of ``agents/advantages.py`` (GAGPO in several settings, with key back-off
  where the API has it, GiGPO, GRPO, RLOO, GAE, discounted returns, normalisation, the set statistics) on one
  seeded random layout of about 400 rows (several groups in shuffled order, episodes of 1-30 steps, repeated
  state keys, int64 and str keys, terminated and truncated episodes), hashed as float64 bytes;
* ``run_X/...``: three seeded CPU training runs (``learn(450)``, a few iterations each) hashed as every
  parameter tensor after training (the model and the value head, by sorted name, float32 bytes), every number
  logged per iteration except ``time/*`` (timings), the step counters and ``evaluate(n_tasks=6, episodes=True)``:
  ``run_a`` Maze, choose mode, GAGPO with KL and entropy terms; ``run_b`` FrozenLake, generate mode, PPO with a
  value head; ``run_c`` Maze, GAGPO with key back-off ``("observation", "group")``.

Only the public API is used (``agents.GAGPOAgent``, ``agents.GAGPOConfig``, ``agents.advantages``, SB3's logger),
so this file runs unchanged against older checkouts, where it does not exist. ``agents``, ``wrappers`` and
``gagpo_gym`` are imported from ``sys.path``, never from beside this file, so ``PYTHONPATH`` picks the checkout
that is measured (this file's own checkout is only the last resort, when nothing on the path provides them).
The checkout used is named on stderr, with the time of each part. (Check a path with this script, not with
``python -c "import agents"`` run from a checkout's root: there the current folder comes before ``PYTHONPATH``.)
Compare two commits like this::

    git worktree add /tmp/base <commit>
    PYTHONPATH=/tmp/base .venv/bin/python lab/bench/fingerprint.py --out /tmp/fp_base.txt
    PYTHONPATH=. .venv/bin/python lab/bench/fingerprint.py --out /tmp/fp_new.txt
    diff /tmp/fp_base.txt /tmp/fp_new.txt && echo identical
    git worktree remove --force /tmp/base

    python lab/bench/fingerprint.py [--only estimators|runs] [--out FILE]

An entry that an older API cannot compute (a keyword it lacks) prints ``n/a`` instead of a hash, so the diff shows
it. On one core the whole script takes about 40 s: the runs 10-15 s each, ``--only estimators`` a few seconds
(mostly importing torch).
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from checkouts import Recorder, log_to, package_root

UNSUPPORTED = "n/a"


def locate_checkout() -> Path:
    """The checkout whose packages are imported: the first on ``sys.path`` (``PYTHONPATH`` first of all, then the
    installed package). All three packages must come from the same folder: a mix would fingerprint no commit at all.
    """
    return package_root("fingerprint")


# ---------------------------------------------------------------------------------------------------------
# Hashing
# ---------------------------------------------------------------------------------------------------------


def digest_arrays(*arrays: Any) -> str:
    """SHA-256 of float64 arrays (shape and bytes of each)."""
    import numpy as np

    h = hashlib.sha256()
    for arr in arrays:
        a = np.ascontiguousarray(np.asarray(arr, dtype=np.float64))
        h.update(repr(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def jsonable(value: Any) -> Any:
    """numpy scalars and arrays, tuples and tensors as plain JSON values (floats keep every bit through repr)."""
    import numpy as np

    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "detach"):  # a torch tensor
        return jsonable(value.detach().cpu().tolist())
    return value


def digest_json(value: Any) -> str:
    text = json.dumps(jsonable(value), sort_keys=True, allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


def digest_tensors(named: dict[str, Any]) -> str:
    """SHA-256 over tensors in sorted name order: name, shape and bytes (floating tensors as float32)."""
    import torch

    h = hashlib.sha256()
    for name in sorted(named):
        t = named[name].detach().cpu().contiguous()
        if t.is_floating_point():
            t = t.to(torch.float32)
        h.update(f"{name}\0{tuple(t.shape)}\0{t.dtype}\0".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def accepts(fn: Callable, *names: str) -> bool:
    params = inspect.signature(fn).parameters
    return all(n in params for n in names)


# ---------------------------------------------------------------------------------------------------------
# 1. Estimators on one seeded layout
# ---------------------------------------------------------------------------------------------------------


def make_layout(seed: int = 20240601) -> dict[str, Any]:
    """About 400 rows: 6 groups (unsorted, non-contiguous ids) of 3-6 episodes of 1-30 steps, in shuffled order.

    Keys come from a small per-group pool plus a pool shared by all groups, so (group, state) sets repeat inside
    and across episodes; the final next key of a truncated episode is sometimes a key the group acted from
    (bootstrappable) and sometimes a fresh one.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    shared = rng.integers(-(2**62), 2**62, size=4)
    episodes = []
    next_id = 0
    for g in (7, -3, 1000, 42, 5, 2**40):
        pool = np.concatenate([shared, rng.integers(-(2**62), 2**62, size=int(rng.integers(2, 7)))])
        for _ in range(int(rng.integers(3, 7))):
            n = int(rng.integers(1, 31))
            keys = rng.choice(pool, size=n)
            terminated = bool(rng.random() < 0.5)
            rewards = np.where(rng.random(n) < 0.2, -0.01, 0.0)
            if terminated:
                rewards[-1] += float(rng.choice([1.0, 10.0, 0.5]))
            final_next = rng.choice(pool) if rng.random() < 0.6 else rng.integers(-(2**62), 2**62)
            episodes.append((next_id * 7 - 50, g, keys, rewards, terminated, final_next))
            next_id += 1
    order = rng.permutation(len(episodes))
    cols: dict[str, list] = {k: [] for k in ("rewards", "episode_index", "group_index", "state", "next", "done")}
    for i in order:
        ep, g, keys, rewards, terminated, final_next = episodes[i]
        n = len(keys)
        cols["rewards"] += rewards.tolist()
        cols["episode_index"] += [ep] * n
        cols["group_index"] += [g] * n
        cols["state"] += keys.tolist()
        cols["next"] += keys[1:].tolist() + [int(final_next)]
        cols["done"] += [False] * (n - 1) + [terminated]
    state = np.array(cols["state"], dtype=np.int64)
    next_state = np.array(cols["next"], dtype=np.int64)
    n_rows = state.size
    return {
        "rewards": np.array(cols["rewards"], dtype=np.float64),
        "episode_index": np.array(cols["episode_index"], dtype=np.int64),
        "group_index": np.array(cols["group_index"], dtype=np.int64),
        "state_keys": state,
        "next_state_keys": next_state,
        "terminated": np.array(cols["done"], dtype=bool),
        "str_state_keys": np.array([f"s:{k % 1000:03d}" for k in state.tolist()]),
        "str_next_state_keys": np.array([f"s:{k % 1000:03d}" for k in next_state.tolist()]),
        # back-off levels, finest first: a coarser hash (a few states share it), then one key per group
        "backoff": [state % 3, np.zeros(n_rows, dtype=np.int64)],
        "str_backoff": [np.array([f"c{k % 3}" for k in state.tolist()]), np.array(["g"] * n_rows)],
        "values": rng.normal(size=n_rows),
        "last_values": rng.normal(size=n_rows),
    }


def estimator_entries() -> list[tuple[str, str]]:
    import numpy as np

    from agents import advantages as adv

    d = make_layout()
    r, ep, grp, done = d["rewards"], d["episode_index"], d["group_index"], d["terminated"]
    s, s_next = d["state_keys"], d["next_state_keys"]
    s_str, s_next_str = d["str_state_keys"], d["str_next_state_keys"]
    out: list[tuple[str, str]] = [
        ("estimators/layout", digest_arrays(r, ep, grp, s, s_next, done, d["values"], d["last_values"])),
        ("estimators/layout_str_keys", digest_json([s_str.tolist(), s_next_str.tolist()])),
    ]

    def entry(name: str, fn_name: str, *args: Any, **kwargs: Any) -> None:
        fn = getattr(adv, fn_name, None)
        if fn is None or not accepts(fn, *kwargs):
            out.append((f"estimators/{name}", UNSUPPORTED))
            return
        result = fn(*args, **kwargs)
        out.append((f"estimators/{name}", digest_json(result) if isinstance(result, dict) else digest_arrays(result)))

    gagpo = (r, ep, grp, s, s_next, done)
    gagpo_str = (r, ep, grp, s_str, s_next_str, done)
    entry("gagpo", "gagpo_advantages", *gagpo)
    entry("gagpo_str_keys", "gagpo_advantages", *gagpo_str)
    entry("gagpo_object_keys", "gagpo_advantages", r, ep, grp, s_str.astype(object), s_next_str.astype(object), done)
    entry("gagpo_g0.9_lam0.5", "gagpo_advantages", *gagpo, gamma=0.9, lam=0.5)
    entry("gagpo_lam1", "gagpo_advantages", *gagpo, lam=1.0)
    entry("gagpo_normalize_batch", "gagpo_advantages", *gagpo, normalize="batch")
    entry("gagpo_normalize_none", "gagpo_advantages", *gagpo, normalize="none")
    entry("gagpo_no_bootstrap", "gagpo_advantages", *gagpo, bootstrap_truncated=False)
    entry("gagpo_eps1e-2", "gagpo_advantages", *gagpo, eps=1e-2)
    entry("gagpo_episode_coef", "gagpo_advantages", *gagpo, episode_coef=0.5)
    entry("gagpo_backoff_m2", "gagpo_advantages", *gagpo, backoff_keys=d["backoff"])
    entry("gagpo_backoff_m4", "gagpo_advantages", *gagpo, backoff_keys=d["backoff"], backoff_min_count=4)
    entry("gagpo_backoff_str_m3", "gagpo_advantages", *gagpo_str, backoff_keys=d["str_backoff"], backoff_min_count=3)
    entry("gigpo", "gigpo_advantages", r, ep, grp, s)
    entry("gigpo_str_keys", "gigpo_advantages", r, ep, grp, s_str)
    entry("gigpo_omega0.5_g0.9", "gigpo_advantages", r, ep, grp, s, omega=0.5, gamma=0.9)
    entry("gigpo_no_std_norm", "gigpo_advantages", r, ep, grp, s, std_norm=False)
    entry("gigpo_episode_stats_rows", "gigpo_advantages", r, ep, grp, s, episode_stats="rows")
    entry("grpo", "grpo_advantages", r, ep, grp)
    entry("grpo_eps1e-2", "grpo_advantages", r, ep, grp, eps=1e-2)
    entry("rloo", "rloo_advantages", r, ep, grp)
    entry("discounted_returns", "discounted_returns", r, ep)
    entry("discounted_returns_g0.5", "discounted_returns", r, ep, gamma=0.5)
    entry("gae", "gae_advantages", r, d["values"], ep, done)
    entry("gae_last_values", "gae_advantages", r, d["values"], ep, done, last_values=d["last_values"], lam=0.8)
    entry("normalize_group", "normalize_advantages", d["values"], grp)
    entry("normalize_batch", "normalize_advantages", d["values"], mode="batch")
    entry("step_group_stats", "step_group_stats", grp, s)
    entry("step_group_stats_backoff", "step_group_stats", grp, s, backoff_keys=d["backoff"], backoff_min_count=3)
    assert np.all(np.isfinite(r))
    return out


# ---------------------------------------------------------------------------------------------------------
# 2. Seeded training runs
# ---------------------------------------------------------------------------------------------------------

TIMESTEPS = 450
COMMON: dict[str, Any] = {
    "seed": 0, "verbose": 0, "torch_threads": 1, "device": "cpu", "num_groups": 2, "group_size": 8,
    "tiny_hidden_size": 32, "history_length": 1,
}  # fmt: skip
MAZE = {"max_episode_steps": 16}
RUNS: dict[str, dict[str, Any]] = {
    "run_a": dict(
        env="gagpo_gym/Maze-v0", env_kwargs=MAZE, action_mode="choose", estimator="gagpo", kl_coef=0.05,
        ent_coef=0.01, n_epochs=2, minibatch_size=16,
    ),
    "run_b": dict(
        env="gagpo_gym/FrozenLake-v0", env_kwargs={"max_episode_steps": 12}, action_mode="generate",
        estimator="ppo", max_new_tokens=8, n_epochs=2, minibatch_size=16,
    ),
    "run_c": dict(
        env="gagpo_gym/Maze-v0", env_kwargs=MAZE, action_mode="choose", estimator="gagpo",
        key_backoff=("observation", "group"), n_epochs=2, minibatch_size=16,
    ),
}  # fmt: skip


def run_entries(name: str, settings: dict[str, Any]) -> list[tuple[str, str]]:
    import gagpo_gym  # noqa: F401  (registers the built-in envs)
    from agents import GAGPOAgent

    settings = dict(settings)
    env = settings.pop("env")
    agent = GAGPOAgent(env, **COMMON, **settings)
    capture = Recorder(keep=lambda key: not key.startswith("time/"))  # every dump, timings left out
    log_to(agent, capture)
    agent.learn(TIMESTEPS)
    tensors = {f"model.{k}": v for k, v in agent.policy.model.state_dict().items()}
    value_head = getattr(agent.policy, "value_head", None)
    if value_head is not None:
        tensors |= {f"value_head.{k}": v for k, v in value_head.state_dict().items()}
    counters = {"num_timesteps": agent.num_timesteps, "iteration": agent.iteration, "dumps": len(capture.rows)}
    print(f"fingerprint: {name}: {counters}", file=sys.stderr)
    evaluation = agent.evaluate(n_tasks=6, episodes=True)
    return [
        (f"{name}/params", digest_tensors(tensors)),
        (f"{name}/logs", digest_json(capture.rows)),
        (f"{name}/counters", digest_json(counters)),
        (f"{name}/evaluate", digest_json(evaluation)),
    ]


# ---------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("estimators", "runs"), help="compute one part only (default: both)")
    parser.add_argument("--out", type=Path, help="also write the lines to this file")
    args = parser.parse_args(argv)
    root = locate_checkout()
    print(f"fingerprint: measuring the checkout at {root}", file=sys.stderr)

    lines: list[str] = []

    def emit(entries: list[tuple[str, str]]) -> None:
        for entry_name, value in entries:
            line = f"{entry_name}  {value}"
            print(line, flush=True)
            lines.append(line)

    if args.only in (None, "estimators"):
        t0 = time.perf_counter()
        emit(estimator_entries())
        print(f"fingerprint: estimators took {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    if args.only in (None, "runs"):
        for name, settings in RUNS.items():
            t0 = time.perf_counter()
            emit(run_entries(name, settings))
            print(f"fingerprint: {name} took {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    # Before torch and tokenizers load (they are imported lazily): one thread each, as on a shared CI box.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
