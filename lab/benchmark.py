"""The learning benchmark's setups and budgets (``lab/bench/learning.py``), and the small measuring pieces that
the benchmark and table scripts share.

A setup is data: ``lab/bench/setups/<name>.yaml`` holds an env as benchmarked (its constructor arguments, the
hyperparameters that suit it, the success bar, a warm-start prior), so that adding one is a file, not code. A file may
``extends`` another setup: its own keys replace the ones of the setup it extends, key by key (not merged inside).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

#: The setups, beside the benchmark that runs them.
SETUPS = Path(__file__).resolve().parent / "bench" / "setups"

#: Budgets (a setup may scale them). ``quick`` is sized for about 15 minutes per env (5 estimators x 3 seeds) on a
#: shared 2-core CPU.
PRESETS: dict[str, dict[str, Any]] = {
    "quick": {"total_steps": 6000, "eval_every": 1500, "eval_tasks": 8, "seeds": [0, 1, 2]},
    "full": {"total_steps": 40000, "eval_every": 4000, "eval_tasks": 64, "seeds": [0, 1, 2, 3, 4]},
    # From the env setup's warm-start prior, evaluated on held-out tasks (seeds from HELDOUT_OFFSET on).
    "paper": {"total_steps": 12000, "eval_every": 3000, "eval_tasks": 100, "seeds": [0, 1, 2, 3, 4], "heldout": True},
}


@dataclass(frozen=True)
class EnvSetup:
    """An env as benchmarked: constructor arguments, hyperparameters that suit it, and the success bar."""

    env_id: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    bar: float = 0.8
    train_bar: float = 0.8  # the bar on the training tasks, where a held-out panel is the main one
    note: str = ""
    budget: dict[str, dict[str, Any]] = field(default_factory=dict)  # preset name -> overrides for this env
    prior: dict[str, Any] = field(default_factory=dict)  # warm-start recipe (agents.warm_start); empty: from scratch
    prior_path: str = ""  # a committed warm-start folder (relative to the repo) used as it is, instead of a recipe

    @property
    def has_prior(self) -> bool:
        return bool(self.prior or self.prior_path)


#: The type each key of a setup file takes (``extends`` names the setup it builds on).
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "env_id": (str,),
    "env_kwargs": (dict,),
    "config": (dict,),
    "bar": (int, float),
    "train_bar": (int, float),
    "note": (str,),
    "budget": (dict,),
    "prior": (dict,),
    "prior_path": (str,),
}


def setup_names(folder: Path = SETUPS) -> list[str]:
    """The setups' names; a missing folder is a ValueError (it would otherwise read as a benchmark with no setups)."""
    if not folder.is_dir():
        raise ValueError(f"no benchmark setups: {folder} is not a folder")
    return sorted(path.stem for path in folder.glob("*.yaml"))


def load_setup(name: str, folder: Path = SETUPS) -> EnvSetup:
    """The setup ``<folder>/<name>.yaml``, its ``extends`` chain resolved and every key checked.

    Raises ValueError with one line naming the file: an unknown key, a value of the wrong type, a hyperparameter
    that GAGPOConfig does not have, a budget for an unknown preset, no ``env_id``, a loop of ``extends``.
    """
    values: dict[str, Any] = {}
    chain: list[Path] = []
    while name:
        path = folder / f"{name}.yaml"
        if not path.is_file():
            by = f"setup {chain[-1]} extends {name!r}: " if chain else ""
            known = ", ".join(setup_names(folder))
            raise ValueError(f"{by}no benchmark setup {name!r} (a file {path}); setups: {known}")
        if path in chain:
            raise ValueError(f"setup {path} extends itself (through {' -> '.join(p.stem for p in chain)})")
        chain.append(path)
        own = _read_setup_file(path)
        name = str(own.pop("extends", "") or "")
        values = {**own, **values}  # what a file sets wins over what it extends
    if "env_id" not in values:
        raise ValueError(f"setup {chain[0]}: missing env_id (the registered env id, e.g. gagpo_gym/Maze-v0)")
    return EnvSetup(**values)


def load_setups(folder: Path = SETUPS) -> dict[str, EnvSetup]:
    """Every setup of ``folder``, by name (the file's stem)."""
    return {name: load_setup(name, folder) for name in setup_names(folder)}


def _read_setup_file(path: Path) -> dict[str, Any]:
    """One setup file's own keys, each checked (see :func:`load_setup`)."""
    import yaml

    from agents.config import GAGPOConfig

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ValueError(f"setup {path} is not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ValueError(f"setup {path} must be a mapping of settings, got {type(data).__name__}")
    unknown = sorted(set(data) - set(_FIELD_TYPES) - {"extends"})
    if unknown:
        known = ", ".join(["extends", *_FIELD_TYPES])
        raise ValueError(f"setup {path}: unknown key(s) {', '.join(unknown)} (known: {known})")
    for key, value in data.items():
        types = (str,) if key == "extends" else _FIELD_TYPES[key]
        if not isinstance(value, types) or isinstance(value, bool):
            raise ValueError(f"setup {path}: {key} must be {' or '.join(t.__name__ for t in types)}, got {value!r}")
    fields = {f.name for f in dataclasses.fields(GAGPOConfig)}
    unknown = sorted(set(data.get("config", {})) - fields)
    if unknown:
        raise ValueError(f"setup {path}: config has unknown hyperparameter(s) {', '.join(unknown)} (GAGPOConfig)")
    for preset, overrides in data.get("budget", {}).items():
        if preset not in PRESETS or not isinstance(overrides, dict):
            raise ValueError(f"setup {path}: budget takes a mapping per preset ({', '.join(PRESETS)}), got {preset!r}")
        unknown = sorted(set(overrides) - set(PRESETS["paper"]))
        if unknown:
            raise ValueError(f"setup {path}: budget {preset} has unknown key(s) {', '.join(unknown)}")
    return {k: float(v) if k in ("bar", "train_bar") else v for k, v in data.items()}


def rollout_curve(iterations: list[dict[str, float]]) -> tuple[np.ndarray, np.ndarray]:
    """Env steps and sampled success of the training rollouts, one entry per iteration that logged it."""
    logged = [it for it in iterations if "rollout/success_rate" in it]
    return np.array([int(it["steps"]) for it in logged]), np.array([it["rollout/success_rate"] for it in logged])


def rollout_steps_to_bar(iterations: list[dict[str, float]], bar: float, window: int = 3) -> int | None:
    """Env steps at which the moving average of training-rollout success (sampled) first reaches ``bar``."""
    steps, success = rollout_curve(iterations)
    for k in range(window - 1, len(success)):
        if np.mean(success[k - window + 1 : k + 1]) >= bar - 1e-12:
            return int(steps[k])
    return None


def run_episode(env: gym.Env, seed: int, policy: Callable[[dict[str, Any]], str]) -> tuple[bool, int, list[int]]:
    """One episode from ``reset(seed=seed)``; returns (won, steps, the time of each ``env.step`` in ns)."""
    _, info = env.reset(seed=seed)
    times: list[int] = []
    while True:
        action = policy(info)
        start = time.perf_counter_ns()
        _, _, terminated, truncated, info = env.step(action)
        times.append(time.perf_counter_ns() - start)
        if terminated or truncated:
            return bool(info["won"]), len(times), times


def uniform_policy(rng: np.random.Generator) -> Callable[[dict[str, Any]], str]:
    """Uniform over the admissible actions."""
    return lambda info: info["admissible_actions"][rng.integers(len(info["admissible_actions"]))]
