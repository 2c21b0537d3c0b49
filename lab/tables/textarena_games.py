"""A Markdown table of the TextArena games (gagpo_gym/TextArena-<Game>-v0), also written to results/textarena/.

    python -m lab.tables.textarena_games                     # every registered TextArena game
    python -m lab.tables.textarena_games --games TowerOfHanoi Nim --episodes 20

Per game: whether it passes the project's checker (and Gymnasium's ``check_env``); random-policy success (uniform
over the admissible actions) over ``--episodes`` seeded tasks, one episode each; the expert's success on the same
tasks where the game has one; the mean random episode length; and the state-key repeat share: ``--groups`` groups
of ``--group-size`` random episodes from one seed each (as the GAGPO estimator groups a rollout), the share of the
steps whose state (where the action was taken) had been seen before within its group.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np

import gagpo_gym
from gagpo_gym.envs.textarena import GAGPO_TEXTARENA_PREFIX, GAMES
from lab.benchmark import run_episode, uniform_policy

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class GameStats:
    game: str
    checker: str
    random_success: float
    expert_success: float | None
    repeat_share: float
    mean_length: float


def repeat_share(env: gym.Env, groups: int, group_size: int) -> float:
    """Share of decision states already seen in their group (groups of same-seed random episodes)."""
    repeats = steps = 0
    for group in range(groups):
        seen: set[int] = set()
        rng = np.random.default_rng([group, 2])
        for _ in range(group_size):
            _, info = env.reset(seed=1000 + group)
            while True:
                key = info["state_key"]
                repeats += key in seen
                seen.add(key)
                steps += 1
                action = info["admissible_actions"][rng.integers(len(info["admissible_actions"]))]
                *_, terminated, truncated, info = env.step(action)
                if terminated or truncated:
                    break
    return repeats / steps


def measure(game: str, episodes: int, groups: int, group_size: int) -> GameStats:
    env_id = f"{GAGPO_TEXTARENA_PREFIX}{game}-v0"
    env = gym.make(env_id)
    try:
        gagpo_gym.check_text_env(gym.make(env_id))
        checker = "pass"
    except AssertionError as error:
        checker = f"fail: {str(error)[:80]}"
    random_runs = [run_episode(env, seed, uniform_policy(np.random.default_rng([seed, 1]))) for seed in range(episodes)]
    expert = None
    if env.unwrapped.EXPERTS:
        expert = float(
            np.mean([run_episode(env, s, lambda info: env.unwrapped.expert_action())[0] for s in range(episodes)])
        )
    stats = GameStats(
        game=game,
        checker=checker,
        random_success=float(np.mean([won for won, _, _ in random_runs])),
        expert_success=expert,
        repeat_share=repeat_share(env, groups, group_size),
        mean_length=float(np.mean([length for _, length, _ in random_runs])),
    )
    env.close()
    return stats


def markdown(rows: list[GameStats], episodes: int, groups: int, group_size: int) -> str:
    lines = [
        f"| env id | checker | random success ({episodes} tasks) | expert success | key repeat share "
        f"({groups} groups x {group_size}) | mean random episode length |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        expert = "-" if r.expert_success is None else f"{r.expert_success:.0%}"
        lines.append(
            f"| {GAGPO_TEXTARENA_PREFIX}{r.game}-v0 | {r.checker} | {r.random_success:.0%} | {expert} "
            f"| {r.repeat_share:.2f} | {r.mean_length:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", nargs="+", default=list(GAMES), choices=list(GAMES), help="games (default: all)")
    parser.add_argument("--episodes", type=int, default=50, help="seeded tasks for the success rates")
    parser.add_argument("--groups", type=int, default=4, help="groups for the key repeat share")
    parser.add_argument("--group-size", type=int, default=8, help="episodes per group")
    parser.add_argument(
        "--out", default=str(ROOT / "results" / "textarena" / "report"), help="output path without suffix"
    )
    args = parser.parse_args(argv)
    if min(args.episodes, args.groups, args.group_size) < 1:
        parser.error("--episodes, --groups and --group-size must be >= 1")
    rows = []
    for game in args.games:
        rows.append(measure(game, args.episodes, args.groups, args.group_size))
        print(f"{game}: {rows[-1]}", flush=True)
    table = markdown(rows, args.episodes, args.groups, args.group_size)
    print(table)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(f"{args.out}.md", "w") as f:
        made = "Made by `python -m lab.tables.textarena_games`."
        f.write(f"# TextArena games (textarena 0.7.4)\n\n{made}\n\n{table}\n")
    with open(f"{args.out}.json", "w") as f:
        json.dump([asdict(r) for r in rows], f, indent=1)
    return table


if __name__ == "__main__":
    main()
