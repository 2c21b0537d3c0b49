"""The built-in text envs honour the contract: Gymnasium's checker, vector envs, determinism, true-state keys,
an expert that solves the tasks, and robustness to malformed actions."""

from __future__ import annotations

import string
from collections import defaultdict
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import gagpo_gym
from gagpo_gym.envs.classic_games import ttt_winner

ENV_IDS = [
    "gagpo_gym/Maze-v0",
    "gagpo_gym/Sokoban-v0",
    "gagpo_gym/FrozenLake-v0",
    "gagpo_gym/Taxi-v0",
    "gagpo_gym/CliffWalking-v0",
    "gagpo_gym/TicTacToe-v0",
    "gagpo_gym/ConnectFour-v0",
]


def true_state(env: gym.Env) -> Any:
    """The env's internal state read from its own fields (not from ``state_string``), task layout included."""
    u = env.unwrapped
    name = type(u).__name__
    if name == "MazeEnv":
        return repr(sorted(u.exits.items())), u.treasure, u.pos
    if name == "SokobanEnv":
        return u.floor, u.targets, u.player, u.boxes
    if name.startswith("Text"):  # toy-text adapter: Gymnasium's own state index and map
        desc = getattr(u.env, "desc", None)
        return (None if desc is None else desc.tobytes()), int(u.env.s)
    engine = u.game.unwrapped
    board = engine.board.squares if name == "TicTacToeEnv" else engine.board
    return tuple(board), u.learner_mark


def play(env: gym.Env, seed: int, policy, max_steps: int = 1000) -> tuple[list, dict]:
    """Run one episode; return the trajectory [(obs, key, admissible)] and the last info."""
    obs, info = env.reset(seed=seed)
    trajectory = [(obs, info["state_key"], tuple(info["admissible_actions"]))]
    for _ in range(max_steps):
        obs, _, terminated, truncated, info = env.step(policy(info))
        trajectory.append((obs, info["state_key"], tuple(info["admissible_actions"])))
        if terminated or truncated:
            break
    return trajectory, info


def random_policy(rng: np.random.Generator):
    return lambda info: info["admissible_actions"][rng.integers(len(info["admissible_actions"]))]


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_gymnasium_check_env_and_contract(env_id: str) -> None:
    env = gym.make(env_id)
    check_env(env.unwrapped, skip_render_check=True)
    gagpo_gym.check_text_env(env, n_steps=40)
    obs, info = env.reset(seed=3)
    assert obs and set(obs) <= set(gagpo_gym.CHARSET)
    assert info["task"] and info["task_id"] and info["won"] is False


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("env_id", ENV_IDS)
def test_make_vec_matches_single_envs(env_id: str, mode: str) -> None:
    kwargs = {"vector_kwargs": {"shared_memory": False}} if mode == "async" else {}
    vec = gym.make_vec(env_id, num_envs=2, vectorization_mode=mode, **kwargs)
    try:
        obs, info = vec.reset(seed=7)  # sub-env i is seeded with 7 + i
        singles = [gym.make(env_id) for _ in range(2)]
        expected = [single.reset(seed=7 + i) for i, single in enumerate(singles)]
        for step in range(4):
            for i, (single_obs, single_info) in enumerate(expected):
                assert obs[i] == single_obs
                assert int(info["state_key"][i]) == single_info["state_key"]
            actions = [list(info["admissible_actions"][i])[0] for i in range(2)]
            obs, _, terminated, truncated, info = vec.step(actions)
            expected = [single.step(a)[::4] for single, a in zip(singles, actions, strict=True)]
            if (terminated | truncated).any():
                break
            assert info["action_valid"].all(), f"step {step}"
    finally:
        vec.close()


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_same_seed_same_trajectory(env_id: str) -> None:
    env_a, env_b = gym.make(env_id), gym.make(env_id)
    for seed in (0, 1, 12345):
        run_a, _ = play(env_a, seed, random_policy(np.random.default_rng([seed, 99])))
        run_b, _ = play(env_b, seed, random_policy(np.random.default_rng([seed, 99])))
        assert run_a == run_b
    # reset() without a seed draws the next task from the env's RNG, reproducibly
    env_a.reset(seed=5)
    env_b.reset(seed=5)
    follow_a = [env_a.reset()[1]["task_id"] for _ in range(5)]
    follow_b = [env_b.reset()[1]["task_id"] for _ in range(5)]
    assert follow_a == follow_b


@pytest.mark.parametrize(
    ("env_id", "min_tasks"),
    [("gagpo_gym/Maze-v0", 38), ("gagpo_gym/Sokoban-v0", 38), ("gagpo_gym/Taxi-v0", 30)],
)
def test_seeds_give_different_tasks(env_id: str, min_tasks: int) -> None:
    env = gym.make(env_id)
    task_ids = {env.reset(seed=seed)[1]["task_id"] for seed in range(40)}
    assert len(task_ids) >= min_tasks


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_keys_are_a_function_of_the_true_state_and_tell_states_apart(env_id: str) -> None:
    env = gym.make(env_id)
    key_of: dict[Any, int] = {}
    state_of: dict[int, Any] = {}
    paths: dict[Any, set] = defaultdict(set)
    for seed in range(4):
        for episode in range(40):
            rng = np.random.default_rng([seed, episode])
            obs, info = env.reset(seed=seed)
            history: tuple[str, ...] = ()
            for _ in range(25):
                state = true_state(env)
                assert key_of.setdefault(state, info["state_key"]) == info["state_key"], "same state, new key"
                assert state_of.setdefault(info["state_key"], state) == state, "same key, different states"
                paths[state].add(history)
                # mostly the first two moves, so that walks meet (transpositions in the games too)
                choices = info["admissible_actions"][: 2 if rng.random() < 0.8 else None]
                action = choices[rng.integers(len(choices))]
                obs, _, terminated, truncated, info = env.step(action)
                history += (action,)
                if terminated or truncated:
                    break
    assert len(key_of) >= 5
    # the property is only tested if some states were reached along different paths
    assert sum(len(p) > 1 for p in paths.values()) >= 3


def run_expert(env: gym.Env, seed: int) -> tuple[dict, int]:
    _, info = env.reset(seed=seed)
    steps = 0
    while True:
        _, _, terminated, truncated, info = env.step(env.unwrapped.expert_action())
        steps += 1
        assert info["action_valid"], "the expert played an invalid action"
        if terminated or truncated:
            return info, steps


@pytest.mark.parametrize(
    "env_id",
    ["gagpo_gym/Maze-v0", "gagpo_gym/Sokoban-v0", "gagpo_gym/FrozenLake-v0", "gagpo_gym/Taxi-v0"]
    + ["gagpo_gym/CliffWalking-v0"],
)
def test_expert_solves_every_deterministic_task_by_a_shortest_path(env_id: str) -> None:
    env = gym.make(env_id)
    for seed in range(200):
        env.reset(seed=seed)
        u = env.unwrapped
        if env_id.endswith("Maze-v0"):
            shortest = u.distance[u.start]
        elif env_id.endswith("Sokoban-v0"):
            shortest = u.solution_length
        else:
            shortest = bfs_steps_to_success(u.env.P, u.state, u.success)
        info, steps = run_expert(env, seed)
        assert info["won"], f"seed {seed}"
        assert steps == shortest, f"seed {seed}: {steps} steps, shortest is {shortest}"


def bfs_steps_to_success(P: dict, start: int, success) -> int:
    """Fewest steps from ``start`` to a success transition of a deterministic Gymnasium table."""
    frontier, seen, steps = [start], {start}, 0
    while frontier:
        steps += 1
        nxt = []
        for s in frontier:
            for transitions in P[s].values():
                ((_, s2, reward, terminated),) = transitions
                if success(reward, terminated):
                    return steps
                if not terminated and s2 not in seen:
                    seen.add(s2)
                    nxt.append(s2)
        frontier = nxt
    raise AssertionError("no path to success")


def test_known_shortest_paths_of_gymnasium_maps() -> None:
    """FrozenLake 4x4 needs 6 moves, CliffWalking 13 (up, 11 right, down), Taxi at most 20 from any start."""
    assert run_expert(gym.make("gagpo_gym/FrozenLake-v0"), 0)[1] == 6
    assert run_expert(gym.make("gagpo_gym/CliffWalking-v0"), 0)[1] == 13
    taxi = gym.make("gagpo_gym/Taxi-v0")
    assert max(run_expert(taxi, seed)[1] for seed in range(50)) <= 20


def test_random_frozenlake_maps_and_slippery_planner() -> None:
    env = gym.make("gagpo_gym/FrozenLake-v0", map_size=6)
    maps = {env.reset(seed=seed)[1]["task_id"] for seed in range(20)}
    assert len(maps) >= 15
    assert all(run_expert(env, seed)[0]["won"] for seed in range(50))
    # Slippery ice: value iteration maximises the chance of success; the optimum on the 4x4 map is about 0.8
    slippery = gym.make("gagpo_gym/FrozenLake-v0", is_slippery=True, max_episode_steps=500)
    success = np.mean([run_expert(slippery, seed)[0]["won"] for seed in range(200)])
    assert 0.7 <= success <= 0.9


def test_tictactoe_expert_never_loses_and_mostly_beats_random() -> None:
    for learner in ("first", "second"):
        perfect = gym.make("gagpo_gym/TicTacToe-v0", opponent="minimax", learner=learner)
        outcomes = [run_expert(perfect, seed)[0]["outcome"] for seed in range(100)]
        assert outcomes.count("loss") == 0 and outcomes.count("draw") == 100
    heuristic = gym.make("gagpo_gym/TicTacToe-v0", opponent="heuristic")
    outcomes = [run_expert(heuristic, seed)[0]["outcome"] for seed in range(200)]
    assert outcomes.count("loss") == 0 and outcomes.count("win") >= 60
    default = gym.make("gagpo_gym/TicTacToe-v0")
    infos = [run_expert(default, seed)[0] for seed in range(200)]
    assert all(info["outcome"] != "loss" for info in infos)
    assert np.mean([info["won"] for info in infos]) >= 0.9


def test_connect_four_expert_beats_random() -> None:
    env = gym.make("gagpo_gym/ConnectFour-v0")
    wins = [run_expert(env, seed)[0]["won"] for seed in range(200)]
    assert np.mean(wins) >= 0.99


@pytest.mark.parametrize("env_id", ["gagpo_gym/TicTacToe-v0", "gagpo_gym/ConnectFour-v0"])
def test_game_outcome_matches_the_board_and_rewards(env_id: str) -> None:
    env = gym.make(env_id, opponent="heuristic")
    seen = set()
    for seed in range(60):
        rng = np.random.default_rng([seed, 7])
        trajectory, info = play(env, seed, random_policy(rng))
        u = env.unwrapped
        seen.add(info["outcome"])
        assert info["won"] == (info["outcome"] == "win")
        assert info["admissible_actions"] == ["pass"]
        if env_id.endswith("TicTacToe-v0"):
            winner = ttt_winner(u.board())
            expected = "draw" if winner == 0 else ("win" if winner == u.learner_mark else "loss")
            assert info["outcome"] == expected
    assert {"win", "loss"} <= seen


def test_tictactoe_cells_follow_pettingzoo_column_major_squares() -> None:
    env = gym.make("gagpo_gym/TicTacToe-v0", learner="first", opponent="minimax")
    env.reset(seed=0)
    env.step("place 2")  # row 1, column 2 of the text board
    squares = env.unwrapped.game.unwrapped.board.squares
    assert squares[3] == 1  # PettingZoo: squares[i] is column i // 3, row i % 3
    assert env.unwrapped.board()[1] == 1
    text = env.unwrapped.board_text().splitlines()[0]
    assert text.split("|")[1].strip() == "X"


def fuzzed_actions(rng: np.random.Generator, commands: list[str], n: int) -> list[Any]:
    """Random unicode, empty and huge strings, near misses of valid commands, and non-strings."""
    printable = string.printable
    fixed: list[Any] = ["", " ", "\n\t", "x" * 10_240, "go nort", "Go  North!", "pushh up", "place 10",
                        "drop 0", "drop -1", "place 1.5", "UP!", "go", "north", None, 3, 2.5, b"go north",
                        ["up"], {"action": "up"}]  # fmt: skip
    out = list(fixed)
    while len(out) < n:
        kind = rng.integers(5)
        base = commands[rng.integers(len(commands))]
        if kind == 0:  # random unicode, including surrogates and control characters
            out.append("".join(chr(int(c)) for c in rng.integers(0, 0x10FFFF, size=rng.integers(1, 30))))
        elif kind == 1:  # drop a character
            i = rng.integers(len(base))
            out.append(base[:i] + base[i + 1 :])
        elif kind == 2:  # insert a character
            i = rng.integers(len(base) + 1)
            out.append(base[:i] + printable[rng.integers(len(printable))] + base[i:])
        elif kind == 3:  # punctuation, prefixes or suffixes
            out.append(str(rng.choice(["", "please ", "> "])) + base + str(rng.choice(["!", ".", " now", "?"])))
        else:  # random printable junk
            out.append("".join(printable[i] for i in rng.integers(0, len(printable), size=rng.integers(1, 40))))
    return out[:n]


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_fuzzed_actions_never_raise_and_change_nothing(env_id: str) -> None:
    env = gym.make(env_id).unwrapped
    rng = np.random.default_rng(2024)
    _, info = env.reset(seed=11)
    _, _, terminated, _, info = env.step(info["admissible_actions"][0])  # leave the initial state
    assert not terminated
    actions = fuzzed_actions(rng, info["admissible_actions"], 500)
    invalid = 0
    for action in actions:
        before = (env.state_string(), info["state_key"], info["admissible_actions"])
        if env.canonical_action(action) is not None:  # e.g. a case or spacing variant: valid by design
            continue
        obs, reward, terminated, truncated, info = env.step(action)
        invalid += 1
        assert info["action_valid"] is False
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert obs == env.invalid_feedback
        assert (env.state_string(), info["state_key"], info["admissible_actions"]) == before
    assert invalid >= 450
    # spacing and case variants of a valid command are accepted
    variant = "  " + info["admissible_actions"][0].upper().replace(" ", "   ") + " "
    assert env.step(variant)[4]["action_valid"] is True


@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [
        ("gagpo_gym/Maze-v0", {"width": 1}),
        ("gagpo_gym/Maze-v0", {"view": "overhead"}),
        ("gagpo_gym/Maze-v0", {"min_path": 9, "max_path": 3}),
        ("gagpo_gym/Sokoban-v0", {"boxes": 0}),
        ("gagpo_gym/Sokoban-v0", {"width": "6"}),
        ("gagpo_gym/FrozenLake-v0", {"map_name": "5x5"}),
        ("gagpo_gym/FrozenLake-v0", {"map_size": 1}),
        ("gagpo_gym/TicTacToe-v0", {"opponent": "grandmaster"}),
        ("gagpo_gym/ConnectFour-v0", {"opponent": "minimax"}),
        ("gagpo_gym/ConnectFour-v0", {"learner": "middle"}),
    ],
)
def test_bad_constructor_arguments_raise_value_error(env_id: str, kwargs: dict) -> None:
    with pytest.raises(ValueError):
        gym.make(env_id, **kwargs)


def test_maze_views_and_sizes() -> None:
    local = gym.make("gagpo_gym/Maze-v0")
    full = gym.make("gagpo_gym/Maze-v0", view="map")
    obs_local, info_local = local.reset(seed=4)
    obs_full, info_full = full.reset(seed=4)
    assert info_local["state_key"] == info_full["state_key"]  # same task, same true state
    assert "Map" not in obs_local and "Exits:" in obs_local and "treasure" in obs_local
    map_lines = [line for line in obs_full.splitlines() if line.startswith("#")]
    assert len(map_lines) == 11 and sum(line.count("P") for line in map_lines) == 1
    big = gym.make("gagpo_gym/Maze-v0", width=9, height=7, rooms=3, room_size=3, min_path=10, max_path=20)
    info, steps = run_expert(big, 0)
    assert info["won"] and 10 <= steps <= 20


ALFWORLD_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "alfworld"
MAKE_VEC_ENVS = [
    pytest.param(env_id, marks=pytest.mark.skipif(not ALFWORLD_DATA.is_dir(), reason="../shared/alfworld is absent"))
    if env_id.endswith("ALFWorld-v0")
    else env_id
    for env_id in gagpo_gym.registered_text_envs()
    if not env_id.endswith("OpenEnv-v0")  # needs a server's url: tests/test_openenv.py runs make_vec on one
    # The TextArena games share one adapter: a single-player game and one against an opponent stand for all 21
    # (tests/test_textarena.py runs the checkers on every one).
    and (not env_id.startswith("gagpo_gym/TextArena-") or env_id.endswith(("TowerOfHanoi-v0", "Nim-v0")))
]


@pytest.mark.parametrize("env_id", MAKE_VEC_ENVS)
def test_make_vec_async_default_matches_sync(env_id: str) -> None:
    """Async with Gymnasium's default shared memory must carry the same text as sync (it used to give '000...')."""
    vectors = [gym.make_vec(env_id, num_envs=2, vectorization_mode=mode) for mode in ("async", "sync")]
    try:
        (obs_async, info_async), (obs_sync, info_sync) = (v.reset(seed=3) for v in vectors)
        assert obs_async == obs_sync and all(obs_sync)
        for _ in range(2):
            actions = [list(info_sync["admissible_actions"][i])[-1] for i in range(2)]
            (obs_async, *_, info_async), (obs_sync, *_, info_sync) = (v.step(actions) for v in vectors)
            assert obs_async == obs_sync
            assert list(info_async["state_key"]) == list(info_sync["state_key"])
    finally:
        for v in vectors:
            v.close()


class UnicodeCafe(gagpo_gym.TextEnv):
    """Order a coffee in French or greet in Chinese: every text it emits or accepts is non-ASCII."""

    GREETING = "Café ☕ … 你好"

    def _new_task(self, seed: int | None, options: dict[str, Any]) -> str:
        self.task, self.task_id, self.said = "Commandez un café ☕ — 你好", "cafe", ""
        return self.GREETING

    def _execute(self, command: str) -> tuple[str, float, bool]:
        self.said = command
        self.won = command == "commander un café ☕"
        return f"Vous avez dit « {command} ».", float(self.won), self.won

    def admissible_actions(self) -> list[str]:
        return ["commander un café ☕", "dire 你好"]

    def state_string(self) -> str:
        return f"cafe|{self.said}"

    def expert_action(self) -> str:
        return "commander un café ☕"


class LaxCafe(UnicodeCafe):
    """Breaks the contract: tidies any action into a command before the env sees it, over-long ones included."""

    def step(self, action: str):
        return super().step(" ".join(str(action).replace("\x00", "").split()))


class ControlCafe(UnicodeCafe):
    """Breaks the contract: an admissible action the action space cannot hold (a control character)."""

    def admissible_actions(self) -> list[str]:
        return ["commander un café ☕", "sonner \x07"]


@pytest.fixture
def register():
    """``register(name, cls)`` -> a made env registered through ``register_text_env``; unregistered afterwards."""
    ids = []

    def make(name: str, env_class: type) -> gym.Env:
        ids.append(gagpo_gym.register_text_env(name, env_class, max_episode_steps=5))
        return gym.make(ids[-1])

    yield make
    for env_id in ids:
        gym.registry.pop(env_id, None)


def test_unicode_text_survives_the_env_and_the_checker(register) -> None:
    env = register("UnicodeCafe-v0", UnicodeCafe)
    gagpo_gym.check_text_env(env, n_steps=6)
    obs, info = env.reset(seed=0)
    assert obs == "Café ☕ … 你好" and info["task"] == "Commandez un café ☕ — 你好"
    assert info["admissible_actions"] == ["commander un café ☕", "dire 你好"]
    obs, reward, terminated, _, info = env.step("Commander un CAFÉ ☕")
    assert info["action_valid"] and obs == "Vous avez dit « commander un café ☕ »." and reward == 1.0 and terminated
    assert env.observation_space.contains("Café ☕ … 你好") and not env.observation_space.contains("bell \x07")


def test_actions_outside_the_action_space_are_invalid(register) -> None:
    env = register("UnicodeCafe-v0", UnicodeCafe)
    _, info = env.reset(seed=0)
    for bad in ("dire 你好" + " " * 3000, "dire 你好\x00", "dire\x1f你好"):
        _, _, _, _, after = env.step(bad)
        assert after["action_valid"] is False and after["state_key"] == info["state_key"], repr(bad[:20])


@pytest.mark.parametrize(
    ("env_class", "match"),
    [(LaxCafe, "action outside the action space accepted"), (ControlCafe, "admissible actions outside")],
)
def test_checker_catches_text_the_spaces_cannot_hold(register, env_class: type, match: str) -> None:
    env = register("BrokenCafe-v0", env_class)
    with pytest.raises(AssertionError, match=match):
        gagpo_gym.check_text_env(env, n_steps=6)
