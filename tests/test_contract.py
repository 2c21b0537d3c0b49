"""The text-env contract at its edges: how commands are matched, and what the checker and the key wrapper say
about an env that breaks the contract (a missing ``state_key``, NaN rewards, empty or malformed admissible lists)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import gagpo_gym
from gagpo_gym import TextEnv, match_command
from gagpo_gym.core import text_space
from wrappers import StateKey, wrap_text_env


class Keys(TextEnv):
    """Press keys spelled in upper case inside brackets; ``_execute`` records the spelling it receives."""

    ACTIONS = ("[A C]", "[B D]", "[Q]")

    def _new_task(self, seed: int | None, options: dict[str, Any]) -> str:
        self.task, self.task_id, self.pressed = "Press [A C] to win, [Q] to quit.", "keys", []
        return "Keys: [A C], [B D], [Q]."

    def _execute(self, command: str) -> tuple[str, float, bool]:
        self.pressed.append(command)
        self.won = command == "[A C]"
        return f"You pressed {command}.", float(self.won), command in ("[A C]", "[Q]")

    def admissible_actions(self) -> list[str]:
        return list(self.ACTIONS)

    def state_string(self) -> str:
        return "|".join(self.pressed)

    def expert_action(self) -> str:
        return "[A C]"


class CaseSensitiveKeys(Keys):
    case_sensitive = True


class TwinKeys(Keys):
    """Two admissible commands that differ only in case."""

    ACTIONS = ("[A C]", "[a c]", "[Q]")


@pytest.fixture
def register():
    """``register(name, cls)`` -> a made env registered through ``register_text_env``; unregistered afterwards."""
    ids: list[str] = []

    def make(name: str, env_class: type, **kwargs: Any) -> gym.Env:
        ids.append(gagpo_gym.register_text_env(name, env_class, max_episode_steps=5))
        return gym.make(ids[-1], **kwargs)

    yield make
    for env_id in ids:
        gym.registry.pop(env_id, None)


# ----- command matching ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("action", "case_sensitive", "expected"),
    [
        ("[A C]", False, "[A C]"),
        ("[A C]", True, "[A C]"),
        ("  [A   C] ", False, "[A C]"),
        ("  [A   C] ", True, "[A C]"),
        ("[a c]", False, "[A C]"),
        ("[a c]", True, None),
        ("[A]", False, None),
        ("", False, None),
        (None, False, None),
        (3, False, None),
    ],
)
def test_match_command_exact_then_whitespace_then_case(action: Any, case_sensitive: bool, expected: Any) -> None:
    assert match_command(action, ["[A C]", "[B D]"], case_sensitive=case_sensitive) == expected


def test_match_command_a_shared_normal_form_matches_only_the_exact_spellings() -> None:
    admissible = ["[A C]", "[a c]", "go  north"]
    assert match_command("[A C]", admissible) == "[A C]" and match_command("[a c]", admissible) == "[a c]"
    assert match_command("[A c]", admissible) is None  # which one would it be?
    assert match_command("Go North", admissible) == "go  north"  # the admissible spelling, spaces and all


def test_upper_case_bracketed_commands_are_accepted_in_their_own_spelling(register) -> None:
    env = register("Keys-v0", Keys)
    gagpo_gym.check_text_env(env, n_steps=10)
    _, info = env.reset(seed=0)
    assert info["admissible_actions"] == ["[A C]", "[B D]", "[Q]"]
    _, reward, terminated, _, info = env.step("[B D]")
    assert info["action_valid"] is True and not terminated and env.unwrapped.pressed == ["[B D]"]
    _, reward, terminated, _, info = env.step("[A C]")
    assert info["action_valid"] is True and terminated and reward == 1.0 and info["won"]
    # a case or spacing variant is the same command, and the env executes the admissible spelling
    env.reset(seed=0)
    assert env.step(" [a   c]")[4]["action_valid"] is True
    assert env.unwrapped.pressed == ["[A C]"]


def test_case_sensitive_env_rejects_case_variants(register) -> None:
    env = register("CaseKeys-v0", CaseSensitiveKeys)
    gagpo_gym.check_text_env(env, n_steps=10)
    _, info = env.reset(seed=0)
    _, reward, terminated, _, after = env.step("[a c]")
    assert after["action_valid"] is False and (reward, terminated) == (0.0, False)
    assert after["state_key"] == info["state_key"] and env.unwrapped.pressed == []
    assert env.step("[A  C] ")[4]["action_valid"] is True and env.unwrapped.pressed == ["[A C]"]


def test_commands_that_differ_only_in_case_stay_apart(register) -> None:
    env = register("TwinKeys-v0", TwinKeys)
    gagpo_gym.check_text_env(env, n_steps=10)
    for command in ("[a c]", "[A C]"):
        env.reset(seed=0)
        assert env.step(command)[4]["action_valid"] is True and env.unwrapped.pressed == [command]
    env.reset(seed=0)
    assert env.step("[A c]")[4]["action_valid"] is False and env.unwrapped.pressed == []


# ----- a missing state_key --------------------------------------------------------------------------------------
class Keyless(gym.Env):
    """A plain Gymnasium text env whose info has everything but ``state_key``."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self) -> None:
        self.observation_space, self.action_space = text_space(100), text_space(100)

    def _info(self, won: bool = False, **extra: Any) -> dict[str, Any]:
        return {"admissible_actions": ["go", "wait"], "task": "Go.", "task_id": "go", "won": won, **extra}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return "Here.", self._info()

    def step(self, action: str):
        won = action == "go"
        return (
            ("There." if won else "Here."),
            float(won),
            won,
            False,
            self._info(won, action_valid=action in ("go", "wait")),
        )


def test_checker_names_the_env_and_a_missing_state_key(register) -> None:
    env = register("Keyless-v0", Keyless)
    with pytest.raises(AssertionError, match=r"gagpo_gym/Keyless-v0: reset\(seed=0\): info lacks 'state_key' \("):
        gagpo_gym.check_text_env(env)


def test_state_key_wrapper_names_the_env_and_the_way_out(register) -> None:
    env = register("Keyless-v0", Keyless)
    message = r"env gagpo_gym/Keyless-v0 gives no info\['state_key'\].*state_key='observation'"
    with pytest.raises(ValueError, match=message):
        wrap_text_env(env).reset(seed=0)
    with pytest.raises(ValueError, match=r"Keyless-v0 .*the back-off key 'state'"):
        StateKey(register("Keyless-v0", Keyless), "observation", backoff=("state",)).reset(seed=0)
    # keyed on the observation, the env needs no state key of its own
    env = wrap_text_env(register("Keyless-v0", Keyless), key="observation", tagged=False)
    _, info = env.reset(seed=0)
    assert info["state_key"] == gagpo_gym.state_key("Here.") and "true_state_key" not in info
    _, _, terminated, _, info = env.step("go")
    assert terminated and info["state_key"] == gagpo_gym.state_key("There.")


def test_learn_on_an_env_without_state_key_says_what_to_do(register) -> None:
    from agents import GAGPOAgent
    from wrappers.grouped_vector_env import SubEnvError

    env_id = gagpo_gym.register_text_env("KeylessLearn-v0", Keyless, max_episode_steps=3)
    small = {"num_groups": 1, "group_size": 2, "tiny_hidden_size": 32, "torch_threads": 1, "verbose": 0}
    try:
        # The wrapper's ValueError, raised in a sub-env's reset: named with the sub-env's task seed, chained to it.
        with pytest.raises(SubEnvError, match=r"KeylessLearn-v0 gives no info\['state_key'\].*'observation'"):
            GAGPOAgent(env_id, action_mode="choose", **small).learn(total_timesteps=2)
        GAGPOAgent(env_id, action_mode="choose", state_key="observation", **small).learn(total_timesteps=2)
    finally:
        gym.registry.pop(env_id, None)


# ----- the checker on faulty envs ---------------------------------------------------------------------------------
class Walk(TextEnv):
    """Walk right three times; subclasses break one point of the contract."""

    EXPERTS = ("oracle",)

    def _new_task(self, seed: int | None, options: dict[str, Any]) -> str:
        self.task, self.task_id, self.pos = "Walk right 3 times.", "walk", 0
        return "At 0."

    def _execute(self, command: str) -> tuple[str, float, bool]:
        self.pos += 1 if command == "right" else 0
        self.won = self.pos == 3
        return f"At {self.pos}.", float(self.won), self.won

    def admissible_actions(self) -> list[str]:
        return ["right", "wait"]

    def state_string(self) -> str:
        return str(self.pos)

    def expert_action(self, kind: str | None = None) -> str:
        self._expert_kind(kind)
        return "right"


class NanReward(Walk):
    def _execute(self, command: str) -> tuple[str, float, bool]:
        obs, _, terminated = super()._execute(command)
        return obs, float("nan"), terminated


class InfReward(Walk):
    def _execute(self, command: str) -> tuple[str, float, bool]:
        obs, _, terminated = super()._execute(command)
        return obs, -float("inf"), terminated


class DeadEnd(Walk):
    """No admissible action once it has moved, yet the episode goes on."""

    def admissible_actions(self) -> list[str]:
        return [] if self.pos else ["right"]


class DoneAtOnce(Walk):
    """Ends on the first step and offers nothing after it: fine, the episode is over."""

    def _execute(self, command: str) -> tuple[str, float, bool]:
        self.pos, self.won = 3, True
        return "Done.", 1.0, True

    def admissible_actions(self) -> list[str]:
        return [] if self.pos else ["right"]


class NumberedActions(Walk):
    def admissible_actions(self) -> list[str]:
        return ["right", 2]  # type: ignore[list-item]


class TupleActions(Walk):
    def admissible_actions(self) -> list[str]:
        return ("right", "wait")  # type: ignore[return-value]

    def _info(self, **extra: Any) -> dict[str, Any]:
        info = super()._info(**extra)
        info["admissible_actions"] = tuple(info["admissible_actions"])
        return info


class TakesEmptyCommand(Walk):
    def canonical_action(self, action: Any) -> str | None:
        return "wait" if action == "" else super().canonical_action(action)


class RaisesOnUnknown(Walk):
    """Raises on any non-admissible action (Gymnasium's checker finds it: it steps random text)."""

    def canonical_action(self, action: Any) -> str | None:
        if isinstance(action, str) and action not in self.admissible_actions():
            raise KeyError("unknown command")
        return super().canonical_action(action)


class RaisesOnUnknownWords(Walk):
    """Raises on an unknown command of plain words, one that random text from the action space is not."""

    def canonical_action(self, action: Any) -> str | None:
        if isinstance(action, str) and re.fullmatch(r"[a-z0-9 ]+", action) and action not in self.admissible_actions():
            raise KeyError(action)
        return super().canonical_action(action)


class FreshStart(Walk):
    """A different task every reset, whatever the seed."""

    resets = 0

    def _new_task(self, seed: int | None, options: dict[str, Any]) -> str:
        obs = super()._new_task(seed, options)
        FreshStart.resets += 1
        self.task_id = f"walk-{FreshStart.resets}"
        return obs


class NoActionValid(Walk):
    def step(self, action: str):
        obs, reward, terminated, truncated, info = super().step(action)
        info.pop("action_valid")
        return obs, reward, terminated, truncated, info


class NoneType(Walk):
    def _info(self, **extra: Any) -> dict[str, Any]:
        return {**super()._info(**extra), "task_type": None}


class NumpyFlags(Walk):
    """numpy bools and ints are fine where the contract asks for bools and an int64."""

    def _info(self, **extra: Any) -> dict[str, Any]:
        info = super()._info(**extra)
        info.update(state_key=np.int64(info["state_key"]), won=np.bool_(info["won"]))
        if "action_valid" in info:
            info["action_valid"] = np.bool_(info["action_valid"])
        return info


class StringKey(Walk):
    def _info(self, **extra: Any) -> dict[str, Any]:
        return {**super()._info(**extra), "state_key": "0"}


class PartialScore(Walk):
    """A partial-credit ``info["score"]`` (how far it got, in [0, 1]) is part of the contract."""

    def _info(self, **extra: Any) -> dict[str, Any]:
        return {**super()._info(**extra), "score": self.pos / 3}


class InfScore(Walk):
    def _info(self, **extra: Any) -> dict[str, Any]:
        return {**super()._info(**extra), **({"score": float("inf")} if "action_valid" in extra else {})}


class StringScore(Walk):
    def _info(self, **extra: Any) -> dict[str, Any]:
        return {**super()._info(**extra), "score": "1.0"}


@pytest.mark.parametrize(
    ("env_class", "match"),
    [
        (NanReward, r"step 1 \('(right|wait)'\): the reward must be finite, got nan"),
        (InfReward, r"step 1 \('(right|wait)'\): the reward must be finite, got -inf"),
        (DeadEnd, r"step 1 \('right'\): info\['admissible_actions'\] is empty but the episode has not ended"),
        (NumberedActions, r"reset\(seed=0\): info\['admissible_actions'\] holds entries that are not str: \[2\]"),
        (TupleActions, r"reset\(seed=0\): info\['admissible_actions'\] must be a list of str, got tuple"),
        (TakesEmptyCommand, r"step\(''\): the empty command was accepted"),
        (RaisesOnUnknown, r"Gymnasium's check_env: KeyError: 'unknown command'"),
        (RaisesOnUnknownWords, r"step\('xyzzy plugh 42'\): step raised KeyError: 'xyzzy plugh 42'"),
        (FreshStart, r"Gymnasium's check_env: AssertionError: Deterministic step info are not equivalent"),
        (NoActionValid, r"step\('right' \+ 2044 spaces\): info lacks 'action_valid' \(action_valid: a bool"),
        (NoneType, r"reset\(seed=0\): info\['task_type'\] must be a str where the env has types, got None"),
        (StringKey, r"reset\(seed=0\): info\['state_key'\] must be an int64, got str '0'"),
        (InfScore, r"step\(.*\): info\['score'\] must be a finite float .*, got inf"),
        (StringScore, r"reset\(seed=0\): info\['score'\] must be a finite float .*, got '1.0'"),
    ],
)
def test_checker_rejects_each_break_with_one_readable_error(register, env_class: type, match: str) -> None:
    env = register(f"{env_class.__name__}-v0", env_class)
    with pytest.raises(AssertionError, match=rf"^gagpo_gym/{env_class.__name__}-v0: {match}"):
        gagpo_gym.check_text_env(env, n_steps=10)


def test_checker_passes_the_faultless_walk_and_an_empty_list_once_the_episode_ended(register) -> None:
    gagpo_gym.check_text_env(register("Walk-v0", Walk), n_steps=10)
    gagpo_gym.check_text_env(register("DoneAtOnce-v0", DoneAtOnce), n_steps=10)
    gagpo_gym.check_text_env(register("NumpyFlags-v0", NumpyFlags), n_steps=10)
    gagpo_gym.check_text_env(register("PartialScore-v0", PartialScore), n_steps=10)
    gagpo_gym.check_text_env(Walk(), n_steps=3)  # unregistered: named by its class
    with pytest.raises(AssertionError, match=r"^NanReward: step 1"):
        gagpo_gym.check_text_env(NanReward(), n_steps=3)


def test_checker_checks_under_python_O() -> None:
    """The checker raises by itself, not with ``assert`` statements that ``python -O`` strips."""
    code = (
        "import gagpo_gym\n"
        "from tests.test_contract import NanReward\n"
        "try:\n"
        "    gagpo_gym.check_text_env(NanReward(), n_steps=3)\n"
        "except AssertionError as error:\n"
        "    print('caught:', error)\n"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-O", "-c", code], capture_output=True, text=True, check=True, cwd=root
    ).stdout
    assert "caught: NanReward: step 1" in out and "must be finite" in out


def test_the_new_task_hook_gets_the_reset_seed_and_the_old_hook_still_works() -> None:
    class Seeded(Walk):
        def _new_task(self, seed: int | None, options: dict[str, Any]) -> str:
            self.seen = (seed, options)
            return super()._new_task(seed, options)

    env = Seeded()
    env.reset(seed=5, options={"a": 1})
    assert env.seen == (5, {"a": 1})
    env.reset()
    assert env.seen == (None, {})
    with pytest.warns(DeprecationWarning, match=r"_new_task\(self, seed, options\)"):

        class OldHook(Walk):
            def _new_task(self, options: dict[str, Any]) -> str:
                self.seen = options
                return super()._new_task(None, options)

    old = OldHook()
    assert old.reset(seed=1, options={"b": 2})[0] == "At 0." and old.seen == {"b": 2}


def test_experts_are_declared_on_the_class_and_an_unknown_kind_names_them() -> None:
    env = Walk()
    env.reset(seed=0)
    assert env.expert_action() == env.expert_action("oracle") == env.expert_action(kind=None) == "right"
    with pytest.raises(ValueError, match=r"Walk: expert kind must be one of \('oracle',\), got 'search'"):
        env.expert_action("search")
