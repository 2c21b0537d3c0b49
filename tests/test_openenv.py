"""The OpenEnv bridges on loopback: gagpo_gym.serve serves an env with OpenEnv's server, OpenEnv-v0 plays it back
with OpenEnv's client, and the round trip is the in-process env step for step."""

from __future__ import annotations

import contextlib
import functools
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("openenv")

import gagpo_gym  # noqa: E402
from gagpo_gym.envs.openenv import OpenEnvError, make_openenv_env  # noqa: E402
from gagpo_gym.serve import LocalServer, wait_ready  # noqa: E402
from wrappers import GroupedVectorEnv  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"size": "small"}
READY_S = 120.0  # seconds for a server's start (its imports: OpenEnv brings gradio) on a loaded 2-core machine


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, LocalServer]]:
    """Two servers of small MiniHouse houses started side by side: one for the tests, one they may stop and kill.

    (Each start imports OpenEnv, gradio included: several CPU seconds, so no more servers than that.)
    """
    started = {
        "minihouse": LocalServer("gagpo_gym/MiniHouse-v0", env_kwargs=SMALL, max_sessions=32, ready_timeout=READY_S),
        "doomed": LocalServer("gagpo_gym/MiniHouse-v0", env_kwargs=SMALL, max_sessions=4, ready_timeout=READY_S),
    }
    try:
        for server in started.values():
            server.start()
        for server in started.values():
            server.wait_ready()
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture
def remote(servers: dict[str, LocalServer]) -> Iterator[gym.Env]:
    env = make_openenv_env(servers["minihouse"].url, timeout=20)
    yield env
    env.close()


def steps_of(env: gym.Env, seed: int, actions: list[Any]) -> list[tuple]:
    """The reset and every step's full result (observation, reward, flags, info) for a fixed action list."""
    out = [env.reset(seed=seed)]
    out += [env.step(action) for action in actions]
    return out


def expert_episode(env: gym.Env, seed: int, mistakes: list[Any]) -> list[Any]:
    """The oracle's commands for task ``seed``, one in two in upper case, with ``mistakes`` (invalid commands)
    played before each command until the episode ends or they run out."""
    _, info = env.reset(seed=seed)
    actions: list[Any] = []
    terminated = truncated = False
    while not (terminated or truncated):
        if len(actions) // 2 < len(mistakes) and len(actions) % 2 == 0:
            actions.append(mistakes[len(actions) // 2])
            env.step(actions[-1])
            continue
        command = env.unwrapped.expert_action()
        actions.append(command.upper() if len(actions) % 4 == 1 else command)
        _, _, terminated, truncated, _ = env.step(actions[-1])
    return actions


def test_an_expert_episode_through_serve_and_consume_equals_the_in_process_env_step_for_step(remote) -> None:
    local = gagpo_gym.make("MiniHouse-v0", **SMALL)
    mistakes = ["xyzzy plugh", "", "take the moon", "go to" + " " * 2100, "look\x00", "go to nowhere 7"]
    for seed in (0, 1, 7):
        actions = expert_episode(local, seed, mistakes)
        expected = steps_of(local, seed, actions)
        assert steps_of(remote, seed, actions) == expected  # observations, rewards, flags, the whole info
        assert expected[-1][1] == 1.0 and expected[-1][2] and expected[-1][4]["won"]
        played = sum(action in mistakes for action in actions)
        assert played >= 3 and [r[4]["action_valid"] for r in expected[1:]].count(False) == played
        assert len({r[-1]["state_key"] for r in expected}) > 2  # keys that move with the state
    # the expert read back from the server's state() is the in-process one
    local.reset(seed=3), remote.reset(seed=3)
    assert remote.unwrapped.expert_action() == local.unwrapped.expert_action()
    with pytest.raises(ValueError, match="default expert only"):
        remote.unwrapped.expert_action("search")


def test_openenvs_own_sync_client_reads_the_info_and_the_true_state(servers) -> None:
    """What TRL or verifiers see: OpenEnv's GenericEnvClient (sync), no gagpo_gym on the client side."""
    from openenv.core.generic_client import GenericEnvClient

    local = gagpo_gym.make("MiniHouse-v0", **SMALL)
    obs, info = local.reset(seed=9)
    with GenericEnvClient(base_url=servers["minihouse"].url).sync() as client:
        result = client.reset(seed=9)
        assert result.observation["text"] == obs and result.metadata == info and not result.done
        command = local.unwrapped.expert_action()
        obs, reward, _, _, info = local.step(command)
        result = client.step({"command": command})
        assert (result.observation["text"], result.reward, result.metadata) == (obs, reward, info)
        state = client.state()
        assert state["state_key"] == info["state_key"] == gagpo_gym.state_key(local.unwrapped.state_string())
        assert state["step_count"] == 1 and state["task_id"] == info["task_id"]
        assert state["expert_action"] == local.unwrapped.expert_action()


def test_the_served_time_limit_truncates_as_in_process_a_win_on_its_last_step_included(remote) -> None:
    local = gagpo_gym.make("MiniHouse-v0", **SMALL)
    plan = expert_episode(local, 5, [])
    for actions in (["look"] * 50, ["look"] * (50 - len(plan)) + plan):  # 50: the registered max_episode_steps
        expected = steps_of(local, 5, actions)
        assert steps_of(remote, 5, actions) == expected
        assert expected[-1][3] and not any(r[2] or r[3] for r in expected[1:-1])
    assert expected[-1][2] and expected[-1][4]["won"]  # the plan's last command wins on the last step: both flags


def test_an_action_that_is_not_text_changes_nothing_and_does_not_raise(remote) -> None:
    obs, info = remote.reset(seed=2)
    after = remote.step(42)
    assert after[:4] == (obs, 0.0, False, False)
    assert after[4] == {**info, "action_valid": False}
    assert remote.step(info["admissible_actions"][0])[4]["action_valid"]  # the session goes on


def test_sixteen_sessions_in_groups_through_vector_envs_equal_the_in_process_ones(servers) -> None:
    """4 groups x 4 members in worker processes, one session each; a group's members share its task seed."""
    seeds = {"task_seeds": [11, 12, 13, 11]}
    remote = GroupedVectorEnv(
        functools.partial(make_openenv_env, servers["minihouse"].url, timeout=20), 4, 4, mode="async"
    )
    local = GroupedVectorEnv(functools.partial(gagpo_gym.make, "MiniHouse-v0", **SMALL), 4, 4)
    try:
        (obs, info), (obs_local, info_local) = remote.reset(options=seeds), local.reset(options=seeds)
        assert obs == obs_local and list(info["state_key"]) == list(info_local["state_key"])
        groups = [obs[g * 4 : g * 4 + 4] for g in range(4)]
        assert all(len(set(group)) == 1 for group in groups)  # the same first observation within a group
        assert groups[0] == groups[3] and len({group[0] for group in groups}) == 3
        rng = np.random.default_rng(0)
        for _ in range(6):
            actions = [
                list(a)[rng.integers(len(a))] if m else ""
                for a, m in zip(info_local["admissible_actions"], local.active)
            ]
            result, expected = remote.step(actions), local.step(actions)
            assert result[0] == expected[0]
            for got, want in zip(result[1:4], expected[1:4]):
                np.testing.assert_array_equal(got, want)
            info, info_local = result[4], expected[4]
            assert set(info) == set(info_local)  # every info key and its mask: keys, admissible actions, won...
            assert all(np.asarray(info[k]).tolist() == np.asarray(info_local[k]).tolist() for k in info_local)
    finally:
        remote.close()
        local.close()
    # Gymnasium's own async vector env (default shared memory) builds the env from its kwargs in each worker.
    url = servers["minihouse"].url
    vector = gym.make_vec("gagpo_gym/OpenEnv-v0", num_envs=2, vectorization_mode="async", url=url)
    try:
        obs, info = vector.reset(seed=[4, 4])
        assert obs[0] == obs[1] == gagpo_gym.make("MiniHouse-v0", **SMALL).reset(seed=4)[0]
    finally:
        vector.close()


def test_the_consuming_env_passes_the_checker_against_a_served_env(servers) -> None:
    env = make_openenv_env(servers["minihouse"].url, timeout=20)
    try:
        gagpo_gym.check_text_env(env)
    finally:
        env.close()


def test_a_session_past_the_servers_capacity_is_one_clear_error(servers) -> None:
    envs = []
    try:
        with pytest.raises(OpenEnvError, match=r"reset\(seed=0\).*CAPACITY_REACHED"):
            for _ in range(33):  # the server takes 32
                envs.append(make_openenv_env(servers["minihouse"].url, timeout=20))
                envs[-1].reset(seed=0)
    finally:
        for env in envs:
            env.close()


def test_info_is_made_json_safe_or_refused_by_name() -> None:
    from gagpo_gym.serve import json_safe

    info = {"n": np.int64(3), "pair": (1, np.float32(0.5)), "grid": np.eye(2, dtype=int), "nested": {1: [np.True_]}}
    safe = {key: json_safe(value, key) for key, value in info.items()}
    assert safe == {"n": 3, "pair": [1, 0.5], "grid": [[1, 0], [0, 1]], "nested": {"1": [True]}}
    assert json.loads(json.dumps(safe)) == safe
    with pytest.raises(TypeError, match=r"info\['nested.1'\] is a object"):
        json_safe({1: object()}, "nested")


def test_a_server_that_hangs_or_dies_gives_one_clear_error_within_the_timeout(servers) -> None:
    server = servers["doomed"]
    env = make_openenv_env(server.url, timeout=2)
    try:
        _, info = env.reset(seed=0)
        env.step(info["admissible_actions"][0])
        server.proc.send_signal(signal.SIGSTOP)  # hangs: the socket stays open, nothing answers
        started = time.monotonic()
        with pytest.raises(OpenEnvError, match=rf"{re.escape(server.url)}: step.*: no answer within 2 s"):
            env.step(info["admissible_actions"][0])
        assert time.monotonic() - started < 4
        with pytest.raises(OpenEnvError, match="reset\\(\\) opens a new one"):  # the session is lost
            env.step(info["admissible_actions"][0])
        server.proc.send_signal(signal.SIGCONT)
        obs, info = env.reset(seed=0)  # a fresh session
        assert obs == gagpo_gym.make("MiniHouse-v0", **SMALL).reset(seed=0)[0]
        env.step(info["admissible_actions"][0])
        server.proc.kill()  # dies mid-episode
        server.proc.wait()
        for call in (lambda: env.step(info["admissible_actions"][0]), lambda: env.reset(seed=0)):
            started = time.monotonic()
            with pytest.raises(OpenEnvError, match=re.escape(server.url)):
                call()
            assert time.monotonic() - started < 2
    finally:
        env.close()  # a dead server: closing is quiet


class Counter:
    """A foreign OpenEnv env (not gagpo_gym's): its metadata has no info keys; ``keyed`` puts a key in state()."""

    @staticmethod
    def app(keyed: bool):
        from openenv.core.env_server.http_server import create_app
        from openenv.core.env_server.interfaces import Environment
        from openenv.core.env_server.types import Action, Observation, State

        class Add(Action):
            command: str

        class Count(Observation):
            text: str

        class CounterEnv(Environment):
            def __init__(self) -> None:
                super().__init__()
                self.n = 0

            def reset(self, seed=None, episode_id=None, **kwargs):
                self.n = 0
                return Count(text="count 0")

            def step(self, action, timeout_s=None, **kwargs):
                self.n += action.command == "add"
                return Count(text=f"count {self.n % 2}", reward=1.0, done=self.n >= 3)

            @property
            def state(self):
                return State(state_key=self.n) if keyed else State()

        return create_app(CounterEnv, Add, Count)


@contextlib.contextmanager
def threaded_server(app) -> Iterator[str]:
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_ready(f"http://127.0.0.1:{port}", timeout=30)
        yield f"ws://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.mark.parametrize("keyed", [False, True], ids=["keys-from-text", "keys-from-state"])
def test_a_foreign_server_gets_the_contracts_neutral_info_and_keys_from_state_or_text(keyed: bool) -> None:
    with threaded_server(Counter.app(keyed)) as url:
        env = make_openenv_env(url, timeout=10)
        try:
            obs, info = env.reset(seed=0)
            assert obs == "count 0"
            assert {k: info[k] for k in ("admissible_actions", "task", "task_id", "won")} == {
                "admissible_actions": [], "task": "", "task_id": "", "won": False}  # fmt: skip
            keys = [info["state_key"]]
            for _ in range(3):
                obs, reward, terminated, truncated, info = env.step("add")
                keys.append(info["state_key"])
                assert reward == 1.0 and info["action_valid"] and not truncated
            assert terminated
            if keyed:  # the server's own keys: counts 0, 1, 2, 3
                assert keys == [0, 1, 2, 3]
            else:  # the observation's: "count 0", "count 1", "count 0", "count 1"
                assert keys == [gagpo_gym.state_key(f"count {n % 2}") for n in range(4)]
            with pytest.raises(NotImplementedError, match="offers no expert"):
                env.unwrapped.expert_action()
        finally:
            env.close()


def test_bad_arguments_and_a_missing_extra_give_one_readable_error() -> None:
    for kwargs in ({"url": "localhost:8000"}, {"url": "http://127.0.0.1:1", "timeout": 0}):
        with pytest.raises(ValueError, match="url must|timeout must"):
            gagpo_gym.make("OpenEnv-v0", **kwargs)
    from gagpo_gym.serve import main, make_app

    with pytest.raises(ValueError, match="max_sessions"):
        make_app("gagpo_gym/Maze-v0", max_sessions=0)
    with pytest.raises(SystemExit) as exit_info:
        main(["gagpo_gym/NoSuchEnv-v0"])
    assert exit_info.value.code == 2
    # Without the extra: gagpo_gym imports, and both bridges name the extra to install.
    code = (
        "import importlib, sys\nsys.modules['openenv'] = None\nimport gagpo_gym\n"
        "for module in ('gagpo_gym.serve', 'gagpo_gym.envs.openenv'):\n"
        "    try:\n        importlib.import_module(module)\n    except ImportError as err:\n        print(err)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and all("pip install 'gagpo-gym[openenv]'" in line for line in lines), out.stderr
