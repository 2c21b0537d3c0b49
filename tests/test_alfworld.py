"""ALFWorld-v0 on the real ALFWorld text engine and the real valid_unseen games in ../shared/alfworld."""

from __future__ import annotations

import multiprocessing
import random
import re
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("alfworld")

import gagpo_gym  # noqa: E402
from gagpo_gym import check_text_env, normalize_command  # noqa: E402
from gagpo_gym.envs.alfworld import TASK_TYPES, find_data_root  # noqa: E402
from wrappers import Memory  # noqa: E402
from wrappers.memory import listed_items  # noqa: E402

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "alfworld"
needs_data = pytest.mark.skipif(
    not (DATA / "json_2.1.1" / "valid_unseen").is_dir(), reason="../shared/alfworld is absent"
)
ENV_ID = "gagpo_gym/ALFWorld-v0"
NOTHING = "Nothing happens."
# Official ALFWorld valid_unseen counts per task type (also in ../shared/alfworld/README.md).
VALID_UNSEEN_COUNTS = {"pick": 24, "look": 18, "clean": 31, "heat": 23, "cool": 21, "pick2": 17}


@pytest.fixture(scope="module")
def env():
    env = gym.make(ENV_ID, split="valid_unseen", data_root=DATA)
    yield env
    env.close()


def seed_of(env, task_type: str, nth: int = 0) -> int:
    """A seed whose game has this task type (seeds index the game list)."""
    games = env.unwrapped.games
    return [i for i, g in enumerate(games) if TASK_TYPES[g.split("-", 1)[0]] == task_type][nth]


def replay(env, seed: int, commands: list[str]) -> tuple[str, dict]:
    obs, info = env.reset(seed=seed)
    for command in commands:
        obs, _, _, _, info = env.step(command)
        assert info["action_valid"], command
    return obs, info


@needs_data
def test_games_are_alfworlds_valid_unseen_split(env):
    games = env.unwrapped.games
    assert len(games) == 134 and len(set(games)) == 134
    counts = Counter(TASK_TYPES[g.split("-", 1)[0]] for g in games)
    assert counts == VALID_UNSEEN_COUNTS
    assert gym.make(ENV_ID, data_root=DATA, task_types=["pick2", "look"]).unwrapped.games == tuple(
        g for g in games if g.startswith(("pick_two_obj_and_place", "look_at_obj_in_light"))
    )


@needs_data
def test_task_types_take_turns_so_a_small_panel_covers_all_six(env):
    games = env.unwrapped.games
    types = [TASK_TYPES[g.split("-", 1)[0]] for g in games]
    assert types[:6] == list(TASK_TYPES.values()) and types[6:12] == types[:6]
    panel = [env.reset(seed=seed)[1]["task_type"] for seed in range(12)]
    assert Counter(panel) == {t: 2 for t in VALID_UNSEEN_COUNTS}
    for task_type in VALID_UNSEEN_COUNTS:  # within a type, sorted path order
        own = [g for g, t in zip(games, types) if t == task_type]
        assert own == sorted(own)
    assert gym.make(ENV_ID, data_root=DATA).unwrapped.games == games  # the same order in every new env


def play_planner_expert(seeds: list[int]) -> list[str]:
    """Play these games with the planner expert through one env made by gymnasium (50-step TimeLimit from the
    registration), asserting the contract at every step; returns the games' task ids."""
    env = gym.make(ENV_ID, split="valid_unseen", data_root=DATA)
    task_ids = []
    for seed in seeds:
        obs, info = env.reset(seed=seed)
        assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-") and f"Your task is to: {info['task']}." in obs
        assert info["task_type"] in VALID_UNSEEN_COUNTS and not info["won"]
        assert info["task_id"].startswith("json_2.1.1/valid_unseen/") and info["task_id"].endswith("game.tw-pddl")
        task_ids.append(info["task_id"])
        for _ in range(50):
            assert info["admissible_actions"], info["task_id"]
            action = env.unwrapped.expert_action()
            assert action in info["admissible_actions"]
            obs, reward, terminated, truncated, info = env.step(action)
            assert info["action_valid"] and obs != NOTHING
            if terminated or truncated:
                break
            assert reward == 0.0 and not info["won"]
        assert terminated and not truncated and info["won"] and reward == 1.0, info["task_id"]
    env.close()
    return task_ids


@needs_data
def test_planner_expert_wins_a_fixed_sample_of_valid_unseen_games_within_50_steps():
    """Seeds 0..5 (task types take turns: a game of each of the six), split over two worker processes (about 3 s
    of CPU per game). The whole split is lab/tables/alfworld_games.py's job (the expert wins all 134 there)."""
    halves = [list(range(0, 6, 2)), list(range(1, 6, 2))]
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        task_ids = [t for ids in pool.map(play_planner_expert, halves) for t in ids]
    assert len(set(task_ids)) == 6
    types = Counter(TASK_TYPES[t.split("/")[2].split("-", 1)[0]] for t in task_ids)
    assert types == {t: 1 for t in VALID_UNSEEN_COUNTS}


@needs_data
@pytest.mark.parametrize("task_type", ["look", "heat", "pick2"])
def test_every_admissible_action_is_accepted_by_the_engine(env, task_type):
    """From the start and after two expert moves, each admissible command steps the engine (its feedback is
    never the engine's "Nothing happens."); a command is tried in the first of the two states that admits it."""
    seed = seed_of(env, task_type)
    env.reset(seed=seed)
    prefix = [env.unwrapped.expert_action()]
    env.step(prefix[0])
    prefix.append(env.unwrapped.expert_action())
    tried: set[str] = set()
    for depth in (0, 2):
        _, info = replay(env, seed, prefix[:depth])
        admissible = info["admissible_actions"]
        assert admissible and "help" not in admissible
        assert all(a == normalize_command(a) for a in admissible)
        if depth:
            assert set(admissible) - tried  # the expert's moves open commands the start did not admit
        for action in [a for a in admissible if a not in tried]:
            tried.add(action)
            replay(env, seed, prefix[:depth])
            obs, _, _, _, after = env.step(action)
            assert after["action_valid"] and obs != NOTHING, action


@needs_data
def test_random_admissible_walks_are_always_accepted(env):
    rng = np.random.default_rng(0)
    for seed in (5, 60, 125):
        _, info = env.reset(seed=seed)
        for _ in range(25):
            action = info["admissible_actions"][rng.integers(len(info["admissible_actions"]))]
            obs, _, terminated, truncated, info = env.step(action)
            assert info["action_valid"] and obs != NOTHING and info["admissible_actions"]
            if terminated or truncated:
                break


@needs_data
def test_same_seed_gives_the_same_episode_in_a_fresh_env_and_after_other_games(env):
    def trace(e, seed):
        obs, info = e.reset(seed=seed)
        rows = [(obs, info["state_key"], tuple(info["admissible_actions"]), info["task_id"])]
        for i in range(4):
            obs, _, _, _, info = e.step(info["admissible_actions"][(7 * i) % len(info["admissible_actions"])])
            rows.append((obs, info["state_key"], tuple(info["admissible_actions"])))
        return rows

    fresh = gym.make(ENV_ID, data_root=DATA)
    first = trace(env, 7)
    trace(env, 8)  # another game in between
    assert trace(env, 7) == first == trace(fresh, 7)
    assert trace(env, 7 + 134)[0] == first[0]  # seeds index the game list modulo its length
    assert len({row[1] for row in first}) > 1  # the true-state key follows the engine
    env.reset(seed=3)
    fresh.reset(seed=3)
    assert [env.reset()[1]["task_id"] for _ in range(2)] == [fresh.reset()[1]["task_id"] for _ in range(2)]
    fresh.close()


@needs_data
def test_replayed_reset_matches_textworlds_own_reset(env):
    """Reset restores a copy of the loaded initial state instead of translating the PDDL again: check it against
    the engine as ALFWorld builds it."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
    from textworld.envs import PddlEnv

    request = textworld.EnvInfos(won=True, admissible_commands=True, facts=True)
    reference = AlfredInfos(AlfredDemangler(PddlEnv(request), shuffle=False))
    rng = random.Random(0)
    seed = seed_of(env, "clean", 3)
    env.reset(seed=seed)
    reference.load(str(DATA / env.unwrapped.task_id))
    for _ in range(2):  # the second round replays the already loaded game
        obs, info = env.reset(seed=seed)
        state = reference.reset()
        for _ in range(12):
            assert obs == state.feedback
            assert env.unwrapped.state_string() == "\n".join(sorted(str(f) for f in state["facts"]))
            assert info["admissible_actions"] == [c for c in state["admissible_commands"] if c != "help"]
            action = rng.choice(info["admissible_actions"])
            obs, _, _, _, info = env.step(action)
            state, _, _ = reference.step(action)


@needs_data
def test_fuzzed_commands_never_raise_and_change_nothing(env):
    seed = seed_of(env, "cool")
    _, info = replay(env, seed, [])
    env.step(env.unwrapped.expert_action())
    _, _, _, _, info = env.step(env.unwrapped.expert_action())
    admissible = info["admissible_actions"]
    rng = random.Random(0)
    fuzz: list = ["", " ", "\n", "\t\t", "x" * 10_000, "go to " * 2_000, "\x00", "😀 go to", "тумба 1", None, 3]
    while len(fuzz) < 200:
        base = rng.choice(admissible)
        kind = rng.randrange(6)
        if kind == 0:  # drop a character
            i = rng.randrange(len(base))
            candidate = base[:i] + base[i + 1 :]
        elif kind == 1:  # wrong instance number
            candidate = base.rsplit(" ", 1)[0] + f" {rng.randint(40, 999)}"
        elif kind == 2:  # trailing garbage
            candidate = base + rng.choice([" now", "!", " 1", "."])
        elif kind == 3:  # unicode look-alike
            candidate = base.replace("o", "\u043e", 1).replace("a", "\u0430", 1)
        elif kind == 4:  # verb alone or with a made-up object
            candidate = base.split()[0] + " " + rng.choice(["", "it", "everything"])
        else:  # random printable noise
            candidate = "".join(rng.choice("abcdefghij 0123456789") for _ in range(rng.randint(1, 40)))
        if normalize_command(candidate) not in admissible:  # a near miss, not a hit
            fuzz.append(candidate)
    assert len(fuzz) == 200
    raw = env.unwrapped  # 200 steps: past the 50-step TimeLimit, which counts invalid steps too
    for command in fuzz:
        obs, reward, terminated, truncated, after = raw.step(command)
        assert obs == NOTHING and reward == 0.0 and not terminated and not truncated
        assert after["action_valid"] is False
        assert after["state_key"] == info["state_key"] and after["admissible_actions"] == admissible
    _, _, _, _, after = raw.step(admissible[0].upper() + "  ")  # case and spacing are not errors
    assert after["action_valid"] is True


@needs_data
def test_check_env_and_the_text_env_contract():
    env = gym.make(ENV_ID, data_root=DATA)
    check_text_env(env, seed=0, n_steps=10)
    env.close()


@needs_data
def test_handcoded_expert_is_deterministic_and_leaves_global_random_alone():
    def play(seed: int) -> tuple[list[str], bool]:
        env = gym.make(ENV_ID, data_root=DATA)
        env.reset(seed=seed)
        actions, info = [], {"won": False}
        for _ in range(50):
            actions.append(env.unwrapped.expert_action(kind="handcoded"))
            _, _, terminated, _, info = env.step(actions[-1])
            assert info["action_valid"]
            if terminated:
                break
        env.close()
        return actions, info["won"]

    random.seed(123)
    outer = random.getstate()
    probe = gym.make(ENV_ID, data_root=DATA)
    seeds = [seed_of(probe.unwrapped, t) for t in ("pick", "clean", "heat")]
    for seed in seeds:
        actions, won = play(seed)
        assert won and actions[0] == "look"
        assert play(seed) == (actions, True)
    assert random.getstate() == outer


def test_clear_errors_for_missing_data_and_bad_arguments(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="ALFWORLD_DATA.*alfworld-download"):
        gym.make(ENV_ID, data_root=tmp_path / "nowhere")
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"\$ALFWORLD_DATA"):
        gym.make(ENV_ID)
    (tmp_path / "json_2.1.1").mkdir()
    with pytest.raises(FileNotFoundError, match="alfworld-download"):
        gym.make(ENV_ID, split="train")
    for bad in ({"split": "test"}, {"expert": "oracle"}, {"task_types": ["pick3"]}, {"task_types": "pick"}):
        with pytest.raises(ValueError):
            gym.make(ENV_ID, data_root=DATA, **bad)


@needs_data
def test_default_data_root_is_the_checkouts_shared_folder(monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    assert find_data_root() == DATA.resolve()
    assert gagpo_gym.make("ALFWorld-v0").unwrapped.data_root == DATA.resolve()


@needs_data
def test_a_panel_in_worker_processes_gives_the_serial_rows():
    """Issue 24, point 3: a real-engine panel stepped in 2 worker processes has the serial panel's rows. 4 games
    of at most 5 steps in batches of 3 (a short last batch), played by the handcoded expert, which draws from its
    env's seeded RNG in whichever process holds the env (tests/test_eval_results.py has a policy drawing here)."""
    from agents.env_spec import REFERENCE_WRAPPING, EnvSpec
    from agents.evaluation import run_panel

    kwargs = {"split": "valid_unseen", "data_root": str(DATA), "max_episode_steps": 5, "expert": "handcoded"}
    factory = EnvSpec(ENV_ID, kwargs).factory(REFERENCE_WRAPPING)

    def expert(obs, infos, venv, idx):
        return list(venv.call("expert_action", indices=idx))

    serial, parallel = (run_panel(expert, factory, 4, batch_size=3, workers=workers) for workers in (0, 2))
    assert parallel == serial
    rows = serial["episodes"]
    assert [r["seed"] for r in rows] == list(range(4)) and len({r["task_id"] for r in rows}) == 4
    assert all(1 <= r["length"] <= 5 for r in rows)


@needs_data
def test_memory_reads_the_real_engines_feedback(env):
    """wrappers.Memory on real games: every listing the engine prints is remembered for its receptacle, and what
    the memory says is held is what the engine's own ``inventory`` answers (asked after every expert step)."""
    memory_env = Memory(env)
    carried = re.compile(r"You are carrying: an? (.+?)\.")
    listing = re.compile(r"(?:On the|The) ([a-z]+ \d+)(?:,| is open\. In it,) you see (.*?)\.")
    checks = Counter()
    for task_type in ("pick", "clean", "pick2"):
        obs, info = memory_env.reset(seed=seed_of(env, task_type))
        for _ in range(20):
            obs, _, terminated, truncated, info = memory_env.step(env.unwrapped.expert_action())
            memory = memory_env.memory
            for place, listing in re.findall(
                r"(?:On the|The) ([a-z]+ \d+)(?:,| is open\. In it,) you see (.*?)\.", obs
            ):
                assert memory.places[place] == listed_items(listing), obs
                checks["listing"] += 1
            if terminated or truncated:
                break
            inventory, *_ = memory_env.step("inventory")
            held = carried.match(inventory)
            assert memory.holding == (held.group(1) if held else None), inventory
            checks["holding" if held else "empty"] += 1
        assert "Seen: " in memory_env.memory.render()
    assert checks["listing"] >= 6 and checks["holding"] >= 3 and checks["empty"] >= 3, checks


# ----- the train split and the engine's speed-ups ---------------------------------------------------------------
ARCHIVE = DATA / "train.tar.xz"
needs_archive = pytest.mark.skipif(not ARCHIVE.is_file(), reason="../shared/alfworld/train.tar.xz is absent")
# The official train split: 3,553 games (ALFWorld's counts, also in ../shared/alfworld/README.md).
TRAIN_COUNTS = {"pick": 790, "look": 308, "clean": 650, "heat": 459, "cool": 533, "pick2": 813}

# Plays command lists on ALFWorld's engine exactly as ALFWorld builds it, in a process that never imports
# gagpo_gym (so textworld's text generator is its own), and prints what each step showed.
_REFERENCE_PLAYER = """
import json, sys
import textworld
from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
from textworld.envs import PddlEnv
request = textworld.EnvInfos(won=True, admissible_commands=True, facts=True)
out = []
for game, commands in json.load(sys.stdin):
    env = AlfredInfos(AlfredDemangler(PddlEnv(request), shuffle=False))
    env.load(game)
    state = env.reset()
    trace = []
    for command in [None, *commands]:
        if command is not None:
            state, _, _ = env.step(command)
        admissible = [c for c in state["admissible_commands"] if c != "help"]
        trace.append([state.feedback, admissible, sorted(str(f) for f in state["facts"]), bool(state["won"])])
    out.append(trace)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def train_root() -> Path:
    """The checkout's unpacked train split (``make alfworld-train``'s step, done here when it has not been)."""
    from gagpo_gym.envs.alfworld import unpack_train_split

    if not ARCHIVE.is_file():
        pytest.skip("../shared/alfworld/train.tar.xz is absent")
    return unpack_train_split()


@needs_archive
def test_the_train_split_is_alfworlds_3553_games_and_is_found_beside_the_evaluation_splits(train_root, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    env = gym.make(ENV_ID, split="train")
    games = env.unwrapped.games
    assert env.unwrapped.data_root == train_root.resolve() == find_data_root(split="train")
    assert find_data_root(split="valid_seen") == DATA.resolve()  # the evaluation splits still come from shared/
    assert len(games) == len(set(games)) == 3553
    assert Counter(TASK_TYPES[g.split("-", 1)[0]] for g in games) == TRAIN_COUNTS
    trials = {p.parent.name for p in (DATA / "json_2.1.1").glob("valid_*/*/*/game.tw-pddl")}
    assert len(trials) == 274 and not trials & {g.split("/")[1] for g in games}  # no evaluation game is trained on

    obs, info = env.reset(seed=7)
    assert info["task_id"] == f"json_2.1.1/train/{games[7]}" and f"Your task is to: {info['task']}." in obs
    env.close()


@needs_archive
def test_unpacking_is_atomic_and_once(tmp_path):
    from gagpo_gym.envs.alfworld import unpack_train_split

    broken = tmp_path / "broken.tar.xz"
    broken.write_bytes(ARCHIVE.read_bytes()[:200_000])  # an interrupted download: a valid start, then nothing
    with pytest.raises(Exception):  # noqa: B017 (tarfile's or lzma's own error: either way, nothing is left)
        unpack_train_split(broken, tmp_path / "data")
    assert not (tmp_path / "data" / "json_2.1.1" / "train").exists()
    assert [p.name for p in (tmp_path / "data").iterdir()] == ["json_2.1.1"]  # no half-unpacked folder either
    with pytest.raises(FileNotFoundError, match="train archive .* is missing"):
        unpack_train_split(tmp_path / "nowhere.tar.xz", tmp_path / "data")
    (tmp_path / "done" / "json_2.1.1" / "train").mkdir(parents=True)
    assert unpack_train_split(tmp_path / "nowhere.tar.xz", tmp_path / "done") == tmp_path / "done"  # found: no work


def _shown(env, obs: str, info: dict) -> list:
    return [obs, info["admissible_actions"], env.unwrapped.state_string().split("\n"), bool(info["won"])]


@needs_data
def test_the_memoized_engine_shows_what_alfworlds_own_engine_shows():
    """The text generator's memoization and the per-process game cache change no text: random command lists on
    three games, one of them played by two envs of this process in turns (as a rollout group's members are),
    against ALFWorld's engine built the usual way in a process that never loads gagpo_gym."""
    import json
    import subprocess
    import sys

    rng = random.Random(1)
    envs = [gym.make(ENV_ID, split="valid_seen", data_root=DATA) for _ in range(2)]
    plays: list[tuple[str, list[str], list]] = []  # (game file, commands, what our env showed)

    def start(env, seed: int) -> dict:
        obs, info = env.reset(seed=seed)
        play = (str(DATA / info["task_id"]), [], [_shown(env, obs, info)])
        plays.append(play)
        return {"env": env, "info": info, "play": play}

    def step(member: dict) -> None:
        if member["info"]["won"]:
            return
        command = rng.choice(member["info"]["admissible_actions"])
        obs, _, _, _, member["info"] = member["env"].step(command)
        member["play"][1].append(command)
        member["play"][2].append(_shown(member["env"], obs, member["info"]))

    alone = start(envs[0], 2)
    for _ in range(12):
        step(alone)
    group = [start(env, 9) for env in envs]  # one game, two envs: the first translates it, the other copies
    for _ in range(12):
        for member in group:
            step(member)
    alone = start(envs[1], 40)
    for _ in range(12):
        step(alone)
    assert len({p[0] for p in plays}) == 3 and len({tuple(p[1]) for p in plays}) == 4
    reference = subprocess.run(
        [sys.executable, "-c", _REFERENCE_PLAYER],
        input=json.dumps([[game, commands] for game, commands, _ in plays]),
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    for (game, _, ours), theirs in zip(plays, json.loads(reference.stdout), strict=True):
        assert ours == theirs, game
    for env in envs:
        env.close()


@needs_data
def test_a_game_is_translated_once_per_process_however_many_envs_play_it(monkeypatch):
    """fast-downward's translation (0.5-2 s) runs at the first load of a game in the process, not at each reset
    nor in each env of a rollout group."""
    from textworld.envs.pddl import logic

    from gagpo_gym.envs import alfworld

    gym.make(ENV_ID, split="valid_seen", data_root=DATA).close()  # the engine's set-up (its SAS cache) done first
    calls = []
    translate = logic.fast_downward.pddl2sas
    monkeypatch.setattr(logic.fast_downward, "pddl2sas", lambda *a, **k: calls.append(1) or translate(*a, **k))
    monkeypatch.setattr(alfworld, "LOADED_GAMES", type(alfworld.LOADED_GAMES)())
    envs = [gym.make(ENV_ID, split="valid_seen", data_root=DATA) for _ in range(3)]
    for _ in range(2):
        for env in envs:
            env.reset(seed=11)
    assert len(calls) == 2  # one translation of the game: its plain and its optimised SAS task
    envs[0].reset(seed=12)
    assert len(calls) == 4


@needs_data
def test_a_closed_envs_planner_library_serves_the_next_env_and_plays_as_its_own_would(monkeypatch):
    """fast-downward's library is copied to disk and loaded for each env (34 MB; its state is global): a closed env
    gives its copy back and the next env built takes it, where a new copy was made for every env before. The env
    on a used copy shows what an env on a copy of its own shows, the planner's plays included."""
    import fast_downward

    from gagpo_gym.envs import alfworld

    copies: list = []
    load_lib = fast_downward.load_lib
    monkeypatch.setattr(fast_downward, "load_lib", lambda: copies.append(load_lib()) or copies[-1])

    class Pool(list):
        """Envs earlier tests left open close when collected (textworld's __del__), at any time: theirs stay out."""

        def append(self, library: object) -> None:
            if any(library is copy for copy in copies):
                super().append(library)

    pool = Pool()
    monkeypatch.setattr(alfworld, "FREE_LIBRARIES", pool)

    def play(env: gym.Env, seed: int) -> list[tuple[str, list[str]]]:
        obs, info = env.reset(seed=seed)
        shown = [(obs, info["admissible_actions"])]
        for _ in range(6):
            obs, _, _, _, info = env.step(env.unwrapped.expert_action())
            shown.append((obs, info["admissible_actions"]))
        return shown

    first = gym.make(ENV_ID, split="valid_seen", data_root=DATA)
    played = play(first, 3)
    first.close()
    assert pool == copies and len(copies) == 1  # the first env's copy, given back
    second = gym.make(ENV_ID, split="valid_seen", data_root=DATA)
    assert not pool and len(copies) == 1  # taken by the second env: no new copy
    play(second, 4)  # another game on it first
    assert play(second, 3) == played
    third = gym.make(ENV_ID, split="valid_seen", data_root=DATA)  # the second is open: a copy of its own
    assert len(copies) == 2 and play(third, 3) == played
    for env in (second, third):
        env.close()
    assert len(pool) == 2


@needs_data
def test_target_stage_follows_the_engines_facts_along_expert_plays():
    """0 before anything, 1 at a shut receptacle holding a target (the cool game's microwave), 2 where one is in
    view, 3 holding one, 2 again once it is put down in view: along the planner's plays of six games."""
    env = gym.make(ENV_ID, split="valid_seen", data_root=DATA)
    seen: dict[str, list[tuple[str, int]]] = {}
    for seed in range(6):
        _, info = env.reset(seed=seed)
        assert env.unwrapped.target_stage() == 0  # the middle of the room
        steps = []
        for _ in range(50):
            command = env.unwrapped.expert_action()
            _, _, terminated, truncated, info = env.step(command)
            steps.append((command, env.unwrapped.target_stage()))
            if terminated or truncated:
                break
        assert info["won"]
        seen[info["task_type"]] = steps
    for task_type, steps in seen.items():
        taken = [k for k, (command, _) in enumerate(steps) if command.startswith("take ")]
        assert taken and all(steps[k][1] == 3 for k in taken), task_type
        assert all(steps[k - 1][1] == 2 for k in taken), task_type  # a target was in view before each take
        assert steps[-1][1] == (3 if task_type == "look" else 2), task_type  # held under the lamp, else put down
    assert [stage for _, stage in seen["cool"][:2]] == [1, 2]  # a shut microwave holding the target, then opened
    env.close()


@needs_data
def test_a_kept_translation_plays_as_a_fresh_one(tmp_path, monkeypatch):
    """fast-downward's SAS output kept on disk (``SAS_CACHE``): a process that reads it plays what one that
    translated plays, and the task it parses is the one the translator returns (the translation changes none of it)."""
    import io
    from contextlib import redirect_stdout

    import fast_downward.interface

    from gagpo_gym.envs import alfworld as engine

    gym.make(ENV_ID, split="valid_seen", data_root=DATA).close()  # the engine's set-up done first, as in a process
    monkeypatch.setattr(engine, "SAS_CACHE", tmp_path)
    calls: list[tuple[str, str, bool]] = []
    kept = fast_downward.pddl2sas

    def spy(domain: str, problem: str, verbose: bool = False, optimize: bool = False):
        calls.append((domain, problem, optimize))
        return kept(domain, problem, verbose=verbose, optimize=optimize)

    monkeypatch.setattr(fast_downward, "pddl2sas", spy)

    def walk() -> list:
        engine.LOADED_GAMES.clear()  # as a new process: the game is loaded, not copied
        env = gym.make(ENV_ID, split="valid_seen", data_root=DATA)
        rng = random.Random(0)
        obs, info = env.reset(seed=5)
        shown = [_shown(env, obs, info)]
        for _ in range(10):
            if info["won"]:
                break
            obs, _, _, _, info = env.step(rng.choice(info["admissible_actions"]))
            shown.append(_shown(env, obs, info))
        env.close()
        return shown

    fresh = walk()
    assert len(list(tmp_path.rglob("*.sas.gz"))) == 2  # the game's two translations (plain and optimised)
    assert walk() == fresh

    def dump(task) -> str:
        out = io.StringIO()
        with redirect_stdout(out):
            task.dump()
        return out.getvalue()

    assert len(calls) == 4 and calls[:2] == calls[2:]  # each walk loaded the game once: two translations
    for domain, problem, optimize in calls[:2]:
        task, sas = fast_downward.interface.pddl2sas(domain, problem, optimize=optimize)
        assert dump(engine.parsed_task(domain, problem)) == dump(task)
        assert fast_downward.interface.pddl2sas(domain, problem, optimize=optimize)[1] == sas  # deterministic
