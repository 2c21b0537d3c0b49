"""The text-env contract: a ``gymnasium.Env`` whose observations and actions are strings.

A text env knows nothing about LLMs: prompts, parsing and penalties are wrappers. What it owes its users is a
small, checkable contract (docs/environments.md#the-contract):

* ``observation_space`` and ``action_space`` are :class:`~gagpo_gym.text_space.TextSpace` (a ``gymnasium.spaces.Text``
  that holds any Unicode text without control characters) with ``min_length=0``;
* ``reset(seed=s)`` gives the same task and initial state for the same ``s``;
* ``info`` always carries ``state_key`` (int64, stable hash of the canonical true state),
  ``admissible_actions``, ``task``, ``task_id``, ``won``, after a step ``action_valid``, and ``task_type``
  where the env has types; optionally ``score``, a finite float (e.g. a partial-credit score in [0, 1], as
  MiniShop and WebShop give at the end of an episode), which evaluation reports instead of ``won`` where present;
* experts are declared on the class: ``EXPERTS`` names the kinds ``expert_action(kind)`` plays, the first being
  the default (``kind=None``); an unknown kind raises one ``ValueError`` that names them;
* an unknown or malformed action (one outside the action space included) never raises: the state is unchanged,
  ``action_valid=False``, reward 0 (the penalty is a wrapper's job).

Subclasses implement a handful of small methods; :class:`TextEnv` turns them into Gymnasium's API.
"""

from __future__ import annotations

import hashlib
import inspect
import string
import warnings
from collections.abc import Sequence
from typing import Any

import gymnasium as gym

from gagpo_gym.text_space import FORBIDDEN, TextSpace

#: The alphabet the text spaces sample from: printable ASCII including space, tab and newline (Gymnasium's
#: default Text charset has no spaces). The spaces themselves hold any Unicode text without control characters.
CHARSET: str = string.printable
OBS_MAX_LENGTH = 32_768
ACTION_MAX_LENGTH = 2_048
INFO_KEYS = ("state_key", "admissible_actions", "task", "task_id", "won")


def state_key(text: str) -> int:
    """Stable signed int64 hash of a canonical state string (blake2b; never Python's salted ``hash``)."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def normalize_command(action: Any) -> str | None:
    """Lower-case, single-spaced command text; ``None`` when the action is not a string at all.

    The built-in envs whose grammars are lower-case (ALFWorld, MiniHouse, MiniShop) match with it. A text env of
    your own needs none of it: :meth:`TextEnv.canonical_action` matches through :func:`match_command`.
    """
    if not isinstance(action, str):
        return None
    return " ".join(action.strip().lower().split())


def match_command(action: Any, admissible: Sequence[str], *, case_sensitive: bool = False) -> str | None:
    """The admissible command that ``action`` denotes, in the admissible spelling; ``None`` when it denotes none.

    An exact match wins. Otherwise ``action`` matches a command that is equal to it once leading, trailing and
    repeated whitespace is collapsed (``"  go   north "`` -> ``"go north"``) and, unless ``case_sensitive``, once
    case is ignored too (``str.casefold``: ``"Go North"`` -> ``"go north"``, ``"[a c]"`` -> ``"[A C]"``). A
    normalised form that two admissible commands share (``"[A C]"`` and ``"[a c]"``) matches neither of them:
    only their exact spellings do.
    """
    if not isinstance(action, str):
        return None
    if action in admissible:
        return action

    def tidy(text: str) -> str:
        text = " ".join(text.split())
        return text if case_sensitive else text.casefold()

    wanted = tidy(action)
    found = {command for command in admissible if isinstance(command, str) and tidy(command) == wanted}
    return found.pop() if len(found) == 1 else None


def text_space(max_length: int) -> TextSpace:
    return TextSpace(max_length=max_length, min_length=0, charset=CHARSET)


def to_charset(text: str) -> str:
    """Drop control characters (Unicode stays) and cap the length, so that the text lies in the observation space."""
    return FORBIDDEN.sub("", text)[:OBS_MAX_LENGTH]


class TextEnv(gym.Env[str, str]):
    """Base class for text envs. Subclasses implement:

    * ``_new_task(seed, options) -> str``: draw a task (from ``seed`` where the env maps seeds to tasks, else from
      ``self.np_random``) and return the first observation; ``seed`` is the one given to ``reset`` (``None`` when
      none was);
    * ``_execute(command) -> (observation, reward, terminated)`` for a command that :meth:`is_valid` accepted;
    * ``admissible_actions() -> list[str]`` and ``state_string() -> str`` (canonical true state);
    * ``expert_action(kind=None) -> str``: an expert used by tests, warm starts and as the eval upper bound, with
      ``EXPERTS`` listing its kinds (``kind=None``: the first); :meth:`_expert_kind` resolves and checks ``kind``;
    * attributes ``task``, ``task_id``, ``won`` (and ``task_type`` where the env has types).

    A command is matched to the admissible list by :func:`match_command`: the exact spelling, else the same
    command up to whitespace and, unless ``case_sensitive`` is set, up to case; ``_execute`` always receives the
    admissible spelling. Override :meth:`canonical_action` when valid commands are not a finite list (e.g.
    ``search[...]``).
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi", "human"]}
    #: Feedback for an invalid action, ALFWorld's wording; the state does not change.
    invalid_feedback: str = "Nothing happens."
    #: Whether commands that differ from an admissible one only in case are invalid (``"go north"`` when ``"Go
    #: North"`` is admissible). Off by default, as in ALFWorld and TextWorld; set it on the class (or on an
    #: instance) of an env where case carries meaning. Whitespace is normalised either way.
    case_sensitive: bool = False
    #: The kinds of :meth:`expert_action`, the default first; empty for an env without an expert.
    EXPERTS: tuple[str, ...] = ()

    task: str = ""
    task_id: str = ""
    task_type: str | None = None
    won: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        hook = cls.__dict__.get("_new_task")
        if callable(hook) and len(inspect.signature(hook).parameters) == 2:  # the old hook, _new_task(self, options)
            warnings.warn(
                f"{cls.__name__}._new_task(self, options) is deprecated: define _new_task(self, seed, options)",
                DeprecationWarning,
                stacklevel=2,
            )

            def _new_task(self: TextEnv, seed: int | None, options: dict[str, Any], _old: Any = hook) -> str:
                return _old(self, options)

            cls._new_task = _new_task

    def __init__(self, render_mode: str | None = None) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.render_mode = render_mode
        self.observation_space = text_space(OBS_MAX_LENGTH)
        self.action_space = text_space(ACTION_MAX_LENGTH)
        self._last_observation = ""

    # ----- subclass API -------------------------------------------------------------------------------
    def _new_task(self, seed: int | None, options: dict[str, Any]) -> str:
        raise NotImplementedError

    def _execute(self, command: str) -> tuple[str, float, bool]:
        raise NotImplementedError

    def admissible_actions(self) -> list[str]:
        raise NotImplementedError

    def state_string(self) -> str:
        raise NotImplementedError

    def expert_action(self, kind: str | None = None) -> str:
        raise NotImplementedError

    def _expert_kind(self, kind: str | None) -> str:
        """``kind`` checked against :attr:`EXPERTS`; ``None`` is the first (the default expert)."""
        if not self.EXPERTS:
            raise ValueError(
                f"{type(self).__name__} has no expert (its class declares no EXPERTS, the expert kinds its "
                "expert_action plays): expert members, warm starts and eval.py --expert need an env with one"
            )
        if kind is None:
            return self.EXPERTS[0]
        if kind not in self.EXPERTS:
            raise ValueError(f"{type(self).__name__}: expert kind must be one of {self.EXPERTS}, got {kind!r}")
        return kind

    def canonical_action(self, action: Any) -> str | None:
        """The admissible command that ``action`` denotes (its admissible spelling), or ``None`` when it is invalid
        here; see :func:`match_command` and :attr:`case_sensitive`."""
        return match_command(action, self.admissible_actions(), case_sensitive=self.case_sensitive)

    # ----- Gymnasium API ------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        self.won = False
        self._last_observation = to_charset(self._new_task(seed, dict(options or {})))
        return self._last_observation, self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        command = self.canonical_action(action) if self.action_space.contains(action) else None
        if command is None:
            return to_charset(self.invalid_feedback), 0.0, False, False, self._info(action_valid=False)
        observation, reward, terminated = self._execute(command)
        self._last_observation = to_charset(observation)
        return self._last_observation, float(reward), bool(terminated), False, self._info(action_valid=True)

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return self._last_observation
        if self.render_mode == "human":
            print(self._last_observation)
        return None

    def _info(self, **extra: Any) -> dict[str, Any]:
        info: dict[str, Any] = {
            "state_key": state_key(self.state_string()),
            "admissible_actions": list(self.admissible_actions()),
            "task": self.task,
            "task_id": self.task_id,
            "won": bool(self.won),
        }
        if self.task_type is not None:
            info["task_type"] = self.task_type
        info.update(extra)
        return info
