"""Train a GAGPO agent (or a baseline) on any registered text env from the command line.

    python scripts/train.py --env gagpo_gym/Maze-v0 --total-timesteps 20000 --save-dir runs/maze
    python scripts/train.py --env gagpo_gym/MiniHouse-v0 --env-kwargs '{"size": "small"}' --estimator gigpo
    python scripts/train.py --resume runs/maze/final --total-timesteps 10000     # continue counting steps

Every field of ``agents.config.GAGPOConfig`` is a flag (``--help`` lists them with types and defaults).
Checkpoints are SB3-style (a callback saving every ``--checkpoint-freq`` env steps); logs go to stdout and, with
``--log-dir``, to CSV, JSON and TensorBoard (when installed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from _common import (
    add_config_arguments,
    check_env_kwargs,
    config_overrides,
    fail,
    markdown_table,
    parse_json_kwargs,
    resolve_env_id,
    table_kind,
    table_legend,
    table_row,
    validated_config,
)


def build_parser() -> tuple[argparse.ArgumentParser, list[str]]:
    parser = argparse.ArgumentParser(
        description="Train a multi-turn LLM agent with GAGPO (or GiGPO, GRPO, RLOO, PPO) on a gagpo_gym env.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    run = parser.add_argument_group("run")
    run.add_argument("--env", help="registered env id, e.g. gagpo_gym/Maze-v0 (required unless --resume)")
    run.add_argument("--env-kwargs", default=None, help='env constructor arguments as JSON, e.g. \'{"size": "small"}\'')
    run.add_argument("--model", default="tiny", help="'tiny' (built locally, no download) or a local HF checkpoint")
    run.add_argument("--total-timesteps", type=int, default=20_000, help="env steps (actions) to train for")
    run.add_argument("--save-dir", default=None, help="where the final agent (<dir>/final) and checkpoints go")
    run.add_argument("--checkpoint-freq", type=int, default=0, help="save every N env steps (0: only at the end)")
    run.add_argument("--resume", default=None, metavar="PATH", help="continue a saved agent; step count continues")
    run.add_argument("--log-dir", default=None, help="SB3 logger folder: CSV, JSON, TensorBoard when installed")
    run.add_argument("--log-interval", type=int, default=1, help="dump logs every N iterations")
    run.add_argument("--progress-bar", action="store_true", help="show a progress bar (env steps)")
    run.add_argument("--eval-tasks", type=int, default=0, help="evaluate on tasks 0..N-1 at the end (0: skip)")
    run.add_argument("--quiet", action="store_true", help="no per-iteration log table on stdout")
    names = add_config_arguments(parser)
    return parser, names


def main(argv: list[str] | None = None) -> int:
    parser, names = build_parser()
    args = parser.parse_args(argv)
    for flag, value in (("--total-timesteps", args.total_timesteps), ("--log-interval", args.log_interval)):
        if value < 1:
            fail(f"{flag} must be >= 1, got {value}")
    for flag, value in (("--checkpoint-freq", args.checkpoint_freq), ("--eval-tasks", args.eval_tasks)):
        if value < 0:
            fail(f"{flag} must be >= 0, got {value}")
    if args.checkpoint_freq and not args.save_dir:
        fail("--checkpoint-freq needs --save-dir")
    overrides = config_overrides(args, names)
    env_kwargs = parse_json_kwargs(args.env_kwargs)

    import gagpo_gym
    from agents.callbacks import IterationCheckpoint
    from agents.gagpo import AGENT_FILE, GAGPOAgent

    verbose = 0 if args.quiet else 1
    started = time.perf_counter()
    if args.resume:
        if not (Path(args.resume) / AGENT_FILE).is_file():
            fail(f"no saved agent at {args.resume} (expected {AGENT_FILE} inside)")
        saved = json.loads((Path(args.resume) / AGENT_FILE).read_text())
        validated_config({**saved["config"], **overrides})
        env: Any = None
        if args.env:
            env_id = resolve_env_id(args.env)
            check_env_kwargs(env_id, env_kwargs)
            env = gagpo_gym.make(env_id, **env_kwargs)
        agent = GAGPOAgent.load(args.resume, env=env, verbose=verbose, log_dir=args.log_dir, **overrides)
        print(f"resumed {args.resume} at {agent.num_timesteps} env steps ({agent.env_id})")
    else:
        if not args.env:
            fail("--env is required (or --resume PATH)")
        env_id = resolve_env_id(args.env)
        check_env_kwargs(env_id, env_kwargs)
        estimator = overrides.pop("estimator", "gagpo")
        validated_config({"estimator": estimator, **overrides})
        try:
            agent = GAGPOAgent(
                env_id,
                model=args.model,
                estimator=estimator,
                env_kwargs=env_kwargs,
                verbose=verbose,
                log_dir=args.log_dir,
                **overrides,
            )
        except (OSError, ValueError) as err:
            fail(str(err).splitlines()[0])

    callbacks = []
    if args.checkpoint_freq:
        callbacks.append(IterationCheckpoint(args.checkpoint_freq, str(Path(args.save_dir) / "checkpoints")))
    agent.learn(
        args.total_timesteps,
        callback=callbacks,
        progress_bar=args.progress_bar,
        log_interval=args.log_interval,
        reset_num_timesteps=not args.resume,
    )
    print(f"trained to {agent.num_timesteps} env steps in {time.perf_counter() - started:.0f}s")
    if args.save_dir:
        final = Path(args.save_dir) / "final"
        agent.save(final)
        print(f"saved: {final}")
    if args.eval_tasks:
        metrics = agent.evaluate(n_tasks=args.eval_tasks)
        kind = table_kind(agent.env_id)
        print(f"\nEvaluation on {agent.env_id} {agent.env_kwargs or ''} tasks 0..{args.eval_tasks - 1} (greedy):\n")
        print(markdown_table([table_row(agent.config.estimator, metrics, kind)]))
        print(f"\n{table_legend(kind)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
