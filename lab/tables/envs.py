"""Print a Markdown table of text envs: expert and random-policy success, expert episode length, step time.

Works for any registered ``gagpo_gym`` env whose unwrapped instance has ``expert_action()``:

    python -m lab.tables.envs                       # the seven small built-in envs, 200 seeded tasks each
    python -m lab.tables.envs --envs MiniHouse-v0 --seeds 50

Each seed is one task (``reset(seed=s)``), played once by the expert and once by a policy uniform over the
admissible actions, under the env's registered time limit. Success is ``info["won"]`` at the end of the episode.
Step time is the mean wall time of ``env.step`` over all those steps (the expert's own thinking is not counted).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

import gagpo_gym
from lab.benchmark import run_episode, uniform_policy

DEFAULT_ENVS = (
    "Maze-v0",
    "Sokoban-v0",
    "FrozenLake-v0",
    "Taxi-v0",
    "CliffWalking-v0",
    "TicTacToe-v0",
    "ConnectFour-v0",
)

#: What the key ranges over, per env id; envs not listed fall back to the first line of their class docstring.
NOTES = {
    "gagpo_gym/Maze-v0": "5x5 cells, 2 rooms, 3 loops; key = position (25/task); local view",
    "gagpo_gym/Sokoban-v0": "6x6, 1 box; key = (player, box) (<= 16x15/task); reverse-play levels",
    "gagpo_gym/FrozenLake-v0": "4x4 map, not slippery; key = cell (16)",
    "gagpo_gym/Taxi-v0": "5x5 taxi grid; key = Gymnasium state (500); 300 starts",
    "gagpo_gym/CliffWalking-v0": "4x12 grid, one task; key = cell (48)",
    "gagpo_gym/TicTacToe-v0": "vs random opponent, random side; key = board + side to move (5,478 boards)",
    "gagpo_gym/ConnectFour-v0": "vs random opponent, random side; key = board + side to move (~4.5e12)",
}


@dataclass
class EnvStats:
    env_id: str
    notes: str
    expert_success: float
    random_success: float
    expert_length: float
    step_us: float


def measure(env_id: str, seeds: int) -> EnvStats:
    """Expert and random-policy statistics of one env over ``seeds`` seeded tasks."""
    full_id = env_id if "/" in env_id else f"gagpo_gym/{env_id}"
    env = gagpo_gym.make(full_id)
    if not hasattr(env.unwrapped, "expert_action"):
        raise ValueError(f"{full_id} has no expert_action()")
    expert_wins, expert_lengths, random_wins, step_ns = [], [], [], []
    for seed in range(seeds):
        won, length, times = run_episode(env, seed, lambda info: env.unwrapped.expert_action())
        expert_wins.append(won)
        expert_lengths.append(length)
        step_ns += times
        # a stream of its own: the env's RNG is seeded with ``seed`` too, and must not mirror the policy's draws
        won, _, times = run_episode(env, seed, uniform_policy(np.random.default_rng([seed, 1])))
        random_wins.append(won)
        step_ns += times
    doc = (type(env.unwrapped).__doc__ or "").strip().splitlines()
    env.close()
    return EnvStats(
        env_id=full_id,
        notes=NOTES.get(full_id, doc[0] if doc else ""),
        expert_success=float(np.mean(expert_wins)),
        random_success=float(np.mean(random_wins)),
        expert_length=float(np.mean(expert_lengths)),
        step_us=float(np.mean(step_ns)) / 1000.0,
    )


def markdown(rows: list[EnvStats], seeds: int) -> str:
    lines = [
        f"| env id | state space | expert success ({seeds} seeds) | random success ({seeds} seeds) "
        "| mean expert episode length | step time (µs) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.env_id} | {r.notes} | {r.expert_success:.1%} | {r.random_success:.1%} "
            f"| {r.expert_length:.2f} | {r.step_us:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=list(DEFAULT_ENVS), help="env ids (namespace optional)")
    parser.add_argument("--seeds", type=int, default=200, help="number of seeded tasks per env")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    table = markdown([measure(env_id, args.seeds) for env_id in args.envs], args.seeds)
    print(table)
    return table


if __name__ == "__main__":
    main()
