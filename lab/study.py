"""The one shape of a study runner (``lab/studies/*.py``): a settings file known by its sha256, run records that name
the settings and the code's commit, and the subcommands ``status``, ``train``, ``evaluate``, ``all`` and ``report``.

A study is rerun from its record alone: the settings' sha256 says which settings made a result (a pre-registered
study refuses any other file), the commit which code.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from agents.cli import fail
from agents.reporting import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "status": "the settings and what is done",
    "train": "train (resumable)",
    "evaluate": "play the trained agents on the evaluation panels",
    "all": "every pending step, in order",
    "report": "write the report from what is done",
}


def shown(path: Path) -> str:
    """A path as the messages show it: relative to the repository when inside it."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def load_settings(path: Path, preregistration: Path | None = None) -> dict[str, Any]:
    """A study's settings with their file's sha256 (``settings["sha256"]``). With ``preregistration`` the file must be
    the one that record names (``sha256 `<digest>```): a result is only ever made from the registered settings."""
    if not Path(path).is_file():
        fail(f"no settings file {shown(path)}")
    text = Path(path).read_bytes()
    digest = hashlib.sha256(text).hexdigest()
    if preregistration is not None:
        record = preregistration.read_text(encoding="utf-8") if preregistration.is_file() else ""
        if f"sha256 `{digest}`" not in record:
            fail(f"{shown(path)} (sha256 {digest}) is not the pre-registered settings file: "
                 f"{shown(preregistration)} records another (or none)")  # fmt: skip
    settings = yaml.safe_load(text)
    if not isinstance(settings, dict):
        fail(f"{shown(path)} must be a mapping of settings")
    settings["sha256"] = digest
    return settings


def code_commit() -> str:
    """The commit of the code that runs, ``+dirty`` when tracked files differ from it (``unknown`` outside git)."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode:
        return "unknown"
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def write_record(path: Path, settings: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A run's record (``fields``) with the settings' sha256 and the code's commit, written all or nothing."""
    record = {**fields, "settings_sha256": settings["sha256"], "commit": code_commit()}
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


def read_curve(path: Path) -> list[dict[str, float]]:
    """The rows of a JSON-lines curve (:class:`lab.recorder.Recorder` with a path); none when it is not there."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def study_parser(description: str, helps: dict[str, str]) -> tuple[argparse.ArgumentParser, dict[str, Any]]:
    """The study's command line: one subcommand per :data:`COMMANDS` entry (``helps`` says what each does in this
    study); returns the parser and the subcommands' parsers, to which the study adds its options."""
    parser = argparse.ArgumentParser(description=description)
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {name: sub.add_parser(name, help=helps.get(name, default)) for name, default in COMMANDS.items()}
    return parser, commands
