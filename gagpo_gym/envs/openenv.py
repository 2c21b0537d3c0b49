"""OpenEnv-v0: a text env whose episodes run on an OpenEnv server (``pip install 'gagpo-gym[openenv]'``).

    env = gagpo_gym.make("OpenEnv-v0", url="http://127.0.0.1:8000")      # or make_openenv_env(url)

OpenEnv serves an environment's ``reset``/``step``/``state`` over a WebSocket session; ``python -m
gagpo_gym.serve`` serves any gagpo_gym env that way, and this env plays one back, with OpenEnv's own client
(``GenericEnvClient``). It follows the text-env contract (:mod:`gagpo_gym.core`):

* Spaces: :class:`~gagpo_gym.text_space.TextSpace` observations and actions. The observation is the server's
  ``text`` field (``text_field``); an action goes to the server as ``{"command": action}`` (``action_field``).
* ``info`` is the observation's ``metadata``, where a server of :mod:`gagpo_gym.serve` puts the served env's info
  (so ``state_key``, ``admissible_actions``, ``task``, ``task_id``, ``won``, ``action_valid``, ``task_type``,
  ``score`` are the served env's own). Keys a server does not send get the contract's neutral values:
  ``admissible_actions`` ``[]``, ``task`` and ``task_id`` ``""``, ``won`` False, ``action_valid`` True.
* ``state_key``: the server's, from the metadata; else from its ``state()`` where that has a ``state_key`` (one
  more round trip per step); else :func:`gagpo_gym.state_key` of the observation text (GiGPO's observation key).
* ``terminated``/``truncated``: the observation's fields of those names (a win on the time limit's last step is
  both); from a server without them, ``done`` is ``terminated`` (and without ``truncated`` nothing truncates).
  The time limit is the server's: OpenEnv-v0 is registered without one of its own.
* An action that is text goes to the server, which judges it (an invalid one changes nothing there). An action
  that is not text never leaves: the state is unchanged, ``action_valid=False``, reward 0.
* ``expert_action()``: the server's default expert, from its ``state()`` (:mod:`gagpo_gym.serve` computes it on
  request); ``NotImplementedError`` where the server has none, as for a text env without an expert.

Sessions: one per env instance, opened by the first ``reset``; a reset starts a fresh episode in it, and a session
that failed is closed and a new one opened. ``close()`` closes it. Every call to the server is given up on after
``timeout`` seconds: a server that dies, hangs or answers with an error raises one :class:`OpenEnvError` that names
the url and the call, never a hang; the env then refuses to step until the next reset.

The env holds nothing but its constructor arguments until it is reset, so vector envs can build it in worker
processes from its kwargs (``gymnasium.make_vec(..., vectorization_mode="async")``, ``GroupedVectorEnv``'s
``mode="async"``, ``GAGPOAgent(..., vec_mode="async")``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import gymnasium as gym

from gagpo_gym.core import ACTION_MAX_LENGTH, OBS_MAX_LENGTH, state_key, text_space, to_charset
from gagpo_gym.registration import make

try:
    from openenv.core.client_types import StepResult
    from openenv.core.generic_client import GenericEnvClient
except ImportError as err:  # the extra is not installed
    raise ImportError(f"gagpo_gym/OpenEnv-v0 needs OpenEnv: pip install 'gagpo-gym[openenv]' ({err})") from err

#: Seconds a call to the server (connect, reset, step, state, close) may take.
DEFAULT_TIMEOUT = 30.0
_SCHEMES = ("http", "https", "ws", "wss")
T = TypeVar("T")


class OpenEnvError(RuntimeError):
    """The OpenEnv server failed a call: it is gone, did not answer in time, or answered with an error."""


class _Session:
    """One OpenEnv session: OpenEnv's async client on an event loop of its own thread.

    OpenEnv's sync wrapper (``SyncEnvClient``) waits for its loop without a deadline; driving the async client
    from here lets every call end after ``timeout`` seconds, cancelled (OpenEnv then drops the socket, so no late
    answer is read as the next one's).
    """

    def __init__(self, url: str, timeout: float) -> None:
        self.url, self.timeout = url, timeout
        self.failed = False
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=f"openenv {url}", daemon=True)
        self.thread.start()
        self.client = GenericEnvClient(base_url=url, connect_timeout_s=timeout, message_timeout_s=timeout)

    def call(self, what: str, request: Callable[[GenericEnvClient], Awaitable[T]]) -> T:
        """``request(client)`` awaited on the session's loop; one :class:`OpenEnvError` if it fails or times out."""

        async def run() -> T:
            return await request(self.client)

        future = asyncio.run_coroutine_threadsafe(run(), self.loop)
        try:
            return future.result(self.timeout)
        except BaseException as err:  # Ctrl-C too: the request must not outlive the call, nor the session it
            future.cancel()
            self.failed = True
            where = f"OpenEnv server at {self.url}: {what}"
            if isinstance(err, TimeoutError):  # ours or the client's own message timeout
                raise OpenEnvError(f"{where}: no answer within {self.timeout:g} s") from err
            if isinstance(err, Exception):
                raise OpenEnvError(f"{where}: {type(err).__name__}: {err}") from err
            raise

    def close(self) -> None:
        """End the session on the server (best effort: a dead server has none left), then stop the loop."""
        with contextlib.suppress(OpenEnvError):
            self.call("close", lambda client: client.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(self.timeout)
        if not self.thread.is_alive():
            self.loop.close()


class OpenEnvTextEnv(gym.Env[str, str]):
    """A text env played on an OpenEnv server at ``url`` (see the module docstring).

    Args:
        url: the server, ``http(s)://host:port`` or ``ws(s)://host:port``.
        timeout: seconds any one call to the server may take before :class:`OpenEnvError`.
        text_field: the observation field that holds the text (``"text"`` on a :mod:`gagpo_gym.serve` server).
        action_field: the action field that carries the command (``"command"`` there).
        render_mode: ``"ansi"`` (``render()`` returns the last observation) or ``None``.
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"]}

    def __init__(
        self,
        url: str,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        text_field: str = "text",
        action_field: str = "command",
        render_mode: str | None = None,
    ) -> None:
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in _SCHEMES or not parts.hostname:
            raise ValueError(f"url must be like http://host:port or ws://host:port, got {url!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.url, self.timeout = url, float(timeout)
        self.text_field, self.action_field = text_field, action_field
        self.render_mode = render_mode
        self.observation_space = text_space(OBS_MAX_LENGTH)
        self.action_space = text_space(ACTION_MAX_LENGTH)
        self._session: _Session | None = None
        self._keys_from: str | None = None  # "state" or "text" once a server without keys in its metadata is seen
        self._observation = ""
        self._info: dict[str, Any] = {}

    # ----- Gymnasium API ------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        if self._session is not None and self._session.failed:
            self._close_session()
        if self._session is None:
            self._session = _Session(self.url, self.timeout)
        data: dict[str, Any] = {} if seed is None else {"seed": int(seed)}
        if options:
            data["options"] = dict(options)
        result = self._session.call(f"reset(seed={seed})", lambda client: client.reset(**data))
        self._accept(result, after_step=False)
        return self._observation, self._info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        session = self._live_session()
        if not isinstance(action, str):
            return self._observation, 0.0, False, False, {**self._info, "action_valid": False}
        result = session.call(f"step({action[:80]!r})", lambda client: client.step({self.action_field: action}))
        terminated, truncated = self._accept(result, after_step=True)
        reward = 0.0 if result.reward is None else float(result.reward)
        return self._observation, reward, terminated, truncated, self._info

    def render(self) -> str | None:
        return self._observation if self.render_mode == "ansi" else None

    def close(self) -> None:
        self._close_session()
        super().close()

    # ----- the expert ---------------------------------------------------------------------------------
    def expert_action(self, kind: str | None = None) -> str:
        """The server's default expert's next command (its ``state()["expert_action"]``).

        Only the default expert is served: ``kind`` must be ``None``. ``NotImplementedError`` where the server
        offers none (a served env without an expert, or a server that is not :mod:`gagpo_gym.serve`'s).
        """
        if kind is not None:
            raise ValueError(
                f"{type(self).__name__}: the server plays its default expert only (kind=None), got {kind!r}"
            )
        action = self._live_session().call("state()", lambda client: client.state()).get("expert_action")
        if action is None:
            raise NotImplementedError(
                f"the OpenEnv server at {self.url} offers no expert (state() has no expert_action)"
            )
        return str(action)

    # ----- internals ----------------------------------------------------------------------------------
    def _live_session(self) -> _Session:
        if self._session is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        if self._session.failed:
            raise OpenEnvError(
                f"OpenEnv server at {self.url}: the session failed in an earlier call; reset() opens a new one"
            )
        return self._session

    def _accept(self, result: StepResult, *, after_step: bool) -> tuple[bool, bool]:
        """Take the server's answer as the current observation and info; returns (terminated, truncated)."""
        fields = result.observation if isinstance(result.observation, dict) else {}
        if self.text_field not in fields:
            raise OpenEnvError(
                f"OpenEnv server at {self.url}: its observation has no {self.text_field!r} field (it has "
                f"{sorted(fields)}): pass text_field= naming the one that holds the text"
            )
        self._observation = to_charset(str(fields[self.text_field]))
        metadata = result.metadata if result.metadata is not None else fields.get("metadata")
        info = dict(metadata or {})
        for key, default in (("admissible_actions", []), ("task", ""), ("task_id", ""), ("won", False)):
            info.setdefault(key, default)
        if after_step:
            info.setdefault("action_valid", True)
        if "state_key" not in info:
            info["state_key"] = self._key_without_metadata()
        self._info = info
        truncated = bool(fields.get("truncated", False))
        return bool(fields.get("terminated", bool(result.done) and not truncated)), truncated

    def _key_without_metadata(self) -> int:
        """The server's ``state()["state_key"]`` where it has one, else the key of the observation text."""
        if self._keys_from != "text":
            key = self._live_session().call("state()", lambda client: client.state()).get("state_key")
            self._keys_from = "text" if key is None else "state"
            if key is not None:
                return int(key)
        return state_key(self._observation)

    def _close_session(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None


def make_openenv_env(url: str, timeout: float = DEFAULT_TIMEOUT, **kwargs: Any) -> gym.Env:
    """``gagpo_gym.make("OpenEnv-v0", url=url, timeout=timeout, **kwargs)``: the text env of an OpenEnv server."""
    return make("OpenEnv-v0", url=url, timeout=timeout, **kwargs)
