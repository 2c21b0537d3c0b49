"""The wrapper layer: grouped vector env (sync/async), state keys, parsing, penalties, history, prompts.

Built-in Maze tasks give realistic, seed-dependent observations; a small counting env defined here checks
who gets stepped (a finished group member must not be) and what it is asked to do.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import gagpo_gym
from agents.config import GAGPOConfig
from agents.env_spec import EnvSpec, text_wrapping
from agents.evaluation import info_at, recorded
from agents.tiny import train_tokenizer
from gagpo_gym.core import TextEnv, state_key
from wrappers import (
    EpisodeStatistics,
    GroupedVectorEnv,
    History,
    InvalidActionPenalty,
    Memory,
    ParseAction,
    PlaceMemory,
    PromptBuilder,
    RevisitPenalty,
    StateKey,
    extract_action,
    parse_key_spec,
    wrap_text_env,
)
from wrappers.memory import listed_items
from wrappers.prompt import CHOOSE_INSTRUCTION, GENERATE_INSTRUCTION, SYSTEM_PROMPT, cut_middle

MAZE = "gagpo_gym/Maze-v0"
SMALL_MAZE = {"width": 3, "height": 3, "min_path": 2, "max_path": 4}


class CountingWalk(TextEnv):
    """Walk right until ``target`` (1..4, drawn from the task seed); counts every ``step`` call it receives."""

    def __init__(self) -> None:
        super().__init__()
        self.step_calls = 0
        self.received: list[Any] = []
        self.target = 1
        self.pos = 0

    def _new_task(self, seed: int | None, options: dict[str, Any]) -> str:
        self.target = int(self.np_random.integers(1, 5))
        self.pos = 0
        self.task, self.task_id = f"Walk right {self.target} times.", f"walk-{self.target}"
        return f"You are at 0 of {self.target}."

    def step(self, action):
        self.step_calls += 1
        self.received.append(action)
        return super().step(action)

    def _execute(self, command: str) -> tuple[str, float, bool]:
        self.pos += 1 if command == "right" else -1
        self.won = self.pos == self.target
        return f"You are at {self.pos} of {self.target}.", float(self.won), self.won

    def admissible_actions(self) -> list[str]:
        return ["left", "right"]

    def state_string(self) -> str:
        return f"walk|{self.target}|{self.pos}"

    def expert_action(self) -> str:
        return "right"

    def calls(self) -> tuple[int, list[Any]]:
        return self.step_calls, list(self.received)


def make_maze(**kwargs: Any) -> gym.Env:
    return wrap_text_env(gagpo_gym.make(MAZE, **SMALL_MAZE), history_length=1, tagged=False, **kwargs)


def rollout(venv: GroupedVectorEnv, seed: int) -> list[tuple]:
    """Play seeded random admissible actions until every member is done; returns everything observed."""
    rng = np.random.default_rng(seed)
    obs, infos = venv.reset(seed=seed)
    trace = [(obs, tuple(infos["state_key"]), tuple(venv.task_seeds), tuple(venv.episode_index))]
    admissible = list(infos["admissible_actions"])
    while venv.active.any():
        actions = [
            admissible[i][rng.integers(len(admissible[i]))] if venv.active[i] else None for i in range(venv.num_envs)
        ]
        obs, rewards, terminated, truncated, infos = venv.step(actions)
        keys = tuple(int(k) if m else None for k, m in zip(infos["state_key"], infos["_state_key"]))
        trace.append((obs, tuple(rewards), tuple(terminated), tuple(truncated), keys))
        for i in np.flatnonzero(infos["_admissible_actions"]):
            admissible[i] = infos["admissible_actions"][i]
    return trace


# ----- GroupedVectorEnv ---------------------------------------------------------------------------------
def test_grouped_env_is_a_gymnasium_vector_env() -> None:
    venv = GroupedVectorEnv(make_maze, num_groups=2, group_size=3)
    try:
        assert isinstance(venv, gym.vector.VectorEnv)
        assert venv.num_envs == 6
        assert venv.group_index.tolist() == [0, 0, 0, 1, 1, 1]
        obs, infos = venv.reset(seed=1)
        assert isinstance(obs, tuple) and all(isinstance(o, str) and o for o in obs)
        assert infos["_state_key"].all() and len(infos["state_key"]) == 6
    finally:
        venv.close()


def test_sync_and_async_give_identical_trajectories() -> None:
    sync = GroupedVectorEnv(make_maze, num_groups=2, group_size=3, mode="sync")
    asyn = GroupedVectorEnv(make_maze, num_groups=2, group_size=3, mode="async", n_workers=2)
    try:
        for seed in (3, 4):
            a, b = rollout(sync, seed), rollout(asyn, seed)
            assert len(a) > 2
            assert a == b
    finally:
        sync.close()
        asyn.close()


def test_members_of_a_group_share_a_task() -> None:
    venv = GroupedVectorEnv(make_maze, num_groups=4, group_size=3)
    try:
        obs, infos = venv.reset(seed=11)
        for g in range(4):
            members = np.flatnonzero(venv.group_index == g)
            assert len({obs[i] for i in members}) == 1
            assert len({int(infos["state_key"][i]) for i in members}) == 1
            assert len({infos["task_id"][i] for i in members}) == 1
        # Four independently drawn Maze tasks: not all the same.
        assert len(set(infos["task_id"])) > 1
        # A group's task is what a plain env gives for the group's task seed.
        single = make_maze()
        first, info = single.reset(seed=int(venv.task_seeds[2]))
        assert first == obs[6] and info["state_key"] == infos["state_key"][6]
    finally:
        venv.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_finished_member_is_not_stepped_and_needs_no_action(mode: str) -> None:
    venv = GroupedVectorEnv(CountingWalk, num_groups=1, group_size=2, mode=mode, n_workers=2)
    try:
        _, infos = venv.reset(options={"task_seeds": [0]})
        target = int(infos["task_id"][0].split("-")[1])
        # Member 0 walks straight to the goal; member 1 walks away from it.
        for t in range(target):
            obs, rewards, terminated, _, infos = venv.step(["right", "left"])
            assert terminated[0] == (t == target - 1)
        assert venv.active.tolist() == [False, True]
        assert rewards[0] == 1.0
        for _ in range(3):  # the finished member gets None and is left alone
            obs, rewards, terminated, truncated, infos = venv.step([None, "left"])
            assert not infos["_state_key"][0] and infos["_state_key"][1]
            assert rewards[0] == 0.0 and not terminated[0] and not truncated[0]
            assert obs[0] == f"You are at {target} of {target}."
        calls = venv.call("calls")
        assert calls[0] == (target, ["right"] * target)
        assert calls[1] == (target + 3, ["left"] * (target + 3))
    finally:
        venv.close()


def test_episode_ids_unique_across_resets() -> None:
    venv = GroupedVectorEnv(CountingWalk, num_groups=2, group_size=2)
    try:
        seen: list[int] = []
        for seed in (0, 0, 1):
            venv.reset(seed=seed)
            seen += venv.episode_index.tolist()
        assert len(seen) == len(set(seen)) == 12
    finally:
        venv.close()


def test_seeded_reset_and_task_seeds_option() -> None:
    venv = GroupedVectorEnv(make_maze, num_groups=3, group_size=2)
    try:
        venv.reset(seed=5)
        first = venv.task_seeds.copy()
        venv.reset()
        assert not np.array_equal(first, venv.task_seeds)  # the sampler moves on
        venv.reset(seed=5)
        assert np.array_equal(first, venv.task_seeds)  # and restarts with the seed
        obs, infos = venv.reset(options={"task_seeds": [7, 8, 7]})
        assert venv.task_seeds.tolist() == [7, 8, 7]
        assert obs[0] == obs[4] and infos["task_id"][0] == infos["task_id"][5]
        assert obs[0] == make_maze().reset(seed=7)[0]
    finally:
        venv.close()


def test_task_pool_limits_the_task_seeds() -> None:
    venv = GroupedVectorEnv(CountingWalk, num_groups=4, group_size=1, task_pool=3)
    try:
        drawn = set()
        for seed in range(6):
            venv.reset(seed=seed)
            drawn |= set(venv.task_seeds.tolist())
        assert drawn == {0, 1, 2}
        venv.reset(options={"task_seeds": [5, 6, 7, 8]})  # an explicit panel is not limited by the pool
        assert venv.task_seeds.tolist() == [5, 6, 7, 8]
    finally:
        venv.close()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_groups": 1, "group_size": 2, "task_pool": 0}, "task_pool must be >= 1"),
        ({"num_groups": 0, "group_size": 2}, "num_groups and group_size"),
        ({"num_groups": 2, "group_size": 0}, "num_groups and group_size"),
        ({"num_groups": 1, "group_size": 2, "mode": "threads"}, "mode must be"),
        ({"num_groups": 2, "group_size": 2, "env_fns": [CountingWalk] * 3}, "expected 4 env factories"),
    ],
)
def test_bad_constructor_arguments(kwargs: dict, match: str) -> None:
    kwargs = {"env_fns": CountingWalk, **kwargs}
    with pytest.raises(ValueError, match=match):
        GroupedVectorEnv(**kwargs)


def test_bad_reset_and_step_arguments() -> None:
    venv = GroupedVectorEnv(CountingWalk, num_groups=2, group_size=2)
    try:
        with pytest.raises(ValueError, match="one seed per group"):
            venv.reset(options={"task_seeds": [1, 2, 3]})
        venv.reset(seed=0)
        with pytest.raises(ValueError, match="expected 4 actions"):
            venv.step(["right"] * 3)
    finally:
        venv.close()


class Fragile(CountingWalk):
    """A CountingWalk whose ``fail_at``-th step call raises (once: later calls work)."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.fail_at = fail_at

    def step(self, action):
        if self.step_calls + 1 == self.fail_at:
            self.step_calls += 1
            raise RuntimeError("boom: the engine crashed")
        return super().step(action)


def fragile_venv(failing_sub_env: int | None) -> GroupedVectorEnv:
    """2 groups x 2 members over 2 workers (worker w holds sub-envs w and w + 2); one sub-env fails at step 2."""
    fns = [functools.partial(Fragile, 2 if i == failing_sub_env else None) for i in range(4)]
    return GroupedVectorEnv(fns, num_groups=2, group_size=2, mode="async", n_workers=2)


def reset_trace(venv: GroupedVectorEnv) -> tuple:
    obs, infos = venv.reset(seed=5)
    steps = venv.step(["right"] * 4)
    return obs, tuple(venv.task_seeds), steps[0], tuple(steps[1]), tuple(infos["state_key"])


def test_async_worker_error_names_the_worker_and_a_retry_works() -> None:
    with contextlib.closing(fragile_venv(None)) as healthy:
        expected = reset_trace(healthy)
    venv = fragile_venv(0)
    try:
        venv.reset(seed=5)
        venv.step(["right"] * 4)
        with pytest.raises(RuntimeError, match="boom") as failure:
            venv.step(["left"] * 4)
        message = str(failure.value)
        assert f"sub-env worker 0 (pid {venv.workers.procs[0].pid}), sub-env 0 raised during step" in message
        with pytest.raises(RuntimeError, match="call reset"):
            venv.step(["left"] * 4)
        assert reset_trace(venv) == expected  # no stale answer from worker 1 is left in its pipe
    finally:
        venv.close()


def test_async_killed_worker_is_reported_and_restarted_by_reset() -> None:
    with contextlib.closing(fragile_venv(None)) as healthy:
        expected = reset_trace(healthy)
    venv = fragile_venv(None)
    try:
        venv.reset(seed=5)
        pid = venv.workers.procs[1].pid
        os.kill(pid, signal.SIGKILL)
        venv.workers.procs[1].join(timeout=10)
        with pytest.raises(RuntimeError, match=rf"sub-env worker 1 \(pid {pid}\) died with exit code -9"):
            venv.step(["right"] * 4)
        assert reset_trace(venv) == expected and venv.workers.procs[1].pid != pid
    finally:
        venv.close()


def test_async_workers_leave_ctrl_c_to_the_parent(capfd) -> None:
    """Ctrl-C reaches every process of the group; workers ignore it (no traceback each) and go on serving."""
    with contextlib.closing(fragile_venv(None)) as healthy:
        expected = reset_trace(healthy)
    venv = fragile_venv(None)
    try:
        venv.reset(seed=5)
        pids = [proc.pid for proc in venv.workers.procs]
        for pid in pids:
            os.kill(pid, signal.SIGINT)
        time.sleep(0.5)
        assert all(proc.is_alive() for proc in venv.workers.procs)
        assert reset_trace(venv) == expected and [proc.pid for proc in venv.workers.procs] == pids
    finally:
        venv.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


class Slow(CountingWalk):
    def __init__(self, delay: float = 0.0) -> None:
        super().__init__()
        self.delay = delay

    def step(self, action):
        time.sleep(self.delay)
        return super().step(action)


def test_async_call_interrupted_while_waiting_leaves_no_stale_answer() -> None:
    """A KeyboardInterrupt while the workers step leaves their answers unread; the next reset must not read them."""
    fns = [functools.partial(Slow, 0.5)] * 4
    with contextlib.closing(GroupedVectorEnv(fns, 2, 2, mode="async", n_workers=2)) as healthy:
        expected = reset_trace(healthy)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    venv = GroupedVectorEnv(fns, 2, 2, mode="async", n_workers=2)
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        venv.reset(seed=5)
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(KeyboardInterrupt):
            venv.step(["right"] * 4)
        with pytest.raises(RuntimeError, match="call reset"):
            venv.step(["right"] * 4)
        assert reset_trace(venv) == expected
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        venv.close()


# ----- StateKey -----------------------------------------------------------------------------------------
def test_state_key_granularities() -> None:
    base = functools.partial(gagpo_gym.make, MAZE, **SMALL_MAZE)
    true_env, obs_env, hist_env = (
        StateKey(base(), "state"),
        StateKey(base(), "observation"),
        StateKey(base(), "history:2"),
    )
    outs = [env.reset(seed=2) for env in (true_env, obs_env, hist_env)]
    (obs, t_info), (_, o_info), (_, h_info) = outs
    assert t_info["state_key"] == t_info["true_state_key"] == state_key(true_env.unwrapped.state_string())
    assert o_info["state_key"] == state_key(obs) and o_info["true_state_key"] == t_info["state_key"]
    assert h_info["state_key"] == state_key(obs)
    previous = obs
    for _ in range(3):
        action = true_env.unwrapped.admissible_actions()[0]
        results = [env.step(action) for env in (true_env, obs_env, hist_env)]
        (obs, *_, t_info), (_, *_, o_info), (_, *_, h_info) = results
        assert t_info["state_key"] == state_key(true_env.unwrapped.state_string())
        assert o_info["state_key"] == state_key(obs)
        # history:2 = the last two observations and the action between them.
        assert h_info["state_key"] == state_key(f"{previous}\n> {action}\n{obs}")
        assert h_info["true_state_key"] == t_info["state_key"]
        previous = obs


def test_history_key_separates_paths_that_the_state_key_merges() -> None:
    env = StateKey(CountingWalk(), "history:2")
    env.reset(seed=0)
    *_, via_left = env.step("left")
    *_, back = env.step("right")  # at 0 again, arrived from -1
    env.reset(seed=0)
    *_, start = env.step("bogus")  # at 0, stayed (invalid)
    assert back["true_state_key"] == start["true_state_key"]
    assert back["state_key"] != start["state_key"]
    assert via_left["state_key"] != back["state_key"]


@pytest.mark.parametrize("spec", ["", "obs", "history", "history:0", "history:x", "state:2"])
def test_bad_state_key_spec(spec: str) -> None:
    with pytest.raises(ValueError, match="state key must be"):
        parse_key_spec(spec)
    with pytest.raises(ValueError, match="state key must be"):
        StateKey(CountingWalk(), spec)


# ----- ParseAction, InvalidActionPenalty, History -------------------------------------------------------
def test_extract_action() -> None:
    assert extract_action("<think>east is close</think><action> go east </action>", tagged=True) == "go east"
    assert extract_action("<ACTION>a</ACTION> then <action>b</action>", tagged=True) == "b"
    assert extract_action("<action>multi\nline</action>", tagged=True) == "multi\nline"
    assert extract_action("go east", tagged=True) is None
    assert extract_action("<action>unclosed", tagged=True) is None
    assert extract_action("  go east \n", tagged=False) == "go east"
    assert extract_action(None, tagged=True) is None  # type: ignore[arg-type]


def test_parse_action_tagged_and_untagged() -> None:
    env = ParseAction(CountingWalk(), tagged=True)
    env.reset(seed=0)
    obs, reward, _, _, info = env.step("<think>go right</think>\n<action>Right</action>")
    assert info["action_parsed"] and info["action_valid"] and obs.startswith("You are at 1 of ")
    assert env.unwrapped.received[-1] == "Right"
    state = env.unwrapped.state_string()
    obs, reward, terminated, truncated, info = env.step("right")  # no tags: not parsed
    assert not info["action_parsed"] and not info["action_valid"]
    assert env.unwrapped.received[-1] == "" and env.unwrapped.state_string() == state
    assert (obs, reward, terminated, truncated) == (CountingWalk.invalid_feedback, 0.0, False, False)
    plain = ParseAction(CountingWalk(), tagged=False)
    plain.reset(seed=0)
    *_, info = plain.step(" right ")
    assert info["action_parsed"] and info["action_valid"]


@pytest.mark.parametrize(
    "garbage", [None, 17, b"<action>right</action>", "", "<action></action>", "\x00\xff" * 50, "<" * 5000]
)
def test_parse_action_never_raises_on_garbage(garbage: Any) -> None:
    env = InvalidActionPenalty(ParseAction(CountingWalk(), tagged=True), penalty=0.25)
    env.reset(seed=0)
    state = env.unwrapped.state_string()
    obs, reward, terminated, truncated, info = env.step(garbage)
    assert not info["action_valid"]
    assert reward == -0.25 and not terminated and not truncated
    assert env.unwrapped.state_string() == state


def test_invalid_action_penalty() -> None:
    env = InvalidActionPenalty(CountingWalk(), penalty=0.05)
    env.reset(options=None, seed=0)
    target = env.unwrapped.target
    *_, reward, _, _, info = env.step("jump")
    assert reward == pytest.approx(-0.05) and not info["action_valid"]
    *_, reward, _, _, info = env.step("left")
    assert reward == 0.0 and info["action_valid"]
    env.reset(seed=0)
    for _ in range(target):
        _, reward, terminated, _, _ = env.step("right")
    assert terminated and reward == 1.0  # the success reward is untouched
    assert wrap_text_env(CountingWalk()).get_wrapper_attr("penalty") == 0.01  # the documented default
    with pytest.raises(ValueError, match="penalty must be >= 0"):
        InvalidActionPenalty(CountingWalk(), penalty=-0.1)


def test_revisit_penalty_charges_valid_steps_back_to_a_visited_state() -> None:
    env = EpisodeStatistics(RevisitPenalty(InvalidActionPenalty(StateKey(CountingWalk()), penalty=0.05), penalty=0.2))
    env.reset(seed=0)
    target = env.unwrapped.target
    _, reward, *_, info = env.step("left")  # 0 -> -1: a new state
    assert reward == 0.0 and not info["revisit"]
    _, reward, *_, info = env.step("right")  # -1 -> 0: back at the start
    assert reward == pytest.approx(-0.2) and info["revisit"]
    _, reward, *_, info = env.step("jump")  # invalid: the state stays, only the invalid penalty is charged
    assert reward == pytest.approx(-0.05) and not info["revisit"] and not info["action_valid"]
    _, reward, *_, info = env.step("left")  # -1 again
    assert reward == pytest.approx(-0.2) and info["revisit"]
    for _ in range(target + 1):
        _, reward, terminated, _, info = env.step("right")
    assert terminated and reward == 1.0 and info["episode"]["revisits"] == 3  # 0 once more, then new states
    assert info["episode"]["r"] == pytest.approx(1.0 - 3 * 0.2 - 0.05)
    env.reset(seed=0)  # a new episode remembers nothing
    _, reward, *_, info = env.step("left")
    assert reward == 0.0 and not info["revisit"]
    counting = wrap_text_env(CountingWalk(), tagged=False)  # the default penalty 0 only counts
    counting.reset(seed=0)
    counting.step("left")
    _, reward, *_, info = counting.step("right")
    assert reward == 0.0 and info["revisit"]
    with pytest.raises(ValueError, match="revisit penalty must be >= 0"):
        RevisitPenalty(CountingWalk(), penalty=-0.1)


def test_history_keeps_the_last_pairs() -> None:
    env = History(CountingWalk(), length=2)
    obs0, info = env.reset(seed=3)
    assert info["history"] == []
    obs1, *_, info = env.step("left")
    assert info["history"] == [[obs0, "left"]]
    obs2, *_, info = env.step("bogus")
    assert info["history"] == [[obs0, "left"], [obs1, "bogus"]]
    _, *_, info = env.step("right")
    assert info["history"] == [[obs1, "bogus"], [obs2, "right"]]
    _, info = env.reset(seed=3)
    assert info["history"] == []
    none = History(CountingWalk(), length=0)
    none.reset(seed=0)
    *_, info = none.step("left")
    assert info["history"] == []
    with pytest.raises(ValueError, match="history length"):
        History(CountingWalk(), length=-1)


def test_wrap_text_env_stack_order() -> None:
    env = wrap_text_env(CountingWalk(), key="observation", penalty=0.5, history_length=1, tagged=True)
    layers = [env]
    while layers[-1] is not env.unwrapped:
        layers.append(layers[-1].env)
    assert [type(w).__name__ for w in layers[:-1]] == [
        "EpisodeStatistics",
        "ParseAction",
        "History",
        "RevisitPenalty",
        "InvalidActionPenalty",
        "StateKey",
    ]
    assert isinstance(layers[-1], CountingWalk)
    obs0, _ = env.reset(seed=0)
    obs, reward, _, _, info = env.step("no tags here")
    assert reward == -0.5 and not info["action_parsed"] and info["state_key"] == state_key(obs)
    # History sits inside ParseAction: it records the command the env received (here: none could be parsed).
    assert info["history"] == [[obs0, ""]]
    assert env.unwrapped.received == [""]


# ----- EpisodeStatistics --------------------------------------------------------------------------------
def layers(env: gym.Env) -> list[str]:
    names = [type(env).__name__]
    while hasattr(env, "env"):
        env = env.env
        names.append(type(env).__name__)
    return names


def play_expert(env: gym.Env, first: list[str] = ()) -> tuple[list[float], list[dict], bool, bool]:
    """Send ``first`` (raw model outputs), then the expert's tagged commands until the episode ends."""
    rewards, infos, terminated, truncated = [], [], False, False
    for text in first:
        _, reward, terminated, truncated, info = env.step(text)
        rewards.append(reward)
        infos.append(info)
    while not (terminated or truncated):
        _, reward, terminated, truncated, info = env.step(f"<action>{env.unwrapped.expert_action()}</action>")
        rewards.append(reward)
        infos.append(info)
    return rewards, infos, terminated, truncated


def test_episode_statistics_record_a_hand_played_maze_episode() -> None:
    env = wrap_text_env(gym.make(MAZE, **SMALL_MAZE), penalty=0.25, tagged=True)
    assert isinstance(env, EpisodeStatistics) and isinstance(env, gym.wrappers.RecordEpisodeStatistics)
    _, info = env.reset(seed=4)
    assert "episode" not in info
    # unparsable output (also invalid: ParseAction sends ""), a parsed command the maze rejects, a valid no-goal move
    rewards, infos, terminated, truncated = play_expert(env, ["go east", "<action>fly away</action>"])
    assert terminated and not truncated
    assert all("episode" not in i for i in infos[:-1])  # nothing before the last step
    record = infos[-1]["episode"]
    assert set(record) == {"r", "l", "t", "invalid", "unparsed", "revisits", "won", "score"}
    assert [i["action_parsed"] for i in infos[:2]] == [False, True] and not any(i["action_valid"] for i in infos[:2])
    assert record["invalid"] == 2 and record["unparsed"] == 1
    assert record["l"] == len(rewards) > 2
    total = 0.0
    for r in rewards:
        total += float(r)
    assert record["r"] == total and type(record["r"]) is float  # the penalised rewards, summed in step order
    assert record["r"] == pytest.approx(1.0 - 0.5)
    assert record["won"] is True and record["score"] == 1.0  # no info["score"]: float(won)
    assert record["t"] >= 0.0
    assert list(env.return_queue) == [total] and list(env.length_queue) == [record["l"]] and env.episode_count == 1
    # a reset starts a fresh tally: the expert alone, no invalid or unparsed step
    env.reset(seed=4)
    rewards, infos, *_ = play_expert(env)
    record = infos[-1]["episode"]
    assert (record["invalid"], record["unparsed"], record["l"], record["r"]) == (0, 0, len(rewards), 1.0)
    assert record["revisits"] == 0  # the expert never walks back into a cell it left
    assert env.episode_count == 2


def test_episode_statistics_on_a_truncated_lost_episode() -> None:
    env = wrap_text_env(gym.make(MAZE, max_episode_steps=3, **SMALL_MAZE), penalty=0.1, tagged=False)
    env.reset(seed=0)
    outputs = []
    for text in ("fly", "<action>north</action>", "dance"):  # untagged mode: all parse, none is a maze command
        outputs.append(env.step(text))
    *_, terminated, truncated, info = outputs[-1]
    assert truncated and not terminated and all("episode" not in o[4] for o in outputs[:-1])
    record = info["episode"]
    assert (record["l"], record["invalid"], record["unparsed"], record["won"], record["score"]) == (3, 3, 0, False, 0.0)
    assert record["r"] == (0.0 - 0.1) - 0.1 - 0.1


class ScoredWalk(CountingWalk):
    """CountingWalk with float32 rewards of 0.1 per step and a partial-credit ``info["score"]``."""

    def _execute(self, command: str) -> tuple[str, float, bool]:
        obs, _, done = super()._execute(command)
        return obs, 0.1, done

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, np.float32(reward), terminated, truncated, {**info, "score": 0.25}


def test_episode_statistics_sums_rewards_as_python_floats_and_reads_the_score() -> None:
    env = EpisodeStatistics(ScoredWalk())
    env.reset(seed=1)
    rewards, terminated = [], False
    while not terminated:
        _, reward, terminated, _, info = env.step("right")
        rewards.append(reward)
    assert len(rewards) >= 2 and all(isinstance(r, np.float32) for r in rewards)
    record = info["episode"]
    expected = np.zeros(1)  # the hand tallies' float64 accumulator
    for r in rewards:
        expected[0] += r
    assert type(record["r"]) is float and record["r"] == expected[0]
    assert record["score"] == 0.25 and record["won"] is True


def test_an_inner_record_episode_statistics_is_replaced_by_the_outer_record() -> None:
    env = wrap_text_env(gym.wrappers.RecordEpisodeStatistics(gym.make(MAZE, **SMALL_MAZE)), penalty=0.25)
    env.reset(seed=2)
    rewards, infos, *_ = play_expert(env, ["nonsense"])
    record = infos[-1]["episode"]
    assert record["unparsed"] == 1 and record["r"] == pytest.approx(0.75)  # the outer record: with the penalty


def test_episode_statistics_through_the_grouped_vector_env() -> None:
    def make() -> gym.Env:
        return wrap_text_env(gagpo_gym.make(MAZE, **SMALL_MAZE), penalty=0.5)

    venv = GroupedVectorEnv(make, num_groups=1, group_size=2)
    try:
        venv.reset(options={"task_seeds": [3]})
        returns, lengths = np.zeros(2), [0, 0]
        records: dict[int, dict] = {}
        while venv.active.any():  # both follow the expert, member 1 after sending garbage twice
            idx = np.flatnonzero(venv.active)
            actions: list[Any] = [None, None]
            for i, expert in zip(idx, venv.call("expert_action", indices=idx)):
                actions[i] = "garbage" if i == 1 and lengths[1] < 2 else f"<action>{expert}</action>"
            _, rewards, terminated, truncated, infos = venv.step(actions)
            for i in idx:
                returns[i] += rewards[i]
                lengths[i] += 1
                info = info_at(infos, int(i))
                if terminated[i] or truncated[i]:
                    records[int(i)] = info["episode"]
                else:
                    assert "episode" not in info
        assert sorted(records) == [0, 1]
        for i in (0, 1):
            assert records[i]["r"] == returns[i] and records[i]["l"] == lengths[i] and records[i]["won"]
        assert (records[0]["invalid"], records[0]["unparsed"]) == (0, 0)
        assert (records[1]["invalid"], records[1]["unparsed"]) == (2, 2)
    finally:
        venv.close()


def test_episode_statistics_in_gymnasiums_own_vector_env() -> None:
    venv = gym.vector.SyncVectorEnv([lambda: wrap_text_env(gym.make(MAZE, max_episode_steps=2, **SMALL_MAZE))] * 2)
    try:
        venv.reset(seed=0)
        _, _, _, _, infos = venv.step(["<action>fly</action>", "nothing"])
        assert "episode" not in infos
        _, _, _, truncated, infos = venv.step(["<action>fly</action>", "nothing"])
        assert truncated.all() and infos["_episode"].all()
        assert infos["episode"]["l"].tolist() == [2, 2] and infos["episode"]["invalid"].tolist() == [2, 2]
        assert infos["episode"]["unparsed"].tolist() == [0, 2]
        venv.step(["<action>fly</action>", "nothing"])  # gymnasium's next-step autoreset
        _, _, _, _, infos = venv.step(["<action>fly</action>", "nothing"])
        assert "episode" not in infos  # the reset started a fresh tally
    finally:
        venv.close()


def test_every_env_the_agent_plays_has_one_episode_statistics() -> None:
    spec = EnvSpec(MAZE, dict(SMALL_MAZE))
    for mode in ("choose", "generate"):  # what EnvSpec.vector builds each training sub-env with
        stack = layers(spec.factory(text_wrapping(GAGPOConfig(action_mode=mode)))())
        assert stack[0] == "EpisodeStatistics" and stack.count("EpisodeStatistics") == 1
    # evaluation panels: a wrapped factory keeps its one record, a bare env gets one
    assert layers(recorded(spec.factory(text_wrapping(GAGPOConfig())))).count("EpisodeStatistics") == 1
    assert layers(recorded(spec.factory()))[0] == "EpisodeStatistics"


# ----- PromptBuilder ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer():
    corpus = [f"You are at {i} of {j}." for i in range(-5, 6) for j in range(1, 5)] + ["left | right"]
    return train_tokenizer(corpus, vocab_size=400)


def test_prompt_uses_the_chat_template(tokenizer) -> None:
    builder = PromptBuilder(tokenizer, action_mode="generate")
    ids = builder.build("Walk right.", [], "You are at 0 of 3.", ["left", "right"])
    text = tokenizer.decode(ids)
    assert text.startswith(f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n")
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert "Task: Walk right." in text and "Current observation: You are at 0 of 3." in text
    assert "Admissible actions: left | right" in text and GENERATE_INSTRUCTION in text
    choose = tokenizer.decode(PromptBuilder(tokenizer, action_mode="choose").build("t", [], "o", ["a"]))
    assert CHOOSE_INSTRUCTION in choose and GENERATE_INSTRUCTION not in choose
    hidden = tokenizer.decode(PromptBuilder(tokenizer, show_admissible=False).build("t", [], "o", ["a"]))
    assert "Admissible actions" not in hidden


def test_prompt_without_chat_template(tokenizer) -> None:
    plain = train_tokenizer(["You are at 0 of 3."], vocab_size=300)
    plain.chat_template = None
    text = plain.decode(PromptBuilder(plain, action_mode="choose").build("t", [], "You are at 0 of 3.", ["a"]))
    assert text.startswith(SYSTEM_PROMPT) and text.endswith("\n\nAnswer:") and "<|im_start|>" not in text


def test_prompt_truncates_history_oldest_first_never_the_observation(tokenizer) -> None:
    history = [[f"You are at {i} of 4.", "right"] for i in range(-5, 0)]
    current = "You are at 0 of 4."
    builder = PromptBuilder(tokenizer, action_mode="choose", max_prompt_tokens=10_000)
    full = builder.build("Walk.", history, current, ["left", "right"])
    assert builder.truncated_count == 0
    budget = len(builder.build("Walk.", history[-2:], current, ["left", "right"]))  # two recent steps fit
    small = PromptBuilder(tokenizer, action_mode="choose", max_prompt_tokens=budget)
    ids = small.build("Walk.", history, current, ["left", "right"])
    text = tokenizer.decode(ids)
    assert len(ids) <= budget < len(full)
    assert small.truncated_count == 1 and small.overflow_count == 0
    assert "You are at -2 of 4." in text and "You are at -1 of 4." in text
    assert "You are at -3 of 4." not in text and "You are at -5 of 4." not in text
    assert f"Current observation: {current}" in text
    # A budget that not even the bare prompt fits: the observation is cut to the marker, the overflow counted, and
    # the prompt keeps its last 16 tokens (an engine sized for the budget is never handed more).
    tiny = PromptBuilder(tokenizer, action_mode="choose", max_prompt_tokens=16)
    long_obs = "You are at 0 of 4. " * 20
    ids = tiny.build("Walk.", history, long_obs, ["left"])
    bare = PromptBuilder(tokenizer, action_mode="choose").build("Walk.", [], cut_middle(long_obs, 0), ["left"])
    assert len(bare) > 16 and ids == bare[-16:]
    assert f"[... {len(long_obs)} characters cut ...]" in tokenizer.decode(bare)
    assert tiny.overflow_count == 1 and tiny.truncated_count == 0 and tiny.observation_cuts == 1


def test_prompt_drops_all_history_before_cutting_the_observation(tokenizer) -> None:
    """No step of history fits, the bare prompt does: every step is dropped and the observation stays whole."""
    history = [["You are at 1 of 4. " * 30, "left"]]  # one long step
    current = "You are at 0 of 4. " * 5
    bare = PromptBuilder(tokenizer, action_mode="choose").build("Walk.", [], current, ["left", "right"])
    builder = PromptBuilder(tokenizer, action_mode="choose", max_prompt_tokens=len(bare))
    ids = builder.build("Walk.", history, current, ["left", "right"])
    assert "characters cut" not in tokenizer.decode(ids) and ids == bare
    assert builder.truncated_count == 1 and builder.observation_cuts == 0 and builder.overflow_count == 0
    # One token less and the observation is cut after all (the history is gone either way).
    tighter = PromptBuilder(tokenizer, action_mode="choose", max_prompt_tokens=len(bare) - 1)
    cut = tokenizer.decode(tighter.build("Walk.", history, current, ["left", "right"]))
    assert "characters cut" in cut and "Recent steps" not in cut and tighter.observation_cuts == 1


def test_prompt_cuts_a_huge_observation_keeping_head_and_tail(tokenizer) -> None:
    head, tail = "You are at 0 of 4. The HEAD of the page.", "The TAIL of the page. You are at 3 of 4."
    filler = " ".join(f"row {i} of 4" for i in range(10_000))
    observation = f"{head} {filler} {tail}"
    assert len(observation) > 100_000
    builder = PromptBuilder(tokenizer, action_mode="choose", max_prompt_tokens=512)
    ids = builder.build("Walk.", [["You are at 1 of 4.", "right"]], observation, ["left", "right"])
    text = tokenizer.decode(ids)
    assert len(ids) <= 512
    assert f"Current observation: {head}" in text and tail in text and "Admissible actions: left | right" in text
    cut = re.search(r"\[\.\.\. (\d+) characters cut \.\.\.\]", text)
    assert cut and int(cut.group(1)) > len(observation) // 2 and "Recent steps" not in text
    assert builder.observation_cuts == 1 and builder.truncated_count == 1 and builder.overflow_count == 0
    # As much of the observation as fits: one character more would not.
    kept = len(observation) - int(cut.group(1))
    assert ids == builder.encode(
        builder.render(builder.user_message("Walk.", [], cut_middle(observation, kept), ["left", "right"]))
    )
    longer = builder.user_message("Walk.", [], cut_middle(observation, kept + 1), ["left", "right"])
    assert len(builder.encode(builder.render(longer))) > 512
    small = builder.build("Walk.", [], "You are at 1 of 4.", ["left"])  # a short observation is never cut
    assert "characters cut" not in tokenizer.decode(small) and builder.observation_cuts == 1


def test_cut_middle_keeps_head_and_tail_around_the_marker() -> None:
    text = "abcdefghij"
    assert cut_middle(text, 4) == "ab\n[... 6 characters cut ...]\nij"
    assert cut_middle(text, 5) == "abc\n[... 5 characters cut ...]\nij"  # an odd character goes to the head
    assert cut_middle(text, 0) == "\n[... 10 characters cut ...]\n"
    assert cut_middle(text, 10) == text and cut_middle(text, 11) == text
    assert cut_middle(text, 9) == "abcde\n[... 1 characters cut ...]\nghij"


def test_user_message_layout(tokenizer) -> None:
    builder = PromptBuilder(tokenizer, action_mode="choose")
    message = builder.user_message("Walk.", [["o1", "a1"], ["o2", "a2"]], "now", ["x", "y"])
    assert message == (
        "Task: Walk.\n\nRecent steps:\nObservation: o1\nAction: a1\nObservation: o2\nAction: a2\n\n"
        f"Current observation: now\n\nAdmissible actions: x | y\n\n{CHOOSE_INSTRUCTION}"
    )
    assert builder.user_message("", [], "now", []) == f"Current observation: now\n\n{CHOOSE_INSTRUCTION}"


def test_prompt_counters_add_up_and_an_overflow_keeps_the_cut_marker(tokenizer) -> None:
    long_obs = "You are at 0 of 4. " * 20
    bare = PromptBuilder(tokenizer, action_mode="choose").build("Walk.", [], cut_middle(long_obs, 0), ["left"])
    history = [["You are at 1 of 4.", "left"]]
    # A budget of exactly the bare prompt (the observation cut to the marker) is no overflow: the cut fits.
    exact = PromptBuilder(tokenizer, action_mode="choose", max_prompt_tokens=len(bare))
    assert exact.build("Walk.", history, long_obs, ["left"]) == bare and exact.overflow_count == 0
    # One token less: an overflow, the prompt's end (marker included) kept; counted once per prompt.
    short = PromptBuilder(tokenizer, action_mode="choose", max_prompt_tokens=len(bare) - 1)
    for _ in range(2):
        assert short.build("Walk.", history, long_obs, ["left"]) == bare[1:]
    assert (short.overflow_count, short.observation_cuts, short.truncated_count) == (2, 2, 0)
    fits = PromptBuilder(tokenizer, action_mode="choose", max_prompt_tokens=len(bare) + 40)
    for _ in range(2):
        fits.build("Walk.", history, long_obs, ["left"])  # history dropped, observation cut
        fits.build("Walk.", history * 3, "You are at 0 of 4.", ["left"])  # history dropped only
    assert (fits.truncated_count, fits.observation_cuts, fits.overflow_count) == (4, 2, 0)
    assert PromptBuilder(tokenizer).max_prompt_tokens == 1024


def test_prompt_builder_bad_arguments(tokenizer) -> None:
    with pytest.raises(ValueError, match="action_mode"):
        PromptBuilder(tokenizer, action_mode="chat")
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        PromptBuilder(tokenizer, max_prompt_tokens=8)


# ----- Unicode end to end -------------------------------------------------------------------------------
class Greeter(TextEnv):
    """Greets in several scripts; the greeting to answer with is the task."""

    def _new_task(self, seed: int | None, options: dict[str, Any]) -> str:
        self.task, self.task_id, self.last = "Répondez « 你好 » ☕", "greet", ""
        return "Café ☕ … 你好"

    def _execute(self, command: str) -> tuple[str, float, bool]:
        self.last, self.won = command, command == "你好"
        return f"Vous: {command} — ça va ?", float(self.won), self.won

    def admissible_actions(self) -> list[str]:
        return ["你好", "bonjour café"]

    def state_string(self) -> str:
        return f"greet|{self.last}"

    def expert_action(self) -> str:
        return "你好"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_unicode_survives_wrappers_vector_env_and_prompt(tokenizer, mode: str) -> None:
    venv = GroupedVectorEnv(lambda: wrap_text_env(Greeter(), history_length=1), 1, 2, mode=mode)
    try:
        obs, infos = venv.reset(seed=0)
        assert obs == ("Café ☕ … 你好",) * 2 and list(infos["task"]) == ["Répondez « 你好 » ☕"] * 2
        obs, rewards, *_, infos = venv.step(["<action>bonjour café</action>", "<action>你好</action>"])
        assert obs == ("Vous: bonjour café — ça va ?", "Vous: 你好 — ça va ?") and list(rewards) == [0.0, 1.0]
        builder = PromptBuilder(tokenizer, action_mode="generate")
        ids = builder.build(infos["task"][0], infos["history"][0], obs[0], list(infos["admissible_actions"][0]))
        text = tokenizer.decode(ids)
        assert "Task: Répondez « 你好 » ☕" in text and "Observation: Café ☕ … 你好\nAction: bonjour café" in text
        assert "Current observation: Vous: bonjour café — ça va ?" in text and "你好 | bonjour café" in text
    finally:
        venv.close()


# ----- the episode's memory (wrappers.memory) ------------------------------------------------------------------
def test_place_memory_reads_alfworlds_phrasing() -> None:
    memory = PlaceMemory.of([
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you see "
        "a cabinet 1, a countertop 1, a drawer 1, and a microwave 1.\n\nYour task is to: heat some apple and put it "
        "in countertop.",
        "You arrive at cabinet 1. The cabinet 1 is closed.",
        "You arrive at countertop 1. On the countertop 1, you see a apple 1, a butterknife 2, and a spoon 1.",
        "You pick up the apple 1 from the countertop 1.",
        "You arrive at drawer 1. The drawer 1 is closed.",
        "You open the drawer 1. The drawer 1 is open. In it, you see nothing.",
        "Nothing happens.",  # unrecognised: changes nothing
        "You arrive at microwave 1. The microwave 1 is closed.",
        "You heat the apple 1 using the microwave 1.",
        "You arrive at countertop 1. On the countertop 1, you see a butterknife 2, and a spoon 1.",
        "You move the apple 1 to the countertop 1.",
    ])  # fmt: skip
    assert memory.places == {
        "cabinet 1": None, "countertop 1": ["butterknife 2", "spoon 1", "apple 1"], "drawer 1": [], "microwave 1": None,
    }  # fmt: skip
    assert memory.holding is None and memory.done == ["heat apple 1"]
    assert memory.render() == (
        "Seen: cabinet 1 (closed), countertop 1 (butterknife 2, spoon 1, apple 1), drawer 1 (nothing), "
        "microwave 1 (closed). Done: heat apple 1."
    )
    assert PlaceMemory.of(["You pick up the cup 2 from the shelf 3."]).render() == "Holding: cup 2."
    assert PlaceMemory().render() == "" and listed_items("a pen 1, and a pencil 2") == ["pen 1", "pencil 2"]


def test_memory_knows_what_the_searching_expert_knows() -> None:
    """On full-size MiniHouse houses, with the searching expert and random actions mixed: after every step the
    memory (from the text alone) holds exactly the expert's knowledge (from the true state, where it looked)."""
    rng = np.random.default_rng(0)
    env = Memory(gym.make("gagpo_gym/MiniHouse-v0", size="full"))
    steps, verbs = 0, set()
    for seed in range(12):
        obs, info = env.reset(seed=seed)
        for _ in range(40):
            admissible = info["admissible_actions"]
            closing = [a for a in admissible if a.startswith("close ")]
            if closing and rng.random() < 0.3:  # closed again: the memory keeps what it saw inside
                action = closing[0]
            else:
                action = env.unwrapped.expert_action("search") if rng.random() < 0.6 else rng.choice(admissible)
            obs, _, terminated, truncated, info = env.step(action)
            verbs.add(str(action).split()[0])
            house, expert, memory = env.unwrapped.house, env.unwrapped.searcher, env.memory
            names, things = house.rec_name, house.obj_name
            assert list(memory.places) == list(dict.fromkeys(memory.places))  # one entry per place
            assert set(memory.places) == {names[r] for r in expert.openable}
            for r in expert.openable:
                shown, known = memory.places[names[r]], expert.seen.get(r)
                # the same items (a moved one is listed last until the place is looked at again)
                assert (None if shown is None else sorted(shown)) == (
                    None if known is None else sorted(things[o] for o in known)
                )
            assert memory.holding == (None if house.held < 0 else things[house.held])
            assert info["memory"] == memory.render()
            steps += 1
            if terminated or truncated:
                break
    assert steps > 150 and {"take", "move", "open", "close", "go"} <= verbs
