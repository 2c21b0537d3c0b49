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


def test_the_credit_agreement_reads_the_rollout_and_changes_no_training():
    """Logged beside training, never part of it: the same seed trains to the same weights with it, and GAGPO's own
    credit agrees with itself."""
    import torch
    from agent_helpers import capture_logs

    from agents import GAGPOAgent
    from lab.study import CreditAgreement

    maze = {"width": 3, "height": 3, "rooms": 0, "loops": 1, "min_path": 2, "max_path": 3, "max_episode_steps": 8}
    kwargs = dict(env_kwargs=maze, num_groups=2, group_size=4, tiny_hidden_size=32, seed=1, torch_threads=1,
                  verbose=0, advantage_scale="unit")  # fmt: skip
    plain, watched = GAGPOAgent("gagpo_gym/Maze-v0", **kwargs), GAGPOAgent("gagpo_gym/Maze-v0", **kwargs)
    logs = capture_logs(watched)
    plain.learn(10**6, max_iterations=2)
    watched.learn(10**6, max_iterations=2, callback=CreditAgreement(["gagpo", "grpo"]))
    for name, p in plain.policy.model.state_dict().items():
        assert torch.equal(watched.policy.model.state_dict()[name], p)
    row = logs.dumps[-1]
    assert row["agreement/gagpo/all_same_sign"] == 1.0
    assert -1 <= row["agreement/grpo/all_corr"] <= 1 and 0 <= row["agreement/grpo/failed_same_sign"] <= 1
