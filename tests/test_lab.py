"""The lab's shared pieces: the study runner's shape (lab/study.py) and the one logger recorder (lab/recorder.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from lab.recorder import Recorder
from lab.study import COMMANDS, load_settings, read_curve, same_settings, study_parser, write_record


def test_a_settings_file_is_known_by_its_sha256_and_refused_unless_pre_registered(tmp_path: Path, capsys) -> None:
    settings_file = tmp_path / "settings.yaml"
    settings_file.write_text("seed: 0\narms: [gagpo, grpo]\n")
    digest = hashlib.sha256(settings_file.read_bytes()).hexdigest()
    record = tmp_path / "preregistration.md"
    record.write_text(f"Settings: sha256 `{digest}`.\n")
    assert load_settings(settings_file, record) == {"seed": 0, "arms": ["gagpo", "grpo"], "sha256": digest}
    settings_file.write_text("seed: 1\narms: [gagpo, grpo]\n")  # changed after it was registered
    with pytest.raises(SystemExit) as ended:
        load_settings(settings_file, record)
    assert ended.value.code == 2 and "is not the pre-registered settings file" in capsys.readouterr().err
    assert load_settings(settings_file)["seed"] == 1  # a study without a pre-registration reads any file


def test_a_run_record_names_the_settings_and_the_commit_and_refuses_other_settings(tmp_path: Path, capsys) -> None:
    settings = {"seed": 0, "sha256": "a" * 64}
    record = write_record(tmp_path / "run.json", settings, steps=12)
    assert json.loads((tmp_path / "run.json").read_text()) == record
    assert record["steps"] == 12 and record["settings_sha256"] == "a" * 64 and record["commit"]
    assert same_settings(tmp_path / "run.json", settings) and not same_settings(tmp_path / "none.json", settings)
    with pytest.raises(SystemExit):
        same_settings(tmp_path / "run.json", {**settings, "sha256": "b" * 64})
    assert "was made with settings sha256 " + "a" * 64 in capsys.readouterr().err


def test_every_study_has_the_same_subcommands() -> None:
    parser, commands = study_parser("a study", {"train": "one run"})
    assert list(commands) == list(COMMANDS) == ["status", "train", "evaluate", "all", "report"]
    assert parser.parse_args(["report"]).command == "report"
    assert "one run" in parser.format_help()


def test_the_recorder_keeps_each_dump_as_a_row_and_appends_its_curve(tmp_path: Path) -> None:
    curve = tmp_path / "curve.jsonl"
    recorder = Recorder(curve, keep=lambda key: not key.startswith("time/"), step_key="steps")
    recorder.write({"rollout/success_rate": np.float32(0.5), "time/update_s": 3.0, "note": "text", "n": 2}, {}, 64)
    recorder.write({"rollout/success_rate": 0.75}, {}, 128)
    assert recorder.rows == [{"steps": 64, "rollout/success_rate": 0.5, "n": 2.0},
                             {"steps": 128, "rollout/success_rate": 0.75}]  # fmt: skip
    assert read_curve(curve) == recorder.rows and read_curve(tmp_path / "none.jsonl") == []
