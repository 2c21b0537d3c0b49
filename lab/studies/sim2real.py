"""Sim-to-real: train the tiny model in MiniHouse only, then play the real ALFWorld games.

    python -m lab.studies.sim2real status                   # the settings and what is done
    python -m lab.studies.sim2real all --resume             # the committed run (results/sim2real)
    python -m lab.studies.sim2real all --settings my.yaml --out /tmp/s2r   # other settings (a copy of the file, edited)

The settings are ``lab/studies/sim2real.yaml`` (``--settings`` names another file); ``--out`` (default
``results/sim2real``) receives what is kept. Subcommands:

1. ``train``: the **warm start** (``agents.warm_start``) on full-size MiniHouse houses, all six task types, fresh
   tasks every episode, from the transcripts of MiniHouse's searching expert (it finds objects by looking; it never
   reads where they are), with the ``"choice"`` objective (the choose-mode policy's own cross-entropy), or the
   settings' ``prior`` folder made before (``scripts/warm_start.py``) as it is; then **GAGPO** on full-size MiniHouse
   from that prior (``GAGPOAgent(env, model=prior).learn(steps)``), with the fine-tuning settings a prior brings
   (its ``prior.json``, else ``agents.prior.FINE_TUNE``).
2. ``evaluate``: the **real engine** through ``scripts/eval.py`` (ALFWorld-v0, 50 steps, greedy, per task type): the
   random admissible policy, the prior, the agent after GAGPO, and ALFWorld's handcoded expert (it sees what the agent
   sees). Model selection uses valid_seen only: of the prior and the agent after GAGPO, the better one on valid_seen
   becomes ``<out>/agent``. valid_unseen is played once per model, after training has ended. The prior and the agent
   also play held-out full-size MiniHouse houses (what RL raised in simulation).
3. ``report``: ``<out>/sim2real.{json,md}`` (tables per split, training steps and wall times).

``all`` runs the three. With ``--resume`` a stage whose output is there is kept (a training record made with other
settings is refused). Writes ``<out>/agent`` (the selected agent, a few MB), ``<out>/prior_agent`` (the prior's row)
and ``<out>/eval/<split>/<row>/eval.json``; the work folder ``<out>/work`` holds the prior, both agents and the
records of ``train`` and ``evaluate`` (the settings' sha256 and the code's commit).
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
from lab.study import ROOT, load_settings, read_json, same_settings, shown, study_parser, write_record

SETTINGS = Path(__file__).resolve().parent / "sim2real.yaml"
MINIHOUSE = "gagpo_gym/MiniHouse-v0"
ALFWORLD = "gagpo_gym/ALFWorld-v0"
#: The MiniHouse panel the models are also played on: held-out full-size houses, never trained on.
MINIHOUSE_HELDOUT = "minihouse_heldout"
ROWS = ("random", "prior", "gagpo", "handcoded expert")


def build_parser() -> argparse.ArgumentParser:
    parser, commands = study_parser(
        __doc__.split("\n")[0],
        {"train": "warm start and GAGPO in MiniHouse", "evaluate": "the rows on the real games; select on valid_seen",
         "all": "train, evaluate, report", "report": "write <out>/sim2real.{json,md}"},
    )  # fmt: skip
    for command in commands.values():
        command.add_argument("--settings", type=Path, default=SETTINGS, help="the settings file")
        command.add_argument("--out", type=Path, default=ROOT / "results" / "sim2real", help="output folder")
        command.add_argument("--resume", action="store_true", help="keep the stages whose outputs exist in --out")
        command.add_argument("--torch-threads", type=int, default=1, help="torch CPU threads per process")
        command.add_argument("--jobs", type=int, default=2, help="eval.py processes at a time")
        command.add_argument(
            "--workers", type=int, default=0, help="env worker processes per eval.py (its --workers; the same tables)"
        )
    return parser


def read_settings(path: Path) -> dict[str, Any]:
    """The settings file, checked for what the stages read (one line naming a missing or out-of-range value)."""
    settings = load_settings(path)
    for section, keys in (("warm_start", ("episodes",)), ("gagpo", ("steps",)),
                          ("evaluation", ("valid_seen", "valid_unseen", "minihouse_heldout"))):  # fmt: skip
        for key in keys:
            value = settings.get(section, {}).get(key)
            if not isinstance(value, int) or value < (0 if key == "steps" else 1):
                fail(f"{shown(path)}: {section}.{key} must be an int >= {0 if key == 'steps' else 1}, got {value!r}")
    return settings


def warm_start_stage(settings: dict[str, Any], prior: Path, resume: bool, torch_threads: int) -> dict[str, Any]:
    """The prior's record: the settings' ``prior`` folder as it is, a resumed one, or a new warm start."""
    from agents.prior import read_prior
    from agents.warm_start import warm_start

    record = read_prior(prior) if resume or settings["prior"] else None
    if record is not None:
        print(f"warm start: reusing {prior}")
        return record
    if settings["prior"]:
        fail(f"prior {settings['prior']}: not a warm-start folder (no readable prior.json)")
    ws = settings["warm_start"]
    return warm_start(
        MINIHOUSE, prior, env_kwargs={"size": "full"}, episodes=ws["episodes"], epsilon=ws["epsilon"],
        epochs=ws["epochs"], learning_rate=ws["learning_rate"], batch_size=ws["batch_size"], seed=settings["seed"],
        expert="search", objective=ws["objective"], task_pool=0, history_length=ws["history_length"],
        show_admissible=ws["show_admissible"], memory=ws["memory"], tiny_hidden_size=ws["tiny_hidden_size"],
        tiny_layers=ws["tiny_layers"], torch_threads=torch_threads,
    )  # fmt: skip


def rl_stage(settings: dict[str, Any], prior: Path, work: Path, resume: bool, torch_threads: int) -> dict[str, Any]:
    """Save the prior as an agent (0 steps) and train GAGPO from it; returns steps and wall time."""
    from agents.checkpoint import AGENT_FILE
    from agents.gagpo import GAGPOAgent

    prior_agent, final = work / "prior_agent", work / "gagpo"
    record_file = work / "rl.json"
    if resume and (final / AGENT_FILE).is_file() and same_settings(record_file, settings):
        print(f"GAGPO: reusing {final}")
        return read_json(record_file, {})

    started = time.perf_counter()
    rl = settings["gagpo"]
    learner = GAGPOAgent(
        MINIHOUSE, str(prior), env_kwargs={"size": "full"}, estimator=rl["estimator"], task_pool=0,
        num_groups=rl["num_groups"], group_size=rl["group_size"], ent_coef=rl["ent_coef"], seed=settings["seed"],
        verbose=0, torch_threads=torch_threads,
    )  # fmt: skip
    learner.save(prior_agent)  # the prior as an agent, before any step
    if rl["steps"]:
        learner.learn(rl["steps"])
    learner.save(final)
    record = write_record(record_file, settings, steps=learner.num_timesteps, seconds=time.perf_counter() - started,
                          config=vars(learner.config))  # fmt: skip
    print(f"GAGPO: {record['steps']} MiniHouse env steps in {record['seconds']:.0f}s; saved {final}")
    return record


def train(settings: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The warm start and GAGPO; their record (``<out>/work/train.json``) is what ``report`` reads."""
    work = args.out / "work"
    work.mkdir(parents=True, exist_ok=True)
    prior = ROOT / settings["prior"] if settings["prior"] else work / "prior"
    import torch

    torch.set_num_threads(args.torch_threads)
    prior_record = warm_start_stage(settings, prior, args.resume, args.torch_threads)
    rl_record = rl_stage(settings, prior, work, args.resume, args.torch_threads)
    training = {
        "warm_start": {
            "episodes": prior_record["episodes"], "actions": prior_record["actions"],
            "transcript_success": prior_record["transcript_success"], "losses": prior_record["losses"],
            "seconds": prior_record["collect_s"] + prior_record["train_s"],
        },
        "gagpo": {"minihouse_env_steps": rl_record["steps"], "seconds": rl_record["seconds"]},
    }  # fmt: skip
    return write_record(work / "train.json", settings, training=training)


def eval_rows(settings: dict[str, Any], args: argparse.Namespace, split: str, rows: list[str]) -> dict[str, Any]:
    """Run scripts/eval.py once per row on ``split`` (``--jobs`` at a time); returns each row's eval.json."""
    n_tasks = settings["evaluation"][split]
    work = args.out / "work"
    sources = {"prior": work / "prior_agent", "gagpo": work / "gagpo"}

    def run(row: str) -> dict[str, Any]:
        folder = args.out / "eval" / split / row.replace(" ", "_")
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


def evaluate(settings: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Every row on both splits and the held-out houses; the prior or the GAGPO agent, the better on valid_seen, is
    copied to ``<out>/agent``. Its record (``<out>/work/evaluate.json``) names the selected row."""
    work = args.out / "work"
    if not same_settings(work / "train.json", settings):
        fail(f"{shown(args.out)} has no training with these settings yet: run `train` first")
    seen = eval_rows(settings, args, "valid_seen", list(ROWS))
    selected = max(("prior", "gagpo"), key=lambda row: (seen[row]["results"][0]["success_rate"], row == "gagpo"))
    eval_rows(settings, args, "valid_unseen", list(ROWS))
    eval_rows(settings, args, MINIHOUSE_HELDOUT, ["prior", "gagpo"])
    for source, target in ((work / ("prior_agent" if selected == "prior" else "gagpo"), args.out / "agent"),
                           (work / "prior_agent", args.out / "prior_agent")):  # fmt: skip
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source, target)
    return write_record(work / "evaluate.json", settings, selected=selected)


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


def report(settings: dict[str, Any], args: argparse.Namespace) -> str:
    """``<out>/sim2real.{json,md}`` from the records of ``train`` and ``evaluate`` and the rows' eval.json."""
    work = args.out / "work"
    if not (same_settings(work / "train.json", settings) and same_settings(work / "evaluate.json", settings)):
        fail(f"{shown(args.out)} has no evaluation with these settings yet: run `train` and `evaluate` first")
    training, selected = read_json(work / "train.json", {})["training"], read_json(work / "evaluate.json", {})

    def played(split: str, rows: tuple[str, ...]) -> dict[str, Any]:
        return {row: read_json(args.out / "eval" / split / row.replace(" ", "_") / "eval.json", {}) for row in rows}

    tables = {split: split_table(played(split, ROWS)) for split in ("valid_seen", "valid_unseen")}
    tables[MINIHOUSE_HELDOUT] = []
    for row, payload in played(MINIHOUSE_HELDOUT, ("prior", "gagpo")).items():
        metrics = payload["results"][0]
        per_type = {t: round(100 * v, 1) for t, v in sorted(metrics["per_type"].items())}
        tables[MINIHOUSE_HELDOUT].append(
            {"policy": row, "All": round(100 * metrics["success_rate"], 1), **per_type,
             "Length": metrics["mean_length"], "Houses": metrics["n_tasks"]}
        )  # fmt: skip
    payload = {"selected": selected["selected"], "settings": {k: v for k, v in settings.items() if k != "sha256"},
               "settings_sha256": settings["sha256"], "commit": selected["commit"], "training": training,
               "tables": tables}  # fmt: skip
    (args.out / "sim2real.json").write_text(json.dumps(payload, indent=2, default=str))
    ws, rl = training["warm_start"], training["gagpo"]
    reused = f" (reused: `{settings['prior']}`)" if settings["prior"] else ""
    lines = [
        f"Selected on valid_seen: **{payload['selected']}** (copied to `{args.out / 'agent'}`).",
        f"Warm start{reused}: {ws['episodes']} "
        f"searching-expert episodes ({ws['actions']} actions), {ws['seconds']:.0f}s. "
        f"GAGPO: {rl['minihouse_env_steps']} MiniHouse env steps, {rl['seconds']:.0f}s.",
    ]
    for split, rows in tables.items():
        if split == MINIHOUSE_HELDOUT:
            title = f"**MiniHouse, held-out full-size houses** (seeds {HELDOUT_OFFSET}.., greedy; success %)"
        else:
            title = f"**ALFWorld {split}** (greedy, 50 steps; success %)"
        lines += ["", f"{title}:", "", markdown_table(rows)]
    text = "\n".join(lines)
    (args.out / "sim2real.md").write_text(text + "\n")
    print(text)
    return text


def status(settings: dict[str, Any], args: argparse.Namespace) -> None:
    print(json.dumps(settings, indent=1))
    work = args.out / "work"
    for stage, done in (("train", work / "train.json"), ("evaluate", work / "evaluate.json"),
                        ("report", args.out / "sim2real.json")):  # fmt: skip
        print(f"{stage}: {'done' if done.is_file() else 'pending'}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = read_settings(args.settings)
    if args.command == "status":
        status(settings, args)
        return 0
    if args.command in ("train", "all"):
        train(settings, args)
    if args.command in ("evaluate", "all"):
        evaluate(settings, args)
    if args.command in ("report", "all"):
        report(settings, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
