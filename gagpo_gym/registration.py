"""The registry: built-in envs and the one-call way to add your own (a thin layer over ``gymnasium.register``)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import gymnasium as gym

NAMESPACE = "gagpo_gym"


def register_text_env(
    id: str,
    entry_point: str | Callable[..., gym.Env],
    max_episode_steps: int | None = None,
    **kwargs: Any,
) -> str:
    """Register a text env with Gymnasium and return its full id.

    ``id`` without a namespace is placed under ``gagpo_gym/`` (``"MyEnv-v0"`` -> ``"gagpo_gym/MyEnv-v0"``).
    ``entry_point`` is a class/factory or a ``"module:Class"`` string (imported lazily on ``make``).
    ``kwargs`` become the env's default constructor arguments. Re-registering an id replaces it.
    """
    if not isinstance(id, str) or not id:
        raise ValueError(f"env id must be a non-empty string, got {id!r}")
    if not (callable(entry_point) or (isinstance(entry_point, str) and ":" in entry_point)):
        raise ValueError(f"entry_point must be a callable or a 'module:Class' string, got {entry_point!r}")
    if max_episode_steps is not None and (not isinstance(max_episode_steps, int) or max_episode_steps < 1):
        raise ValueError(f"max_episode_steps must be a positive int, got {max_episode_steps!r}")
    full_id = id if "/" in id else f"{NAMESPACE}/{id}"
    gym.registry.pop(full_id, None)
    gym.register(
        id=full_id,
        entry_point=entry_point,
        max_episode_steps=max_episode_steps,
        kwargs=kwargs,
        disable_env_checker=True,
    )
    return full_id


def registered_text_envs() -> list[str]:
    """Ids of every env registered under the ``gagpo_gym/`` namespace that can be made here: the TextArena games only
    where textarena is installed (without it they are registered only to say, when made, how to install it)."""
    absent = set() if _textarena_installed() else {f"{NAMESPACE}/{row[0]}" for row in TEXTARENA_ENVS}
    return sorted(k for k in gym.registry if k.startswith(f"{NAMESPACE}/") and k not in absent)


def _textarena_installed() -> bool:
    """Whether the optional ``textarena`` can be imported (only its presence is checked: nothing is imported)."""
    return importlib.util.find_spec("textarena") is not None


def make(id: str, **kwargs: Any) -> gym.Env:
    """``gymnasium.make`` with one readable error for an unknown id."""
    full_id = id if "/" in id else f"{NAMESPACE}/{id}"
    if full_id not in gym.registry:
        known = ", ".join(registered_text_envs())
        raise ValueError(f"unknown env id {id!r}; registered text envs: {known}")
    return gym.make(full_id, **kwargs)


#: A registry row: id, entry point, max_episode_steps, default kwargs. Entry points are strings: nothing heavy is
#: imported until an env is made, and this module imports no env.
EnvRow = tuple[str, str, int | None, dict[str, Any]]
BUILTIN_ENVS: list[EnvRow] = [
    ("Maze-v0", "gagpo_gym.envs.maze:MazeEnv", 50, {}),
    ("Sokoban-v0", "gagpo_gym.envs.sokoban:SokobanEnv", 30, {}),
    ("FrozenLake-v0", "gagpo_gym.envs.toy_text:TextFrozenLake", 50, {}),
    ("Taxi-v0", "gagpo_gym.envs.toy_text:TextTaxi", 100, {}),
    ("CliffWalking-v0", "gagpo_gym.envs.toy_text:TextCliffWalking", 100, {}),
    ("TicTacToe-v0", "gagpo_gym.envs.classic_games:TicTacToeEnv", 20, {}),
    ("ConnectFour-v0", "gagpo_gym.envs.classic_games:ConnectFourEnv", 50, {}),
    ("ALFWorld-v0", "gagpo_gym.envs.alfworld:ALFWorldEnv", 50, {}),
    ("MiniHouse-v0", "gagpo_gym.envs.minihouse:MiniHouseEnv", 50, {}),
    ("MiniShop-v0", "gagpo_gym.envs.minishop:MiniShopEnv", 15, {}),
    ("OpenEnv-v0", "gagpo_gym.envs.openenv:OpenEnvTextEnv", None, {}),  # needs url=; the server's time limit
]


#: The TextArena games (:mod:`gagpo_gym.envs.textarena` adapts each; its ``GAMES`` table says how), by name, with
#: each id's ``max_episode_steps``: ``gagpo_gym/TextArena-<Game>-v0``.
TEXTARENA_GAMES: dict[str, int] = {
    "TowerOfHanoi": 30,
    "FrozenLake": 30,
    "GuessTheNumber": 10,
    "Mastermind": 20,
    "Minesweeper": 25,
    "LightsOut": 20,
    "2048": 200,
    "Blackjack": 15,
    "FifteenPuzzle": 50,
    "Sokoban": 30,
    "Countdown": 10,
    "Cryptarithm": 40,
    "Secretary": 10,
    "ThreeCardMonte": 5,
    "RushHour": 50,
    "PegJump": 20,
    "Slitherlink": 60,
    "TicTacToe": 10,
    "ConnectFour": 30,
    "Nim": 15,
    "KuhnPoker": 15,
}
TEXTARENA_ENVS: list[EnvRow] = [
    (f"TextArena-{game}-v0", "gagpo_gym.envs.textarena:TextArenaEnv", max_steps, {"game": game})
    for game, max_steps in TEXTARENA_GAMES.items()
]


def register_builtin_envs() -> None:
    """Register every built-in env and the TextArena games. textarena itself is imported when such an env is made;
    without it, making one raises an ImportError that names the extra to install (not Gymnasium's NameNotFound)."""
    for env_id, entry_point, max_steps, kwargs in BUILTIN_ENVS + TEXTARENA_ENVS:
        register_text_env(env_id, entry_point, max_episode_steps=max_steps, **kwargs)
