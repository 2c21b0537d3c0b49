"""`make demo`: train the tiny model with GAGPO on FrozenLake (4x4, not slippery) and show before/after success.

Prints a Markdown table (random policy, tiny model before and after training, the expert as upper bound) and
writes a learning-curve PNG to runs/demo/. Runs on a laptop CPU in a few minutes.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402

from agents import GAGPOAgent  # noqa: E402
from agents.evaluation import reference_policy_panel  # noqa: E402

ENV_ID = "gagpo_gym/FrozenLake-v0"
ENV_KWARGS = {"max_episode_steps": 20}


class CurveRecorder(BaseCallback):
    """Record the sampled success rate of every rollout against env steps."""

    def __init__(self) -> None:
        super().__init__()
        self.points: list[tuple[int, float]] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        episodes = self.model.last_rollout["episodes"]
        self.points.append((self.model.num_timesteps, float(np.mean([e["won"] for e in episodes]))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=12_000, help="env steps of training")
    parser.add_argument("--tasks", type=int, default=100, help="evaluation panel size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/demo")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    start = time.perf_counter()
    agent = GAGPOAgent(ENV_ID, env_kwargs=ENV_KWARGS, seed=args.seed, verbose=0, history_length=0)
    rows = {
        "random": reference_policy_panel("random", ENV_ID, ENV_KWARGS, args.tasks),
        "tiny model, before": agent.evaluate(n_tasks=args.tasks),
    }
    recorder = CurveRecorder()
    t0 = time.perf_counter()
    agent.learn(args.steps, callback=recorder, progress_bar=True)
    train_s = time.perf_counter() - t0
    rows["tiny model, after GAGPO"] = agent.evaluate(n_tasks=args.tasks)
    rows["expert (upper bound)"] = reference_policy_panel("expert", ENV_ID, ENV_KWARGS, args.tasks)
    agent.save(out / "agent")

    lines = [
        f"`{ENV_ID}` {ENV_KWARGS}, tiny model, GAGPO, {agent.num_timesteps} env steps ({train_s:.0f} s of training); "
        f"{args.tasks} fixed tasks, greedy evaluation.",
        "",
        "| policy | success | mean episode length |",
        "|---|---|---|",
        *(f"| {name} | {m['success_rate']:.2f} | {m['mean_length']:.1f} |" for name, m in rows.items()),
    ]
    summary = "\n".join(lines)
    print("\n" + summary)
    (out / "summary.md").write_text(summary + "\n")
    steps, success = zip(*recorder.points)
    plt.figure(figsize=(6, 4))
    plt.plot(steps, success, marker="o", label="GAGPO (sampled rollouts)")
    plt.axhline(rows["random"]["success_rate"], color="gray", linestyle="--", label="random policy")
    plt.xlabel("env steps")
    plt.ylabel("success rate")
    plt.ylim(0, 1.02)
    plt.title(f"tiny model, GAGPO, {ENV_ID.split('/')[-1]}")
    plt.legend()
    plt.tight_layout()
    plt.savefig(out / "learning_curve.png", dpi=120)
    print(f"\ntotal wall time {time.perf_counter() - start:.0f} s")
    print(f"learning curve: {out / 'learning_curve.png'}; agent saved to {out / 'agent'}")


if __name__ == "__main__":
    main()
