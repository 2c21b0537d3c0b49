"""The headroom comparison's runner (lab/studies/alfworld_headroom.py): the #49 runner's runs under its own layout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from agent_helpers import script

ROOT = Path(__file__).resolve().parents[1]


def test_each_layout_names_the_module_its_subprocesses_run():
    """``all`` starts ``python -m <layout.module>``: under ``python -m`` a module's __name__ is "__main__", which
    names no module."""
    compare, headroom = script("lab.studies.alfworld_compare"), script("lab.studies.alfworld_headroom")
    assert compare.LAYOUT.module == "lab.studies.alfworld_compare"
    assert headroom.LAYOUT.module == "lab.studies.alfworld_headroom"
    assert headroom.LAYOUT.final_agent("gagpo-seed0") == ROOT / "runs" / "alfworld-headroom" / "gagpo-seed0" / "final"


def test_status_lists_the_registered_order_seed_by_seed():
    out = subprocess.run([sys.executable, "-m", "lab.studies.alfworld_headroom", "status"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=True).stdout  # fmt: skip
    steps = [line.split()[1:] for line in out.splitlines() if line.startswith("pending:")]
    trains = [(arm, int(seed)) for what, arm, seed in steps if what == "train"]
    assert trains == sorted(trains, key=lambda t: t[1]) and len(trains) <= 25
