"""How far a real model's length-normalised action ratio moves in an update, and so which clip range binds.

    python -m lab.bench.clip --model .cache/smollm2-135m-instruct --iterations 2

Fine-tunes a pretrained chat model in generate mode and records |rho - 1| of every action in every minibatch
after the first optimiser step of an iteration (the first minibatch is on-policy: rho = 1). Prints quantiles
of |rho - 1| and the share of actions that PPO's clip 0.2, GSPO's ranges (3e-4 / 4e-4) and ranges between
would clip, per setting (full fine-tuning at the pretrained default lr, LoRA at a typical LoRA lr). The
generate-mode defaults in ``agents.config`` come from this.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from stable_baselines3.common.callbacks import CallbackList

from agents import GAGPOAgent

RANGES = {"ppo 0.2": (0.2, 0.2), "gspo 3e-4/4e-4": (3e-4, 4e-4)} | {f"{e:g}": (e, e) for e in (1e-3, 3e-3, 1e-2, 3e-2)}


def update_ratios(agent: GAGPOAgent) -> np.ndarray:
    """One iteration of ``learn``, its update stepped minibatch by minibatch (``agent.update.minibatch_step``):
    the ratios of every action after the first step (the first minibatch is on-policy)."""
    callback = CallbackList([])
    callback.init_callback(agent)
    agent.collect_rollouts(callback)
    agent.policy.release_engine()
    plan = agent.update_plan()
    agent.recompute_log_probs(plan)
    agent.policy.train()
    steps = [agent.update.minibatch_step(minibatch) for epoch in plan for minibatch in epoch]
    agent.optimizer.zero_grad(set_to_none=True)
    agent.iteration += 1
    return np.concatenate([step.action_ratios for step in steps[1:]]) - 1.0


def measure(model: str, setting: dict, iterations: int, seed: int) -> dict:
    agent = GAGPOAgent(
        "gagpo_gym/FrozenLake-v0", model=model, action_mode="generate", num_groups=2, group_size=4,
        minibatch_size=4, n_epochs=2, max_new_tokens=24, history_length=0, torch_threads=1, verbose=0,
        seed=seed, env_kwargs={"max_episode_steps": 2}, **setting,
    )  # fmt: skip
    t0 = time.perf_counter()
    per_iteration = [update_ratios(agent) for _ in range(iterations)]
    dev = np.concatenate(per_iteration)
    out = {
        "actions": int(dev.size),
        "median_abs_dev": float(np.median(np.abs(dev))),
        "max_abs_dev": float(np.abs(dev).max()),
    }
    for q in (50, 80, 90, 95):
        out[f"p{q}_abs_dev"] = float(np.percentile(np.abs(dev), q))
    for name, (low, high) in RANGES.items():
        out[f"clipped {name}"] = float(np.mean((dev > high) | (dev < -low)))
    out["seconds"] = time.perf_counter() - t0
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a local pretrained checkpoint folder")
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = parser.parse_args()
    settings = {
        "full fine-tuning, lr 1e-6": {"learning_rate": 1e-6},
        "LoRA r=8, lr 1e-5": {"learning_rate": 1e-5, "lora_r": 8},
    }
    results = {}
    for name, setting in settings.items():
        results[name] = measure(args.model, setting, args.iterations, args.seed)
        print(name, json.dumps(results[name]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
