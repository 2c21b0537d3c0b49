"""The learning benchmark's setups as data (lab/bench/setups/*.yaml, lab.benchmark): every file loads, the loaded
settings are the ones the benchmark ran with when its setups were Python, and a bad file fails with one line that
names it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from agent_helpers import script

from agents.config import GAGPOConfig
from lab.benchmark import PRESETS, SETUPS, EnvSetup, load_setup, load_setups, setup_names

ROOT = Path(__file__).resolve().parents[1]
FULL_CONFIG = {"num_groups": 4, "group_size": 4, "task_pool": 0, "n_epochs": 1, "learning_rate": 1e-4}


def test_every_setup_file_loads_with_known_hyperparameters_and_budgets():
    setups = load_setups()
    assert set(setups) == {path.stem for path in SETUPS.glob("*.yaml")} and len(setups) == 12
    fields = {f.name for f in dataclasses.fields(GAGPOConfig)}
    for name, setup in setups.items():
        assert setup.env_id.startswith("gagpo_gym/"), name
        assert set(setup.config) <= fields and set(setup.budget) <= set(PRESETS), name
        assert 0 < setup.bar <= 1 and 0 < setup.train_bar <= 1, name
        GAGPOConfig(**setup.config)  # each value of its field's type and range
        if setup.prior_path:  # a committed prior, in the repository
            assert (ROOT / setup.prior_path / "prior.json").is_file(), name


def test_the_loaded_setups_equal_the_former_python_registry():
    """Values of the registry the benchmark ran with before its setups became files (written out here once)."""
    assert load_setup("maze") == EnvSetup(
        "gagpo_gym/Maze-v0",
        {"width": 4, "height": 4, "rooms": 1, "room_size": 2, "loops": 2, "min_path": 3, "max_path": 6,
         "max_episode_steps": 20},
        {"num_groups": 4, "group_size": 8, "history_length": 0, "task_pool": 8},
        bar=0.5,
        note="4x4 maze, one room, 2 loops, shortest path 3-6 steps, 20-step limit; random policy: 32% success",
    )  # fmt: skip
    assert load_setup("minihouse-many") == EnvSetup(
        "gagpo_gym/MiniHouse-v0",
        {"size": "small", "max_episode_steps": 30},
        {"num_groups": 8, "group_size": 8, "history_length": 2, "task_pool": 64},
        bar=0.4,
        train_bar=0.85,
        note="small houses, all six task types, one house and task per seed, 30-step limit; 64 training tasks",
        prior={"episodes": 600, "epsilon": 0.2, "epochs": 10},
        budget={"paper": {"total_steps": 6000, "eval_every": 2000}},
    )
    full = load_setup("minihouse-full")
    assert (full.env_kwargs, full.config, full.bar, full.train_bar) == ({"size": "full"}, FULL_CONFIG, 0.75, 0.8)
    assert full.budget == {"paper": {"total_steps": 22000, "eval_every": 2000, "seeds": [0, 1, 2]}}
    assert full.prior_path == "results/agents/minihouse-full-search" and not full.prior
    assert isinstance(full.config["learning_rate"], float)  # YAML's 1.0e-4, not the string "1e-4"
    # A derived setup is its base with the note and the prior replaced, the rest inherited (extends, twice here).
    derived = load_setup("minihouse-full-sweep-w128")
    assert derived == dataclasses.replace(
        full, note=derived.note, prior_path="results/agents/minihouse-full-sweep-w128"
    )
    assert derived.note.endswith("the prior imitates the sweeping expert, 128 wide")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("extends: maze\nbarr: 0.5\n", "unknown key(s) barr"),
        ("env_kwargs: {size: full}\n", "missing env_id"),
        ("env_id: gagpo_gym/Maze-v0\nconfig: {num_group: 4}\n", "unknown hyperparameter(s) num_group"),
        ("env_id: gagpo_gym/Maze-v0\nbudget: {fast: {total_steps: 10}}\n", "got 'fast'"),
        (
            "env_id: gagpo_gym/Maze-v0\nbudget: {quick: {total_step: 10}}\n",
            "budget quick has unknown key(s) total_step",
        ),
        ("env_id: gagpo_gym/Maze-v0\nbar: high\n", "bar must be int or float, got 'high'"),
        ("extends: bad\n", "extends itself"),
        ("- 1\n", "must be a mapping"),
        ("env_id: [1\n", "not valid YAML"),
        ("extends: nowhere\n", "no benchmark setup 'nowhere'"),
    ],
)
def test_a_bad_setup_file_is_one_error_naming_it(tmp_path: Path, text: str, message: str):
    (tmp_path / "bad.yaml").write_text(text)
    (tmp_path / "maze.yaml").write_text((SETUPS / "maze.yaml").read_text())
    with pytest.raises(ValueError) as error:
        load_setup("bad", tmp_path)
    assert message in str(error.value) and "bad.yaml" in str(error.value), error.value
    assert len(str(error.value).splitlines()) == 1


def test_the_benchmark_names_its_setups_and_exits_on_a_bad_file(monkeypatch, capsys):
    bench = script("lab.bench.learning")
    parser, _ = bench.build_parser()
    assert "".join(str(setup_names()).split()) in "".join(parser.format_help().split())  # argparse wraps at '-'
    with pytest.raises(SystemExit):  # the setup is found and its env made; the run list is empty
        bench.main(["--envs", "maze-many", "--estimators"])
    assert capsys.readouterr().err.startswith("error: nothing to run")
    monkeypatch.setattr(bench, "load_setups", lambda: load_setup("no-such-setup"))
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--envs", "maze"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("error: no benchmark setup 'no-such-setup'"), err


def test_a_missing_setups_folder_is_one_error():
    with pytest.raises(ValueError, match="no benchmark setups"):
        setup_names(ROOT / "no-such-folder")
