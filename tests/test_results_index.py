"""results/: the committed index (results/README.md) is what scripts/dev/results_index.py writes from the studies'
study.yaml and runs.json, and every learning study's folder holds what the benchmark writes."""

from __future__ import annotations

from pathlib import Path

import yaml
from agent_helpers import script

ROOT = Path(__file__).resolve().parents[1]
LEARNING = ROOT / "results" / "learning"


def test_the_committed_results_index_is_up_to_date():
    index = script("dev/results_index")
    assert (ROOT / "results" / "README.md").read_text() == index.render(), "python scripts/dev/results_index.py"
    assert index.main(["--check"]) == 0


def test_every_learning_study_is_indexed_with_its_report_and_a_headline():
    text = (ROOT / "results" / "README.md").read_text()
    studies = sorted(p.name for p in LEARNING.iterdir() if p.is_dir())
    assert len(studies) >= 30
    for name in studies:
        folder = LEARNING / name
        assert name == name.lower() and "_" not in name, name  # one naming rule: lower case, '-' separated
        if not (folder / "report.md").is_file() and (folder / "preregistration.md").is_file():  # still running
            assert f"### {name} (registered, running)" in text, name
            continue
        assert (folder / "report.md").is_file() and f"### [{name}](learning/{name}/report.md)" in text, name
        meta = yaml.safe_load((folder / "study.yaml").read_text())
        assert meta["command"].startswith("python -m lab.bench.learning"), name
        if (folder / "runs.json").is_file():  # a run the benchmark wrote: its plot is linked beside it
            assert "![learning curves](curve.png)" in (folder / "report.md").read_text(), name


def test_a_study_without_a_question_is_refused(tmp_path, monkeypatch):
    index = script("dev/results_index")
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "report.md").write_text("# a study\n")
    (tmp_path / "study" / "study.yaml").write_text("command: python x.py\nheadline: 1\nquestio: typo\n")
    try:
        index.read_study(tmp_path / "study")
    except SystemExit as err:
        assert "unknown key(s) ['questio']" in str(err) and "missing ['question']" in str(err)
    else:
        raise AssertionError("a study.yaml with a misspelt key was read")
