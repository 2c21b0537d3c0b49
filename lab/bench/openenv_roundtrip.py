"""The OpenEnv round trip against in-process: the same env steps and the same GAGPO run, at what cost.

    nice -n 10 python -m lab.bench.openenv_roundtrip                  # results/openenv/report.md and report.json
    python -m lab.bench.openenv_roundtrip --steps 600 --episodes 20 --out /tmp/openenv   # a quick look

The env is the learning benchmark's ``minihouse`` setup (``lab/bench/setups/minihouse.yaml``: small houses,
pick-and-place, 20-step limit, a pool of 8 tasks, 4 groups x 8 episodes), served by ``python -m gagpo_gym.serve`` in
a subprocess on loopback (``LocalServer``) and played back by ``gagpo_gym/OpenEnv-v0`` (OpenEnv's WebSocket
client), against the same env made in-process.

1. Env stepping: ``--episodes`` episodes of random admissible actions (task seeds 0.., one action generator per
   side with the same seed) on one env, then ``--rollouts`` rollouts of a ``GroupedVectorEnv`` of the setup's
   groups, sync and async (2 worker processes: their sessions' round trips overlap). Env steps/s, resets
   included; the two sides' trajectories must be identical (digests of every observation, reward, flag and key).
2. Learning: ``GAGPOAgent`` (tiny model, ``--seed``, one torch thread) learns ``--steps`` env steps in-process
   (``vec_mode="sync"``) and through OpenEnv with each ``--openenv-modes`` vec mode. If the round trip is exact,
   each OpenEnv run is the in-process run: the same tokenizer corpus (the expert is read from the server's
   ``state()``), the same rollouts, so the same logged values (every key but ``time/*``) at every iteration,
   the rollout success curve included, and the same final weights. The script checks all three and exits 1 if
   any differs. Env steps/s: ``learn()``'s steps over its wall time, and over the rollouts' env time alone
   (``time/env_s``).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import hashlib
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.logger import Logger

import gagpo_gym
from agents.cli import check_writable, fail
from agents.gagpo import GAGPOAgent
from agents.reporting import atomic_write_text, markdown_table
from gagpo_gym.envs.openenv import make_openenv_env
from gagpo_gym.serve import LocalServer
from lab.benchmark import load_setup, rollout_curve
from lab.recorder import Recorder
from wrappers import GroupedVectorEnv

ROOT = Path(__file__).resolve().parents[2]

SETUP = load_setup("minihouse")
TIMEOUT = 60.0  # seconds per call to the server: generous on a loaded machine, a dead server still fails at once


# ----- 1. env stepping ---------------------------------------------------------------------------------------
def random_episodes(make_env: Callable[[], Any], episodes: int, seed: int) -> dict[str, Any]:
    """``episodes`` episodes of uniformly random admissible actions on tasks 0..episodes-1."""
    env = make_env()
    rng = np.random.default_rng(seed)
    digest = hashlib.blake2b(digest_size=8)
    steps = 0
    started = time.perf_counter()
    for task in range(episodes):
        obs, info = env.reset(seed=task)
        digest.update(obs.encode())
        done = False
        while not done:
            admissible = info["admissible_actions"]
            obs, reward, terminated, truncated, info = env.step(admissible[rng.integers(len(admissible))])
            digest.update(repr((obs, reward, terminated, truncated, info["state_key"], info["won"])).encode())
            steps, done = steps + 1, terminated or truncated
    seconds = time.perf_counter() - started
    env.close()
    return {"steps": steps, "seconds": seconds, "steps_per_s": steps / seconds, "digest": digest.hexdigest()}


def vector_rollouts(make_env: Callable[[], Any], mode: str, rollouts: int, seed: int) -> dict[str, Any]:
    """``rollouts`` rollouts of the setup's groups (random admissible actions) on a ``GroupedVectorEnv``."""
    config = SETUP.config
    venv = GroupedVectorEnv(
        make_env, config["num_groups"], config["group_size"], mode=mode, task_pool=config["task_pool"]
    )
    rng = np.random.default_rng(seed)
    digest = hashlib.blake2b(digest_size=8)
    steps = 0
    started = time.perf_counter()
    try:
        for k in range(rollouts):
            obs, info = venv.reset(seed=seed + k)
            digest.update(repr(obs).encode())
            while venv.active.any():
                actions = [
                    list(choices)[rng.integers(len(choices))] if active else ""
                    for choices, active in zip(info["admissible_actions"], venv.active)
                ]
                steps += int(venv.active.sum())
                obs, rewards, terminated, truncated, info = venv.step(actions)
                digest.update(repr((obs, rewards.tolist(), terminated.tolist(), truncated.tolist())).encode())
    finally:
        venv.close()
    seconds = time.perf_counter() - started
    return {"steps": steps, "seconds": seconds, "steps_per_s": steps / seconds, "digest": digest.hexdigest()}


# ----- 2. learning -------------------------------------------------------------------------------------------
def learn(env_id: str, env_kwargs: dict[str, Any], vec_mode: str, steps: int, seed: int) -> dict[str, Any]:
    """One GAGPO run: its iterations' logged values, steps/s and a digest of the final weights."""
    started = time.perf_counter()
    agent = GAGPOAgent(
        env_id, "tiny", env_kwargs=env_kwargs, verbose=0, seed=seed, torch_threads=1, vec_mode=vec_mode,
        **SETUP.config,
    )  # fmt: skip
    build_s = time.perf_counter() - started
    record = Recorder(step_key="steps")
    agent.set_logger(Logger(folder=None, output_formats=[record]))
    started = time.perf_counter()
    agent.learn(steps, log_interval=1)
    learn_s = time.perf_counter() - started
    agent.get_env().close()
    weights = hashlib.blake2b(digest_size=8)
    for name, tensor in sorted(agent.policy.model.state_dict().items()):
        weights.update(name.encode())
        weights.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    env_s = sum(row.get("time/env_s", 0.0) for row in record.rows)
    success_steps, success = rollout_curve(record.rows)
    return {
        "env_id": env_id, "vec_mode": vec_mode, "num_timesteps": int(agent.num_timesteps),
        "iterations": record.rows, "success_steps": success_steps.tolist(), "success": success.tolist(),
        "build_s": build_s, "learn_s": learn_s, "env_s": env_s, "steps_per_s": agent.num_timesteps / learn_s,
        "env_steps_per_s": agent.num_timesteps / env_s if env_s else None, "weights": weights.hexdigest(),
    }  # fmt: skip


def logged_values(run: dict[str, Any]) -> list[dict[str, float]]:
    """Every iteration's logged values but the timings (``time/*``), which no two runs share."""
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in run["iterations"]]


# ----- the report --------------------------------------------------------------------------------------------
def report(result: dict[str, Any]) -> str:
    stepping = result["stepping"]
    rows = [
        {"what": what, "in-process steps/s": f"{pair['in_process']['steps_per_s']:.0f}",
         "OpenEnv steps/s": f"{pair['openenv']['steps_per_s']:.0f}",
         "ratio": f"{pair['in_process']['steps_per_s'] / pair['openenv']['steps_per_s']:.1f}x",
         "env steps": pair["openenv"]["steps"], "identical": "yes" if pair["identical"] else "**no**"}
        for what, pair in stepping.items()
    ]  # fmt: skip
    runs = result["learning"]
    base = runs["in_process"]
    learn_rows = [
        {"run": name, "vec_mode": run["vec_mode"], "env steps": run["num_timesteps"],
         "learn() steps/s": f"{run['steps_per_s']:.1f}",
         "env-part steps/s": "-" if run["env_steps_per_s"] is None else f"{run['env_steps_per_s']:.0f}",
         "env s": f"{run['env_s']:.1f}", "learn s": f"{run['learn_s']:.0f}", "build s": f"{run['build_s']:.0f}",
         "same logs": "-" if name == "in_process" else ("yes" if run["same_logs"] else "**no**"),
         "same weights": "-" if name == "in_process" else ("yes" if run["weights"] == base["weights"] else "**no**")}
        for name, run in runs.items()
    ]  # fmt: skip
    curves = [
        {"iteration": i + 1, "env steps": steps, **{name: f"{run['success'][i]:.3f}" for name, run in runs.items()}}
        for i, steps in enumerate(base["success_steps"])
    ]
    verdict = "exact" if result["exact"] else "NOT exact"
    return (
        "# OpenEnv round trip against in-process (`lab/bench/openenv_roundtrip.py`)\n\n"
        f"- Env: `{SETUP.env_id}` `{json.dumps(SETUP.env_kwargs)}` ({SETUP.note}), served by `python -m "
        f"gagpo_gym.serve` on loopback, played by `gagpo_gym/OpenEnv-v0` (openenv {result['openenv']}).\n"
        f"- Machine: {result['machine']}; load average {result['load_before']} before, {result['load_after']} "
        "after (a shared machine: the rates are what it gave, not its best).\n"
        f"- Agent: GAGPOAgent, tiny model, seed {result['seed']}, torch threads 1, `{json.dumps(SETUP.config)}`.\n"
        f"- Regenerate: `nice -n 10 {result['command']}` ({result['wall_s']:.0f} s, {result['date']}; the runs one "
        "after the other, so a change in the machine's load between them shows in their rates).\n\n"
        f"**The round trip is {verdict}**: the same env trajectories, and learning through OpenEnv logs the same "
        "values at every iteration (every key but `time/*`, the rollout success below included) and ends with the "
        "same weights as in-process.\n\n"
        "## Env stepping (random admissible actions, resets included)\n\n"
        + markdown_table(rows)
        + "\n\n## Learning\n\n"
        + markdown_table(learn_rows)
        + "\n\nlearn() steps/s: env steps over `learn()`'s wall time (model included); env-part steps/s: env steps "
        "over the rollouts' env time (`time/env_s`).\n\n"
        "### Rollout success per iteration (sampled actions; env steps: the total after the iteration)\n\n"
        + markdown_table(curves)
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--steps", type=int, default=4000, help="env steps of each learning run (the learning benchmark's quick budget)"
    )
    parser.add_argument("--episodes", type=int, default=200, help="random episodes on one env")
    parser.add_argument("--rollouts", type=int, default=4, help="rollouts of the grouped vector env, per mode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--openenv-modes", nargs="+", default=["sync", "async"], choices=["sync", "async"],
                        help="vec modes of the learning runs through OpenEnv")  # fmt: skip
    parser.add_argument("--out", default=str(ROOT / "results" / "openenv"), help="folder for report.md and report.json")
    args = parser.parse_args(argv)
    if min(args.steps, args.episodes, args.rollouts) < 1:
        fail("--steps, --episodes and --rollouts must be >= 1")
    out = check_writable(args.out)
    import openenv

    started = time.perf_counter()
    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    sessions = SETUP.config["num_groups"] * SETUP.config["group_size"] + 2
    local = functools.partial(gagpo_gym.make, SETUP.env_id, **SETUP.env_kwargs)
    with LocalServer(SETUP.env_id, env_kwargs=SETUP.env_kwargs, max_sessions=sessions) as server:
        remote = functools.partial(make_openenv_env, server.url, timeout=TIMEOUT)
        print(f"serving {SETUP.env_id} at {server.url}", flush=True)
        stepping: dict[str, dict[str, Any]] = {}
        jobs: list[tuple[str, Callable[[Callable[[], Any]], dict[str, Any]]]] = [
            (f"one env, {args.episodes} episodes", lambda make: random_episodes(make, args.episodes, args.seed)),
            (f"GroupedVectorEnv sync, {args.rollouts} rollouts",
             lambda make: vector_rollouts(make, "sync", args.rollouts, args.seed)),
            (f"GroupedVectorEnv async, {args.rollouts} rollouts",
             lambda make: vector_rollouts(make, "async", args.rollouts, args.seed)),
        ]  # fmt: skip
        for what, job in jobs:
            pair = {"in_process": job(local), "openenv": job(remote)}
            pair["identical"] = pair["in_process"]["digest"] == pair["openenv"]["digest"]
            stepping[what] = pair
            rates = [pair[side]["steps_per_s"] for side in ("in_process", "openenv")]
            print(f"{what}: in-process {rates[0]:.0f} steps/s, OpenEnv {rates[1]:.0f} steps/s, identical: "
                  f"{pair['identical']}", flush=True)  # fmt: skip
        learning = {"in_process": learn(SETUP.env_id, SETUP.env_kwargs, "sync", args.steps, args.seed)}
        for mode in args.openenv_modes:
            # The server's env ends its episodes; the agent asks for the same limit on its side too.
            limit = SETUP.env_kwargs.get("max_episode_steps") or gym.spec(SETUP.env_id).max_episode_steps
            kwargs = {"url": server.url, "timeout": TIMEOUT, "max_episode_steps": limit}
            learning[f"openenv_{mode}"] = learn("gagpo_gym/OpenEnv-v0", kwargs, mode, args.steps, args.seed)
        for name, run in learning.items():
            run["same_logs"] = logged_values(run) == logged_values(learning["in_process"])
            print(f"learning {name}: {run['steps_per_s']:.1f} steps/s, rollout success "
                  f"{[round(s, 3) for s in run['success']]}, same logs: {run['same_logs']}", flush=True)  # fmt: skip
    base = learning["in_process"]
    exact = all(pair["identical"] for pair in stepping.values()) and all(
        run["same_logs"] and run["weights"] == base["weights"] for run in learning.values()
    )
    result = {
        "env_id": SETUP.env_id, "env_kwargs": SETUP.env_kwargs, "config": SETUP.config, "seed": args.seed,
        "openenv": openenv.__version__, "exact": exact, "stepping": stepping, "learning": learning,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs, Python "
        f"{platform.python_version()}",
        "load_before": load_before, "load_after": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "command": " ".join(["python -m lab.bench.openenv_roundtrip", *(sys.argv[1:] if argv is None else argv)]),
        "date": datetime.date.today().isoformat(), "wall_s": time.perf_counter() - started,
    }  # fmt: skip
    text = report(result)
    atomic_write_text(out / "report.md", text)
    atomic_write_text(out / "report.json", json.dumps(result, indent=1) + "\n")
    print("\n" + text + f"\nwrote {out}/report.md and report.json", flush=True)
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
