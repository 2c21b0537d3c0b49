"""Where an estimator's credit goes in one rollout of a policy: winning episodes, failing ones, and the failing
episodes' revisits of a state (their loops).

    python -m lab.research.credit_check --model results/agents/minihouse-full-search --env-kwargs '{"size": "full"}'

It plays one rollout (``--groups`` tasks x ``--group-size`` episodes) of the policy at each seed and key, with no
update, and computes GAGPO's advantages on it, before normalisation and after, with and without the episode term
(``episode_coef``), as ``agents.advantages`` does in training. The question it answers: does a failing episode's
every action get pushed down, or only the step where it left the states a winner also visited? A failing tail that
no winner shared has TD residuals of exactly 0 (``Vbar = R_t = 0`` along it), so its loops keep their probability.

``--compare gigpo grpo g2po`` adds how far GAGPO's advantages (as it trains: per-group normalised, with the episode term
at ``--train-episode-coef``) are from another estimator's on the very same rows: if two estimators give each action
nearly the same advantage, their updates are nearly the same and so are the policies they end at.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from agents.cli import fail, parse_json_kwargs
from agents.reporting import atomic_write_text, markdown_table

#: Row kinds of the report, each a mask over the rollout's rows.
KINDS = (
    "winning-episode rows",
    "failing-episode rows",
    "failing rows in mixed groups",
    "failing revisit rows",
    "failing revisit rows, mixed groups",
)


def rollout_rows(model: str, env_id: str, env_kwargs: dict[str, Any], groups: int, size: int, seed: int, key: str):
    """The rows of one rollout of ``model`` (before any update), in the estimators' layout, and the policy's prompt
    history."""
    import torch
    from stable_baselines3.common.callbacks import BaseCallback

    from agents.gagpo import GAGPOAgent

    torch.set_num_threads(1)
    agent = GAGPOAgent(
        env_id, model, env_kwargs=env_kwargs, verbose=0, seed=seed, num_groups=groups, group_size=size, state_key=key
    )

    class Capture(BaseCallback):
        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            self.rows = list(agent.buffer.rows)

    capture = Capture()
    agent.learn(1, callback=capture, max_iterations=1)
    return sorted(capture.rows, key=lambda row: (row.group, row.episode)), agent.config.history_length


def credit_table(rows: list, coefs: list[float]) -> list[dict[str, Any]]:
    """Per row kind: how many rows, the share whose GAGPO advantage is exactly 0 before normalisation, and the mean
    normalised advantage at each episode coefficient."""
    from agents.advantages import gagpo_advantages

    arrays = row_arrays(rows)
    raw = gagpo_advantages(*arrays, normalize="none")
    advantages = {coef: gagpo_advantages(*arrays, episode_coef=coef) for coef in coefs}
    episode, group = arrays[1], arrays[2]
    won = {r.episode for r in rows if r.won}
    failing = np.array([e not in won for e in episode])
    seen: set = set()
    revisit = np.zeros(len(rows), dtype=bool)
    for i, row in enumerate(rows):
        revisit[i] = (row.episode, row.state_key) in seen
        seen.add((row.episode, row.state_key))
    members: dict[int, set] = {}
    for e, g in zip(episode, group):
        members.setdefault(int(g), set()).add(int(e))
    mixed_groups = {g for g, eps in members.items() if 0 < len(eps & won) < len(eps)}
    mixed = np.array([int(g) in mixed_groups for g in group])
    masks = dict(zip(KINDS, (~failing, failing, failing & mixed, failing & revisit, failing & revisit & mixed)))
    table = []
    for kind, mask in masks.items():
        row = {"rows": kind, "n": int(mask.sum())}
        if mask.any():
            row["raw A = 0"] = f"{np.mean(np.abs(raw[mask]) < 1e-12):.2f}"
            for coef, a in advantages.items():
                row[f"mean A, episode_coef {coef:g}"] = f"{a[mask].mean():+.3f}"
        table.append(row)
    return table


def row_arrays(rows: list) -> tuple[np.ndarray, ...]:
    """rewards, episodes, groups, state keys, next state keys, terminated: the estimators' flat layout."""
    return (
        np.array([r.reward for r in rows]), np.array([r.episode for r in rows]), np.array([r.group for r in rows]),
        np.array([r.state_key for r in rows]), np.array([r.next_state_key for r in rows]),
        np.array([r.terminated for r in rows]),
    )  # fmt: skip


def agreement_table(rows: list, others: list[str], episode_coef: float, history: int = 2) -> list[dict[str, Any]]:
    """GAGPO's advantage of each row against each other estimator's, over all rows, winning rows and failing rows:
    Pearson correlation, the share with the same sign (rows where either is 0 count when both are), and the mean
    absolute difference in units of GAGPO's standard deviation. The estimators run with the library's defaults,
    HGPO with the policy's prompt history as its deepest level (as the agent trains it)."""
    from agents import advantages as adv

    rewards, episodes, groups, keys, next_keys, terminated = row_arrays(rows)
    success = np.array([r.done and r.won for r in rows], dtype=bool)
    ours = adv.gagpo_advantages(rewards, episodes, groups, keys, next_keys, terminated, episode_coef=episode_coef)
    theirs = {
        "gigpo": lambda: adv.gigpo_advantages(rewards, episodes, groups, keys),
        "grpo": lambda: adv.grpo_advantages(rewards, episodes, groups),
        "rloo": lambda: adv.rloo_advantages(rewards, episodes, groups),
        "hgpo": lambda: adv.hgpo_advantages(rewards, episodes, groups, keys, history=history),
        "graphgpo": lambda: adv.graphgpo_advantages(rewards, episodes, groups, keys, next_keys, success),
        "g2po": lambda: adv.g2po_advantages(rewards, episodes, groups, keys, success),
    }
    won = {r.episode for r in rows if r.won}
    winning = np.array([e in won for e in episodes])
    table = []
    for other in others:
        if other not in theirs:
            raise ValueError(f"--compare takes {sorted(theirs)}, got {other!r}")
        a = theirs[other]()
        for name, mask in (
            ("all rows", np.ones(len(rows), bool)),
            ("winning rows", winning),
            ("failing rows", ~winning),
        ):
            if mask.sum() < 2:
                continue
            x, y = ours[mask], a[mask]
            both_spread = x.std() > 0 and y.std() > 0
            table.append({
                "gagpo vs": other, "rows": name, "n": int(mask.sum()),
                "correlation": f"{np.corrcoef(x, y)[0, 1]:.3f}" if both_spread else "-",
                "same sign": f"{np.mean(np.sign(np.round(x, 9)) == np.sign(np.round(y, 9))):.2f}",
                "mean abs difference / std": f"{np.mean(np.abs(x - y)) / max(ours.std(), 1e-12):.3f}",
            })  # fmt: skip
    return table


def legend(args: argparse.Namespace) -> str:
    """What the report's tables hold."""
    return (
        f"One rollout of the policy per seed and key, no update: {args.groups} tasks x {args.group_size} episodes. "
        "Rows: the actions of winning and of failing episodes; a revisit is an action taken from a state its own "
        "episode had been in before (a loop); a mixed group has winners and losers. raw A = 0: the share whose GAGPO "
        "advantage (gamma 0.95, lambda 0.8) is exactly 0 before normalisation; mean A: the mean group-normalised "
        "advantage, with the GRPO episode term times episode_coef added.\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a warm-start prior or saved agent's folder, or 'tiny'")
    parser.add_argument("--env", default="gagpo_gym/MiniHouse-v0")
    parser.add_argument("--env-kwargs", default=None, help="JSON of the env's constructor arguments")
    parser.add_argument("--groups", type=int, default=16, help="tasks in the rollout")
    parser.add_argument("--group-size", type=int, default=4, help="episodes per task")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--state-keys", nargs="+", default=["state", "observation"], help="GAGPO's state keys")
    parser.add_argument("--episode-coefs", nargs="+", type=float, default=[0.0, 1.0])
    parser.add_argument(
        "--compare", nargs="*", default=[], choices=["gigpo", "grpo", "rloo", "hgpo", "graphgpo", "g2po"],
        help="also compare GAGPO's advantages on the same rows with these estimators'",
    )  # fmt: skip
    parser.add_argument(
        "--train-episode-coef", type=float, default=1.0,
        help="GAGPO's episode term in --compare (the full-house priors train with 1)",
    )  # fmt: skip
    parser.add_argument("--out", default=None, help="also write the report (markdown) here")
    args = parser.parse_args(argv)
    if args.groups < 1 or args.group_size < 2:
        fail("--groups must be >= 1 and --group-size >= 2")
    env_kwargs = parse_json_kwargs(args.env_kwargs)
    parts = [f"# Where GAGPO's credit goes: {args.env} {env_kwargs}, policy `{args.model}`\n", legend(args)]
    for seed in args.seeds:
        for key in args.state_keys:
            rows, history = rollout_rows(args.model, args.env, env_kwargs, args.groups, args.group_size, seed, key)
            episodes = {r.episode for r in rows}
            wins = {r.episode for r in rows if r.won}
            parts.append(
                f"## seed {seed}, state_key {key!r}: {len(episodes)} episodes ({len(wins)} won), {len(rows)} rows\n\n"
                + markdown_table(credit_table(rows, args.episode_coefs))
                + "\n"
            )
            if args.compare:
                parts.append(
                    f"GAGPO (episode_coef {args.train_episode_coef:g}) against the others on these rows:\n\n"
                    + markdown_table(agreement_table(rows, args.compare, args.train_episode_coef, history))
                    + "\n"
                )
    text = "\n".join(parts)
    print(text)
    if args.out:
        atomic_write_text(Path(args.out), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
