"""Evaluation panels: play a fixed list of tasks once each with any policy (an agent, the expert, random).

Kept apart from the training loop: scripts, benchmarks and the agent's ``evaluate()`` share it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import load_env_creator

import gagpo_gym
from wrappers import GroupedVectorEnv, wrap_text_env


def make_env(
    env_id: str,
    env_kwargs: dict[str, Any],
    wrap: dict[str, Any] | None,
    env_wrappers: Sequence[tuple[str, dict[str, Any]]] = (),
) -> gym.Env:
    """Picklable env factory (async workers rebuild envs from it).

    ``env_wrappers`` are ``(entry point, kwargs)`` of wrappers the user put on a made env (Gymnasium records
    them in ``env.spec.additional_wrappers``); they go on before the agent's own text wrappers.
    """
    env = gagpo_gym.make(env_id, **env_kwargs)
    for entry_point, kwargs in env_wrappers:
        env = load_env_creator(entry_point)(env, **kwargs)
    return wrap_text_env(env, **wrap) if wrap is not None else env


def info_at(infos: dict[str, Any], i: int) -> dict[str, Any]:
    """The i-th sub-env's info out of Gymnasium's vectorised info dict (``_key`` masks say who has a key)."""
    out = {}
    for key, value in infos.items():
        if key.startswith("_"):
            continue
        if isinstance(value, dict):
            out[key] = info_at(value, i)
        elif infos[f"_{key}"][i]:
            out[key] = value[i]
    return out


def run_panel(
    act, make_env, n_tasks: int, *, batch_size: int = 16, seed_offset: int = 0, episodes: bool = True
) -> dict[str, Any]:
    """Play tasks ``seed_offset + 0 .. n_tasks - 1`` once each; ``act(obs, infos, venv, indices) -> actions``.

    Used for agents, the expert and random reference policies alike; tasks run ``batch_size`` at a time.
    ``episodes=False`` leaves the per-episode rows out of the summary.
    """
    results: list[dict[str, Any]] = []
    for start in range(0, n_tasks, batch_size):
        seeds = np.arange(start, min(start + batch_size, n_tasks)) + seed_offset
        venv = GroupedVectorEnv(make_env, len(seeds), 1)
        try:
            obs, infos = venv.reset(options={"task_seeds": seeds})
            current = [info_at(infos, i) for i in range(venv.num_envs)]
            ret = np.zeros(venv.num_envs)
            length = np.zeros(venv.num_envs, dtype=int)
            invalid = np.zeros(venv.num_envs, dtype=int)
            while venv.active.any():
                idx = np.flatnonzero(venv.active)
                chosen = act([obs[i] for i in idx], [current[i] for i in idx], venv, idx)
                actions: list[Any] = [None] * venv.num_envs
                for k, i in enumerate(idx):
                    actions[i] = chosen[k]
                obs, rewards, _, _, infos = venv.step(actions)
                for i in idx:
                    current[i] = info_at(infos, i)
                    ret[i] += rewards[i]
                    length[i] += 1
                    invalid[i] += not current[i].get("action_valid", True)
            for i in range(venv.num_envs):
                info = current[i]
                results.append({
                    "seed": int(seeds[i]), "won": bool(info.get("won", False)), "return": float(ret[i]),
                    "length": int(length[i]), "invalid": int(invalid[i]), "task_type": info.get("task_type"),
                    "score": float(info.get("score", float(info.get("won", False)))),
                })  # fmt: skip
        finally:
            venv.close()
    summary = summarize(results)
    if not episodes:
        del summary["episodes"]
    return summary


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Panel metrics: overall and per task type."""
    out: dict[str, Any] = {
        "n_tasks": len(results),
        "success_rate": float(np.mean([r["won"] for r in results])) if results else 0.0,
        "score": float(np.mean([r["score"] for r in results])) if results else 0.0,
        "mean_return": float(np.mean([r["return"] for r in results])) if results else 0.0,
        "mean_length": float(np.mean([r["length"] for r in results])) if results else 0.0,
        "invalid_rate": float(sum(r["invalid"] for r in results) / max(sum(r["length"] for r in results), 1)),
        "episodes": results,
    }
    types = sorted({r["task_type"] for r in results if r["task_type"] is not None})
    out["per_type"] = {t: float(np.mean([r["won"] for r in results if r["task_type"] == t])) for t in types}
    return out


def reference_policy_panel(
    kind: str, env_id: str, env_kwargs: dict[str, Any], n_tasks: int, *, seed: int = 0, seed_offset: int = 0
) -> dict[str, Any]:
    """Panel metrics of a reference policy: ``"expert"`` (the env's oracle) or ``"random"`` (uniform admissible)."""
    rng = np.random.default_rng(seed)

    def act(obs, infos, venv, idx):
        if kind == "expert":
            return list(venv.call("expert_action", indices=idx))
        return [i["admissible_actions"][rng.integers(len(i["admissible_actions"]))] for i in infos]

    if kind not in ("expert", "random"):
        raise ValueError(f"reference policy must be 'expert' or 'random', got {kind!r}")
    wrap = {"key": "state", "penalty": 0.0, "history_length": 0, "tagged": False}
    return run_panel(act, functools.partial(make_env, env_id, env_kwargs, wrap), n_tasks, seed_offset=seed_offset)
