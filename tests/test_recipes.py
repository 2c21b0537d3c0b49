"""The paper's runs as recipes (agents/configs/recipes): every recipe resolves to a valid config with a source for each
value, flags override it, a dry run shows a real ALFWorld game's first prompt, and every ALFWorld recipe trains one
iteration on CPU scaled down by flags only (tests/test_recipe_runs.py: a file of its own, so that xdist runs it
beside this one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from agent_helpers import fetch_smollm2

from agents import recipes
from agents.config import ESTIMATORS, GAGPOConfig

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "alfworld"
RECIPES = recipes.recipe_names()
# The 7B recipes differ from the 1.5B ones in the model alone (GraphGPO's also in its minibatch size), which every CPU
# run replaces: one per estimator, + LoRA.
ALFWORLD = [name for name in RECIPES if name.startswith("alfworld-") and not name.endswith("-7b")]
# The estimators with a recipe on each env (test_recipes_cover_both_envs_every_estimator_and_both_sizes says why).
# Self-imitation is the RL-free control, with no published GPU run to cite: any recipe trains it with
# --estimator self_imitation.
ON_ENV = {"alfworld": tuple(e for e in ESTIMATORS if e != "self_imitation"),
          "minishop": ("gagpo", "gigpo", "grpo", "rloo", "ppo")}  # fmt: skip
# Iterations: verl-agent's 150, or the count a rival's own ALFWorld script trains for.
ITERATIONS = {"hgpo": 160, "g2po": 100}
ENVS = ("gagpo_gym/ALFWorld-v0", "gagpo_gym/MiniShop-v0")
# The scale-down every CPU run of a recipe uses: flags only, the recipe's other values stay.
CPU = ["--backend", "hf", "--dtype", "float32", "--num-groups", "1", "--group-size", "2", "--max-new-tokens", "8",
       "--max-prompt-tokens", "160",
       "--minibatch-size", "4", "--torch-threads", "1", "--iterations", "1", "--quiet"]  # fmt: skip
GAMES = json.dumps({"split": "valid_unseen", "data_root": str(DATA), "max_episode_steps": 2})


def train(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    command = [sys.executable, str(ROOT / "scripts" / "train.py"), *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return fetch_smollm2()


def test_recipes_cover_both_envs_every_estimator_and_both_sizes():
    """Every estimator on ALFWorld, the paper's five on MiniShop too, each at 1.5B and 7B. The 2026 rivals
    (docs/rivals.md) are on ALFWorld alone: their recipes are their authors' ALFWorld runs, and their WebShop scripts
    are not translated to MiniShop (an offline stand-in whose recipes would need values nobody published)."""
    for env, estimators in ON_ENV.items():
        for estimator in estimators:
            for size in ("1.5b", "7b"):
                assert f"{env}-{estimator}-qwen2.5-{size}" in RECIPES
    assert "alfworld-gagpo-qwen2.5-7b-lora" in RECIPES


@pytest.mark.parametrize("name", RECIPES)
def test_every_recipe_resolves_to_a_valid_config_with_a_source_for_each_value(name: str):
    values, sources = recipes.load_recipe(name)
    config = {k: v for k, v in values.items() if k not in recipes.RECIPE_RUN_KEYS}
    GAGPOConfig(**config).resolved(tiny=False)  # every value has its field's type and range
    assert not set(values) - set(sources), f"{name}: values without a source: {set(values) - set(sources)}"
    assert values["num_groups"] == 16 and values["group_size"] == 8
    assert values["iterations"] == ITERATIONS.get(values["estimator"], 150)
    assert values["model"].startswith("Qwen/Qwen2.5-") and values["env"] in (
        "gagpo_gym/ALFWorld-v0",
        "gagpo_gym/MiniShop-v0",
    )
    if name.split("-")[1] in ESTIMATORS:  # the file name says the estimator
        assert values["estimator"] == name.split("-")[1]


def test_a_recipe_takes_its_base_values_and_its_own_win():
    shop, _ = recipes.load_recipe("minishop-grpo-qwen2.5-7b")
    base, _ = recipes.load_recipe("verl-agent-alfworld")
    assert shop["estimator"] == "grpo" and base["estimator"] == "gigpo"
    assert shop["max_prompt_tokens"] == 4096 and base["max_prompt_tokens"] == 2048  # the WebShop base's own value
    assert shop["gigpo_std_norm"] is False and shop["learning_rate"] == base["learning_rate"] == 1e-6
    lora, sources = recipes.load_recipe("alfworld-gagpo-qwen2.5-7b-lora")
    assert (lora["lora_r"], lora["learning_rate"], lora["kl_coef"]) == (64, 3e-6, 0.0)
    assert "run_alfworld_lora.sh" in sources["lora_r"]


def test_bad_recipes_exit_with_one_readable_line(tmp_path: Path, capsys: pytest.CaptureFixture):
    cases = {
        "unknown.yaml": ("learning_rat: 1.0e-6\n", "unknown key(s) learning_rat"),
        "loop.yaml": (f"extends: {tmp_path / 'loop.yaml'}\n", "extends itself"),
        "list.yaml": ("- 1\n- 2\n", "must be a mapping"),
        "typed.yaml": ("extends: verl-agent-alfworld\nnum_groups: many\n", "num_groups"),
        "broken.yaml": ("num_groups: [1\n", "not valid YAML"),
    }
    for file, (text, message) in cases.items():
        (tmp_path / file).write_text(text)
        with pytest.raises(SystemExit) as exit_info:
            recipes.load_recipe(str(tmp_path / file))
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.startswith("error: ") and message in err, (file, err)
        assert len(err.strip().splitlines()) == 1, err
    done = train("--recipe", "no-such-recipe", "--dry-run")  # through the script: one line, the recipes named
    assert done.returncode == 2 and done.stderr.startswith("error: ") and "alfworld-gagpo-qwen2.5-1.5b" in done.stderr


@pytest.mark.skipif(not (DATA / "json_2.1.1" / "valid_unseen").is_dir(), reason="../shared/alfworld is absent")
def test_dry_run_prints_the_resolved_recipe_and_a_real_games_first_prompt(smollm2: Path):
    pytest.importorskip("alfworld")
    games = json.dumps({"split": "valid_unseen", "data_root": str(DATA)})
    done = train("--recipe", "alfworld-gagpo-qwen2.5-1.5b", "--model", str(smollm2), "--backend", "hf",
                 "--env-kwargs", games, "--dry-run")  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert "run_alfworld.sh: algorithm.gamma=0.95" in rows["gamma"] and "0.95" in rows["gamma"]
    assert '(flag; the recipe: "vllm")' in rows["backend"] and '"hf"' in rows["backend"]  # the flag won
    config = json.loads(out.split("\nconfig: ", 1)[1].splitlines()[0])
    assert config["learning_rate"] == 1e-6 and config["kl_coef"] == 0.01 and config["backend"] == "hf"
    prompt = out.split("tokens of at most 2048):", 1)[1]
    assert "<|im_start|>user" in prompt and "Your task is to: " in prompt and "go to " in prompt  # a real game
    assert "<think> </think>" in prompt and prompt.rstrip().endswith("<|im_start|>assistant")
