"""The one shape of a study runner (``lab/studies/*.py``): a settings file known by its sha256, run records that name
the settings and the code's commit, and the subcommands ``status``, ``train``, ``evaluate``, ``all`` and ``report``.

A study is rerun from its record alone: the settings' sha256 says which settings made a result, the commit which
code. A study with a pre-registration is held to the protocol (docs/design.md#registering-a-study): a run starts
only from a clean tree whose committed pre-registration names the settings' sha256 as its one current digest, and
its record says so (:func:`start_run`, :func:`registration_problems`).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import re
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from stable_baselines3.common.callbacks import BaseCallback

from agents.cli import fail
from agents.evaluation import info_at
from agents.reporting import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "status": "the settings and what is done",
    "train": "train (resumable)",
    "evaluate": "play the trained agents on the evaluation panels",
    "all": "every pending step, in order",
    "report": "write the report from what is done",
}
#: The pre-registration's line naming the settings file in force: exactly one, outside a "Superseded" section.
CURRENT_DIGEST = re.compile(r"^settings sha256: ([0-9a-f]{64})\s*$")
DIGEST = re.compile(r"\b[0-9a-f]{64}\b")
HEADING = re.compile(r"^(#+)\s+(.*)$")
#: The file beside a run's record listing every process that worked on it (:func:`start_run`), one JSON line each.
STARTS = "starts.jsonl"
#: The file beside a run's record listing the train games it played, by iteration (:class:`GamesPlayed`).
GAMES = "games.json"


def shown(path: Path) -> str:
    """A path as the messages show it: relative to the repository when inside it."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


# ----- the pre-registration's digests -------------------------------------------------------------------------
def registered_digests(text: str) -> tuple[list[str], list[str]]:
    """(current, superseded) settings digests of a pre-registration. A current one is a line
    ``settings sha256: <digest>``; every digest inside a section whose heading starts with "Superseded" (up to the
    next heading of its level or above) is superseded, so an amendment keeps the old digests on record."""
    current: list[str] = []
    superseded: list[str] = []
    inside: int | None = None  # the level of the Superseded heading we are under
    for line in text.splitlines():
        heading = HEADING.match(line)
        if heading:
            level = len(heading.group(1))
            if inside is not None and level <= inside:
                inside = None
            if heading.group(2).strip().lower().startswith("superseded"):
                inside = level
        if inside is not None:
            superseded += DIGEST.findall(line)
        elif match := CURRENT_DIGEST.match(line.strip()):
            current.append(match.group(1))
    return current, superseded


def check_preregistration(digest: str, preregistration: Path, what: str = "the settings file") -> None:
    """Exits unless ``preregistration`` names ``digest`` as its one current settings digest: a result is only ever
    made from the registered settings, and a superseded file is refused even though the record lists it."""
    if not preregistration.is_file():
        fail(f"no pre-registration {shown(preregistration)}")
    current, superseded = registered_digests(preregistration.read_text(encoding="utf-8"))
    where = shown(preregistration)
    if len(current) != 1:
        fail(f"{where} must name exactly one current settings digest (a line `settings sha256: <digest>`; "
             f"superseded ones under a '## Superseded' heading), it names {len(current)}")  # fmt: skip
    if digest in superseded and digest != current[0]:
        fail(f"{what} (sha256 {digest}) is superseded in {where}: the current settings are sha256 {current[0]}")
    if digest != current[0]:
        fail(f"{what} (sha256 {digest}) is not the pre-registered settings file: {where} names sha256 {current[0]}")


def read_settings_file(path: Path) -> tuple[dict[str, Any], str]:
    """The settings mapping and its file's sha256."""
    if not Path(path).is_file():
        fail(f"no settings file {shown(path)}")
    text = Path(path).read_bytes()
    settings = yaml.safe_load(text)
    if not isinstance(settings, dict):
        fail(f"{shown(path)} must be a mapping of settings")
    return settings, hashlib.sha256(text).hexdigest()


def load_settings(path: Path, preregistration: Path | None = None) -> dict[str, Any]:
    """A study's settings with their file's sha256 (``settings["sha256"]``). With ``preregistration`` the file must be
    the one it names as current (:func:`check_preregistration`)."""
    settings, digest = read_settings_file(path)
    if preregistration is not None:
        check_preregistration(digest, preregistration, shown(path))
    settings["sha256"] = digest
    return settings


def load_legacy_settings(path: Path, preregistration: Path) -> dict[str, Any]:
    """LEGACY: the check of pre-registrations written before the protocol, which accepts any digest written as
    ``sha256 `<digest>``` in the record, superseded ones too. Kept only so a study registered that way can still
    report from its committed runs; :func:`start_run` never accepts such a record."""
    settings, digest = read_settings_file(path)
    record = preregistration.read_text(encoding="utf-8") if preregistration.is_file() else ""
    if f"sha256 `{digest}`" not in record:
        fail(f"{shown(path)} (sha256 {digest}) is not listed in the legacy pre-registration {shown(preregistration)}")
    settings["sha256"] = digest
    return settings


# ----- the code's commit and the run's registration -----------------------------------------------------------
def git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)


def tree_state(root: Path = ROOT) -> tuple[str, bool]:
    """The commit checked out and whether the tracked files match it (untracked and ignored files do not count:
    ``.cache`` or a run's outputs are no code); ``("unknown", False)`` outside git."""
    head = git(root, "rev-parse", "HEAD")
    if head.returncode:
        return "unknown", False
    status = git(root, "status", "--porcelain", "--untracked-files=no")
    return head.stdout.strip(), not status.stdout.strip()


def code_commit(root: Path = ROOT) -> str:
    """The commit of the code that runs, ``+dirty`` when tracked files differ from it (``unknown`` outside git)."""
    commit, clean = tree_state(root)
    return commit if clean or commit == "unknown" else commit + "+dirty"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def start_run(
    settings: dict[str, Any],
    preregistration: Path | None,
    *,
    allow_dirty: bool = False,
    stage: str = "",
    root: Path = ROOT,
) -> dict[str, Any]:
    """Call as a run's process starts, before any work: the registration fields its record keeps (the code's commit,
    whether the tree was clean, the start time; for a pre-registered study the pre-registration's path, commit and
    commit time). A pre-registered study exits with one line when the tree has modified tracked files, when the
    pre-registration is not committed as it is, or when it does not name these settings as current;
    ``allow_dirty`` (a development run) lets the tree and the pre-registration differ from HEAD and is recorded,
    so that :func:`registration_problems` calls the run unregistered. ``stage`` names what the process does
    (``train``, ``evaluate``); :func:`record_start` keeps the fields beside the run's record."""
    started = now()
    commit, clean = tree_state(root)
    fields: dict[str, Any] = {"stage": stage, "commit": commit, "clean": clean, "allow_dirty": allow_dirty,
                              "started": started}  # fmt: skip
    if preregistration is not None:
        check_preregistration(settings["sha256"], preregistration)
        if not Path(preregistration).resolve().is_relative_to(Path(root).resolve()):
            fail(f"{shown(preregistration)} is outside the repository: a pre-registration is committed with the code")
        rel = str(Path(preregistration).resolve().relative_to(Path(root).resolve()))
        committed = not git(root, "cat-file", "-e", f"HEAD:{rel}").returncode  # in HEAD, not merely staged
        unchanged = committed and not git(root, "diff", "--quiet", "HEAD", "--", rel).returncode
        if not unchanged and not allow_dirty:
            fail(f"{rel} is {'modified since' if committed else 'not'} committed: commit the pre-registration before "
                 "the first run starts")  # fmt: skip
        if not clean and not allow_dirty:
            fail("the working tree has uncommitted changes to tracked files (git status): commit them before a "
                 "registered run, or pass --allow-dirty for a development run (recorded as unregistered)")  # fmt: skip
        log = git(root, "log", "-1", "--format=%H %cI", "--", rel).stdout.split()
        fields |= {
            "preregistration": rel,
            "preregistration_commit": log[0] if log else None,
            "preregistration_committed": log[1] if log else None,
            "preregistration_unchanged": unchanged,
        }
    return fields


def record_start(run_dir: Path, registration: dict[str, Any], fresh: bool = False) -> None:
    """Append a process's registration (:func:`start_run`) to the run's ``starts.jsonl``: a run resumed or
    evaluated by later processes keeps every process's. ``fresh``: the run starts over, its old starts go."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    path = Path(run_dir) / STARTS
    if fresh:
        path.unlink(missing_ok=True)
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(registration, sort_keys=True) + "\n")


def registration_problems(starts: list[dict[str, Any]]) -> list[str]:
    """Why a run is not registered (none: it is), from every process that worked on it (:func:`read_starts`, or
    the record's ``starts``): each started on a clean tree without ``--allow-dirty``, all from one code commit and
    one committed, unchanged pre-registration, each after that pre-registration was committed."""
    if not starts:
        return ["no registration recorded"]
    if any("preregistration_commit" not in s for s in starts):
        return ["no pre-registration recorded (made before the protocol, or by a study without one)"]
    problems = []
    if any(s.get("allow_dirty") for s in starts):
        problems.append("a development run (--allow-dirty)")
    if not all(s.get("clean") for s in starts):
        problems.append("started on a tree with uncommitted changes")
    if not all(s.get("preregistration_unchanged") for s in starts):
        problems.append("the pre-registration differed from its commit")
    if len({s["commit"] for s in starts}) > 1:
        problems.append(
            "its processes ran different commits (" + ", ".join(sorted({s["commit"][:7] for s in starts})) + ")"
        )
    if len({s["preregistration_commit"] for s in starts}) > 1:
        problems.append("its processes ran under different versions of the pre-registration")
    for s in starts:
        committed = s.get("preregistration_committed")
        if not committed or datetime.fromisoformat(committed) > datetime.fromisoformat(s["started"]):
            problems.append("started before the pre-registration was committed")
            break
    return problems


def run_starts(run_dir: Path, record: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every process's registration of a run: its ``starts.jsonl``, else what its record kept."""
    return read_starts(run_dir) or (record or {}).get("starts", [])


def run_rows(runs: dict[str, Path]) -> list[dict[str, Any]]:
    """The report's table of runs (``runs``: name -> run folder): registered or why not, the code's commit, the
    pre-registration's commit and time, the first start, and the distinct train games it played (its
    ``games.json``, :class:`GamesPlayed`) with their episodes."""
    rows = []
    for name, folder in runs.items():
        record = read_json(Path(folder) / "run.json", None)
        starts = run_starts(folder, record)
        problems = registration_problems(starts)
        first = starts[0] if starts else {}
        games = train_games(read_json(Path(folder) / GAMES, {}))
        rows.append({
            "run": name, "registered": "yes" if not problems else "no: " + "; ".join(problems),
            "code commit": str(first.get("commit", "-"))[:12],
            "pre-registration": f"{str(first.get('preregistration_commit') or '-')[:12]} "
                                f"({first.get('preregistration_committed') or '-'})",
            "started": first.get("started", "-"), "processes": len(starts),
            "distinct train games": len(games) if games else "-", "train episodes": sum(games.values()) or "-",
        })  # fmt: skip
    return rows


def read_starts(run_dir: Path) -> list[dict[str, Any]]:
    """Every process's registration of a run, in order (``starts.jsonl``; none when it is not there)."""
    return read_curve(Path(run_dir) / STARTS)  # the same JSON-lines shape


def write_record(
    path: Path, settings: dict[str, Any], registration: dict[str, Any] | None = None, **fields: Any
) -> dict[str, Any]:
    """A run's record (``fields``) with the settings' sha256 and the code's commit, written all or nothing. With
    ``registration`` (:func:`start_run`'s fields, taken when the process started: the code that ran, not the tree at
    the end) those fields are kept, the first process's at the top and every process's under ``starts`` (read from
    ``starts.jsonl`` beside ``path`` when there is one)."""
    if registration is None:
        commit, clean = tree_state()
        record = {**fields, "settings_sha256": settings["sha256"], "commit": commit, "clean": clean}
    else:
        starts = read_starts(Path(path).parent) or [registration]
        record = {**fields, "settings_sha256": settings["sha256"], **starts[0], "starts": starts}
    atomic_write_text(path, json.dumps(record, indent=2, default=str) + "\n")
    return record


def same_settings(path: Path, settings: dict[str, Any]) -> bool:
    """Whether the record at ``path`` was made with these settings (False: no record); exits naming both sha256 when
    it was made with others, since work kept from other settings would mix two runs into one."""
    record = read_json(path, None)
    if record is None:
        return False
    if record.get("settings_sha256") != settings["sha256"]:
        fail(f"{shown(path)} was made with settings sha256 {record.get('settings_sha256')}, these are "
             f"{settings['sha256']}: use another output folder, or remove it")  # fmt: skip
    return True


def read_json(path: Path, default: Any) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else default


def read_curve(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines curve (:class:`lab.recorder.Recorder` with a path); none when it is not there."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# ----- the train games a run played ---------------------------------------------------------------------------
class GamesPlayed(BaseCallback):
    """Records the game (``info["task_id"]``) of every training episode that ends, by iteration, into a JSON file
    rewritten after each rollout: "trained on N train games" names a pool; the record says what a run played.
    A resumed run reloads the file; an iteration played again after a stop replaces its own entry."""

    def __init__(self, path: Path) -> None:
        super().__init__(verbose=0)
        self.path = Path(path)
        self.games: dict[str, list[str]] = read_json(self.path, {})
        self.current: list[str] = []

    def _on_rollout_start(self) -> None:
        self.current = []

    def _on_step(self) -> bool:
        infos, dones = self.locals["infos"], self.locals["dones"]
        self.current += [str(info_at(infos, int(i)).get("task_id")) for i in range(len(dones)) if dones[i]]
        return True

    def _on_rollout_end(self) -> None:
        self.games[str(self.model.iteration)] = sorted(self.current)
        atomic_write_text(self.path, json.dumps(self.games, indent=0, sort_keys=True) + "\n")


class CreditAgreement(BaseCallback):
    """Logs each iteration how other estimators would credit the run's own rollout, against ``reference``'s credit
    of it (GAGPO's): the correlation and the share of actions given the same sign, over every action and over the
    actions of failed episodes (``agreement/<name>/...``). Each estimator's per-group advantages, before any batch
    step, with the run's own settings: where the estimators differ on the data each arm trains on."""

    def __init__(self, others: list[str], reference: str = "gagpo") -> None:
        super().__init__(verbose=0)
        self.others, self.reference = list(others), reference

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        buffer, config = self.model.buffer, self.model.config
        if len(buffer) < 2:
            return
        credit = {name: buffer.credit_under(dataclasses.replace(config, estimator=name))
                  for name in (self.reference, *self.others)}  # fmt: skip
        won = {(r.group, r.episode) for r in buffer.rows if r.done and r.won}
        failed = np.array([(r.group, r.episode) not in won for r in buffer.rows])
        ref = credit[self.reference]
        for name in self.others:
            for rows, mask in (("all", np.ones_like(failed)), ("failed", failed)):
                a, b = ref[mask], credit[name][mask]
                if a.size < 2:
                    continue
                corr = float(np.corrcoef(a, b)[0, 1]) if a.std() > 0 and b.std() > 0 else float("nan")
                self.logger.record(f"agreement/{name}/{rows}_corr", corr)
                self.logger.record(f"agreement/{name}/{rows}_same_sign", float(np.mean(np.sign(a) == np.sign(b))))


def train_games(games: dict[str, list[str]]) -> dict[str, int]:
    """Distinct games of a run's :class:`GamesPlayed` record, with how many training episodes each had."""
    counts: dict[str, int] = {}
    for episodes in games.values():
        for game in episodes:
            counts[game] = counts.get(game, 0) + 1
    return counts


# ----- the command line ---------------------------------------------------------------------------------------
def study_parser(description: str, helps: dict[str, str]) -> tuple[argparse.ArgumentParser, dict[str, Any]]:
    """The study's command line: one subcommand per :data:`COMMANDS` entry (``helps`` says what each does in this
    study); returns the parser and the subcommands' parsers, to which the study adds its options."""
    parser = argparse.ArgumentParser(description=description)
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {name: sub.add_parser(name, help=helps.get(name, default)) for name, default in COMMANDS.items()}
    return parser, commands


def add_allow_dirty(command: argparse.ArgumentParser) -> None:
    """``--allow-dirty`` on a subcommand that starts runs: a development run, recorded and reported as unregistered."""
    command.add_argument(
        "--allow-dirty", action="store_true",
        help="start on uncommitted changes (a development run: recorded, and reported as not registered)",
    )  # fmt: skip
