"""Evaluate saved agents, the expert and a random policy on a fixed panel of tasks; print the paper's table.

    python scripts/eval.py --env gagpo_gym/Maze-v0                       # expert and random reference rows
    python scripts/eval.py --agent runs/house_gagpo/final --agent runs/house_grpo/final --expert --random \\
        --out results/eval_house                                          # the env the agents were trained on

A saved agent brings its env id and env kwargs (its agent.json); ``--env`` / ``--env-kwargs`` override them, with
a warning when they differ.

The panel is tasks ``0..N-1`` (``reset(seed=i)``), each played once: the same tasks on every machine. Agents act
greedily. Columns follow the paper: per-task-type success for ALFWorld/MiniHouse (Pick, Look, Clean, Heat, Cool,
Pick2, All; the mean length of the won episodes), score and success for MiniShop, success elsewhere, and the mean
episode length.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from _common import (
    check_env_kwargs,
    fail,
    markdown_table,
    parse_json_kwargs,
    resolve_env_id,
    table_kind,
    table_legend,
    table_row,
    write_csv,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Evaluate agents and reference policies on a fixed task panel (tasks 0..N-1, each once).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--env", default=None, help="registered env id, e.g. gagpo_gym/Maze-v0 (default: the saved agents' env)"
    )
    parser.add_argument(
        "--env-kwargs", default=None, help="env constructor arguments as JSON (default: the saved agents' ones)"
    )
    parser.add_argument("--agent", action="append", default=[], metavar="PATH", help="saved agent (repeatable)")
    parser.add_argument("--name", action="append", default=[], help="row label for each --agent, in order")
    parser.add_argument("--expert", action="store_true", help="add the env's expert as a reference row")
    parser.add_argument("--random", action="store_true", help="add a uniform-random admissible-action row")
    parser.add_argument("--random-seed", type=int, default=0, help="seed of the random policy's action stream")
    parser.add_argument("--n-tasks", type=int, default=50, help="panel size: tasks 0..N-1")
    parser.add_argument("--seed-offset", type=int, default=0, help="panel starts at this task seed")
    parser.add_argument("--batch-size", type=int, default=16, help="tasks played side by side")
    parser.add_argument("--sampled", action="store_true", help="agents sample actions instead of acting greedily")
    parser.add_argument("--out", default=None, help="folder for eval.csv and eval.json")
    return parser


def evaluate_agent(path: str, env_id: str, env_kwargs: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    from agents.gagpo import GAGPOAgent

    agent = GAGPOAgent.load(path, verbose=0, torch_threads=1)
    return agent.evaluate(
        env_id,
        n_tasks=args.n_tasks,
        deterministic=not args.sampled,
        batch_size=args.batch_size,
        seed_offset=args.seed_offset,
        env_kwargs=env_kwargs,
        episodes=True,
    )


def evaluate_reference(kind: str, env_id: str, env_kwargs: dict[str, Any], args: argparse.Namespace) -> dict:
    from agents.evaluation import reference_policy_panel

    return reference_policy_panel(
        kind, env_id, env_kwargs, args.n_tasks, seed=args.random_seed, seed_offset=args.seed_offset
    )


def saved_env(path: str) -> tuple[str | None, dict[str, Any]]:
    """The env id and env kwargs a saved agent was trained on, read from its agent.json."""
    from agents.gagpo import AGENT_FILE

    meta = json.loads((Path(path) / AGENT_FILE).read_text())
    return meta.get("env_id"), dict(meta.get("env_kwargs") or {})


def choose_env(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The panel's env: ``--env`` / ``--env-kwargs`` where given, else the saved agents' own; warns on a mismatch."""
    saved = {path: saved_env(path) for path in args.agent}
    trained_on = sorted({(env_id, json.dumps(kwargs, sort_keys=True)) for env_id, kwargs in saved.values() if env_id})
    if args.env is None and not trained_on:
        fail("give --env (or --agent with a saved agent that names its env)")
    if args.env is None and len(trained_on) > 1:
        fail(f"the agents were trained on different envs ({'; '.join(map(' '.join, trained_on))}); give --env")
    env_id = resolve_env_id(args.env) if args.env is not None else trained_on[0][0]
    same_env = [kwargs for saved_id, kwargs in saved.values() if saved_id == env_id]
    default_kwargs = same_env[0] if same_env else {}
    env_kwargs = default_kwargs if args.env_kwargs is None else parse_json_kwargs(args.env_kwargs)
    for path, (saved_id, kwargs) in saved.items():
        if saved_id is not None and saved_id != env_id:
            warn(f"--env {env_id} differs from the env {path} was trained on ({saved_id})")
        elif saved_id == env_id and kwargs != env_kwargs:
            warn(f"--env-kwargs {json.dumps(env_kwargs)} differ from {path}'s training env kwargs {json.dumps(kwargs)}")
    return env_id, env_kwargs


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.n_tasks < 1 or args.batch_size < 1:
        fail(f"--n-tasks and --batch-size must be >= 1, got {args.n_tasks} and {args.batch_size}")
    if args.name and len(args.name) != len(args.agent):
        fail(f"give one --name per --agent ({len(args.agent)} agents, {len(args.name)} names)")
    from agents.gagpo import AGENT_FILE

    for path in args.agent:
        if not (Path(path) / AGENT_FILE).is_file():
            fail(f"no saved agent at {path} (expected {AGENT_FILE} inside; train.py writes <save-dir>/final)")
    env_id, env_kwargs = choose_env(args)
    check_env_kwargs(env_id, env_kwargs)
    if not (args.agent or args.expert or args.random):
        args.expert = args.random = True

    # (row label, saved agent path or reference policy kind)
    entries = [(args.name[k] if args.name else _agent_label(path), path) for k, path in enumerate(args.agent)]
    entries += [(ref, ref) for ref, wanted in (("expert", args.expert), ("random", args.random)) if wanted]

    kind = table_kind(env_id)
    rows, results = [], []
    for name, source in entries:
        started = time.perf_counter()
        try:
            if source in ("expert", "random"):
                metrics = evaluate_reference(source, env_id, env_kwargs, args)
            else:
                metrics = evaluate_agent(source, env_id, env_kwargs, args)
        except AttributeError as err:
            fail(f"{name}: {env_id} has no expert ({err})")
        seconds = time.perf_counter() - started
        rows.append(table_row(name, metrics, kind))
        results.append({"agent": name, "source": source, "seconds": seconds, **metrics})

    panel = f"tasks {args.seed_offset}..{args.seed_offset + args.n_tasks - 1}"
    print(f"{env_id} {json.dumps(env_kwargs) if env_kwargs else ''} | {panel}, each once\n")
    print(markdown_table(rows))
    print(f"\n{table_legend(kind)}")
    if args.out:
        out = Path(args.out)
        write_csv(out / "eval.csv", rows)
        payload = {"env": env_id, "env_kwargs": env_kwargs, "panel": panel, "table": rows, "results": results}
        (out / "eval.json").write_text(json.dumps(payload, indent=2))
        print(f"\nwrote {out / 'eval.csv'} and {out / 'eval.json'}")
    return 0


def _agent_label(path: str) -> str:
    """``<estimator> @ <steps>`` from the saved agent's metadata, so side-by-side rows say what they are."""
    from agents.gagpo import AGENT_FILE

    meta = json.loads((Path(path) / AGENT_FILE).read_text())
    return f"{meta['config']['estimator']} @ {meta['num_timesteps']} steps ({path})"


if __name__ == "__main__":
    sys.exit(main())
