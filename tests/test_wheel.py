"""A wheel that works outside a checkout: `pip install .` (not editable) ships the recipes as package data of
``agents`` (``agents/configs/recipes``, read through importlib.resources), so the library and the recipes work from
an installed package in any folder, and it ships no lab (the studies and benchmarks, with the benchmark setups, stay
in the checkout). An install without its recipes says so in one line instead of listing no recipes.

The wheel is built from a copy of the package sources (what an sdist holds) and installed with ``--no-deps`` into a
temporary venv that reads this venv's dependencies through a ``.pth`` line (``--system-site-packages`` would give the
base interpreter's packages, not this venv's); the editable install's finder is not activated there, so ``agents``
can only come from the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

from agents import recipes

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gagpo_gym", "agents", "wrappers")


def build_wheel(out: Path) -> Path:
    """The project's wheel, built without network from a copy of its package sources."""
    src = out / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    for name in PACKAGES:
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out / "dist"),
         str(src)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    (wheel,) = (out / "dist").glob("gagpo_gym-*.whl")
    return wheel


def venv_with_this_venvs_packages(folder: Path) -> Path:
    """A fresh venv (no pip) whose site-packages reads this venv's through a .pth line; its python."""
    venv.EnvBuilder(with_pip=False).create(folder)
    python = folder / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    (Path(site) / "base_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(the wheel, the temporary venv's python, a working folder outside the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(tmp)
    python = venv_with_this_venvs_packages(tmp / "venv")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-build-isolation", "-q",
         str(wheel)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    return wheel, python, elsewhere


def run_outside(python: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_wheel_carries_the_recipes_and_no_lab(installed):
    wheel, _, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in recipes.recipe_names():
        assert f"agents/configs/recipes/{name}.yaml" in names, name
    assert not [name for name in names if name.startswith("lab/")]


def test_the_installed_package_lists_and_loads_recipes_outside_the_checkout(installed):
    _, python, elsewhere = installed
    check = textwrap.dedent(
        """
        import json

        import gymnasium

        import agents
        import gagpo_gym
        from agents import GAGPOAgent, GAGPOConfig
        from agents.recipes import RECIPES, load_recipe, recipe_names

        _, info = gymnasium.make("gagpo_gym/Maze-v0").reset(seed=0)  # the envs register from the wheel
        assert info["admissible_actions"] and gagpo_gym.__file__
        values, sources = load_recipe("alfworld-gagpo-qwen2.5-1.5b")  # extends verl-agent-alfworld
        GAGPOConfig(**{k: v for k, v in values.items() if k in GAGPOConfig.__dataclass_fields__})
        print(json.dumps({
            "package": agents.__file__, "envs": gagpo_gym.__file__,
            "recipes_dir": str(RECIPES), "recipes": recipe_names(), "estimator": values["estimator"],
            "n_sources": len(sources), "agent": GAGPOAgent.__name__,
        }))
        """
    )
    run = run_outside(python, elsewhere, "-c", check)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    site = str(python.parents[1])
    for key in ("package", "envs", "recipes_dir"):  # the wheel's files, not the checkout's
        assert got[key].startswith(site) and not got[key].startswith(str(ROOT)), (key, got[key])
    assert got["recipes"] == recipes.recipe_names()
    assert got["estimator"] == "gagpo" and got["n_sources"] > 10


def test_train_list_recipes_runs_against_the_installed_package(installed):
    """scripts/train.py run by path puts scripts/ (not the repository) on sys.path: ``agents`` is the wheel's."""
    _, python, elsewhere = installed
    run = run_outside(python, elsewhere, str(ROOT / "scripts" / "train.py"), "--list-recipes")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == recipes.recipe_names()


def test_an_install_without_its_recipes_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(recipes, "RECIPES", tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        recipes.recipe_names()
    assert exit_info.value.code != 0
    err = capsys.readouterr().err
    assert err.startswith("error: no recipes in") and "package data" in err and len(err.splitlines()) == 1
