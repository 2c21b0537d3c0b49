"""Train a GAGPO agent (or a baseline) on any registered text env from the command line.

    python scripts/train.py --env gagpo_gym/Maze-v0 --total-timesteps 20000 --save-dir runs/maze
    python scripts/train.py --env gagpo_gym/MiniHouse-v0 --env-kwargs '{"size": "small"}' --estimator gigpo
    python scripts/train.py --resume runs/maze/final --total-timesteps 10000     # 10000 more steps
    python scripts/train.py --resume runs/maze/final --until 30000               # until the count reaches 30000
    PYTHONPATH=. python scripts/train.py --env my_envs:MyEnv-v0                  # your own env (module:EnvId)

Every field of ``agents.config.GAGPOConfig`` is a flag (``--help`` lists them with types and defaults).
Checkpoints are SB3-style (a callback saving every ``--checkpoint-freq`` env steps); logs go to stdout and, with
``--log-dir``, to CSV, JSON and TensorBoard (when installed). ``--progress-bar`` draws a bar on stderr (env steps
done / total, time left, steps/s). Ctrl-C ends with one line naming the last checkpoint, and exit code 130.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from common import (
    add_config_arguments,
    check_env_kwargs,
    config_overrides,
    fail,
    interrupted,
    parse_json_kwargs,
    resolve_env_id,
    results_table,
    table_kind,
    table_legend,
    table_row,
    validated_config,
)

DEFAULT_TIMESTEPS = 20_000


def build_parser() -> tuple[argparse.ArgumentParser, list[str]]:
    parser = argparse.ArgumentParser(
        description="Train a multi-turn LLM agent with GAGPO (or GiGPO, GRPO, RLOO, PPO) on a gagpo_gym env.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    run = parser.add_argument_group("run")
    run.add_argument(
        "--env",
        help="registered env id, e.g. gagpo_gym/Maze-v0, or Gymnasium's module:EnvId form, e.g. my_envs:MyEnv-v0 "
        "(the module is imported first and kept in the saved agent's env id); required unless --resume",
    )
    run.add_argument("--env-kwargs", default=None, help='env constructor arguments as JSON, e.g. \'{"size": "small"}\'')
    run.add_argument("--model", default="tiny", help="'tiny' (built locally, no download) or a local HF checkpoint")
    steps = run.add_mutually_exclusive_group()
    steps.add_argument(
        "--total-timesteps",
        type=int,
        default=argparse.SUPPRESS,  # given or not: --until excludes it, its default is DEFAULT_TIMESTEPS
        help=f"env steps (actions) to train for in this run (default: {DEFAULT_TIMESTEPS}); with --resume, this many "
        "MORE steps on top of the saved agent's count (SB3's reset_num_timesteps=False); see --until",
    )
    steps.add_argument(
        "--until",
        type=int,
        default=argparse.SUPPRESS,
        metavar="N",
        help="train until the agent's step count (num_timesteps, saved with it) reaches N: with --resume, "
        "N minus the saved count more steps (none when it is already there)",
    )
    run.add_argument("--save-dir", default=None, help="where the final agent (<dir>/final) and checkpoints go")
    run.add_argument("--checkpoint-freq", type=int, default=0, help="save every N env steps (0: only at the end)")
    run.add_argument(
        "--resume",
        default=None,
        metavar="PATH",
        help="continue a saved agent; its step count continues (--total-timesteps N: N more; --until N: up to N)",
    )
    run.add_argument("--log-dir", default=None, help="SB3 logger folder: CSV, JSON, TensorBoard when installed")
    run.add_argument("--log-interval", type=int, default=1, help="dump logs every N iterations")
    run.add_argument(
        "--progress-bar", action="store_true", help="progress bar on stderr: env steps done / total, time left, steps/s"
    )
    run.add_argument("--eval-tasks", type=int, default=0, help="evaluate on tasks 0..N-1 at the end (0: skip)")
    run.add_argument("--quiet", action="store_true", help="no per-iteration log table on stdout")
    names = add_config_arguments(parser)
    return parser, names


def say(*args: Any) -> None:
    """print, from the main process only: under a launch every rank runs this script."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(*args)


def main(argv: list[str] | None = None) -> int:
    parser, names = build_parser()
    args = parser.parse_args(argv)
    args.total_timesteps, args.until = getattr(args, "total_timesteps", None), getattr(args, "until", None)
    state: dict[str, Any] = {"agent": None, "checkpoints": None, "resumed": None}
    try:
        return _main(args, names, state)
    except KeyboardInterrupt:
        interrupted(_where(state))


def _where(state: dict[str, Any]) -> str:
    """What a Ctrl-C leaves: the steps trained and the last checkpoint to resume from."""
    agent, folder = state["agent"], state["checkpoints"]
    steps = f"at {agent.num_timesteps} env steps; " if agent is not None else ""
    saved = sorted(folder.glob("*_steps"), key=_steps_of) if folder is not None and folder.is_dir() else []
    if saved:
        return f"{steps}last checkpoint: {saved[-1]} (resume with --resume {saved[-1]})"
    if state["resumed"]:
        return f"{steps}no new checkpoint; the run started from {state['resumed']}"
    hint = "" if folder is not None else " (--save-dir and --checkpoint-freq save them as training goes)"
    return f"{steps}no checkpoint was saved{hint}"


def _steps_of(path: Path) -> int:
    try:
        return int(path.name.rsplit("_", 2)[-2])
    except (IndexError, ValueError):
        return -1


def _main(args: argparse.Namespace, names: list[str], state: dict[str, Any]) -> int:
    if args.total_timesteps is not None and args.total_timesteps < 1:
        fail(f"--total-timesteps must be >= 1, got {args.total_timesteps}")
    if args.until is not None and args.until < 1:
        fail(f"--until must be >= 1, got {args.until}")
    if args.log_interval < 1:
        fail(f"--log-interval must be >= 1, got {args.log_interval}")
    for flag, value in (("--checkpoint-freq", args.checkpoint_freq), ("--eval-tasks", args.eval_tasks)):
        if value < 0:
            fail(f"{flag} must be >= 0, got {value}")
    if args.checkpoint_freq and not args.save_dir:
        fail("--checkpoint-freq needs --save-dir")
    overrides = config_overrides(args, names)
    env_kwargs = parse_json_kwargs(args.env_kwargs)

    from agents.callbacks import IterationCheckpoint
    from agents.checkpoint import AGENT_FILE
    from agents.env_spec import make_env
    from agents.gagpo import GAGPOAgent

    verbose = 0 if args.quiet else 1
    started = time.perf_counter()
    if args.resume:
        if not (Path(args.resume) / AGENT_FILE).is_file():
            fail(f"no saved agent at {args.resume} (expected {AGENT_FILE} inside)")
        try:
            saved = json.loads((Path(args.resume) / AGENT_FILE).read_text())
            saved_config = saved["config"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            fail(f"saved agent at {args.resume} is damaged: {AGENT_FILE} cannot be read ({type(err).__name__}: {err})")
        validated_config({**saved_config, **overrides})
        env: Any = None
        if args.env:
            env_id = resolve_env_id(args.env)
            check_env_kwargs(env_id, env_kwargs)
            # An id keeps a module:id's module in the saved agent; a made env carries kwargs (its spec, no module).
            env = make_env(env_id, env_kwargs, None) if env_kwargs else env_id
        elif saved.get("env_id"):
            resolve_env_id(saved["env_id"])  # a module:id env imports its module; an unknown one is one line
        try:
            agent = GAGPOAgent.load(args.resume, env=env, verbose=verbose, log_dir=args.log_dir, **overrides)
        except (OSError, ValueError) as err:
            fail(str(err).splitlines()[0])
        state["resumed"] = args.resume
        say(f"resumed {args.resume} at {agent.num_timesteps} env steps ({agent.env_id})")
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
    state["agent"] = agent

    if args.until is not None:
        more = max(0, args.until - agent.num_timesteps)
        if not more:
            say(f"already at {agent.num_timesteps} env steps (--until {args.until}): nothing to train")
    else:
        more = args.total_timesteps if args.total_timesteps is not None else DEFAULT_TIMESTEPS
    callbacks = []
    if args.checkpoint_freq:
        state["checkpoints"] = Path(args.save_dir) / "checkpoints"
        callbacks.append(IterationCheckpoint(args.checkpoint_freq, str(state["checkpoints"])))
    if more:
        agent.learn(
            more,
            callback=callbacks,
            progress_bar=args.progress_bar,
            log_interval=args.log_interval,
            reset_num_timesteps=not args.resume,
        )
        say(f"trained to {agent.num_timesteps} env steps in {time.perf_counter() - started:.0f}s")
    if args.save_dir:
        final = Path(args.save_dir) / "final"
        agent.save(final)
        say(f"saved: {final}")
    if args.eval_tasks:
        from agents.callbacks import ProgressBar
        from agents.evaluation import panel_progress

        bar = ProgressBar(args.eval_tasks, "evaluation", unit="task", enabled=args.progress_bar)
        with bar, panel_progress(bar.advance):
            metrics = agent.evaluate(n_tasks=args.eval_tasks, episodes=True)
        kind = table_kind(agent.env_id)
        say(f"\nEvaluation on {agent.env_id} {agent.env_kwargs or ''} tasks 0..{args.eval_tasks - 1} (greedy):\n")
        say(results_table([table_row(agent.config.estimator, metrics, kind)]))
        say(f"\n{table_legend(kind)}")
    agent.env.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
