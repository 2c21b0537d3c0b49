"""Real-engine rollouts: env steps/s of GAGPO's rollouts on ALFWorld's train games, with the engine stepped in this
process (``vec_mode="sync"``), in worker processes (``"async"``) while the policy batches across them, or in worker
processes pipelined with the policy (``"pipeline"``: one lane of sub-envs steps while the policy acts for the other).

    python -m lab.bench.alfworld_rollouts                        # results/throughput/alfworld-rollouts.md
    python -m lab.bench.alfworld_rollouts --iterations 1 --out /tmp/rollouts.md

Each mode trains a fresh agent from the same prior and seed for ``--iterations`` iterations (4 groups x 8 episodes,
the comparison's settings) in a subprocess of its own, one torch thread each. The table gives each mode's rollout
time (acting and env steps, ``time/rollout_s``), its env steps per second, and a fingerprint of every episode's
actions, rewards and state keys: the modes must play the same episodes, so the fingerprints must be equal. Needs the
train split (``make alfworld-train``) and a quiet machine: other processes on the cores slow one mode more than the
other.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agents.cli import fail
from agents.reporting import atomic_write_text, markdown_table
from lab.recorder import Recorder

ROOT = Path(__file__).resolve().parents[2]
PRIOR = ROOT / "results" / "agents" / "minihouse-full-search"


MODES: dict[str, dict[str, Any]] = {
    "sync": {"vec_mode": "sync"},
    "async": {"vec_mode": "async"},
    "pipeline": {"vec_mode": "async", "pipeline": True},
}


def measure(mode: str, iterations: int, seed: int) -> dict[str, float | str]:
    """Train ``iterations`` iterations with the engine stepped ``mode``-wise; times and the episodes' fingerprint
    (each rollout's rows in a canonical order: the pipeline's lanes add them in another)."""
    import torch
    from stable_baselines3.common.logger import Logger

    from agents import GAGPOAgent

    torch.set_num_threads(1)
    recorder = Recorder()
    agent = GAGPOAgent(
        "gagpo_gym/ALFWorld-v0", model=str(PRIOR), env_kwargs={"split": "train"}, estimator="gagpo", num_groups=4,
        group_size=8, seed=seed, torch_threads=1, verbose=0, **MODES[mode],
    )  # fmt: skip
    agent.set_logger(Logger(folder=None, output_formats=[recorder]))
    digest = hashlib.sha256()
    started = time.perf_counter()
    for _ in range(iterations):
        agent.learn(10**9, reset_num_timesteps=False, max_iterations=1)
        rows = sorted((r.group, r.episode, r.chosen, r.reward, r.state_key, r.won) for r in agent.buffer.rows)
        digest.update(repr(rows).encode())
    total = time.perf_counter() - started
    agent.get_env().close()
    rollout = sum(x["time/rollout_s"] for x in recorder.rows)
    return {
        "mode": mode, "iterations": iterations, "env steps": agent.num_timesteps,
        "rollout s": round(rollout, 1), "rollout steps/s": round(agent.num_timesteps / rollout, 2),
        "env s": round(sum(x["time/env_s"] for x in recorder.rows), 1),
        "acting s": round(sum(x["time/generate_s"] for x in recorder.rows), 1),
        "learn steps/s": round(agent.num_timesteps / total, 2), "episodes": digest.hexdigest()[:16],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=2, help="iterations per mode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "results" / "throughput" / "alfworld-rollouts.md"))
    parser.add_argument("--mode", choices=list(MODES), help=argparse.SUPPRESS)  # one measurement (child)
    args = parser.parse_args(argv)
    if args.iterations < 1:
        fail("--iterations must be >= 1")
    if args.mode:
        print(json.dumps(measure(args.mode, args.iterations, args.seed)))
        return 0
    rows = []
    for mode in MODES:
        child = [sys.executable, "-m", __spec__.name, "--mode", mode, "--iterations", str(args.iterations)]
        child += ["--seed", str(args.seed)]
        done = subprocess.run(child, capture_output=True, text=True, check=False, cwd=ROOT)
        if done.returncode:
            fail(f"the {mode} measurement failed:\n{done.stderr[-2000:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    same = len({row["episodes"] for row in rows}) == 1
    speedup = {row["mode"]: row["rollout steps/s"] / rows[0]["rollout steps/s"] for row in rows[1:]}
    text = (
        "# Real-engine rollouts: the engine in worker processes, and pipelined, against the serial loop\n\n"
        f"`python -m lab.bench.alfworld_rollouts --iterations {args.iterations}`: GAGPO from "
        "`results/agents/minihouse-full-search` on ALFWorld's train games, 4 groups x 8 episodes, seed "
        f"{args.seed}, one torch thread.\n\n{markdown_table(rows)}\n\n"
        f"Same episodes in every mode: {'yes' if same else 'NO'}. Rollout env steps/s over sync: "
        + ", ".join(f"{mode} {x:.2f}x" for mode, x in speedup.items())
        + ".\n"
    )
    atomic_write_text(Path(args.out), text)
    print(text)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
