"""Serve a registered text env as an OpenEnv environment (reset/step/state over WebSocket and HTTP).

    python -m gagpo_gym.serve gagpo_gym/MiniHouse-v0 --port 8000 [--host 127.0.0.1] [--env-kwargs JSON]
        [--max-sessions N]

OpenEnv (``pip install 'gagpo-gym[openenv]'``) is the env-over-the-network spec that TRL, verifiers and SkyRL
read. This module adapts a gagpo_gym env to OpenEnv's own ``Environment`` interface and serves it with OpenEnv's
own app factory (``create_app``: FastAPI, its ``/ws`` WebSocket sessions, ``/health``, ``/schema``...) on uvicorn.

* Sessions: every WebSocket connection is a session with a gymnasium env of its own, made with
  :func:`gagpo_gym.make` (so with the env's registered ``max_episode_steps``, or the one in ``env_kwargs``), up to
  ``max_sessions`` at once. OpenEnv's stateless HTTP ``/reset`` and ``/step`` make a fresh env per request.
* ``reset``: ``{"seed": s, "options": {...}}``; the same seed gives the same task, so a rollout group's sessions
  share one. ``step``: ``{"command": text}``; every command goes to the env, which applies the text-env contract
  (an invalid one changes nothing and says so in ``action_valid``).
* Observation: ``text`` (the env's observation), ``reward``, ``done`` (terminated or truncated), ``terminated``
  and ``truncated`` (the time limit; a win on its last step is both) and, in ``metadata``, the env's ``info``
  made JSON-safe (``state_key``, ``admissible_actions``, ``task``, ``task_id``, ``won``, ``action_valid``,
  ``task_type``, ``score``...).
* ``state()``: OpenEnv's ``episode_id`` and ``step_count``, the true ``state_key``, ``task_id``, ``won``, and
  ``expert_action``, the env's default expert's next command (computed on request; ``None`` where the env has
  no expert or no episode is running). It is what :mod:`gagpo_gym.envs.openenv`'s ``expert_action()`` reads.

Nothing here imports agents/ or wrappers/: a served env is the bare env, without an agent's text wrappers.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import gagpo_gym

try:
    import uvicorn
    from fastapi import FastAPI
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
except ImportError as err:  # the extra is not installed
    raise ImportError(f"gagpo_gym.serve needs OpenEnv: pip install 'gagpo-gym[openenv]' ({err})") from err

#: Sessions served at once by default: a GAGPOAgent's default rollout (4 groups x 8) twice over.
DEFAULT_MAX_SESSIONS = 64


class TextAction(Action):
    """One command of the text env."""

    command: str


class TextObservation(Observation):
    """The env's observation text; ``done`` is terminated or truncated, which both can be (a win on the last step
    the time limit allows)."""

    text: str = ""
    terminated: bool = False
    truncated: bool = False


class TextState(State):
    """The session's true state, as far as OpenEnv's ``state()`` shows it."""

    state_key: int | None = None
    task_id: str = ""
    won: bool = False
    expert_action: str | None = None


def json_safe(value: Any, key: str) -> Any:
    """``value`` with NumPy scalars and arrays as Python numbers and lists, tuples as lists, so it goes into JSON.

    Anything else that JSON cannot carry raises one ``TypeError`` naming the info ``key``: a session must not
    send something that the client would read back differently.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Mapping):
        return {str(k): json_safe(v, f"{key}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, key) for v in value]
    raise TypeError(f"info[{key!r}] is a {type(value).__name__}, which an OpenEnv observation cannot carry as JSON")


class GymTextEnvironment(Environment[TextAction, TextObservation, TextState]):
    """One session's env: a gagpo_gym env behind OpenEnv's ``Environment`` interface.

    Each session runs on a thread of its own (OpenEnv gives every session a one-thread executor), so sessions
    never share an env.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, env_id: str, env_kwargs: Mapping[str, Any]) -> None:
        super().__init__()
        self.env_id = env_id
        self.env: gym.Env = gagpo_gym.make(env_id, **dict(env_kwargs))
        self._info: dict[str, Any] = {}
        self._episode_id: str | None = None
        self._steps = 0
        self._running = False

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> TextObservation:
        text, info = self.env.reset(seed=seed, options=options)
        self._episode_id = episode_id or str(uuid.uuid4())
        self._steps, self._running = 0, True
        return self._observation(text, 0.0, False, False, info)

    def step(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        text, reward, terminated, truncated, info = self.env.step(action.command)
        self._steps += 1
        self._running = not (terminated or truncated)
        return self._observation(text, reward, terminated, truncated, info)

    def _observation(self, text: str, reward: float, terminated: bool, truncated: bool, info: dict) -> TextObservation:
        self._info = {key: json_safe(value, key) for key, value in info.items()}
        return TextObservation(
            text=text, reward=float(reward), done=bool(terminated or truncated), terminated=bool(terminated),
            truncated=bool(truncated), metadata=self._info,
        )  # fmt: skip

    @property
    def state(self) -> TextState:
        return TextState(
            episode_id=self._episode_id,
            step_count=self._steps,
            state_key=self._info.get("state_key"),
            task_id=str(self._info.get("task_id", "")),
            won=bool(self._info.get("won", False)),
            expert_action=self._expert_action(),
        )

    def _expert_action(self) -> str | None:
        expert = getattr(self.env.unwrapped, "expert_action", None)
        if expert is None or not self._running:
            return None
        try:
            return str(expert())
        except NotImplementedError:  # the text-env contract's default: no expert
            return None

    def get_metadata(self) -> EnvironmentMetadata:
        doc = (type(self.env.unwrapped).__doc__ or "").strip()
        return EnvironmentMetadata(name=self.env_id, description=doc.splitlines()[0] if doc else self.env_id)

    def close(self) -> None:
        self.env.close()


def make_app(
    env_id: str, *, env_kwargs: Mapping[str, Any] | None = None, max_sessions: int = DEFAULT_MAX_SESSIONS
) -> FastAPI:
    """OpenEnv's FastAPI app serving ``env_id`` (one env per session, at most ``max_sessions`` at once).

    The env is made once here, so that an unknown id or a bad constructor argument fails before serving.
    """
    if not isinstance(max_sessions, int) or max_sessions < 1:
        raise ValueError(f"max_sessions must be a positive int, got {max_sessions!r}")
    kwargs = dict(env_kwargs or {})
    probe = gagpo_gym.make(env_id, **kwargs)
    full_id = probe.spec.id
    probe.close()
    factory = functools.partial(GymTextEnvironment, full_id, kwargs)
    return create_app(
        factory, TextAction, TextObservation, env_name=full_id.split("/")[-1], max_concurrent_envs=max_sessions,
        state_cls=TextState,
    )  # fmt: skip


def serve(
    env_id: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    env_kwargs: Mapping[str, Any] | None = None,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    log_level: str = "warning",
) -> None:
    """Serve ``env_id`` on ``host:port`` until interrupted (uvicorn; WebSocket sessions at ``ws://host:port/ws``)."""
    app = make_app(env_id, env_kwargs=env_kwargs, max_sessions=max_sessions)
    print(
        f"serving {env_id} at http://{host}:{port} (OpenEnv sessions at ws://{host}:{port}/ws, up to {max_sessions})",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(app, host=host, port=port, log_level=log_level)


def wait_ready(url: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    """Return once ``url/health`` answers 200; ``RuntimeError`` at once if ``proc`` (the server) exited, and
    ``TimeoutError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server for {url} exited with code {proc.returncode}")
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
            if answer.status == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"no OpenEnv server answered at {url} within {timeout:g} s")


class LocalServer:
    """``python -m gagpo_gym.serve`` in a subprocess on a free loopback port: a server of one's own for tests,
    benchmarks and scripts.

        with LocalServer("gagpo_gym/Maze-v0") as server:
            env = make_openenv_env(server.url)

    ``start()`` returns at once (start several side by side, then ``wait_ready()`` each); entering the context
    does both. The port is one the OS had free a moment before the server binds it. The server runs the
    ``gagpo_gym`` imported here; its log goes to a temporary file, shown when it fails to start.
    """

    def __init__(
        self,
        env_id: str,
        *,
        env_kwargs: Mapping[str, Any] | None = None,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        ready_timeout: float = 120.0,
    ) -> None:
        self.env_id, self.env_kwargs, self.max_sessions = env_id, dict(env_kwargs or {}), max_sessions
        self.ready_timeout = ready_timeout
        self.url = ""
        self.proc: subprocess.Popen | None = None
        self.log: Any = None

    def start(self) -> LocalServer:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "gagpo_gym.serve", self.env_id, "--port", str(port),
                   "--env-kwargs", json.dumps(self.env_kwargs), "--max-sessions", str(self.max_sessions)]  # fmt: skip
        root = str(Path(gagpo_gym.__file__).resolve().parents[1])
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path}
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - the server's whole life: stop() closes it
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=self.log, env=env)
        return self

    def wait_ready(self) -> None:
        try:
            wait_ready(self.url, self.ready_timeout, self.proc)
        except RuntimeError as err:
            self.log.seek(0)
            raise RuntimeError(f"{err}:\n{self.log.read().decode(errors='replace')[-2000:]}") from None

    def stop(self) -> None:
        """Terminate the server (a stopped one is continued first) and wait for it."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def __enter__(self) -> LocalServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON ({err.msg} at char {err.pos}): {text!r}") from err
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f'must be a JSON object like \'{{"size": "small"}}\', got {text!r}')
    return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gagpo_gym.serve", description=__doc__.splitlines()[0])
    parser.add_argument("env_id", help="a registered text env, e.g. gagpo_gym/MiniHouse-v0")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    parser.add_argument("--env-kwargs", type=_json_object, default={}, help="constructor arguments, a JSON object")
    parser.add_argument(
        "--max-sessions", type=int, default=DEFAULT_MAX_SESSIONS,
        help=f"sessions (WebSocket connections, one env each) served at once (default: {DEFAULT_MAX_SESSIONS})",
    )  # fmt: skip
    parser.add_argument("--log-level", default="warning", help="uvicorn's log level (default: warning)")
    args = parser.parse_args(argv)
    try:
        serve(
            args.env_id, host=args.host, port=args.port, env_kwargs=args.env_kwargs, max_sessions=args.max_sessions,
            log_level=args.log_level,
        )  # fmt: skip
    except (TypeError, ValueError) as err:  # an unknown id, a bad constructor argument or --max-sessions
        parser.error(str(err))


if __name__ == "__main__":
    main()
