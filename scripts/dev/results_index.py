"""Write results/README.md, the index of the studies in results/: each study's question, the command that makes
it, and its headline number.

    python scripts/dev/results_index.py            # rewrite results/README.md
    python scripts/dev/results_index.py --check    # exit 1 if results/README.md is not what this writes

The data: every study folder holds a ``study.yaml`` with ``question``, ``command`` and ``headline`` (and ``report``,
the report's file name, default ``report.md``), or ``studies:``, a list of those for a folder of several reports. A
learning study (``results/learning/<study>/``, written by ``lab/bench/learning.py``) may leave out its headline:
it is read from its ``runs.json``, the final success of each run (mean +- sd over seeds). The committed agents
(``results/agents/``) are listed from their own ``prior.json`` or ``agent.json``. A test checks that the committed
index is what this script writes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
KEYS = {"question", "command", "headline", "report"}
#: Folders of results/ that are no study of their own (the committed models, listed apart).
NOT_STUDIES = ("agents",)
#: What results/ may weigh (tests/test_results_policy.py holds the working tree to it): the whole folder, one file,
#: one committed agent folder, in bytes. About 12%, 20% and 20% above what they weigh now; a study that needs more
#: keeps its bulk out of the repository (the command that rebuilds it is recorded) rather than raising them.
FOLDER_BUDGET = 85_000_000
FILE_BUDGET = 3_000_000
AGENT_BUDGET = 2_500_000
#: The one file of a saved agent that only resuming its run reads (agents.checkpoint.OPTIMIZER_FILE).
OPTIMIZER_FILE = "optimizer.pt"


def policy_lines() -> list[str]:
    """The section of results/README.md that says what results/ holds (tests/test_results_policy.py enforces it)."""
    mb = 1e6
    return [
        "## What results/ holds",
        "",
        "- A study's record: its report, the data its tables and plots are made from (runs.json, CSV, JSON), its",
        "  plots and its `study.yaml`. Not its working files: checkpoints go to the ignored `runs/`.",
        "- Committed agents (`agents/`): only those a page or the README names, a report links, a benchmark setup",
        "  fine-tunes (`prior_path`) or a study reads (`lab/studies/alfworld_compare.py` takes each run's final",
        "  agent as the record that the run is trained, and evaluates from it). Each is saved for playing: model,",
        f"  tokenizer, config, RNG state and manifest, no optimizer state (`{OPTIMIZER_FILE}`: only resuming a run",
        "  reads it; `agents.checkpoint.drop_optimizer_state` makes the copy, `GAGPOAgent.load` plays it and refuses",
        "  to train it, naming why). Every other agent is rebuilt by the command its study records.",
        f"- Budgets (`tests/test_results_policy.py`): the folder {FOLDER_BUDGET / mb:g} MB, one file "
        f"{FILE_BUDGET / mb:g} MB, one agent {AGENT_BUDGET / mb:g} MB.",
        f"- The agents' `{OPTIMIZER_FILE}` files were dropped after some evaluations were written: a `fingerprint`",
        "  recorded before (the SHA-256 of the agent's manifest) names the agent with that file; the digests of its",
        "  weights in the manifest are unchanged.",
        "",
    ]


def read_study(folder: Path) -> list[dict[str, str]]:
    """The studies ``folder/study.yaml`` describes, each with its report's path relative to results/."""
    path = folder / "study.yaml"
    data = yaml.safe_load(path.read_text())
    entries = data.get("studies", [data]) if isinstance(data, dict) else None
    if not entries or not all(isinstance(e, dict) for e in entries):
        raise SystemExit(f"error: {path} must be a mapping of {sorted(KEYS)}, or studies: a list of them")
    out = []
    for entry in entries:
        unknown = sorted(set(entry) - KEYS)
        missing = sorted({"question", "command"} - set(entry))
        if unknown or missing:
            raise SystemExit(f"error: {path}: unknown key(s) {unknown} / missing {missing} (keys: {sorted(KEYS)})")
        report = folder / entry.get("report", "report.md")
        if not report.is_file():
            raise SystemExit(f"error: {path} names a report {report.name} that is not there")
        headline = entry.get("headline") or learning_headline(folder)
        if not headline:
            raise SystemExit(f"error: {path} has no headline and no runs.json to read one from")
        out.append({**entry, "report": report.relative_to(RESULTS).as_posix(), "headline": headline})
    return out


def learning_headline(folder: Path) -> str:
    """Final success per run label from a learning study's runs.json ("" if it has none)."""
    runs = folder / "runs.json"
    if not runs.is_file():
        return ""
    payload = json.loads(runs.read_text())
    panel = "held-out tasks" if payload["budget"].get("heldout") else "tasks"
    finals = ", ".join(f"{row['estimator']} {row['final success']}" for row in payload["summary"])
    return f"final {payload['eval']} success on {payload['budget']['eval_tasks']} {panel}: {finals}"


def agent_rows() -> list[dict[str, Any]]:
    """One row per committed model folder of results/agents/: a warm-start prior or a saved agent."""
    rows = []
    for folder in sorted(p for p in (RESULTS / "agents").iterdir() if p.is_dir()):
        prior, agent = folder / "prior.json", folder / "agent.json"
        record = json.loads((prior if prior.is_file() else agent).read_text())
        kind = "warm-start prior" if prior.is_file() else f"agent ({record['num_timesteps']} env steps)"
        env = f"`{record['env_id']}` `{json.dumps(record.get('env_kwargs', {}))}`"
        rows.append({"folder": f"[{folder.name}](agents/{folder.name})", "kind": kind, "env": env})
    return rows


def entry_lines(study: dict[str, str], name: str) -> list[str]:
    return [
        f"### [{name}]({study['report']})",
        "",
        study["question"],
        "",
        f"- command: `{study['command']}`",
        f"- headline: {study['headline']}",
        "",
    ]


def registered_lines(name: str) -> list[str]:
    """The entry of a learning study whose plan is committed and whose runs are not in yet."""
    return [
        f"### {name} (registered, running)",
        "",
        f"The plan: [preregistration.md](learning/{name}/preregistration.md).",
        "",
    ]


def render() -> str:
    """The whole results/README.md."""
    lines = [
        "# Results",
        "",
        "Generated by `python scripts/dev/results_index.py` from each study's `study.yaml` (question, command,",
        "headline) and, for a learning study without a headline, its `runs.json`; edit those, not this file.",
        "Commands that a report did not record are rebuilt from the settings it lists; defaults changed since some",
        "runs, so an old study's numbers may move when it is run again.",
        "",
        *policy_lines(),
        "## Committed agents (`agents/`)",
        "",
        "Warm-start priors and saved agents, each loading as the tests load it (`agents/README.md` tells how each",
        "prior was made).",
        "",
        "| folder | kind | env |",
        "|---|---|---|",
        *(f"| {r['folder']} | {r['kind']} | {r['env']} |" for r in agent_rows()),
        "",
        "## Learning studies (`learning/`)",
        "",
        "Each made by `lab/bench/learning.py` (setups: `lab/bench/setups/`): report.md, runs.json, steps.csv,",
        "iterations.csv, curve.png.",
        "",
    ]
    for folder in sorted(p for p in (RESULTS / "learning").iterdir() if p.is_dir()):
        if not (folder / "study.yaml").is_file() and (folder / "preregistration.md").is_file():
            lines += registered_lines(folder.name)  # its runs are not in yet
            continue
        if not (folder / "study.yaml").is_file():
            raise SystemExit(f"error: the learning study {folder.relative_to(ROOT)} has no study.yaml")
        for study in read_study(folder):
            lines += entry_lines(study, folder.name)
    lines += ["## Other studies", ""]
    others = []
    for folder in sorted(p for p in RESULTS.iterdir() if p.is_dir() and p.name not in (*NOT_STUDIES, "learning")):
        if not (folder / "study.yaml").is_file():
            others.append(folder.name)
            continue
        studies = read_study(folder)
        for study in studies:
            name = folder.name if len(studies) == 1 else Path(study["report"]).stem
            lines += entry_lines(study, f"{folder.name}: {name}" if len(studies) > 1 else name)
    if others:
        lines += ["Folders without an index entry: " + ", ".join(f"`{name}/`" for name in others) + ".", ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if results/README.md is out of date")
    args = parser.parse_args(argv)
    text, index = render(), RESULTS / "README.md"
    if args.check:
        if not index.is_file() or index.read_text() != text:
            print(f"{index.relative_to(ROOT)} is out of date: python scripts/dev/results_index.py", file=sys.stderr)
            return 1
        return 0
    index.write_text(text)
    print(f"wrote {index.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
