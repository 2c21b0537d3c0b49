"""Recipes: named sets of settings in ``agents/configs/recipes/<name>.yaml`` (GAGPOConfig fields and run settings
of ``scripts/train.py``), each able to ``extends`` another, checked before any work starts."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from agents.cli import fail

#: The shipped recipes: package data of ``agents`` (pyproject's package-data), found through the package itself so
#: that a wheel installed anywhere reads the same files as an editable checkout.
RECIPES = Path(str(resources.files("agents") / "configs" / "recipes"))
#: Recipe keys that are run settings of scripts/train.py rather than GAGPOConfig fields.
RECIPE_RUN_KEYS = (
    "env", "env_kwargs", "model", "iterations", "total_timesteps", "eval_tasks", "eval_freq", "eval_split",
    "eval_temperature",
)  # fmt: skip


def recipe_names() -> list[str]:
    """The shipped recipes' names; none found is an install without its package data, said in one line (an empty
    list would read as "no recipes exist")."""
    names = sorted(path.stem for path in RECIPES.glob("*.yaml"))
    if not names:
        fail(f"no recipes in {RECIPES}: this install of gagpo-gym lacks its package data (agents/configs/recipes)")
    return names


def load_recipe(name: str) -> tuple[dict[str, Any], dict[str, str]]:
    """A recipe's values and the source of each (``agents/configs/recipes/<name>.yaml``, or a path to a YAML file), its
    ``extends`` chain resolved: a file's own values and sources replace those of the recipe it extends."""
    import dataclasses

    import yaml

    from agents.config import GAGPOConfig

    known = {f.name for f in dataclasses.fields(GAGPOConfig)} | set(RECIPE_RUN_KEYS)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    chain: list[Path] = []
    while name:
        # A file's path: from the working directory on the command line, beside the extending file in ``extends``
        # (a user's recipe and its base sit together wherever train.py runs from).
        where = chain[-1].parent if chain else Path()
        path = (where / name if name.endswith((".yaml", ".yml")) else RECIPES / f"{name}.yaml").resolve()
        if not path.is_file():
            fail(f"no recipe {name!r} (a file {path}); recipes: {', '.join(recipe_names())}")
        if path in chain:
            fail(f"recipe {path} extends itself (through {' -> '.join(p.stem for p in chain)})")
        chain.append(path)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            fail(f"recipe {path} is not valid YAML: {str(err).splitlines()[0]}")
        if not isinstance(data, dict):
            fail(f"recipe {path} must be a mapping of settings, got {type(data).__name__}")
        own_sources = data.pop("sources", {}) or {}
        parent = data.pop("extends", "")
        unknown = sorted(set(data) - known)
        if unknown:
            fail(f"recipe {path}: unknown key(s) {', '.join(unknown)} (GAGPOConfig fields or {RECIPE_RUN_KEYS})")
        values = {**data, **values}  # what a file sets wins over what it extends
        sources = {**{k: str(v) for k, v in own_sources.items()}, **sources}
        name = str(parent)
    try:  # each value of its field's type and range, named by the recipe (not by a flag the user never gave)
        GAGPOConfig(**{k: v for k, v in values.items() if k not in RECIPE_RUN_KEYS})
    except (TypeError, ValueError) as err:
        fail(f"recipe {chain[0]}: {str(err).splitlines()[0]}")
    return values, sources
