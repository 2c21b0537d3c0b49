"""Sim-to-real in one command: train the tiny model in MiniHouse only, then play the real ALFWorld games.

    python scripts/sim2real.py --out results/sim2real                 # the full run (about 1.5 hours on 2 CPU cores)
    python scripts/sim2real.py --prior results/agents/minihouse-full-search   # fine-tune the committed prior
    python scripts/sim2real.py --out /tmp/s2r --episodes 20 --epochs 1 --steps 128 --n-seen 12 --n-unseen 6

Stages (each skipped with ``--resume`` when its output is there):

1. **Warm start** (``agents.warm_start``) on full-size MiniHouse houses, all six task types, fresh tasks every
   episode, from the transcripts of MiniHouse's searching expert (it finds objects by looking; it never reads where
   they are), with the ``"choice"`` objective (the choose-mode policy's own cross-entropy). ``--prior PATH`` uses
   a warm-start folder made before (``scripts/warm_start.py``) instead.
2. **GAGPO** on full-size MiniHouse from that prior (``GAGPOAgent(env, model=prior).learn(steps)``), with the
   fine-tuning settings a prior brings (its ``prior.json``, else ``agents.prior.FINE_TUNE``).
3. **Evaluation on the real engine** through ``scripts/eval.py`` (ALFWorld-v0, 50 steps, greedy, per task type):
   the random admissible policy, the prior, the agent after GAGPO, and ALFWorld's handcoded expert (it sees what
   the agent sees). Model selection uses valid_seen only: of the prior and the agent after GAGPO, the better one on
   valid_seen becomes ``<out>/agent``. valid_unseen is played once per model, after training has ended. The prior
   and the agent also play ``--n-heldout`` held-out full-size MiniHouse houses (what RL raised in simulation).

Writes ``<out>/agent`` (the selected agent, a few MB), ``<out>/prior_agent`` (the prior's row),
``<out>/sim2real.{json,md}`` (tables per split, training
steps and wall times) and ``<out>/eval/<split>/<row>/eval.json``; the work folder ``<out>/work`` holds the prior and
both agents.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agents.cli import fail
from agents.prior import HELDOUT_OFFSET
from agents.reporting import ALFWORLD_ORDER, markdown_table

ROOT = Path(__file__).resolve().parents[1]

MINIHOUSE = "gagpo_gym/MiniHouse-v0"
ALFWORLD = "gagpo_gym/ALFWorld-v0"
SPLIT_GAMES = {"valid_seen": 140, "valid_unseen": 134}
#: The MiniHouse panel the models are also played on: held-out full-size houses, never trained on.
MINIHOUSE_HELDOUT = "minihouse_heldout"
ROWS = ("random", "prior", "gagpo", "handcoded expert")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Warm start and GAGPO in MiniHouse, then greedy evaluation on the real ALFWorld games.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--out", default=str(ROOT / "results" / "sim2real"), help="output folder")
    parser.add_argument("--resume", action="store_true", help="reuse the stages whose outputs exist in --out")
    parser.add_argument("--seed", type=int, default=0, help="warm start and GAGPO seed")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch CPU threads per process")
    warm = parser.add_argument_group("warm start (MiniHouse full-size houses, the searching expert)")
    warm.add_argument(
        "--prior", default=None,
        help="a warm-start folder to fine-tune instead of building one (results/agents/minihouse-full-search)",
    )  # fmt: skip
    warm.add_argument("--episodes", type=int, default=800, help="expert episodes, each on a fresh task")
    warm.add_argument("--epsilon", type=float, default=0.2, help="probability of a random admissible action")
    warm.add_argument(
        "--epochs", type=int, default=12,
        help="passes over the transcripts (6 left the prior undertrained; results/agents/README.md)",
    )  # fmt: skip
    warm.add_argument("--warm-learning-rate", type=float, default=1e-3, help="AdamW learning rate")
    warm.add_argument("--warm-batch-size", type=int, default=16, help="actions per optimiser step")
    warm.add_argument("--objective", choices=("tokens", "choice"), default="choice", help="warm-start loss")
    warm.add_argument("--history-length", type=int, default=4, help="recent steps shown in the prompt")
    warm.add_argument("--show-admissible", action="store_true", help="list the admissible actions in the prompt")
    warm.add_argument("--memory", action="store_true", help="the prompt carries the episode's memory of places seen")
    warm.add_argument("--tiny-hidden-size", type=int, default=64, help="width of the tiny model")
    warm.add_argument("--tiny-layers", type=int, default=2, help="decoder layers of the tiny model")
    rl = parser.add_argument_group("GAGPO (MiniHouse full-size houses)")
    rl.add_argument(
        "--steps", type=int, default=20000,
        help="GAGPO env steps (0: skip; the prior is the agent); the committed run's 20k (bench_learning's: 22k)",
    )  # fmt: skip
    rl.add_argument("--num-groups", type=int, default=4, help="tasks per iteration")
    rl.add_argument("--group-size", type=int, default=4, help="episodes per task")
    rl.add_argument("--estimator", default="gagpo", help="advantage estimator")
    rl.add_argument("--ent-coef", type=float, default=0.0, help="entropy bonus coefficient")
    ev = parser.add_argument_group("evaluation (real ALFWorld, 50 steps, greedy)")
    ev.add_argument("--n-seen", type=int, default=SPLIT_GAMES["valid_seen"], help="valid_seen games (selection)")
    ev.add_argument("--n-unseen", type=int, default=SPLIT_GAMES["valid_unseen"], help="valid_unseen games")
    ev.add_argument(
        "--n-heldout", type=int, default=100,
        help=f"held-out full-size MiniHouse houses (seeds {HELDOUT_OFFSET}..) the prior and the agent also play",
    )  # fmt: skip
    ev.add_argument("--jobs", type=int, default=2, help="eval.py processes at a time")
    ev.add_argument(
        "--workers", type=int, default=0, help="env worker processes per eval.py (its --workers; the same tables)"
    )
    return parser


def warm_start_stage(args: argparse.Namespace, prior: Path) -> dict[str, Any]:
    from agents.prior import read_prior
    from agents.warm_start import warm_start

    record = read_prior(prior) if args.resume or args.prior else None
    if record is not None:
        print(f"warm start: reusing {prior}")
        return record
    if args.prior:
        fail(f"--prior {args.prior}: not a warm-start folder (no readable prior.json)")
    return warm_start(
        MINIHOUSE, prior, env_kwargs={"size": "full"}, episodes=args.episodes, epsilon=args.epsilon,
        epochs=args.epochs, learning_rate=args.warm_learning_rate, batch_size=args.warm_batch_size, seed=args.seed,
        expert="search", objective=args.objective, task_pool=0, history_length=args.history_length,
        show_admissible=args.show_admissible, memory=args.memory, tiny_hidden_size=args.tiny_hidden_size,
        tiny_layers=args.tiny_layers,
        torch_threads=args.torch_threads,
    )  # fmt: skip


def rl_stage(args: argparse.Namespace, prior: Path, work: Path) -> dict[str, Any]:
    """Save the prior as an agent (0 steps) and train GAGPO from it; returns steps and wall time."""
    from agents.checkpoint import AGENT_FILE
    from agents.gagpo import GAGPOAgent

    prior_agent, final = work / "prior_agent", work / "gagpo"
    record_file = work / "rl.json"
    if args.resume and (final / AGENT_FILE).is_file() and record_file.is_file():
        print(f"GAGPO: reusing {final}")
        return json.loads(record_file.read_text())

    started = time.perf_counter()
    learner = GAGPOAgent(
        MINIHOUSE, str(prior), env_kwargs={"size": "full"}, estimator=args.estimator, task_pool=0,
        num_groups=args.num_groups, group_size=args.group_size, ent_coef=args.ent_coef, seed=args.seed, verbose=0,
        torch_threads=args.torch_threads,
    )  # fmt: skip
    learner.save(prior_agent)  # the prior as an agent, before any step
    if args.steps:
        learner.learn(args.steps)
    learner.save(final)
    record = {"steps": learner.num_timesteps, "seconds": time.perf_counter() - started, "config": vars(learner.config)}
    record_file.write_text(json.dumps(record, indent=2, default=str))
    print(f"GAGPO: {record['steps']} MiniHouse env steps in {record['seconds']:.0f}s; saved {final}")
    return record


def eval_rows(args: argparse.Namespace, work: Path, out: Path, split: str, rows: list[str]) -> dict[str, Any]:
    """Run scripts/eval.py once per row on ``split`` (``--jobs`` at a time); returns each row's eval.json."""
    n_tasks = {"valid_seen": args.n_seen, "valid_unseen": args.n_unseen}.get(split, args.n_heldout)
    sources = {"prior": work / "prior_agent", "gagpo": work / "gagpo"}

    def run(row: str) -> dict[str, Any]:
        folder = out / "eval" / split / row.replace(" ", "_")
        if args.resume and (folder / "eval.json").is_file():
            return json.loads((folder / "eval.json").read_text())
        if split == MINIHOUSE_HELDOUT:
            env, kwargs, offset = MINIHOUSE, {"size": "full"}, HELDOUT_OFFSET
        else:
            env, kwargs, offset = ALFWORLD, {"split": split}, 0
            kwargs |= {"expert": "handcoded"} if row == "handcoded expert" else {}
        command = [
            sys.executable, str(ROOT / "scripts" / "eval.py"), "--env", env, "--env-kwargs", json.dumps(kwargs),
            "--n-tasks", str(n_tasks), "--seed-offset", str(offset), "--batch-size", "8", "--workers",
            str(args.workers), "--out", str(folder), "--overwrite",  # a row not kept by --resume is played anew
        ]  # fmt: skip
        if row in sources:
            command += ["--agent", str(sources[row]), "--name", row]
        else:
            command += ["--expert" if row == "handcoded expert" else "--random"]
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            fail(f"eval.py failed for {row} on {split}:\n{done.stderr[-2000:]}")
        print(f"{split} / {row}: {time.perf_counter() - started:.0f}s")
        return json.loads((folder / "eval.json").read_text())

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        return dict(zip(rows, pool.map(run, rows)))


def split_table(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per policy: success per task type (%), all, mean steps of won games, mean length, games."""
    table = []
    for row, payload in results.items():
        metrics = payload["results"][0]
        entry = {"policy": row, **{c: payload["table"][0].get(c) for c in (*ALFWORLD_ORDER, "All", "Won steps")}}
        entry["Length"] = metrics["mean_length"]
        entry["Games"] = metrics["n_tasks"]
        entry["Eval s"] = metrics["seconds"]
        table.append(entry)
    return table


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if min(args.n_seen, args.n_unseen, args.n_heldout, args.episodes) < 1 or args.steps < 0:
        fail("--n-seen, --n-unseen, --n-heldout and --episodes must be >= 1 and --steps >= 0")
    out = Path(args.out)
    work = out / "work"
    prior = Path(args.prior) if args.prior else work / "prior"
    work.mkdir(parents=True, exist_ok=True)
    import torch

    torch.set_num_threads(args.torch_threads)

    prior_record = warm_start_stage(args, prior)
    rl_record = rl_stage(args, prior, work)

    seen = eval_rows(args, work, out, "valid_seen", list(ROWS))
    selected = max(("prior", "gagpo"), key=lambda row: (seen[row]["results"][0]["success_rate"], row == "gagpo"))
    unseen = eval_rows(args, work, out, "valid_unseen", list(ROWS))
    heldout = eval_rows(args, work, out, MINIHOUSE_HELDOUT, ["prior", "gagpo"])
    agent_dir = out / "agent"
    for source, target in ((work / ("prior_agent" if selected == "prior" else "gagpo"), agent_dir),
                           (work / "prior_agent", out / "prior_agent")):  # fmt: skip
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source, target)

    tables = {"valid_seen": split_table(seen), "valid_unseen": split_table(unseen), MINIHOUSE_HELDOUT: []}
    for row, payload in heldout.items():
        metrics = payload["results"][0]
        per_type = {t: round(100 * v, 1) for t, v in sorted(metrics["per_type"].items())}
        tables[MINIHOUSE_HELDOUT].append(
            {"policy": row, "All": round(100 * metrics["success_rate"], 1), **per_type,
             "Length": metrics["mean_length"], "Houses": metrics["n_tasks"]}
        )  # fmt: skip
    training = {
        "warm_start": {
            "episodes": prior_record["episodes"], "actions": prior_record["actions"],
            "transcript_success": prior_record["transcript_success"], "losses": prior_record["losses"],
            "seconds": prior_record["collect_s"] + prior_record["train_s"],
        },
        "gagpo": {"minihouse_env_steps": rl_record["steps"], "seconds": rl_record["seconds"]},
    }  # fmt: skip
    payload = {"selected": selected, "args": vars(args), "training": training, "tables": tables}
    (out / "sim2real.json").write_text(json.dumps(payload, indent=2, default=str))
    lines = [
        f"Selected on valid_seen: **{selected}** (copied to `{agent_dir}`).",
        f"Warm start{f' (reused: `{args.prior}`)' if args.prior else ''}: "
        f"{training['warm_start']['episodes']} searching-expert episodes "
        f"({training['warm_start']['actions']} actions), {training['warm_start']['seconds']:.0f}s. "
        f"GAGPO: {training['gagpo']['minihouse_env_steps']} MiniHouse env steps, {training['gagpo']['seconds']:.0f}s.",
    ]
    for split, rows in tables.items():
        if split == MINIHOUSE_HELDOUT:
            title = f"**MiniHouse, held-out full-size houses** (seeds {HELDOUT_OFFSET}.., greedy; success %)"
        else:
            title = f"**ALFWorld {split}** (greedy, 50 steps; success %)"
        lines += ["", f"{title}:", "", markdown_table(rows)]
    text = "\n".join(lines)
    (out / "sim2real.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
