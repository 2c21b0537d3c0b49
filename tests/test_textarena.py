"""The TextArena adapter (gagpo_gym/envs/textarena.py): the contract on every registered game, seeds, invalid moves,
opponents, keys and experts."""

from __future__ import annotations

import dataclasses
import random
import subprocess
import sys

import gymnasium as gym
import pytest

pytest.importorskip("textarena")

import gagpo_gym  # noqa: E402
from gagpo_gym.envs import textarena as adapter  # noqa: E402

TEXTARENA_IDS = [env_id for env_id in gagpo_gym.registered_text_envs() if "/TextArena-" in env_id]
#: Games whose TextArena generator takes a second or more per new seed (the rest take milliseconds).
SLOW_TO_GENERATE = {"RushHour", "Sokoban"}


def make(game: str, **kwargs) -> gym.Env:
    return gym.make(f"gagpo_gym/TextArena-{game}-v0", **kwargs)


def play(env: gym.Env, actions: list[str]) -> list[tuple]:
    return [env.step(action) for action in actions]


def test_every_game_of_the_table_is_registered() -> None:
    assert sorted(TEXTARENA_IDS) == sorted(f"gagpo_gym/TextArena-{name}-v0" for name in adapter.GAMES)
    assert len(TEXTARENA_IDS) >= 20


@pytest.mark.parametrize("env_id", TEXTARENA_IDS)
def test_contract_and_gymnasium_check_env(env_id: str) -> None:
    gagpo_gym.check_text_env(gym.make(env_id))  # runs gymnasium's check_env first


@pytest.mark.parametrize("env_id", [e for e in TEXTARENA_IDS if e.split("-")[1] not in SLOW_TO_GENERATE])
def test_same_seed_same_task_regenerated(env_id: str) -> None:
    """Same seed, a fresh game built again (not the cached copy), in spite of other users of ``random``."""
    runs = []
    for _ in range(2):
        adapter.FRESH_CACHE.clear()
        random.seed(12345 + len(runs))  # the global stream differs between the runs: the games must not see it
        env = gym.make(env_id)
        obs, info = env.reset(seed=7)
        steps = play(env, info["admissible_actions"][:1])
        runs.append((obs, info["state_key"], info["task"], steps[0][0], steps[0][4]["state_key"]))
    assert runs[0] == runs[1]
    assert runs[0][0] and runs[0][2] in runs[0][0]  # the first observation opens with the game's prompt


def test_different_seeds_give_different_tasks() -> None:
    keys = {make("FrozenLake").reset(seed=s)[1]["state_key"] for s in range(8)}
    assert len(keys) > 4


def test_interleaved_envs_keep_their_own_random_stream() -> None:
    """Two envs of a stochastic game on one seed, stepped alternately: the same trajectory (2048 spawns tiles)."""
    envs = [make("2048"), make("2048")]
    infos = [env.reset(seed=3)[1] for env in envs]
    for _ in range(15):
        steps = [env.step(info["admissible_actions"][0]) for env, info in zip(envs, infos)]
        random.random()
        assert steps[0][0] == steps[1][0] and steps[0][4]["state_key"] == steps[1][4]["state_key"]
        infos = [s[4] for s in steps]
        if steps[0][2]:
            break


def test_tower_of_hanoi_expert_wins_in_seven_moves() -> None:
    env = make("TowerOfHanoi")
    _, info = env.reset(seed=0)
    assert sorted(info["admissible_actions"]) == ["[A B]", "[A C]"]
    moves = []
    while True:
        move = env.unwrapped.expert_action()
        moves.append(move)
        _, reward, terminated, truncated, info = env.step(move)
        if terminated or truncated:
            break
    assert moves == ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"]
    assert terminated and info["won"] and reward == 1.0 and info["score"] == 1.0


def test_tower_of_hanoi_expert_recovers_from_a_detour() -> None:
    env = make("TowerOfHanoi")
    env.reset(seed=0)
    play(env, ["[A B]", "[A C]", "[B A]"])
    steps = 0
    while not env.step(env.unwrapped.expert_action())[2]:
        steps += 1
    assert env.unwrapped.won and steps + 1 <= 7


def test_state_keys_repeat_for_the_same_state_and_differ_otherwise() -> None:
    env = make("TowerOfHanoi")
    _, start = env.reset(seed=0)
    after_ac = env.step("[A C]")[4]
    back = env.step("[C A]")[4]
    after_ab = env.step("[A B]")[4]
    assert back["state_key"] == start["state_key"]
    assert len({start["state_key"], after_ac["state_key"], after_ab["state_key"]}) == 3
    other = make("Mastermind")
    keys = {other.reset(seed=s)[1]["state_key"] for s in range(5)}
    assert len(keys) == 5  # the hidden code is part of the state: same board, different keys


@pytest.mark.parametrize("action", ["[C A]", "move the top disk", "", "[A C] [A B]", "[A, C] please"])
def test_invalid_move_keeps_state_and_episode(action: str) -> None:
    env = make("TowerOfHanoi")
    _, start = env.reset(seed=0)
    for _ in range(5):  # far past TextArena's error allowance of one
        obs, reward, terminated, truncated, info = env.step(action)
        assert not info["action_valid"] and reward == 0.0 and not terminated and not truncated
        assert info["state_key"] == start["state_key"] and info["admissible_actions"] == start["admissible_actions"]
        assert obs
    assert env.step("[a   c]")[4]["action_valid"]  # case and spacing still match the legal move


def test_rejected_move_restores_the_game() -> None:
    """A listed move the game itself rejects is undone exactly, its random stream included: 2048 with every
    direction listed (no probing), a direction that moves no tile, then the same play as a twin that never erred."""
    envs = [adapter.TextArenaEnv("2048"), adapter.TextArenaEnv("2048")]
    envs[0].game = dataclasses.replace(envs[0].game, probe=False)
    infos = [env.reset(seed=0)[1] for env in envs]
    while len(infos[1]["admissible_actions"]) == 4:  # play on until some direction is stuck
        infos = [env.step(infos[1]["admissible_actions"][0])[4] for env in envs]
    stuck = next(m for m in infos[0]["admissible_actions"] if m not in infos[1]["admissible_actions"])
    before = adapter.canonical_state(envs[0].game.state(envs[0].ta_game))
    for _ in range(3):
        obs, reward, terminated, _, info = envs[0].step(stuck)
        assert not info["action_valid"] and reward == 0.0 and not terminated
        assert "invalid move" in obs and info["state_key"] == infos[0]["state_key"]
        assert adapter.canonical_state(envs[0].game.state(envs[0].ta_game)) == before
    move = infos[1]["admissible_actions"][0]
    after = [env.step(move) for env in envs]
    assert after[0][0] == after[1][0] and after[0][4]["state_key"] == after[1][4]["state_key"]


def test_game_mode_keeps_textarena_error_allowance() -> None:
    env = make("TowerOfHanoi", invalid_move="game")
    _, start = env.reset(seed=0)
    _, _, terminated, _, info = env.step("[C A]")
    assert not info["action_valid"] and not terminated and info["state_key"] == start["state_key"]
    _, reward, terminated, _, info = env.step("no move at all")
    assert not info["action_valid"] and terminated and not info["won"] and reward == 0.0
    env.reset(seed=0)
    *_, info = env.step("I move [A, C] now")  # TextArena's own parser accepts what it accepts
    assert info["action_valid"]


def test_turn_limit_is_gymnasiums() -> None:
    env = make("TowerOfHanoi")  # TextArena's own limit for 3 disks is 14 turns
    _, info = env.reset(seed=0)
    for t in range(1, 31):
        _, _, terminated, truncated, info = env.step("[A B]" if t % 2 else "[B A]")
        assert not terminated
    assert truncated and t == env.spec.max_episode_steps and not info["won"]


def test_minesweeper_mine_is_a_loss_not_an_invalid_move() -> None:
    env = make("Minesweeper")
    _, info = env.reset(seed=0)
    *_, info = env.step("[2 2]")  # the first reveal is safe
    game = env.unwrapped.ta_game
    mine = next(f"[{r} {c}]" for r in range(5) for c in range(5) if game.grid[r][c] == -1)
    assert mine in info["admissible_actions"]
    _, reward, terminated, _, info = env.step(mine)
    assert terminated and info["action_valid"] and not info["won"] and reward == 0.0


def test_two_player_against_a_random_opponent_is_reproducible() -> None:
    def episode() -> list[int]:
        env = make("TicTacToe")
        _, info = env.reset(seed=5)
        keys = [info["state_key"]]
        while True:
            *_, terminated, truncated, info = env.step(info["admissible_actions"][0])
            keys.append(info["state_key"])
            if terminated or truncated:
                return keys

    first = episode()
    assert first == episode() and len(first) >= 3


def test_two_player_against_a_user_callable() -> None:
    seen: list[list[str]] = []

    def highest_cell(observation: str, legal: list[str]) -> str:
        seen.append(legal)
        return legal[-1].lower()  # matched to the legal spelling

    env = make("TicTacToe", opponent=highest_cell, learner="second")
    obs, info = env.reset(seed=0)
    assert seen == [[f"[{i}]" for i in range(9)]] and "[8]" not in info["admissible_actions"]
    assert "[Opponent]" in obs
    env.step("[0]")
    assert "[7]" not in env.unwrapped.admissible_actions() and len(seen) == 2

    def cheat(observation: str, legal: list[str]) -> str:
        return "[9]"

    env = make("TicTacToe", opponent=cheat, learner="second")
    with pytest.raises(ValueError, match="not one of its legal moves"):
        env.reset(seed=0)


def test_two_player_win_and_loss() -> None:
    env = make("Nim", learner="first")
    wins = 0
    for seed in range(5):
        _, info = env.reset(seed=seed)
        while True:
            _, reward, terminated, _, info = env.step(env.unwrapped.expert_action())
            if terminated:
                break
        wins += info["won"]
        assert reward == float(info["won"])
    assert wins == 5  # piles 3 4 5: the first player wins by leaving a zero nim-sum


@pytest.mark.parametrize(
    ("game", "seeds"), [("FrozenLake", 8), ("GuessTheNumber", 8), ("Mastermind", 3), ("LightsOut", 5), ("PegJump", 1)]
)
def test_experts_win(game: str, seeds: int) -> None:
    env = make(game)
    for seed in range(seeds):
        _, info = env.reset(seed=seed)
        while True:
            action = env.unwrapped.expert_action()
            assert action in info["admissible_actions"]
            *_, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
        assert info["won"], (game, seed)


def test_games_without_expert_say_so() -> None:
    env = make("Blackjack")
    env.reset(seed=0)
    with pytest.raises(ValueError, match="expert kind"):
        env.unwrapped.expert_action()


def test_canonical_state_is_stable_across_spellings() -> None:
    a = adapter.canonical_state({"b": (1, 2), "a": {3: {5, 4}}})
    b = adapter.canonical_state({"a": {3: {4, 5}}, "b": [1, 2]})
    assert a == b == '{"a":{"3":[4,5]},"b":[1,2]}'


def test_importing_gagpo_gym_does_not_import_textarena() -> None:
    code = "import sys, gagpo_gym; assert 'textarena' not in sys.modules; print(len(gagpo_gym.registered_text_envs()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert int(out) >= len(TEXTARENA_IDS)
