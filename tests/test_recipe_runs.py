"""Every distinct ALFWorld recipe trains one iteration on CPU, scaled down by flags only: SmolLM2-135M-Instruct,
1 task x 2 episodes of 2 steps on the real games in ../shared/alfworld (the settings: tests/test_recipes.py).

Distinct: the GiGPO, GRPO and RLOO recipes are GAGPO's with another estimator and nothing else, and the rivals' (HGPO,
GraphGPO, G2PO) differ beyond that only in their own settings and in values the CPU flags replace (asserted below), so
GAGPO's run stands for their pipeline, and the estimators themselves are checked against references
(tests/test_advantages.py, tests/test_rivals.py); PPO (a critic) and LoRA (peft) take their own code paths and run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_helpers import fetch_smollm2
from test_recipes import ALFWORLD, CPU, DATA, GAMES, train

from agents.recipes import load_recipe

RUNS = ["alfworld-gagpo-qwen2.5-1.5b", "alfworld-ppo-qwen2.5-1.5b", "alfworld-gagpo-qwen2.5-7b-lora"]


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return fetch_smollm2()


def test_the_estimator_recipes_differ_from_gagpos_in_the_estimator_alone():
    """Once the CPU flags apply: a rival's recipe also sets its own ``<estimator>_*`` settings, and where its authors'
    script differs from verl-agent's (iterations, prompt length) the value the flags replace."""
    gagpo, _ = load_recipe("alfworld-gagpo-qwen2.5-1.5b")
    replaced = {flag[2:].replace("-", "_") for flag in CPU if flag.startswith("--")}
    for name in set(ALFWORLD) - set(RUNS):
        values, _ = load_recipe(name)
        estimator = values["estimator"]
        differ = {key for key in {*values, *gagpo} if values.get(key) != gagpo.get(key)}
        own = {key for key in values if key.startswith(f"{estimator}_")}
        assert estimator != "gagpo" and differ - replaced - own == {"estimator"}, (name, differ)
        if estimator in ("gigpo", "grpo", "rloo"):
            assert {**values, "estimator": "gagpo"} == gagpo, name


@pytest.mark.slow
@pytest.mark.skipif(not (DATA / "json_2.1.1" / "valid_unseen").is_dir(), reason="../shared/alfworld is absent")
@pytest.mark.parametrize("name", RUNS)
def test_every_alfworld_recipe_trains_one_iteration_on_cpu(name: str, smollm2: Path, tmp_path: Path):
    pytest.importorskip("alfworld")
    if "lora" in name:
        pytest.importorskip("peft")
    # The validation panel: 1 game (the recipe's 128 are too many here) of valid_unseen, sampled at 0.4, before
    # the first iteration and after the last, in one recipe; the others skip it.
    panel = (
        ["--eval-tasks", "1"] if name == "alfworld-gagpo-qwen2.5-1.5b" else ["--eval-tasks", "0", "--eval-freq", "0"]
    )
    done = train("--recipe", name, "--model", str(smollm2), "--env-kwargs", GAMES, *CPU, *panel,
                 "--save-dir", str(tmp_path), "--log-dir", str(tmp_path / "logs"))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    settings = json.loads((tmp_path / "run.json").read_text())
    assert settings["recipe"] == name and settings["run"]["iterations"] == 1  # the flag over the recipe's 150
    if panel[1] == "1":
        assert settings["run"]["eval_split"] == "valid_unseen" and settings["run"]["eval_temperature"] == 0.4
        assert "tasks 0..0 (sampled at temperature 0.4)" in done.stdout
        logged = (tmp_path / "logs" / "progress.csv").read_text().splitlines()[0].split(",")
        assert "eval/success_rate" in logged and any(k.startswith("eval/type/") for k in logged)
    assert settings["config"]["kl_coef"] == (0.0 if "lora" in name else 0.01) and settings["config"]["n_epochs"] == 1
    saved = json.loads((tmp_path / "final" / "agent.json").read_text())
    assert saved["iteration"] == 1 and saved["num_timesteps"] >= 2  # one iteration: 2 episodes of 1-2 steps
    assert saved["config"]["estimator"] == name.split("-")[1] and saved["config"]["history_length"] == 2
