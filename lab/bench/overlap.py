"""learn() with the update beside the next rollout (``overlap=True``) against the sequential loop, in one run.

    python -m lab.bench.overlap                                      # MiniHouse small, tiny model
    python -m lab.bench.overlap --settings minihouse-small alfworld-train smollm2-generate --iterations 6

Each setting trains fresh agents (seed 0, ``vec_mode="async"``: the envs step in 2 worker processes) with
``learn(max_iterations=--iterations)``, the two modes alternating ``--repeats`` times (off, on, off, on...) so that
a drift in the machine's load hits both. Both modes have the same torch thread budget, ``--threads`` (default 2):
off gives all of it to the one loop, on splits it between the rollout's thread and the update's
(:func:`agents.overlap.thread_split`). Agent construction is not timed; the first iteration is (the pipeline's
fill: its rollout has no update beside it).

A last row runs the sequential loop on one thread (``--no-one-thread`` leaves it out): on a busy machine one OpenMP
thread can beat two, and the speedup over that row is the overlap's own. Printed per mode (medians over the repeats):
env steps/s (env steps of learn() over its wall time) and the share of the wall time each stage waits. Off: the
rollout waits while the recompute and update run, the update while the rollout runs. On: the rollout waits when the
version it must act with is not out yet (``time/rollout_wait_s``); the update thread waits when it has no rollout to
train on (1 - its busy time, ``time/update_thread_s``, over the wall time). ``load`` is the machine's 1-minute load
average at the start and the end: the numbers are only comparable on a quiet machine. Settings: ``minihouse-small``
(MiniHouse ``{"size": "small"}``, tiny model, choose mode), ``alfworld-train`` (ALFWorld's train split, tiny model;
needs ``ALFWORLD_DATA``), ``smollm2-generate`` (SmolLM2-135M-Instruct in generate mode, from
``.cache/smollm2-135m-instruct``: ``python scripts/fetch_smollm2.py``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from stable_baselines3.common.logger import Logger

from lab.recorder import Recorder

SETTINGS: dict[str, dict[str, Any]] = {
    "minihouse-small": {"env": "gagpo_gym/MiniHouse-v0", "env_kwargs": {"size": "small"}},
    "alfworld-train": {"env": "gagpo_gym/ALFWorld-v0", "env_kwargs": {"split": "train"}},
    "smollm2-generate": {  # episodes cut at 12 steps: a learn() of 2 iterations fits a quiet slot on 2 cores
        "env": "gagpo_gym/MiniHouse-v0",
        "env_kwargs": {"size": "small", "max_episode_steps": 12},
        "model": ".cache/smollm2-135m-instruct",
        "config": {"action_mode": "generate", "max_new_tokens": 24, "num_groups": 2, "group_size": 4},
    },  # fmt: skip
}


#: The modes: (pipeline, overlap) flags of GAGPOConfig.
MODES = {"off": (False, False), "pipeline": (True, False), "overlap": (False, True), "both": (True, True)}


def measure(
    setting: dict[str, Any], mode: str, iterations: int, threads: int, sizes: dict[str, int]
) -> dict[str, float]:
    """One learn() of ``iterations`` iterations in ``mode`` (:data:`MODES`): env steps/s and the shares of wall time
    each stage waits (``sizes``: the groups and group size, over the setting's)."""
    from agents import GAGPOAgent

    pipeline, overlap = MODES[mode]
    model = setting.get("model", "tiny")
    config = {"vec_mode": "async", "torch_threads": threads, "seed": 0, **setting.get("config", {}), **sizes}
    agent = GAGPOAgent(setting["env"], model=model, env_kwargs=setting["env_kwargs"], verbose=0, overlap=overlap,
                       pipeline=pipeline, **config)  # fmt: skip
    keep = Recorder()
    agent.set_logger(Logger(folder=None, output_formats=[keep]))
    agent.get_env()  # the worker processes start before the clock
    t0 = time.perf_counter()
    agent.learn(10**9, max_iterations=iterations)
    wall = time.perf_counter() - t0
    agent.close()

    def total(key: str) -> float:
        return sum(float(d.get(key, 0.0)) for d in keep.rows)

    if overlap:
        rollout_waits = total("time/rollout_wait_s") / wall
        update_waits = 1 - total("time/update_thread_s") / wall
    else:
        rollout_waits = (total("time/recompute_s") + total("time/update_s")) / wall
        update_waits = total("time/rollout_s") / wall
    return {"steps_per_s": agent.num_timesteps / wall, "rollout_waits": rollout_waits, "update_waits": update_waits,
            # inside the rollouts: waiting for the envs' answers, and the policy's acting
            "env_waits": total("time/env_s") / wall, "policy_acts": total("time/generate_s") / wall,
            "wall_s": wall, "steps": agent.num_timesteps}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", default=["minihouse-small"], choices=sorted(SETTINGS))
    parser.add_argument("--modes", nargs="+", default=["off", "pipeline", "overlap", "both"], choices=list(MODES),
                        help="compared with off (always run) on the same thread budget")  # fmt: skip
    parser.add_argument("--iterations", type=int, default=6, help="iterations of each learn()")
    parser.add_argument("--repeats", type=int, default=2, help="learn() runs of each mode, alternating")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each mode, all in all")
    parser.add_argument("--num-groups", type=int, default=None, help="rollout groups (default: the setting's)")
    parser.add_argument("--group-size", type=int, default=None, help="episodes per group (default: the setting's)")
    parser.add_argument(
        "--one-thread", action=argparse.BooleanOptionalAction, default=True,
        help="also run the sequential loop on one thread",
    )  # fmt: skip
    args = parser.parse_args(argv)
    sizes = {k: v for k, v in (("num_groups", args.num_groups), ("group_size", args.group_size)) if v is not None}
    for name in args.settings:
        load = os.getloadavg()[0]
        # (mode, torch threads): every mode on one budget, and the sequential loop on one thread beside them
        # (under CPU contention one OpenMP thread can beat two: that, not the overlap, may be the difference).
        modes = [(m, args.threads) for m in dict.fromkeys(["off", *args.modes])]
        modes += [("off", 1)] if args.threads > 1 and args.one_thread else []
        runs: dict[tuple[str, int], list[dict[str, float]]] = {m: [] for m in modes}
        for _ in range(args.repeats):
            for mode, threads in modes:
                result = measure(SETTINGS[name], mode, args.iterations, threads, sizes)
                runs[mode, threads].append(result)
                print(f"  ({mode}, {threads} thr: {result['steps']:.0f} steps in {result['wall_s']:.0f} s, "
                      f"load {os.getloadavg()[0]:.2f})", flush=True)  # fmt: skip
        print(f"{name}: {args.iterations} iterations x {args.repeats} repeats, "
              f"load {load:.2f} -> {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")  # fmt: skip
        print(f"  {'mode':<15} {'steps/s':>8} {'x off':>6} {'rollout waits':>14} {'update waits':>13} "
              f"{'env waits':>10} {'policy acts':>12}  runs (steps/s)")  # fmt: skip
        rates = {key: statistics.median(r["steps_per_s"] for r in results) for key, results in runs.items()}
        for (mode, threads), results in runs.items():
            med = {k: statistics.median(r[k] for r in results) for k in results[0]}
            each = ", ".join(f"{r['steps_per_s']:.1f}" for r in results)
            ratio = med["steps_per_s"] / rates["off", args.threads]
            print(f"  {f'{mode}, {threads} thr':<15} {med['steps_per_s']:8.1f} {ratio:5.2f}x "
                  f"{med['rollout_waits']:14.0%} {med['update_waits']:13.0%} {med['env_waits']:10.0%} "
                  f"{med['policy_acts']:12.0%}  {each}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
