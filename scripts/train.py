"""Train a GAGPO agent (or a baseline) on any registered text env from the command line.

    python scripts/train.py --env gagpo_gym/Maze-v0 --total-timesteps 20000 --save-dir runs/maze
    python scripts/train.py --env gagpo_gym/MiniHouse-v0 --env-kwargs '{"size": "small"}' --estimator gigpo
    python scripts/train.py --resume runs/maze/final --total-timesteps 10000     # 10000 more steps
    python scripts/train.py --resume runs/maze/final --until 30000               # until the count reaches 30000
    PYTHONPATH=. python scripts/train.py --env my_envs:MyEnv-v0                  # your own env (module:EnvId)
    python scripts/train.py --recipe alfworld-gagpo-qwen2.5-1.5b --model /models/Qwen2.5-1.5B-Instruct
    python scripts/train.py --recipe alfworld-gagpo-qwen2.5-1.5b --model .cache/smollm2-135m-instruct \
        --backend hf --env-kwargs '{"split": "valid_unseen"}' --dry-run     # the resolved settings and first prompt

Every field of ``agents.config.GAGPOConfig`` is a flag (``--help`` lists them with types and defaults).
``--recipe NAME`` starts from ``agents/configs/recipes/NAME.yaml`` (the paper's runs with verl-agent's settings,
each value with its source; ``--list-recipes`` names them); a flag given overrides the recipe's value. The resolved
settings are printed and, with ``--save-dir``, written to ``<dir>/run.json`` before training starts.
Checkpoints are SB3-style (a callback saving every ``--checkpoint-freq`` env steps); logs go to stdout and, with
``--log-dir``, to CSV, JSON and TensorBoard (when installed). ``--progress-bar`` draws a bar on stderr (env steps
done / total, time left, steps/s). Ctrl-C ends with one line naming the last checkpoint, and exit code 130.
SIGTERM (a cluster's preemption, ``timeout``) ends the same way, with exit code 143, after saving the agent at its
last iteration boundary into ``<save-dir>/checkpoints`` (an update under way is finished first). An env that raises
ends with its own traceback, one line naming the env, task, seed and step, and the agent saved the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn

from stable_baselines3.common.callbacks import BaseCallback

from agents.cli import (
    add_config_arguments,
    check_env_kwargs,
    check_writable,
    config_overrides,
    fail,
    first_line,
    interrupted,
    parse_json_kwargs,
    resolve_env_id,
    validated_config,
)
from agents.recipes import load_recipe, recipe_names
from agents.reporting import results_table, table_kind, table_legend, table_row
from wrappers.grouped_vector_env import SubEnvError

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
    run.add_argument(
        "--recipe",
        default=None,
        metavar="NAME",
        help="start from agents/configs/recipes/NAME.yaml (or a YAML file's path); a flag given overrides its value",
    )
    run.add_argument("--list-recipes", action="store_true", help="name the recipes in agents/configs/recipes and exit")
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="print the resolved settings and the prompt of task 0's first step, then exit without training "
        "(a pretrained model's tokenizer is read, not its weights)",
    )
    run.add_argument(
        "--iterations",
        type=int,
        default=None,
        help="stop after N iterations (rollout + update); with --total-timesteps, whichever comes first",
    )
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
    run.add_argument(
        "--save-dir",
        default=None,
        help="where the final agent (<dir>/final), checkpoints and run.json go; the folder belongs to one run: "
        "another run into it is refused unless it resumes from inside it (see --overwrite-save-dir)",
    )
    run.add_argument(
        "--overwrite-save-dir",
        action="store_true",
        help="start over in a --save-dir another run used: its run.json, checkpoints and final agent are removed",
    )
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
    run.add_argument(
        "--eval-freq",
        type=int,
        default=0,
        metavar="N",
        help="also evaluate the --eval-tasks panel every N iterations while training, and before the first "
        "(eval/* in the logs, per task type too; 0: only at the end)",
    )
    run.add_argument(
        "--eval-split", default=None, help="the env's split to evaluate on (ALFWorld: valid_seen, valid_unseen)"
    )
    run.add_argument(
        "--eval-temperature",
        type=float,
        default=None,
        help="evaluate with actions sampled at this temperature (verl-agent: 0.4); default: greedy",
    )
    run.add_argument("--quiet", action="store_true", help="no per-iteration log table on stdout")
    names = add_config_arguments(parser)
    return parser, names


def say(*args: Any) -> None:
    """print, from the main process only: under a launch every rank runs this script."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(*args)


def main(argv: list[str] | None = None) -> int:
    parser, names = build_parser()
    recipe = apply_recipe(parser, argv)
    args = parser.parse_args(argv)
    if args.list_recipes:
        print("\n".join(recipe_names()))
        return 0
    args.total_timesteps, args.until = getattr(args, "total_timesteps", None), getattr(args, "until", None)
    state: dict[str, Any] = {
        "agent": None, "checkpoint": None, "resumed": None, "recipe": recipe, "lock": None, "save_dir": args.save_dir,
        "terminated": False, "final": None, "start_steps": 0,
    }  # fmt: skip
    main_thread = threading.current_thread() is threading.main_thread()  # where Python lets a handler be set
    previous = signal.signal(signal.SIGTERM, sigterm_handler(state)) if main_thread else None
    try:
        return _main(args, names, state)
    except KeyboardInterrupt:
        if state["terminated"]:
            terminated(state)
        interrupted(resume_hint(state))
    except SubEnvError as err:
        if state["terminated"]:  # a worker the same SIGTERM ended (`timeout` signals the whole group)
            terminated(state)
        env_failed(err, state)
    except Exception:
        if state["terminated"]:
            terminated(state)
        raise
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        if state["lock"] is not None:
            os.close(state["lock"])  # the save dir's lock (claim_save_dir)


# ----- SIGTERM and failing envs: stop, save at the boundary, say how to resume ---------------------------------
class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt: what unwinds a rollout unwinds it too (its steps are
    dropped, the agent stays at its last iteration boundary)."""


def sigterm_handler(state: dict[str, Any]) -> Any:
    """SIGTERM stops the run as Ctrl-C does, except inside an update (weights between two boundaries, which no save
    can hold): there it is noted and :class:`StopOnSigterm` stops the run when the next rollout starts. Only the
    first signal counts: `timeout` signals the process and then its group."""

    def handler(signum: int, frame: Any) -> None:
        if state["terminated"]:
            return
        state["terminated"] = True
        if state["agent"] is not None and state["agent"].boundary is None:
            return  # inside an update: finished first
        raise Terminated

    return handler


class StopOnSigterm(BaseCallback):
    """Raises :class:`Terminated` when a rollout starts after a SIGTERM that came inside an update: the agent is at
    a boundary again, which the save holds."""

    def __init__(self, state: dict[str, Any]) -> None:
        super().__init__()
        self.state = state

    def _on_rollout_start(self) -> None:
        if self.state["terminated"]:
            raise Terminated

    def _on_step(self) -> bool:
        return True


def save_at_boundary(state: dict[str, Any]) -> str:
    """Save the agent at its last iteration boundary into ``<save-dir>/checkpoints`` (unless this run's final save
    or last checkpoint holds that boundary already); what was saved, and how to resume, in words."""
    agent, save_dir = state["agent"], state["save_dir"]
    if agent is None:
        return "before the agent was built: nothing to save"
    if not save_dir or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return resume_hint(state)  # nowhere to save (or a launch, whose ranks save together): the checkpoints made
    # What a save holds: the boundary's count (a stop after a rollout, before its update, has counted its steps).
    steps = agent.boundary["num_timesteps"] if agent.boundary is not None else agent.num_timesteps
    if steps == state["start_steps"]:
        return resume_hint(state)  # no iteration ended in this run: nothing new to save
    name = f"agent_{steps}_steps"
    last = state["checkpoint"].last_path if state["checkpoint"] is not None else None
    path = state["final"] or (last if last is not None and Path(last).name == name else None)
    if path is None:
        path = Path(save_dir) / "checkpoints" / name
        try:
            agent.save(path)
        except (OSError, RuntimeError) as err:
            return f"{resume_hint(state)}; the agent could not be saved: {first_line(err)}"
    return f"at {steps} env steps; saved {path} (resume with --resume {path} --save-dir {save_dir})"


def terminated(state: dict[str, Any]) -> NoReturn:
    """End a run stopped by SIGTERM: the agent saved at its boundary, one line, exit code 143 (128 + SIGTERM)."""
    from agents.callbacks import ProgressBar

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM does not cut the save short
    hint = save_at_boundary(state)
    ProgressBar.close_all()
    print(f"terminated (SIGTERM): {hint}", file=sys.stderr)
    raise SystemExit(143)


def env_failed(err: SubEnvError, state: dict[str, Any]) -> NoReturn:
    """End a run whose env raised: the env's own traceback (where to fix it), then one line naming the env, the task,
    its seed and the step, and the agent saved at its last boundary to resume from once the env is fixed."""
    from agents.callbacks import ProgressBar

    ProgressBar.close_all()
    if err.__cause__ is not None:
        traceback.print_exception(err.__cause__, file=sys.stderr)
    agent = state["agent"]
    if agent is not None:
        agent.close()  # its worker processes end now, not at exit
    print(f"error: {err}", file=sys.stderr)
    print(f"stopped {save_at_boundary(state)}", file=sys.stderr)
    raise SystemExit(1)


def apply_recipe(parser: argparse.ArgumentParser, argv: list[str] | None) -> dict[str, Any] | None:
    """Make ``--recipe``'s values the parser's defaults (flags given still win); its name, values and sources."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--recipe", default=None)
    name = pre.parse_known_args(argv)[0].recipe
    if name is None:
        return None
    values, sources = load_recipe(name)
    parser.set_defaults(**{k: json.dumps(v) if k == "env_kwargs" else v for k, v in values.items()})
    return {"name": name, "values": values, "sources": sources}


def resume_hint(state: dict[str, Any]) -> str:
    """What a Ctrl-C leaves: the steps trained and this run's last checkpoint to resume from (the one its own
    checkpoint callback wrote, not whichever folder in the save dir has the most steps)."""
    agent, checkpoints = state["agent"], state["checkpoint"]
    steps = f"at {agent.num_timesteps} env steps; " if agent is not None else ""
    last = checkpoints.last_path if checkpoints is not None else None
    if last is not None:
        return f"{steps}last checkpoint: {last} (resume with --resume {last})"
    if state["resumed"]:
        return f"{steps}no new checkpoint; the run started from {state['resumed']}"
    hint = "" if checkpoints is not None else " (--save-dir and --checkpoint-freq save them as training goes)"
    return f"{steps}no checkpoint was saved{hint}"


# ----- one save dir, one run ----------------------------------------------------------------------------------
RUN_FILE = "run.json"
#: What a run writes in its save dir: removed by --overwrite-save-dir.
RUN_OUTPUTS = (RUN_FILE, "checkpoints", "final")
#: Held (flock) by the live run that owns the folder.
LOCK_FILE = ".train.lock"


def claim_save_dir(folder: Path, resume: str | None, overwrite: bool) -> tuple[str, int]:
    """This run's id in ``folder``, and the descriptor of its exclusive lock on the folder (held until closed).

    A save dir belongs to one run: its run.json records the run id, and checkpoints, ``final`` and run.json are
    that run's. A run resuming from an agent inside the folder continues that run (same id); any other run into a
    used folder is refused, unless ``--overwrite-save-dir`` removes what the earlier run wrote. Two live runs never
    share one.
    """
    import fcntl
    import shutil
    import uuid

    check_writable(folder, "--save-dir")
    # A file of its own: the folder itself is what each save into it locks (agents.checkpoint.folder_lock).
    lock = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        fail(f"--save-dir {folder} is in use by another train.py that is still running: wait for it or choose another")
    used = [name for name in RUN_OUTPUTS if (folder / name).exists()]
    if not used:
        return uuid.uuid4().hex[:12], lock
    try:
        previous = str(json.loads((folder / RUN_FILE).read_text()).get("run_id") or "unrecorded")
    except (OSError, ValueError, AttributeError):
        previous = "unrecorded"
    inside = resume is not None and Path(resume).resolve().is_relative_to(folder.resolve())
    if overwrite:
        if inside:
            os.close(lock)
            fail(f"--overwrite-save-dir would remove --resume {resume}: resume without it, or into another --save-dir")
        for name in used:
            if (folder / name).is_dir():
                shutil.rmtree(folder / name)
            else:
                (folder / name).unlink()
        return uuid.uuid4().hex[:12], lock
    if inside:
        return previous, lock
    os.close(lock)
    fail(
        f"--save-dir {folder} holds another run (run id {previous}; {', '.join(used)}): resume that run with "
        f"--resume {folder / 'final'} (or one of its checkpoints), choose a new --save-dir, or pass "
        "--overwrite-save-dir to start over"
    )


def _main(args: argparse.Namespace, names: list[str], state: dict[str, Any]) -> int:
    if args.total_timesteps is not None and args.total_timesteps < 1:
        fail(f"--total-timesteps must be >= 1, got {args.total_timesteps}")
    if args.until is not None and args.until < 1:
        fail(f"--until must be >= 1, got {args.until}")
    if args.log_interval < 1:
        fail(f"--log-interval must be >= 1, got {args.log_interval}")
    for flag, value in (
        ("--checkpoint-freq", args.checkpoint_freq), ("--eval-tasks", args.eval_tasks), ("--eval-freq", args.eval_freq)
    ):  # fmt: skip
        if value < 0:
            fail(f"{flag} must be >= 0, got {value}")
    if args.eval_freq and not args.eval_tasks:
        fail("--eval-freq needs --eval-tasks (the panel's size)")
    if args.eval_temperature is not None and not args.eval_temperature > 0:
        fail(f"--eval-temperature must be > 0, got {args.eval_temperature}")
    if args.checkpoint_freq and not args.save_dir:
        fail("--checkpoint-freq needs --save-dir")
    if args.iterations is not None and args.iterations < 1:
        fail(f"--iterations must be >= 1, got {args.iterations}")
    if args.iterations is not None and args.progress_bar and args.total_timesteps is None:
        fail("--progress-bar counts env steps: give --total-timesteps with --iterations")
    if args.dry_run and args.resume:
        fail("--dry-run shows a new run's settings and first prompt; it does not take --resume")
    overrides = config_overrides(args, names)
    env_kwargs = parse_json_kwargs(args.env_kwargs)

    from agents.callbacks import IterationCheckpoint, PanelEvaluation
    from agents.checkpoint import saved_config
    from agents.env_spec import make_env
    from agents.gagpo import GAGPOAgent

    if args.overwrite_save_dir and not args.save_dir:
        fail("--overwrite-save-dir needs --save-dir")
    run_id = None
    if args.save_dir and not args.dry_run and int(os.environ.get("RANK", "0")) == 0:  # the main process writes
        run_id, state["lock"] = claim_save_dir(Path(args.save_dir), args.resume, args.overwrite_save_dir)
    verbose = 0 if args.quiet else 1
    started = time.perf_counter()
    if args.resume:
        saved = read_saved_agent(args.resume)
        try:
            config = saved_config(saved, args.resume, overrides)
        except ValueError as err:
            fail(str(err))
        validated_config(config)
        env: Any = None
        if args.env:
            env_id = resolve_env_id(args.env)
            check_other_env(args, saved.get("env_id"), env_id)
            check_env_kwargs(env_id, env_kwargs)
            # An id keeps a module:id's module in the saved agent; a made env carries kwargs (its spec, no module).
            env = make_env(env_id, env_kwargs, None) if env_kwargs else env_id
        elif saved.get("env_id"):
            resolve_env_id(saved["env_id"])  # a module:id env imports its module; an unknown one is one line
        try:
            agent = GAGPOAgent.load(args.resume, env=env, verbose=verbose, log_dir=args.log_dir, **overrides)
        except (OSError, ValueError) as err:
            fail(first_line(err))
        except ImportError as err:
            missing_extra(err, str(config.get("backend")))
        state["resumed"] = args.resume
        say(f"resumed {args.resume} at {agent.num_timesteps} env steps ({agent.env_id})")
    else:
        if not args.env:
            fail("--env is required (or --resume PATH)")
        env_id = resolve_env_id(args.env)
        check_env_kwargs(env_id, env_kwargs)
        estimator = overrides.pop("estimator", "gagpo")
        backend = validated_config({"estimator": estimator, **overrides}).backend
        if args.dry_run:
            return dry_run(args, env_id, env_kwargs, {"estimator": estimator, **overrides}, state["recipe"])
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
            fail(first_line(err))
        except ImportError as err:
            missing_extra(err, backend)
    state["agent"], state["start_steps"] = agent, agent.num_timesteps
    settings = run_settings(args, agent.env_id, agent.env_kwargs, agent.config.to_dict(), state["recipe"])
    if state["recipe"]:
        say(describe(settings, state["recipe"]))
    if run_id is not None:
        record = {"run_id": run_id, "resumed_from": args.resume, **settings}
        (Path(args.save_dir) / RUN_FILE).write_text(json.dumps(record, indent=1))

    if args.until is not None:
        more = max(0, args.until - agent.num_timesteps)
        if not more:
            say(f"already at {agent.num_timesteps} env steps (--until {args.until}): nothing to train")
    elif args.total_timesteps is not None:
        more = args.total_timesteps
    else:  # --iterations alone bounds the run; without it, the default budget
        more = sys.maxsize if args.iterations is not None else DEFAULT_TIMESTEPS
    callbacks = []
    if args.checkpoint_freq:
        state["checkpoint"] = IterationCheckpoint(args.checkpoint_freq, str(Path(args.save_dir) / "checkpoints"))
        callbacks.append(state["checkpoint"])
    panel = eval_panel(args, agent)
    if args.eval_freq:
        callbacks.append(PanelEvaluation(args.eval_freq, unit="iterations", verbose=verbose, **panel))
    callbacks.append(StopOnSigterm(state))  # last: a checkpoint due at the same boundary is written first
    if more:
        agent.learn(
            more,
            callback=callbacks,
            progress_bar=args.progress_bar,
            log_interval=args.log_interval,
            reset_num_timesteps=not args.resume,
            max_iterations=args.iterations,
        )
        if state["terminated"]:  # it came inside the last update: the run ends at its boundary
            raise Terminated
        say(f"trained to {agent.num_timesteps} env steps in {time.perf_counter() - started:.0f}s")
    if args.save_dir:
        final = Path(args.save_dir) / "final"
        agent.save(final)
        state["final"] = final
        say(f"saved: {final}")
    if args.eval_tasks:
        from agents.callbacks import ProgressBar
        from agents.evaluation import panel_progress

        bar = ProgressBar(args.eval_tasks, "evaluation", unit="task", enabled=args.progress_bar)
        with bar, panel_progress(bar.advance):
            metrics = agent.evaluate(episodes=True, **panel)
        kind = table_kind(agent.env_id)
        how = "greedy" if args.eval_temperature is None else f"sampled at temperature {args.eval_temperature:g}"
        kwargs = panel.get("env_kwargs", agent.env_kwargs)
        say(f"\nEvaluation on {agent.env_id} {kwargs or ''} tasks 0..{args.eval_tasks - 1} ({how}):\n")
        say(results_table([table_row(agent.config.estimator, metrics, kind)]))
        say(f"\n{table_legend(kind)}")
    agent.close()
    return 0


def read_saved_agent(path: str) -> dict[str, Any]:
    """The ``agent.json`` of the agent ``--resume`` names: a folder, or a ``.zip`` of one (SB3's CheckpointCallback
    saves ``<prefix>_<steps>_steps.zip``), or exit with one line saying what is wrong."""
    from agents.checkpoint import AGENT_FILE, opened

    try:
        with opened(Path(path)) as folder:
            if not (folder / AGENT_FILE).is_file():
                fail(f"no saved agent at {path} (expected {AGENT_FILE} inside)")
            try:
                return json.loads((folder / AGENT_FILE).read_text())
            except (OSError, ValueError) as err:
                fail(f"saved agent at {path} is damaged: {AGENT_FILE} cannot be read ({type(err).__name__}: {err})")
    except FileNotFoundError:
        fail(f"no saved agent at {path} (a folder with {AGENT_FILE} inside, or a .zip of one)")
    except ValueError as err:
        fail(first_line(err))


def check_other_env(args: argparse.Namespace, saved_env: str | None, env_id: str) -> None:
    """``--resume`` with an ``--env`` other than the one the agent trained on: refused where the run would go on in
    the saved agent's own save dir (its final agent, trained on the first env, would be replaced); elsewhere a
    new run, said in a warning line."""
    if not saved_env or saved_env == env_id:
        return
    if args.save_dir and Path(args.resume).resolve().is_relative_to(Path(args.save_dir).resolve()):
        fail(
            f"--resume {args.resume} trained on {saved_env}; --env {env_id} would continue that run on another env "
            f"and replace its agents in --save-dir {args.save_dir}: pass another --save-dir to train it on {env_id} "
            "as a new run, or leave --env out to continue on its own env"
        )
    if int(os.environ.get("RANK", "0")) == 0:
        where = f" (a new run in {args.save_dir})" if args.save_dir else ""
        print(f"warning: --resume {args.resume} trained on {saved_env}; now training it on {env_id}{where}",
              file=sys.stderr)  # fmt: skip


def missing_extra(err: ImportError, backend: str) -> NoReturn:
    """An optional dependency the run needs is not installed: its one line, and for vLLM the way around it."""
    hint = " (or pass --backend hf: the trainer samples itself, no vLLM needed)" if backend == "vllm" else ""
    fail(first_line(err) + hint)


def eval_panel(args: argparse.Namespace, agent: Any) -> dict[str, Any]:
    """The evaluation panel's evaluate() arguments: --eval-tasks tasks of the agent's env (--eval-split's split),
    greedy or sampled at --eval-temperature."""
    split = {}  # the agent's own env spec (its wrappers too), unless another split is asked for
    if args.eval_split:
        split = {"env": agent.env_id, "env_kwargs": {**agent.env_kwargs, "split": args.eval_split}}
    return {**split, "n_tasks": max(args.eval_tasks, 1), "deterministic": args.eval_temperature is None,
            "temperature": args.eval_temperature}  # fmt: skip


def run_settings(
    args: argparse.Namespace, env_id: str, env_kwargs: dict[str, Any], config: dict[str, Any], recipe: dict | None
) -> dict[str, Any]:  # fmt: skip
    """What this run trains with, as ``run.json`` records it: the recipe, the run keys, the whole config."""
    run = {"env": env_id, "env_kwargs": env_kwargs, "model": args.model, "iterations": args.iterations,
           "total_timesteps": args.total_timesteps, "until": args.until, "eval_tasks": args.eval_tasks,
           "eval_freq": args.eval_freq, "eval_split": args.eval_split,
           "eval_temperature": args.eval_temperature}  # fmt: skip
    return {"recipe": recipe["name"] if recipe else None, "run": run, "config": config,
            "sources": recipe["sources"] if recipe else {}}  # fmt: skip


def describe(settings: dict[str, Any], recipe: dict[str, Any]) -> str:
    """The recipe's keys as resolved, each with its source, or "(flag)" where a flag replaced the recipe's value."""
    resolved = {**settings["config"], **settings["run"]}
    lines = [f"recipe {recipe['name']} (resolved; every value in run.json with --save-dir):"]
    for key, value in recipe["values"].items():
        now = resolved.get(key, value)
        note = "(flag; the recipe: " + json.dumps(value) + ")" if now != value else recipe["sources"].get(key, "")
        lines.append(f"  {key:<24} {json.dumps(now):<34} {note}")
    return "\n".join(lines)


def dry_run(
    args: argparse.Namespace, env_id: str, env_kwargs: dict[str, Any], overrides: dict[str, Any], recipe: dict | None
) -> int:  # fmt: skip
    """Print the resolved settings and the prompt of task 0's first step. A pretrained model's tokenizer is all
    that is read (a 7B recipe dry-runs on a laptop); the tiny model and a warm-start prior build the agent, whose
    prompt settings come from the prior."""
    from agents.config import GAGPOConfig
    from agents.env_spec import make_env, prompt_builder, text_wrapping
    from agents.gagpo import GAGPOAgent
    from agents.models import check_hub_reachable, load_tokenizer
    from agents.prior import read_prior

    try:
        if args.model == "tiny" or read_prior(args.model) is not None:
            agent = GAGPOAgent(env_id, model=args.model, env_kwargs=env_kwargs, verbose=0, **overrides)
            config, prompts = agent.config, agent.prompts
            agent.close()
        else:
            config = GAGPOConfig(**overrides).resolved(tiny=False)
            check_hub_reachable(args.model)
            prompts = prompt_builder(load_tokenizer(args.model), config)
        env = make_env(env_id, env_kwargs, text_wrapping(config))
    except (OSError, ValueError) as err:
        fail(first_line(err))
    except ImportError as err:
        missing_extra(err, str(overrides.get("backend")))
    settings = run_settings(args, env_id, env_kwargs, config.to_dict(), recipe)
    print(describe(settings, recipe) if recipe else json.dumps(settings["run"]))
    print("\nconfig: " + json.dumps(settings["config"]))
    obs, info = env.reset(seed=0)
    ids = prompts.for_step(obs, info)
    env.close()
    print(f"\nprompt of task 0, step 0 ({len(ids)} tokens of at most {config.max_prompt_tokens}):\n")
    print(prompts.tokenizer.decode(ids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
