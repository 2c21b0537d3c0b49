"""ALFWorld-v0 on the real engine: expert success per task type, step/reset cost, and how often the
observation-text key (GiGPO's) merges states that the true-state key tells apart.

    python -m lab.tables.alfworld_games --splits valid_unseen valid_seen --random-rollouts 2

Aliasing is measured per game, because advantages are grouped per task (a group replays one game):

* rows: every state an action was taken from, in all rollouts of one game from one source (expert, random);
* merge rate: share of rows whose observation key, among that game's rows, comes with more than one true-state
  key (GiGPO would pool states that differ);
* split rate: share of rows whose true-state key comes with more than one observation key (GiGPO would keep
  apart visits of one state, e.g. the same place reached by "go to" and by "look").
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np

import gagpo_gym  # noqa: F401  (registers the envs)
from gagpo_gym.core import state_key
from gagpo_gym.envs.alfworld import SPLITS, TASK_TYPES
from wrappers import EpisodeStatistics

TYPES = list(TASK_TYPES.values())


@dataclass
class Rollouts:
    """Per (source, task type): successes, lengths, and rows (game, obs key, true key) for the aliasing rates."""

    wins: dict = field(default_factory=lambda: defaultdict(list))
    lengths: dict = field(default_factory=lambda: defaultdict(list))
    rows: dict = field(default_factory=lambda: defaultdict(list))


def play(env, seed: int, policy, rng: np.random.Generator, out: Rollouts, source: str, clock: dict) -> None:
    """One episode; ``clock`` collects reset (new game / replay of the loaded one), step and policy times."""
    t = time.perf_counter()
    obs, info = env.reset(seed=seed)
    clock["replay reset" if source == "random" else "new-game reset"].append(time.perf_counter() - t)
    task_type, game = info["task_type"], info["task_id"]
    terminated = truncated = False
    while not (terminated or truncated):
        t = time.perf_counter()
        action = policy(env, info, rng)
        clock[f"{source} policy"].append(time.perf_counter() - t)
        out.rows[source, task_type].append((game, state_key(obs), info["state_key"]))  # StateKey's "observation"
        t = time.perf_counter()
        obs, _, terminated, truncated, info = env.step(action)
        clock["step"].append(time.perf_counter() - t)
    episode = info["episode"]  # EpisodeStatistics' record of the episode
    out.wins[source, task_type].append(episode["won"])
    out.lengths[source, task_type].append(episode["l"])


def expert(env, info, rng) -> str:
    return env.unwrapped.expert_action()


def handcoded_expert(env, info, rng) -> str:
    return env.unwrapped.expert_action(kind="handcoded")


def random_admissible(env, info, rng) -> str:
    return info["admissible_actions"][rng.integers(len(info["admissible_actions"]))]


def rates(rows: list[tuple[str, int, int]]) -> tuple[float, float]:
    """(merge rate, split rate) of rows (game, obs key, true key), keys compared within each game."""
    true_of_obs, obs_of_true = defaultdict(set), defaultdict(set)
    for game, obs, true in rows:
        true_of_obs[game, obs].add(true)
        obs_of_true[game, true].add(obs)
    merged = sum(len(true_of_obs[g, o]) > 1 for g, o, _ in rows)
    split = sum(len(obs_of_true[g, s]) > 1 for g, _, s in rows)
    return merged / max(len(rows), 1), split / max(len(rows), 1)


def run_split(split: str, args: argparse.Namespace) -> None:
    out, clock = Rollouts(), defaultdict(list)
    rng = np.random.default_rng(0)
    planner = EpisodeStatistics(gym.make("gagpo_gym/ALFWorld-v0", split=split, data_root=args.data_root))
    n_games = len(planner.unwrapped.games)
    sources = [("planner", planner, expert)]
    if args.handcoded:
        handcoded = EpisodeStatistics(gym.make("gagpo_gym/ALFWorld-v0", split=split, data_root=args.data_root))
        sources.append(("handcoded", handcoded, handcoded_expert))
    started = time.perf_counter()
    for seed in range(n_games):
        for source, env, policy in sources:
            play(env, seed, policy, rng, out, source, clock)
        for _ in range(args.random_rollouts):  # the same game again: a replayed reset
            play(planner, seed, random_admissible, rng, out, "random", clock)
    elapsed = time.perf_counter() - started

    names = [s for s, _, _ in sources] + (["random"] if args.random_rollouts else [])
    print(f"\n## gagpo_gym/ALFWorld-v0, split={split}: {n_games} games ({elapsed:.0f} s)\n")
    header = "| policy | " + " | ".join(TYPES) + " | all | mean steps (won) |"
    print(header + "\n|" + "---|" * (header.count("|") - 1))
    for source in names:
        cells, wins, won_lengths = [], [], []
        for t in TYPES:
            w = out.wins[source, t]
            wins += w
            won_lengths += [n for n, ok in zip(out.lengths[source, t], w) if ok]
            cells.append(f"{sum(w)}/{len(w)}")
        mean_steps = np.mean(won_lengths) if won_lengths else float("nan")
        print(f"| {source} | " + " | ".join(cells) + f" | {sum(wins)}/{len(wins)} | {mean_steps:.1f} |")

    ms = {k: 1000 * float(np.mean(v)) for k, v in clock.items()}
    line = f"\nstep {ms['step']:.1f} ms (mean of {len(clock['step'])}); reset {ms['new-game reset']:.0f} ms (new game)"
    if args.random_rollouts:
        line += f", {ms['replay reset']:.0f} ms (replay of the loaded game)"
    line += f"; planner expert {ms['planner policy']:.1f} ms per call"
    if args.handcoded:
        line += f"; handcoded expert {ms['handcoded policy']:.1f} ms per call"
    print(line)

    print("\nAliasing of the observation-text key vs the true-state key, per game (rows = states acted from):")
    print("merge = share of rows whose obs key maps to >1 true key; split = share whose true key maps to >1 obs key\n")
    print("| source | " + " | ".join(TYPES) + " | all |")
    print("|" + "---|" * (len(TYPES) + 2))
    for source in names:
        cells, pooled = [], []
        for t in TYPES:
            rows = out.rows[source, t]
            pooled += rows
            merge, split_ = rates(rows)
            cells.append(f"{100 * merge:.1f}% / {100 * split_:.1f}% ({len(rows)})")
        merge, split_ = rates(pooled)
        print(
            f"| {source} merge/split (rows) | " + " | ".join(cells) + f" | {100 * merge:.1f}% / {100 * split_:.1f}% |"
        )
    if args.random_rollouts:
        cells, pooled = [], []
        for t in TYPES:
            rows = out.rows["planner", t] + out.rows["random", t]
            pooled += rows
            merge, split_ = rates(rows)
            cells.append(f"{100 * merge:.1f}% / {100 * split_:.1f}%")
        merge, split_ = rates(pooled)
        print("| planner+random pooled | " + " | ".join(cells) + f" | {100 * merge:.1f}% / {100 * split_:.1f}% |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--splits", nargs="+", default=["valid_unseen"], choices=list(SPLITS))
    parser.add_argument("--data-root", default=None, help="default: $ALFWORLD_DATA, then ../shared/alfworld")
    parser.add_argument("--random-rollouts", type=int, default=1, help="random-admissible episodes per game")
    parser.add_argument(
        "--no-handcoded", dest="handcoded", action="store_false", help="skip ALFWorld's handcoded expert"
    )
    args = parser.parse_args()
    for split in args.splits:
        run_split(split, args)


if __name__ == "__main__":
    main()
