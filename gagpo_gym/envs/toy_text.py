"""Gymnasium's toy-text envs as text envs, through one adapter.

:class:`TextifyDiscrete` wraps any Gymnasium env whose observations and actions are ``Discrete`` and which
exposes its transition table ``P`` (``P[s][a] = [(prob, next_state, reward, terminated), ...]``). It is given
names for the actions, a describer (state -> text) and a success test; the true discrete state is the key, and
the default expert plans on ``P`` itself (value iteration on the probability of success, discounted so that,
on a deterministic table, it follows a shortest path).

Rewards are mapped to the contract's: 1.0 on success, 0.0 otherwise (Gymnasium's step costs and penalties are
dropped). The three configurations below are thin: a describer, action names and options.

* :class:`TextFrozenLake` (``FrozenLake-v1``): success = reaching the goal; a hole ends the episode with
  reward 0. ``is_slippery`` defaults to False (the expert is then exact); ``map_name`` picks a fixed map,
  ``map_size`` draws a new random map for each task.
* :class:`TextTaxi` (``Taxi-v4``, the version in Gymnasium 1.x): success = dropping the passenger at the
  destination (Gymnasium's +20); every other step gives 0. Admissible actions follow Gymnasium's own
  ``action_mask`` (no driving into walls, no pick-up/drop-off where it is illegal).
* :class:`TextCliffWalking` (``CliffWalking-v1``): success = reaching the goal. Stepping into the cliff sends
  the walker back to the start as in Gymnasium, with reward 0 instead of -100 and without ending the episode;
  the observation says so.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.toy_text.frozen_lake import generate_random_map

from gagpo_gym.core import TextEnv

Describer = Callable[[gym.Env, int], str]
#: ``feedback(env, previous_state, action, state, raw_reward)`` -> a sentence on what the last move did.
Feedback = Callable[[gym.Env, int, int, int, float], str]


def _layout(env: gym.Env) -> str:
    """The env's map as text (toy-text envs keep it in ``desc``), or '' when it has none."""
    desc = getattr(env, "desc", None)
    return "" if desc is None else "\n".join(b"".join(row).decode() for row in desc)


class TextifyDiscrete(TextEnv):
    """A Gymnasium ``Discrete``-state env with a transition table ``P`` as a text env.

    Args:
        env: the env, or a factory ``rng -> env`` called for every new task (e.g. to draw a random map).
        action_names: one command per discrete action, in action order.
        describe: ``describe(env, state) -> str``, the observation text of a state.
        name: short name used in task ids and keys.
        task: the instruction text.
        success: ``success(raw_reward, terminated) -> bool`` for one transition; default "terminated with a
            positive reward".
        admissible: ``admissible(env, state) -> list of action indices``; default every action.
        feedback: one sentence on the last move, prefixed to the observation.
        gamma: discount of the default planner (< 1 so that it prefers shorter paths).
    """

    #: The kinds of :meth:`expert_action`: one, value iteration on the transition table.
    EXPERTS = ("oracle",)

    def __init__(
        self,
        env: gym.Env | Callable[[np.random.Generator], gym.Env],
        action_names: Sequence[str],
        describe: Describer,
        *,
        name: str,
        task: str,
        success: Callable[[float, bool], bool] | None = None,
        admissible: Callable[[gym.Env, int], list[int]] | None = None,
        feedback: Feedback | None = None,
        gamma: float = 0.99,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(render_mode=render_mode)
        self._factory = None if isinstance(env, gym.Env) else env
        self.env: gym.Env | None = env.unwrapped if isinstance(env, gym.Env) else None
        if self.env is not None:
            self._check_inner(self.env, len(action_names))
        if not 0.0 < gamma < 1.0:
            raise ValueError(f"gamma must be in (0, 1), got {gamma!r}")
        self.action_names = [" ".join(n.lower().split()) for n in action_names]
        if len(set(self.action_names)) != len(self.action_names):
            raise ValueError(f"action names must be distinct, got {list(action_names)}")
        self._action_index = {n: i for i, n in enumerate(self.action_names)}
        self.describe = describe
        self.name, self.task_text = name, task
        self.success = success or (lambda reward, terminated: terminated and reward > 0)
        self.admissible = admissible or (lambda env, state: list(range(len(self.action_names))))
        self.feedback = feedback
        self.gamma = gamma
        self.state = 0
        self._layout_digest = ""
        self._q: np.ndarray | None = None

    @staticmethod
    def _check_inner(env: gym.Env, n_actions: int) -> None:
        if not isinstance(env.observation_space, spaces.Discrete) or not isinstance(env.action_space, spaces.Discrete):
            raise ValueError("TextifyDiscrete needs an env with Discrete observation and action spaces")
        if env.action_space.n != n_actions:
            raise ValueError(f"got {n_actions} action names for {env.action_space.n} actions")
        if not hasattr(env, "P"):
            raise ValueError("TextifyDiscrete needs the env's transition table `P`")

    # ----- TextEnv API --------------------------------------------------------------------------------
    def _new_task(self, seed: int | None, options: dict[str, Any]) -> str:
        if self._factory is not None:
            self.env = self._factory(self.np_random).unwrapped
            self._check_inner(self.env, len(self.action_names))
            self._q = None
        self.state, _ = self.env.reset(seed=int(self.np_random.integers(2**31)))
        self.state = int(self.state)
        layout = _layout(self.env)
        self._layout_digest = hashlib.blake2b(layout.encode(), digest_size=6).hexdigest()
        self.task = self.task_text
        self.task_id = f"{self.name}-{self._layout_digest}-s{self.state}"
        return f"{self.task}\n{self.describe(self.env, self.state)}"

    def _execute(self, command: str) -> tuple[str, float, bool]:
        action = self._action_index[command]
        previous = self.state
        state, reward, terminated, _, _ = self.env.step(action)
        self.state = int(state)
        self.won = bool(self.success(float(reward), bool(terminated)))
        text = self.describe(self.env, self.state)
        if self.feedback is not None:
            text = f"{self.feedback(self.env, previous, action, self.state, float(reward))}\n{text}"
        return text, float(self.won), bool(terminated)

    def admissible_actions(self) -> list[str]:
        return [self.action_names[a] for a in self.admissible(self.env, self.state)]

    def state_string(self) -> str:
        return f"{self.name}|{self._layout_digest}|{self.state}"

    def expert_action(self, kind: str | None = None) -> str:
        """The admissible action of highest planned value (first in action order on ties)."""
        self._expert_kind(kind)
        if self._q is None:
            self._q = self.plan()
        allowed = self.admissible(self.env, self.state)
        return self.action_names[max(allowed, key=lambda a: self._q[self.state, a])]

    def plan(self, tol: float = 1e-12, max_iterations: int = 100_000) -> np.ndarray:
        """Q-values of the discounted probability of success, by value iteration on ``P``.

        A success transition is worth 1, any other terminal transition 0, and a state is worth its best
        admissible action. On a deterministic table ``Q[s, a] = gamma ** (steps to success - 1)``, so acting
        greedily follows a shortest path.
        """
        env = self.env
        n_states, n_actions = env.observation_space.n, env.action_space.n
        rows = [
            (s, a, p, s2, self.success(float(r), bool(t)), bool(t))
            for s in range(n_states)
            for a in range(n_actions)
            for p, s2, r, t in env.P[s][a]
        ]
        s_idx, a_idx, prob, nxt, win, term = (np.array(col) for col in zip(*rows, strict=True))
        prob = prob.astype(np.float64)
        win, cont = win.astype(np.float64), (~term.astype(bool)).astype(np.float64)
        blocked = np.ones((n_states, n_actions), dtype=bool)
        for s in range(n_states):
            blocked[s, self.admissible(env, s)] = False
        value = np.zeros(n_states)
        q = np.zeros((n_states, n_actions))
        for _ in range(max_iterations):
            q = np.zeros((n_states, n_actions))
            np.add.at(q, (s_idx, a_idx), prob * (win + cont * self.gamma * value[nxt]))
            new_value = np.where(blocked, 0.0, q).max(axis=1)  # q >= 0: a blocked action never wins
            done = np.max(np.abs(new_value - value)) < tol
            value = new_value
            if done:
                break
        return q


# ----- FrozenLake ---------------------------------------------------------------------------------------
LAKE_ACTIONS = ("go west", "go south", "go east", "go north")  # Gymnasium: 0 left, 1 down, 2 right, 3 up


def _describe_lake(env: gym.Env, state: int) -> str:
    row, col = divmod(state, env.ncol)
    grid = [[ch.decode() for ch in line] for line in env.desc]
    grid[row][col] = "*"
    board = "\n".join("".join(line) for line in grid)
    return f"You are at row {row + 1}, column {col + 1}.\nMap (S start, F frozen ice, H hole, G goal, * you):\n{board}"


def _moved(ncol: int, previous: int, command: str, state: int) -> str:
    """'You go east.', or what happened instead when the walker slid or stood still."""
    (r0, c0), (r1, c1) = divmod(previous, ncol), divmod(state, ncol)
    went = {(-1, 0): "go north", (1, 0): "go south", (0, 1): "go east", (0, -1): "go west"}.get((r1 - r0, c1 - c0))
    if went == command:
        return f"You {command}."
    if went is None:
        return f"You try to {command} but stay where you are."
    return f"You try to {command} but slide: you {went}."


def _lake_feedback(env: gym.Env, previous: int, action: int, state: int, reward: float) -> str:
    text = _moved(env.ncol, previous, LAKE_ACTIONS[action], state)
    tile = env.desc[divmod(state, env.ncol)].decode()
    if tile == "H":
        return f"{text} You fell into a hole in the ice!"
    if tile == "G":
        return f"{text} You reached the goal!"
    return text


class TextFrozenLake(TextifyDiscrete):
    """Gymnasium's ``FrozenLake-v1`` as text (``gagpo_gym/FrozenLake-v0``)."""

    def __init__(
        self,
        map_name: str = "4x4",
        map_size: int | None = None,
        frozen_prob: float = 0.8,
        is_slippery: bool = False,
        render_mode: str | None = None,
    ) -> None:
        if map_name not in ("4x4", "8x8"):
            raise ValueError(f"map_name must be '4x4' or '8x8', got {map_name!r}")
        if map_size is not None and (not isinstance(map_size, int) or not 2 <= map_size <= 16):
            raise ValueError(f"map_size must be None or an int in [2, 16], got {map_size!r}")
        if not 0.0 < frozen_prob <= 1.0:
            raise ValueError(f"frozen_prob must be in (0, 1], got {frozen_prob!r}")
        if map_size is None:
            env: Any = gym.make("FrozenLake-v1", map_name=map_name, is_slippery=bool(is_slippery)).unwrapped
        else:

            def env(rng: np.random.Generator) -> gym.Env:
                desc = generate_random_map(size=map_size, p=frozen_prob, seed=int(rng.integers(2**31)))
                return gym.make("FrozenLake-v1", desc=desc, is_slippery=bool(is_slippery)).unwrapped

        slippery = " The ice is slippery: you may slide sideways instead." if is_slippery else ""
        super().__init__(
            env,
            LAKE_ACTIONS,
            _describe_lake,
            name="frozenlake",
            task=f"Walk across the frozen lake from S to the goal G without falling into a hole H.{slippery}",
            feedback=_lake_feedback,
            render_mode=render_mode,
        )


# ----- Taxi ---------------------------------------------------------------------------------------------
TAXI_ACTIONS = ("go south", "go north", "go east", "go west", "pick up", "drop off")  # Gymnasium's order
DEPOTS = ("R (red)", "G (green)", "Y (yellow)", "B (blue)")


def _describe_taxi(env: gym.Env, state: int) -> str:
    row, col, passenger, destination = env.decode(state)
    grid = [[ch.decode() for ch in line] for line in env.desc]
    grid[row + 1][2 * col + 1] = "T"
    board = "\n".join("".join(line) for line in grid)
    at = f", at depot {DEPOTS[env.locs.index((row, col))]}" if (row, col) in env.locs else ""
    if passenger == 4:
        where = f"The passenger is in your taxi and wants to go to depot {DEPOTS[destination]}."
    elif passenger == destination:
        where = f"The passenger has arrived at depot {DEPOTS[destination]}."
    else:
        where = f"The passenger is waiting at depot {DEPOTS[passenger]} and wants to go to depot {DEPOTS[destination]}."
    return (
        f"Your taxi is at row {row + 1}, column {col + 1}{at}. {where}\n"
        f"Map (T your taxi, R G Y B depots, | wall, : open):\n{board}"
    )


def _taxi_feedback(env: gym.Env, previous: int, action: int, state: int, reward: float) -> str:
    command = TAXI_ACTIONS[action]
    if command == "pick up":
        return "The passenger gets into your taxi."
    if command == "drop off":
        return "You dropped the passenger at the destination!" if reward > 0 else "The passenger gets out."
    return f"You {command}."


def _taxi_admissible(env: gym.Env, state: int) -> list[int]:
    return [int(a) for a in np.flatnonzero(env.action_mask(state))]


class TextTaxi(TextifyDiscrete):
    """Gymnasium's ``Taxi-v4`` as text (``gagpo_gym/Taxi-v0``); each task is one of Taxi's 300 starts."""

    def __init__(self, is_rainy: bool = False, fickle_passenger: bool = False, render_mode: str | None = None) -> None:
        env = gym.make("Taxi-v4", is_rainy=bool(is_rainy), fickle_passenger=bool(fickle_passenger)).unwrapped
        super().__init__(
            env,
            TAXI_ACTIONS,
            _describe_taxi,
            name="taxi",
            task="Drive the taxi to the passenger, pick them up, and drop them off at their destination.",
            success=lambda reward, terminated: terminated,
            admissible=_taxi_admissible,
            feedback=_taxi_feedback,
            render_mode=render_mode,
        )


# ----- CliffWalking -------------------------------------------------------------------------------------
CLIFF_ACTIONS = ("go north", "go east", "go south", "go west")  # Gymnasium: 0 up, 1 right, 2 down, 3 left


def _describe_cliff(env: gym.Env, state: int) -> str:
    nrow, ncol = env.shape
    grid = [["C" if env._cliff[r, c] else "." for c in range(ncol)] for r in range(nrow)]
    start_row, start_col = divmod(int(env.start_state_index), ncol)
    grid[start_row][start_col] = "S"
    grid[nrow - 1][ncol - 1] = "G"
    row, col = divmod(state, ncol)
    grid[row][col] = "*"
    board = "\n".join("".join(line) for line in grid)
    legend = "Map (S start, G goal, C cliff, . ground, * you):"
    return f"You are at row {row + 1}, column {col + 1}.\n{legend}\n{board}"


def _cliff_feedback(env: gym.Env, previous: int, action: int, state: int, reward: float) -> str:
    if reward <= -100:
        return "You fell off the cliff and were carried back to the start."
    return _moved(env.shape[1], previous, CLIFF_ACTIONS[action], state)


class TextCliffWalking(TextifyDiscrete):
    """Gymnasium's ``CliffWalking-v1`` as text (``gagpo_gym/CliffWalking-v0``); a single fixed task."""

    def __init__(self, is_slippery: bool = False, render_mode: str | None = None) -> None:
        env = gym.make("CliffWalking-v1", is_slippery=bool(is_slippery)).unwrapped
        slippery = " The ground is slippery: you may slide sideways instead." if is_slippery else ""
        super().__init__(
            env,
            CLIFF_ACTIONS,
            _describe_cliff,
            name="cliffwalking",
            task=f"Walk from the start S to the goal G without stepping into the cliff C.{slippery}",
            success=lambda reward, terminated: terminated,
            feedback=_cliff_feedback,
            render_mode=render_mode,
        )
