"""Check that an env honours the text-env contract (on top of Gymnasium's own ``check_env``)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, NoReturn

import numpy as np
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

from gagpo_gym.core import INFO_KEYS

#: A command no env of ours admits: stepping it must not raise, and if rejected it must change nothing.
_UNKNOWN_COMMAND = "xyzzy plugh 42"

_KEY_HINTS = {
    "state_key": "an int64 hash of the current true state, e.g. gagpo_gym.state_key(canonical_state_text) (a TextEnv "
    "derives it from state_string()); an env that knows no state can give the hash of its observation",
    "admissible_actions": "the list of valid command strings for the current state",
    "task": "the instruction text",
    "task_id": "a stable id of the task (str)",
    "won": "a bool",
}


def check_text_env(env, *, seed: int = 0, n_steps: int = 20, skip_render_check: bool = True) -> None:
    """Raise ``AssertionError`` where ``env`` breaks the text-env contract; runs Gymnasium's ``check_env`` first.

    Gymnasium's ``check_env`` checks the API and that the same seed gives the same observations and infos. Then
    (docs/environments.md#the-contract): the spaces are ``gymnasium.spaces.Text`` with ``min_length=0`` and the
    space character; every ``info`` carries ``state_key`` (an int64), ``admissible_actions`` (a list of strings the
    action space holds, not empty unless the episode has ended), ``task`` (text in the observation space),
    ``task_id`` (str), ``won`` (bool), ``task_type`` (str) and ``score`` (a finite float: a partial-credit score,
    e.g. in [0, 1]) if present and, after a step, ``action_valid`` (bool); no admissible action is listed twice;
    every reward is a finite number; admissible actions are accepted; an action outside the action space and the
    empty command are rejected without a change of state, and an unknown command does not raise.

    Each failure is one ``AssertionError`` that names the env, the call (``reset(seed=0)``, ``step 3 ('go')``)
    and what is wrong. It is raised explicitly, so the checker checks under ``python -O`` too.
    """
    _Checker(env, seed).run(n_steps, skip_render_check)


class _Checker:
    def __init__(self, env, seed: int) -> None:
        self.env, self.seed = env, seed
        spec = getattr(env, "spec", None)
        self.name = spec.id if spec is not None and getattr(spec, "id", None) else type(env.unwrapped).__name__

    def fail(self, where: str, problem: str) -> NoReturn:
        raise AssertionError(f"{self.name}: {where}: {problem}")

    def require(self, condition: Any, where: str, problem: str) -> None:
        if not condition:
            self.fail(where, problem)

    # ----- the checks ---------------------------------------------------------------------------------
    def run(self, n_steps: int, skip_render_check: bool) -> None:
        env = self.env
        try:
            check_env(env.unwrapped, skip_render_check=skip_render_check)
        except Exception as error:  # noqa: BLE001 - named, and chained for the traceback
            raise AssertionError(f"{self.name}: Gymnasium's check_env: {type(error).__name__}: {error}") from error
        for name in ("observation_space", "action_space"):
            space = getattr(env, name)
            self.require(isinstance(space, spaces.Text), name, f"must be gymnasium.spaces.Text, got {space}")
            self.require(space.min_length == 0, name, f"must have min_length=0, got {space.min_length}")
            self.require(" " in space.character_set, name, "its charset must contain the space character")
        self.check_rejected_actions()
        rng = np.random.default_rng(self.seed)
        _, info = self.reset(seed=self.seed)
        for t in range(1, n_steps + 1):
            admissible = info["admissible_actions"]
            action = admissible[int(rng.integers(len(admissible)))]
            where = f"step {t} ({action!r})"
            _, _, terminated, truncated, info = self.step(action, where)
            self.require(
                info["action_valid"],
                where,
                f"the admissible action {action!r} was rejected (action_valid=False)",
            )
            if terminated or truncated:
                _, info = self.reset()

    def reset(self, **kwargs: Any) -> tuple[str, dict]:
        where = f"reset({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
        result = self.env.reset(**kwargs)
        self.require(isinstance(result, tuple) and len(result) == 2, where, f"must return (obs, info), got {result!r}")
        obs, info = result
        self.check_observation(obs, where)
        self.check_info(info, where, ended=False, after_step=False)
        return obs, info

    def step(self, action: str, where: str) -> tuple:
        try:
            result = self.env.step(action)
        except Exception as error:  # noqa: BLE001 - named in the failure
            self.fail(where, f"step raised {type(error).__name__}: {error} (a text env must never raise on an action)")
        self.require(
            isinstance(result, tuple) and len(result) == 5,
            where,
            f"must return (obs, reward, terminated, truncated, info), got {result!r}",
        )
        obs, reward, terminated, truncated, info = result
        self.check_observation(obs, where)
        self.require(
            isinstance(reward, (int, float, np.integer, np.floating)) and not isinstance(reward, (bool, np.bool_)),
            where,
            f"the reward must be a number, got {type(reward).__name__} {reward!r}",
        )
        self.require(math.isfinite(float(reward)), where, f"the reward must be finite, got {reward!r}")
        for flag, value in (("terminated", terminated), ("truncated", truncated)):
            self.require(isinstance(value, (bool, np.bool_)), where, f"{flag} must be a bool, got {value!r}")
        self.check_info(info, where, ended=bool(terminated or truncated), after_step=True)
        return result

    def check_observation(self, obs: Any, where: str) -> None:
        self.require(
            self.env.observation_space.contains(obs),
            where,
            f"observation outside the observation space: {str(obs)[:200]!r}",
        )

    def check_info(self, info: Any, where: str, *, ended: bool, after_step: bool) -> None:
        self.require(isinstance(info, dict), where, f"info must be a dict, got {type(info).__name__}")
        keys = INFO_KEYS + (("action_valid",) if after_step else ())
        missing = [k for k in keys if k not in info]
        if missing:
            hints = "; ".join(f"{k}: {_KEY_HINTS.get(k, 'a bool: was the action accepted')}" for k in missing)
            self.fail(where, f"info lacks {', '.join(map(repr, missing))} ({hints})")
        key = info["state_key"]
        self.require(
            isinstance(key, (int, np.integer))
            and not isinstance(key, (bool, np.bool_))
            and -(2**63) <= int(key) < 2**63,
            where,
            f"info['state_key'] must be an int64, got {type(key).__name__} {key!r}",
        )
        admissible = info["admissible_actions"]
        self.require(
            isinstance(admissible, list),
            where,
            f"info['admissible_actions'] must be a list of str, got {type(admissible).__name__} {admissible!r:.200}",
        )
        not_str = [a for a in admissible if not isinstance(a, str)]
        self.require(not not_str, where, f"info['admissible_actions'] holds entries that are not str: {not_str[:5]!r}")
        outside = [a for a in admissible if not self.env.action_space.contains(a)]
        self.require(not outside, where, f"admissible actions outside the action space: {outside[:5]!r}")
        twice = sorted(a for a, n in Counter(admissible).items() if n > 1)
        self.require(
            not twice,
            where,
            f"info['admissible_actions'] lists {twice[:5]!r} more than once: list each command once (a policy that "
            "picks among the list as given would favour the repeated ones)",
        )
        self.require(
            admissible or ended,
            where,
            "info['admissible_actions'] is empty but the episode has not ended: a state that is not terminal must "
            "offer at least one valid command",
        )
        self.require(
            isinstance(info["task"], str) and self.env.observation_space.contains(info["task"]),
            where,
            f"info['task'] must be text in the observation space, got {str(info['task'])[:200]!r}",
        )
        self.require(
            isinstance(info["task_id"], str), where, f"info['task_id'] must be a str, got {info['task_id']!r:.200}"
        )
        self.require(
            isinstance(info["won"], (bool, np.bool_)), where, f"info['won'] must be a bool, got {info['won']!r:.200}"
        )
        if "task_type" in info:
            self.require(
                isinstance(info["task_type"], str),
                where,
                f"info['task_type'] must be a str where the env has types, got {info['task_type']!r:.200}",
            )
        if "score" in info:
            score = info["score"]
            self.require(
                isinstance(score, (int, float, np.integer, np.floating))
                and not isinstance(score, (bool, np.bool_))
                and math.isfinite(float(score)),
                where,
                f"info['score'] must be a finite float (e.g. a partial-credit score in [0, 1]), got {score!r:.200}",
            )
        if after_step:
            valid = info["action_valid"]
            self.require(
                isinstance(valid, (bool, np.bool_)), where, f"info['action_valid'] must be a bool, got {valid!r:.200}"
            )

    def check_rejected_actions(self) -> None:
        """Actions that must be invalid change nothing, however close they are to a valid one; an unknown command
        does not raise and, if rejected, changes nothing either."""
        _, info = self.reset(seed=self.seed)
        action = info["admissible_actions"][0]
        space = self.env.action_space
        too_long = action + " " * (space.max_length + 1 - len(action))
        for bad in (too_long, action + "\x00"):
            self.require(not space.contains(bad), "action_space", "must not hold over-long or control-character text")
        outside = "action outside the action space accepted (action_valid is not False)"
        probes = [
            (too_long, f"{action!r} + {len(too_long) - len(action)} spaces", outside),
            (action + "\x00", repr(action + "\x00"), outside),
            ("", "''", "the empty command was accepted (wrappers.ParseAction sends it for unparsable output)"),
        ]
        if _UNKNOWN_COMMAND not in info["admissible_actions"]:
            probes.append((_UNKNOWN_COMMAND, repr(_UNKNOWN_COMMAND), None))
        for bad, shown, accepted in probes:
            where = f"step({shown})"
            _, _, terminated, _, after = self.step(bad, where)
            if accepted is not None:
                self.require(not after["action_valid"], where, accepted)
            if not after["action_valid"]:
                self.require(
                    after["state_key"] == info["state_key"] and not terminated,
                    where,
                    "a rejected action changed the state or ended the episode",
                )
            _, info = self.reset(seed=self.seed)
