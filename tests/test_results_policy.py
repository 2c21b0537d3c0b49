"""What results/ holds (its README's "What results/ holds"): budgets for the folder, one file and one committed agent;
committed agents saved for playing, without the optimizer state that only resuming reads; each committed agent one
that something in the repository names or reads. And a play-only agent loads and plays, and refuses to train with
one error that says why, rather than restarting its optimizer silently.

The budgets are measured on the working tree (tracked files and new ones git does not ignore), so a study that
outgrows them fails here before it is committed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import script

from agents import GAGPOAgent, checkpoint

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
AGENTS = RESULTS / "agents"
INDEX = script("dev/results_index")
#: Where a committed agent may be named: pages, reports, setups and scripts (not the agents' own files or the index).
NAMING_SUFFIXES = {".md", ".yaml", ".py"}


def files_under(folder: Path) -> list[Path]:
    """The files git tracks or would add under ``folder`` (ignored ones left out), that exist."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", str(folder.relative_to(ROOT))],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split("\0")  # fmt: skip
    return sorted({ROOT / name for name in listed if name and (ROOT / name).is_file()})


def megabytes(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def test_results_stay_within_their_budgets():
    files = files_under(RESULTS)
    total = sum(f.stat().st_size for f in files)
    assert total <= INDEX.FOLDER_BUDGET, f"results/ weighs {megabytes(total)} > {megabytes(INDEX.FOLDER_BUDGET)}"
    big = [
        f"{f.relative_to(ROOT)} ({megabytes(f.stat().st_size)})" for f in files if f.stat().st_size > INDEX.FILE_BUDGET
    ]
    assert not big, f"files over {megabytes(INDEX.FILE_BUDGET)}: {big}"
    for folder in sorted(p for p in AGENTS.iterdir() if p.is_dir()):
        size = sum(f.stat().st_size for f in files if f.is_relative_to(folder))
        assert size <= INDEX.AGENT_BUDGET, f"{folder.name} weighs {megabytes(size)} > {megabytes(INDEX.AGENT_BUDGET)}"


def test_committed_agents_carry_no_optimizer_state():
    stray = [str(f.relative_to(ROOT)) for f in files_under(RESULTS) if f.name == INDEX.OPTIMIZER_FILE]
    assert not stray, (
        f"optimizer state committed (agents.checkpoint.drop_optimizer_state makes a play-only copy): {stray}"
    )
    assert INDEX.OPTIMIZER_FILE == checkpoint.OPTIMIZER_FILE
    for manifest in sorted(AGENTS.glob("*/manifest.json")):
        assert checkpoint.OPTIMIZER_FILE not in json.loads(manifest.read_text()), manifest.parent.name


def naming_texts() -> str:
    """Every page, report, setup and script of the repository but the committed agents' own files and the index."""
    skip = {RESULTS / "README.md"}
    texts = []
    for path in files_under(ROOT):
        if path.suffix in NAMING_SUFFIXES and path not in skip and not path.is_relative_to(AGENTS):
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(texts)


def test_every_committed_agent_is_named_or_read_by_a_study():
    """A folder of results/agents/ is named (``results/agents/<name>``) by a page, a report, a setup or a script,
    or is a final agent of the ALFWorld comparison with its run's record (lab/studies/alfworld_compare.py reads it)."""
    texts = naming_texts()
    unnamed = []
    for folder in sorted(p for p in AGENTS.iterdir() if p.is_dir()):
        alfworld_run = RESULTS / "alfworld" / "runs" / folder.name.removeprefix("alfworld-") / "run.json"
        if not re.search(rf"results/agents/{re.escape(folder.name)}(?![\w-])", texts) and not (
            folder.name.startswith("alfworld-") and alfworld_run.is_file()
        ):
            unnamed.append(folder.name)
    assert not unnamed, (
        f"committed agents that nothing names or reads (rebuild them by their command instead): {unnamed}"
    )


# ----- a play-only agent -------------------------------------------------------------------------------------------
SMALL: dict[str, Any] = {
    "num_groups": 2, "group_size": 2, "minibatch_size": 8, "torch_threads": 1, "verbose": 0,
    "tiny_hidden_size": 32, "history_length": 1, "learning_rate": 3e-3, "env_kwargs": {"max_episode_steps": 4},
}  # fmt: skip
ENV = "gagpo_gym/FrozenLake-v0"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    agent = GAGPOAgent(ENV, seed=1, **SMALL)
    agent.learn(8)
    path = tmp_path_factory.mktemp("play_only") / "full"
    agent.save(path)
    return path


def play_only_copy(trained: Path, folder: Path) -> Path:
    copy = shutil.copytree(trained, folder)
    assert checkpoint.drop_optimizer_state(copy) and not checkpoint.drop_optimizer_state(copy)
    assert not (copy / checkpoint.OPTIMIZER_FILE).exists()
    return copy


def test_a_play_only_agent_loads_plays_and_refuses_to_train(trained: Path, tmp_path: Path):
    copy = play_only_copy(trained, tmp_path / "copy")
    agent = GAGPOAgent.load(copy, verbose=0)
    full = GAGPOAgent.load(trained, verbose=0)
    assert agent.num_timesteps == full.num_timesteps > 0
    assert agent.evaluate(n_tasks=2) == full.evaluate(n_tasks=2)  # the same weights play the same panel
    assert checkpoint.play_only_reason(agent) is not None and checkpoint.play_only_reason(full) is None
    for reset in (False, True):
        with pytest.raises(RuntimeError) as error:
            agent.learn(8, reset_num_timesteps=reset)
        message = str(error.value)
        assert f"saved agent at {copy} carries no optimizer state" in message and "\n" not in message
        assert "optimizer.pt is not in its manifest.json" in message and "resume from a checkpoint" in message


def test_a_play_only_agent_saved_again_stays_play_only(trained: Path, tmp_path: Path):
    agent = GAGPOAgent.load(play_only_copy(trained, tmp_path / "copy"), verbose=0)
    agent.save(tmp_path / "again")
    assert not (tmp_path / "again" / checkpoint.OPTIMIZER_FILE).exists()
    with pytest.raises(RuntimeError, match="carries no optimizer state"):
        GAGPOAgent.load(tmp_path / "again", verbose=0).learn(8)


def test_an_unlisted_optimizer_file_is_never_read(trained: Path, tmp_path: Path):
    copy = play_only_copy(trained, tmp_path / "copy")
    (copy / checkpoint.OPTIMIZER_FILE).write_bytes(b"not a torch file")  # not in the manifest: not checked, not read
    assert checkpoint.play_only_reason(GAGPOAgent.load(copy, verbose=0)) is not None


def test_a_listed_optimizer_file_that_is_missing_is_named(trained: Path, tmp_path: Path):
    broken = shutil.copytree(trained, tmp_path / "broken")
    (broken / checkpoint.OPTIMIZER_FILE).unlink()
    with pytest.raises(FileNotFoundError, match="is missing optimizer.pt"):
        GAGPOAgent.load(broken, verbose=0)


def test_an_agent_saved_before_any_update_trains_without_optimizer_state(tmp_path: Path):
    """Before the first update the optimizer state is the fresh one: nothing is lost, so it trains on."""
    GAGPOAgent(ENV, seed=1, **SMALL).save(tmp_path / "untrained")
    checkpoint.drop_optimizer_state(tmp_path / "untrained")
    agent = GAGPOAgent.load(tmp_path / "untrained", verbose=0)
    assert checkpoint.play_only_reason(agent) is None
    assert agent.learn(8).num_timesteps >= 8
