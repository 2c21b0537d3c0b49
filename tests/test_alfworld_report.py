"""The ALFWorld comparison's report (lab/studies/alfworld_compare.py), written from the committed runs: it counts what
finished and marks every arm short of its pre-registered seeds as interim, the extra arms included."""

from __future__ import annotations

import builtins
import shutil
from pathlib import Path

import pytest
from agent_helpers import script

RUNS = Path(__file__).resolve().parents[1] / "results" / "alfworld" / "runs"


def report_from(runs: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The report written from copies of these committed runs (and the prior's evaluation) only."""
    compare = script("lab.studies.alfworld_compare")
    for name in ["prior", *runs]:
        shutil.copytree(RUNS / name, tmp_path / "runs" / name)
    monkeypatch.setattr(compare, "OUT", tmp_path)
    monkeypatch.setattr("builtins.print", lambda *_: None)
    return compare.write_report(compare.load_settings(check=False)).read_text()


PRIMARY = [f"{arm}-seed{seed}" for arm in ("gagpo", "gigpo", "grpo") for seed in (0, 1, 2)]


def test_the_report_marks_arms_short_of_their_seeds_as_interim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    full = report_from(PRIMARY, tmp_path / "full", monkeypatch)
    assert "Finished runs: 9 of 9 primary" in full and "extra arms: 0 of 15 (none)" in full
    assert "**Interim**" not in full and "| gagpo vs gigpo | +1.0 [-2.6, +4.5] | 3 / 3 |" in full

    extra = report_from([*PRIMARY, "rloo-seed0"], tmp_path / "extra", monkeypatch)
    assert "extra arms: 1 of 15 (rloo-seed0)" in extra and "**Interim** (rloo):" in extra
    assert "| gagpo vs rloo |" in extra and "| gagpo vs ppo |" not in extra  # an arm with no run has no row

    short = report_from([n for n in PRIMARY if n != "gigpo-seed2"], tmp_path / "short", monkeypatch)
    assert "Finished runs: 8 of 9 primary" in short and "**Interim** (gigpo):" in short


def test_the_committed_study_reports_through_the_legacy_check_and_starts_no_run(tmp_path: Path, monkeypatch, capsys):
    """Its pre-registration predates lab/study.py's protocol: ``report`` still reads the committed runs (the legacy
    check: the settings' sha256 is listed there), while ``train`` and ``evaluate`` refuse to start a run, since that
    record names no current digest as ``settings sha256: <digest>``."""
    compare = script("lab.studies.alfworld_compare")
    shown = builtins.print
    report_from(PRIMARY, tmp_path / "legacy", monkeypatch)  # copies the runs and points OUT there
    monkeypatch.setattr("builtins.print", shown)
    assert compare.main(["report"]) == 0 and (tmp_path / "legacy" / "report.md").is_file()
    assert "Registration and train games" not in (tmp_path / "legacy" / "report.md").read_text()  # none started so
    for command in (["train", "--arm", "gagpo"], ["evaluate", "--arm", "prior", "--allow-dirty"]):
        with pytest.raises(SystemExit) as ended:
            compare.main(command)
        assert ended.value.code == 2
        assert "must name exactly one current settings digest" in capsys.readouterr().err
