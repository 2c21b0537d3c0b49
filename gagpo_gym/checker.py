"""Check that an env honours the text-env contract (on top of Gymnasium's own ``check_env``)."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

from gagpo_gym.core import INFO_KEYS


def check_text_env(env, *, seed: int = 0, n_steps: int = 20, skip_render_check: bool = True) -> None:
    """Raise ``AssertionError`` where ``env`` breaks the contract; runs Gymnasium's ``check_env`` first."""
    check_env(env.unwrapped, skip_render_check=skip_render_check)
    for name in ("observation_space", "action_space"):
        space = getattr(env, name)
        assert isinstance(space, spaces.Text), f"{name} must be gymnasium.spaces.Text, got {space}"
        assert space.min_length == 0, f"{name} must have min_length=0"
        assert " " in space.character_set, f"{name}'s charset must contain the space character"
    _check_rejects_outside_actions(env, seed)
    obs, info = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(n_steps):
        assert env.observation_space.contains(obs), f"observation outside the observation space: {obs[:200]!r}"
        missing = [k for k in INFO_KEYS if k not in info]
        assert not missing, f"info lacks {missing}"
        assert isinstance(info["state_key"], int) and -(2**63) <= info["state_key"] < 2**63
        assert isinstance(info["task"], str) and env.observation_space.contains(info["task"]), (
            f"task text outside the observation space: {str(info['task'])[:200]!r}"
        )
        assert isinstance(info["admissible_actions"], list) and info["admissible_actions"], "no admissible actions"
        outside = [a for a in info["admissible_actions"] if not env.action_space.contains(a)]
        assert not outside, f"admissible actions outside the action space: {outside[:5]!r}"
        action = info["admissible_actions"][rng.integers(len(info["admissible_actions"]))]
        obs, _, terminated, truncated, info = env.step(action)
        assert info.get("action_valid") is True, f"admissible action {action!r} was rejected"
        if terminated or truncated:
            obs, info = env.reset()


def _check_rejects_outside_actions(env, seed: int) -> None:
    """An action the action space cannot hold is invalid and changes nothing, however close it is to a valid one."""
    _, info = env.reset(seed=seed)
    action = info["admissible_actions"][0]
    too_long = action + " " * (env.action_space.max_length + 1 - len(action))
    for bad in (too_long, action + "\x00"):
        assert not env.action_space.contains(bad), "the action space must not hold over-long or control-character text"
        _, _, terminated, _, after = env.step(bad)
        assert after.get("action_valid") is False, f"action outside the action space accepted: {bad[:60]!r}..."
        assert after["state_key"] == info["state_key"] and not terminated, (
            "an action outside the space changed the state"
        )
        _, info = env.reset(seed=seed)
