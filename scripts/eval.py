"""Evaluate saved agents, the expert and a random policy on a fixed panel of tasks; print the paper's table.

    python scripts/eval.py --env gagpo_gym/Maze-v0                       # expert and random reference rows
    python scripts/eval.py --agent runs/house_gagpo/final --agent runs/house_grpo/final --expert --random \\
        --out results/eval_house                                          # the env the agents were trained on
    python scripts/eval.py --env my_envs:MyEnv-v0 --expert                # your own env (Gymnasium's module:id)
    python scripts/eval.py --env gagpo_gym/ALFWorld-v0 --n-tasks 134 --expert --workers 2   # real ALFWorld, 2 cores

A saved agent (a folder, or a ``.zip`` as SB3's CheckpointCallback writes) brings its env id and env kwargs (its
agent.json); ``--env`` / ``--env-kwargs`` override them, with a warning when they differ. The agent is loaded on
the panel's env: its training env is never made, so its training data need not be on this machine.

The panel is tasks ``0..N-1`` (``reset(seed=i)``), each played once: the same tasks on every machine. Agents act
greedily. Columns follow the paper: per-task-type success for ALFWorld/MiniHouse (Pick, Look, Clean, Heat, Cool,
Pick2, All; the mean length of the won episodes), score and success for MiniShop, success elsewhere, and the mean
episode length. Every success rate comes with its 95% Wilson score interval, and each task type with its number of
games. The expert row is named after the env's expert where it has several (ALFWorld: ``planner expert``, the
PDDL planner on the true state; ``handcoded expert``, ALFWorld's rule-based explorer, with
``--env-kwargs '{"expert": "handcoded"}'``).

``--out`` is checked before anything is played. Each row is written to ``<out>/eval.json`` and ``eval.csv`` as
soon as it finishes (atomically: a temporary file, then a rename); a row that fails is reported by name and the
others are still played and written (exit code 1). ``--resume`` keeps the finished rows of an ``eval.json``
written with the same settings and plays only the missing ones. One run writes to an ``--out`` at a time (a second
one is refused while the first lives), and a folder that holds an earlier run's ``eval.json`` is refused unless
``--resume`` adds to it or ``--overwrite`` replaces it (its files are removed before anything is played), so the
files never mix the rows of two runs. Episode rows carry the seed, ``task_id`` (for
ALFWorld the game file, ``json_2.1.1/<split>/<task>/<trial>/game.tw-pddl`` under the data root), task type,
outcome, return and length. A progress bar per row (tasks done / total) goes to stderr when it is a terminal
(``--progress`` / ``--no-progress`` to force it on or off). Ctrl-C ends with one line and exit code 130; the rows
finished by then stay in ``--out``.

``--workers N`` (N >= 2) steps each batch's envs in N worker processes, started once per row, while the policy acts
in this process; the table and the episode rows are the same as serially (the default, ``--workers 0``). It pays
where env steps are slow: the real ALFWorld engine takes about 0.1 s a step, so a 134-game panel takes 13-22 min on
one core; on a 2-core machine ``--workers 2`` is the fast choice (more workers than cores only add overhead).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agents.cli import check_writable, fail, interrupted, parse_json_kwargs, resolve_env_id
from agents.reporting import atomic_write_text, results_table, table_kind, table_legend, table_row, write_csv

EVAL_JSON, EVAL_CSV = "eval.json", "eval.csv"
#: The settings that decide a row's numbers: ``--resume`` reuses rows only when all of them match.
SETTINGS = ("n_tasks", "seed_offset", "batch_size", "sampled", "random_seed")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Evaluate agents and reference policies on a fixed task panel (tasks 0..N-1, each once).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--env",
        default=None,
        help="registered env id, e.g. gagpo_gym/Maze-v0, or Gymnasium's module:EnvId form, e.g. my_envs:MyEnv-v0 "
        "(the module is imported first; default: the saved agents' env)",
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
    parser.add_argument("--batch-size", type=int, default=16, help="tasks played side by side (agents)")
    parser.add_argument("--sampled", action="store_true", help="agents sample actions instead of acting greedily")
    parser.add_argument(
        "--workers",
        type=int,
        default=0,
        help="worker processes that step the envs (0: in this process; the same results either way); for ALFWorld "
        "on a 2-core machine, 2 is the fast choice",
    )
    parser.add_argument("--out", default=None, help="folder for eval.csv and eval.json, written as each row finishes")
    parser.add_argument(
        "--resume", action="store_true", help="keep the finished rows of --out's eval.json (same settings)"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace the rows of an earlier run in --out (removed before playing)"
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=argparse.SUPPRESS,  # neither flag: bars only when stderr is a terminal
        help="progress bars on stderr: on, or off (neither flag: only when stderr is a terminal)",
    )
    return parser


# ----- saved agents ---------------------------------------------------------------------------------------
def saved_agent(path: str) -> tuple[dict[str, Any], str]:
    """A saved agent's agent.json and fingerprint (the SHA-256 of its manifest, which lists every file's digest:
    the same agent, byte for byte), read by the package's reader (every file checked against the manifest first)
    before anything is played: one readable line when it is not sound. A folder or a ``.zip`` of one."""
    from agents import checkpoint

    folder = Path(path)
    try:
        return checkpoint.read_saved(folder)
    except (OSError, ValueError) as err:
        bare = folder.is_dir() and not (folder / checkpoint.AGENT_FILE).is_file()
        hint = "; train.py writes <save-dir>/final" if bare or not folder.exists() else ""
        fail(f"{err}".splitlines()[0] + hint)


def _agent_label(meta: dict[str, Any], path: str) -> str:
    """``<estimator> @ <steps>`` from the saved agent's metadata, so side-by-side rows say what they are."""
    return f"{meta['config']['estimator']} @ {meta['num_timesteps']} steps ({path})"


# ----- the env --------------------------------------------------------------------------------------------
def _bare(env_id: str) -> str:
    return env_id.split(":", 1)[-1]


def choose_env(args: argparse.Namespace, metas: dict[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """The panel's env: ``--env`` / ``--env-kwargs`` where given, else the saved agents' own; warns on a mismatch."""
    from agents.env_spec import canonical_env_id

    saved: dict[str, tuple[str | None, dict[str, Any]]] = {}
    for path, meta in metas.items():
        env_id = meta.get("env_id")
        if env_id is not None:
            try:
                env_id = canonical_env_id(env_id)  # a module:id env imports its module here
            except ValueError as err:
                if args.env is None:
                    fail(f"{path} was trained on env {env_id!r}, which cannot be made here: {err}")
        saved[path] = (env_id, dict(meta.get("env_kwargs") or {}))
    trained_on = sorted({(env_id, json.dumps(kwargs, sort_keys=True)) for env_id, kwargs in saved.values() if env_id})
    if args.env is None and not trained_on:
        fail("give --env (or --agent with a saved agent that names its env)")
    if args.env is None and len(trained_on) > 1:
        fail(f"the agents were trained on different envs ({'; '.join(map(' '.join, trained_on))}); give --env")
    env_id = resolve_env_id(args.env) if args.env is not None else trained_on[0][0]
    same_env = [
        (saved_id, kwargs) for saved_id, kwargs in saved.values() if saved_id and _bare(saved_id) == _bare(env_id)
    ]
    if same_env and ":" not in env_id:  # keep the module part a saved agent's id brings (workers import it)
        env_id = next((saved_id for saved_id, _ in same_env if ":" in saved_id), env_id)
    default_kwargs = same_env[0][1] if same_env else {}
    env_kwargs = default_kwargs if args.env_kwargs is None else parse_json_kwargs(args.env_kwargs)
    for path, (saved_id, kwargs) in saved.items():
        if saved_id is not None and _bare(saved_id) != _bare(env_id):
            warn(f"--env {env_id} differs from the env {path} was trained on ({saved_id})")
        elif saved_id is not None and kwargs != env_kwargs:
            given = "--env-kwargs" if args.env_kwargs is not None else "the first agent's env kwargs"
            warn(f"{given} {json.dumps(env_kwargs)} differ from {path}'s training env kwargs {json.dumps(kwargs)}")
    return env_id, env_kwargs


def probe_env(env_id: str, env_kwargs: dict[str, Any]) -> tuple[bool, str]:
    """Build the env once: a bad constructor argument exits now. Returns (has an expert, the expert row's label)."""
    from agents.env_spec import make_env
    from gagpo_gym.core import TextEnv

    try:
        env = make_env(env_id, env_kwargs, None)
    except (TypeError, ValueError, OSError) as err:
        fail(f"cannot make {env_id} with {env_kwargs}: {err}")
    try:
        unwrapped = env.unwrapped
        method = getattr(type(unwrapped), "expert_action", None)
        has_expert = callable(method) and method is not TextEnv.expert_action
        kind = getattr(unwrapped, "expert", None)  # ALFWorld: "planner" or "handcoded"
        label = f"{kind} expert" if isinstance(kind, str) and kind else "expert"
    finally:
        env.close()
    return has_expert, label


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


# ----- playing a row ----------------------------------------------------------------------------------------
def evaluate_agent(
    path: str, meta: dict[str, Any], env_id: str, env_kwargs: dict[str, Any], args: argparse.Namespace, bar
) -> dict:
    """The agent at ``path`` (``meta``: its agent.json) played on the panel."""
    from agents.evaluation import panel_progress
    from agents.gagpo import GAGPOAgent

    # The agent's own env (and any wrappers it was trained with) when the panel is on it; else it is loaded on the
    # panel's env. Either way its training env is not made (its data, e.g. a train split, need not be here).
    saved_id = meta.get("env_id")
    own = saved_id is not None and _bare(saved_id) == _bare(env_id) and meta.get("env_kwargs") == env_kwargs
    panel_env = {} if own else {"env": env_id, "env_kwargs": env_kwargs}
    # Playing needs no KL reference: none is built (nor its source looked for).
    agent = GAGPOAgent.load(path, **panel_env, verbose=0, torch_threads=1, kl_coef=0.0)
    bar.set_description(bar.description.removesuffix(" (loading)"))
    bar.restart_clock()
    try:
        with panel_progress(bar.advance):
            return agent.evaluate(
                n_tasks=args.n_tasks,
                deterministic=not args.sampled,
                batch_size=args.batch_size,
                seed_offset=args.seed_offset,
                episodes=True,
                workers=args.workers,
            )
    finally:
        agent.close()


def evaluate_reference(kind: str, env_id: str, env_kwargs: dict[str, Any], args: argparse.Namespace, bar) -> dict:
    from agents.evaluation import reference_policy_panel

    return reference_policy_panel(
        kind,
        env_id,
        env_kwargs,
        args.n_tasks,
        seed=args.random_seed,
        seed_offset=args.seed_offset,
        progress=bar.advance,
        workers=args.workers,
    )


# ----- output -----------------------------------------------------------------------------------------------
def previous_rows(out: Path, settings: dict[str, Any]) -> dict[tuple, dict[str, Any]]:
    """The finished rows of ``out/eval.json`` by (label, source, agent fingerprint); exits if its settings differ."""
    file = out / EVAL_JSON
    if not file.is_file():
        return {}
    try:
        payload = json.loads(file.read_text())
    except (OSError, ValueError) as err:
        fail(f"--resume: {file} cannot be read ({type(err).__name__}: {err}); give another --out or drop --resume")
    old = payload.get("settings") if isinstance(payload, dict) else None
    if not isinstance(old, dict):
        fail(f"--resume: {file} records no settings (an older eval.py wrote it); give another --out or drop --resume")
    changed = [k for k in settings if old.get(k) != settings[k]]
    if changed:
        diff = ", ".join(f"{k} {json.dumps(old.get(k))} -> {json.dumps(settings[k])}" for k in changed)
        fail(f"--resume: {file} was written with other settings ({diff}); give another --out or drop --resume")
    return {
        (result["agent"], result["source"], result.get("fingerprint")): {"row": row, "result": result}
        for row, result in zip(payload["table"], payload["results"])
    }


@contextlib.contextmanager
def claim_out(out: Path | None, args: argparse.Namespace) -> Iterator[None]:
    """Hold ``out`` for this run: a second run into it is refused while this one lives (an exclusive ``flock`` on
    the folder, let go when the run ends however it ends), and an earlier run's files are kept (``--resume``),
    replaced (``--overwrite``: removed now) or refused: the files never hold two runs' rows."""
    if out is None:
        yield
        return
    fd = os.open(out, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fail(f"another eval.py run is writing to --out {out}: wait for it to end, or give another --out")
        earlier = [out / name for name in (EVAL_JSON, EVAL_CSV) if (out / name).is_file()]
        if earlier and args.overwrite:
            for file in earlier:
                file.unlink()
        elif earlier and not args.resume:
            fail(
                f"--out {out} holds an earlier run's {earlier[0].name}: --resume adds this run's rows to it (same "
                "settings), --overwrite replaces it, or give another --out"
            )
        yield
    finally:
        os.close(fd)  # lets go of the lock


def write_out(out: Path, payload: dict[str, Any]) -> None:
    """eval.csv, then eval.json (the file that says what is finished), each all or nothing."""
    write_csv(out / EVAL_CSV, payload["table"])
    atomic_write_text(out / EVAL_JSON, json.dumps(payload, indent=2))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    progress = {"done": 0, "rows": 0, "file": None}
    try:
        return _main(args, progress)
    except KeyboardInterrupt:
        kept = f", kept in {progress['file']} (--resume plays only the rest)" if progress["file"] else ""
        interrupted(f"{progress['done']} of {progress['rows']} rows finished{kept}")


def _main(args: argparse.Namespace, progress: dict[str, Any]) -> int:
    if args.n_tasks < 1 or args.batch_size < 1:
        fail(f"--n-tasks and --batch-size must be >= 1, got {args.n_tasks} and {args.batch_size}")
    if args.workers < 0:
        fail(f"--workers must be >= 0, got {args.workers}")
    if args.name and len(args.name) != len(args.agent):
        fail(f"give one --name per --agent ({len(args.agent)} agents, {len(args.name)} names)")
    if args.resume and not args.out:
        fail("--resume needs --out (the folder whose eval.json holds the finished rows)")
    if args.resume and args.overwrite:
        fail("--resume keeps the rows in --out and --overwrite replaces them: give one of them")
    out = check_writable(args.out) if args.out else None  # before anything is played
    with claim_out(out, args):
        return _play(args, out, progress)


def _play(args: argparse.Namespace, out: Path | None, progress: dict[str, Any]) -> int:
    """Every row of the table, each written to ``out`` as it finishes (:func:`claim_out` holds the folder)."""
    from agents.callbacks import ProgressBar

    saved = {path: saved_agent(path) for path in args.agent}
    metas = {path: meta for path, (meta, _) in saved.items()}
    env_id, env_kwargs = choose_env(args, metas)
    has_expert, expert_label = probe_env(env_id, env_kwargs)
    if not (args.agent or args.expert or args.random):
        args.expert, args.random = has_expert, True
    if args.expert and not has_expert:
        fail(f"{env_id} has no expert (its env defines no expert_action)")

    # (row label, saved agent path or reference policy kind, agent fingerprint)
    entries = [
        (args.name[k] if args.name else _agent_label(metas[path], path), path, saved[path][1])
        for k, path in enumerate(args.agent)
    ]
    entries += [(label, kind, None) for label, kind, wanted in
                ((expert_label, "expert", args.expert), ("random", "random", args.random)) if wanted]  # fmt: skip
    labels = [name for name, _, _ in entries]
    if len(set(labels)) != len(labels):
        fail(f"two rows share a label ({', '.join(sorted({n for n in labels if labels.count(n) > 1}))}); use --name")

    panel = f"tasks {args.seed_offset}..{args.seed_offset + args.n_tasks - 1}"
    settings = {"env": env_id, "env_kwargs": env_kwargs, **{k: getattr(args, k) for k in SETTINGS}}
    reuse = previous_rows(out, settings) if out is not None and args.resume else {}

    kind = table_kind(env_id)
    done: dict[str, dict[str, Any]] = {}  # label -> {"row", "result"}, in the order they finish
    failed: list[dict[str, Any]] = []
    progress["rows"] = len(entries)

    def write() -> None:
        finished = [done[name] for name in labels if name in done]
        if out is None or not finished:  # an eval.json always holds at least one finished row
            return
        payload = {
            "env": env_id, "env_kwargs": env_kwargs, "panel": panel, "settings": settings,
            "table": [d["row"] for d in finished], "results": [d["result"] for d in finished],
            "failed": failed, "complete": len(finished) == len(entries),
        }  # fmt: skip
        write_out(out, payload)
        progress["file"] = out / EVAL_JSON

    for name, source, digest in entries:
        if (name, source, digest) in reuse:
            done[name] = reuse[(name, source, digest)]
            progress["done"] += 1
            print(f"{name}: kept from {out / EVAL_JSON}", file=sys.stderr)
    if reuse:
        write()

    for name, source, digest in entries:
        if name in done:
            continue
        started = time.perf_counter()
        bar = ProgressBar(args.n_tasks, name if digest is None else f"{name} (loading)", unit="task",
                          enabled=getattr(args, "progress", None))  # fmt: skip
        try:
            if digest is None:
                metrics = evaluate_reference(source, env_id, env_kwargs, args, bar)
            else:
                metrics = evaluate_agent(source, metas[source], env_id, env_kwargs, args, bar)
        except Exception as err:  # one row's failure must not lose the others
            bar.close()  # before the message (closing twice is fine)
            message = f"{type(err).__name__}: {err}".splitlines()[0]
            failed.append({"agent": name, "source": source, "error": message, "traceback": traceback.format_exc()})
            print(f"error: row {name!r} failed after {time.perf_counter() - started:.0f}s: {message}", file=sys.stderr)
            write()
            continue
        finally:
            bar.close()
        seconds = time.perf_counter() - started
        result = {"agent": name, "source": source, "fingerprint": digest, "seconds": seconds, **metrics}
        done[name] = {"row": table_row(name, metrics, kind), "result": result}
        progress["done"] += 1
        write()

    print(f"{env_id} {json.dumps(env_kwargs) if env_kwargs else ''} | {panel}, each once\n")
    finished = [done[name]["row"] for name in labels if name in done]
    print(results_table(finished))
    print(f"\n{table_legend(kind)}")
    if out is not None and finished:
        print(f"\nwrote {out / EVAL_CSV} and {out / EVAL_JSON}")
    if failed:
        where = ""
        if out is not None and finished:
            where = f" (tracebacks in {out / EVAL_JSON}, under 'failed')"
        else:  # no file holds them
            for failure in failed:
                print(f"\n{failure['agent']}:\n{failure['traceback']}", file=sys.stderr, end="")
        names = ", ".join(repr(f["agent"]) for f in failed)
        print(f"error: {len(failed)} of {len(entries)} rows failed: {names}{where}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
