"""GroupedVectorEnv: ``num_groups x group_size`` sub-envs where each group plays one task.

A rollout group is ``group_size`` episodes of the same task: its members reset together with one task seed.
A finished member is not stepped again, and needs no action, until the next :meth:`reset`; ``active`` says
which members still need one. Sub-envs run in this process (``mode="sync"``) or in worker processes
(``mode="async"``), each worker holding a slice of the sub-envs. Observations cross process boundaries as
pickled Python strings (no shared memory). When a sub-env raises, :class:`SubEnvError` names the env id, the sub-env,
its group, task id and task seed, the step and the action, chained to the env's own exception (from a worker: its
traceback's text); when a worker dies, the error names the worker, its pid and exit code. Either way the env refuses
to step until the next reset, which restarts dead workers.
Workers ignore Ctrl-C (SIGINT goes to the whole process group): the parent alone gets the ``KeyboardInterrupt``,
so an interrupted run prints one traceback, not one per worker; a worker whose answer an interrupt left
unread is restarted by the next reset.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

EnvFactory = Callable[[], gym.Env]
StepResult = tuple[str, float, bool, bool, dict]


class SubEnvError(RuntimeError):
    """A sub-env raised in reset, step or a call: the message names the env id, the sub-env, its group, task id and
    task seed, the step and the action; ``__cause__`` is the env's own exception (or, from a worker process,
    :class:`RemoteTraceback` holding its traceback). ``sub_env``, ``task_seed`` and ``step`` hold them too."""

    def __init__(self, message: str, sub_env: int = -1, task_seed: int = -1, step: int = -1) -> None:
        super().__init__(message)
        self.sub_env, self.task_seed, self.step = sub_env, task_seed, step


class RemoteTraceback(Exception):
    """The traceback text of an exception raised in a worker process (the exception itself may not pickle): the
    cause of its :class:`SubEnvError`, as ``concurrent.futures`` chains a worker's error."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f"\n{self.text.rstrip()}"


class _Raised(Exception):
    """A sub-env's exception on its way out of a backend: the sub-env's index, where it ran (``sub-env 3``, or
    ``sub-env worker 1 (pid 42), sub-env 3``), ``Type: message`` and the other failures of the same call; its cause
    is the exception."""

    def __init__(self, index: int, where: str, summary: str, others: str = "") -> None:
        super().__init__(summary)
        self.index, self.where, self.summary, self.others = index, where, summary, others


def _summary(err: BaseException) -> str:
    """``Type: first line of the message`` of an env's exception."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


def _call(env: gym.Env, name: str, args: tuple) -> Any:
    return getattr(env.unwrapped, name)(*args)


class _InProcess:
    """Sub-envs stepped in this process."""

    def __init__(self, env_fns: Sequence[EnvFactory]) -> None:
        self.envs = [fn() for fn in env_fns]

    def _each(self, jobs: list[tuple[int, Any]], run: Callable[[gym.Env, Any], Any]) -> list[Any]:
        out = []
        for i, job in jobs:
            try:
                out.append(run(self.envs[i], job))
            except Exception as err:  # the vector env names the sub-env's task and step, chained to this
                raise _Raised(i, f"sub-env {i}", _summary(err)) from err
        return out

    def reset(self, jobs: list[tuple[int, int | None]]) -> list[tuple[str, dict]]:
        return self._each(jobs, lambda env, seed: env.reset(seed=seed))

    def step(self, jobs: list[tuple[int, Any]]) -> list[StepResult]:
        return self._each(jobs, lambda env, action: env.step(action))

    def send(self, command: str, jobs: list[tuple[int, Any]]) -> Any:
        """In this process nothing runs in the background: the work is done when :meth:`receive` asks for it."""
        return command, jobs

    def receive(self, ticket: Any) -> list[Any]:
        command, jobs = ticket
        return getattr(self, command)(jobs)

    def worker_of(self, i: int) -> int:
        return 0

    def call(self, name: str, indices: list[int], args: tuple) -> list[Any]:
        # The env's own exception: callers tell "no such method" (AttributeError, NotImplementedError) by its type.
        return [_call(self.envs[i], name, args) for i in indices]

    def close(self) -> None:
        for env in self.envs:
            env.close()


def _worker(conn, parent_ends: list[Any], env_fns: list[EnvFactory]) -> None:
    # Ctrl-C is the parent's: it stops the run and closes (or, at exit, terminates) the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # SIGTERM ends a worker (terminate() sends it), whatever handler a forked worker inherited from its parent.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # The parent's ends of the pipes (this worker's, and under fork the earlier workers'): closed here, the parent
    # holds the last copy of each, so a parent that dies, even by SIGKILL, ends every worker's recv() with EOFError.
    for end in parent_ends:
        end.close()
    envs = [fn() for fn in env_fns]
    try:
        while True:
            command, payload = conn.recv()
            if command == "close":
                break
            out, local = [], None
            try:
                for local, job in payload:
                    if command == "reset":
                        out.append(envs[local].reset(seed=job))
                    elif command == "step":
                        out.append(envs[local].step(job))
                    else:  # call: job is (method name, args)
                        out.append(_call(envs[local], *job))
                conn.send(("ok", out))
            except Exception as err:  # report, keep serving: the parent raises naming the sub-env's task and step
                conn.send(("error", (local, _summary(err), traceback.format_exc())))
    except (EOFError, OSError):  # the parent is gone (its pipe ends closed): nobody will ask again
        pass
    finally:
        for env in envs:
            env.close()
        conn.close()


class _WorkerProcesses:
    """Sub-envs spread over worker processes; sub-env i lives in worker ``i % n_workers``.

    Every call waits for every worker it sent to, also when one fails, so that no stale answer is left in a pipe
    for the next call. A worker that died, or whose answer was left unread (the wait was interrupted, e.g. by
    Ctrl-C), is started again (with fresh sub-envs) by the next :meth:`reset`.
    """

    def __init__(self, env_fns: Sequence[EnvFactory], n_workers: int, context: str | None) -> None:
        self.ctx = mp.get_context(context)
        self.env_fns = list(env_fns)
        self.n_workers = max(1, min(n_workers, len(env_fns)))
        self.conns: list[Any] = [None] * self.n_workers
        self.procs: list[Any] = [None] * self.n_workers
        self.unread: set[int] = set()  # workers whose answer an interrupted call did not read
        for w in range(self.n_workers):
            self._start(w)

    def _start(self, w: int) -> None:
        parent, child = self.ctx.Pipe()
        # A forked worker inherits the parent's ends of every worker's pipe so far; another start method, its own.
        inherited = [c for c in self.conns if c is not None] if self.ctx.get_start_method() == "fork" else []
        args = (child, [parent, *inherited], self.env_fns[w :: self.n_workers])
        proc = self.ctx.Process(target=_worker, args=args, daemon=True)
        proc.start()
        child.close()
        self.conns[w], self.procs[w] = parent, proc

    def _describe(self, w: int) -> str:
        return f"sub-env worker {w} (pid {self.procs[w].pid})"

    def _died(self, w: int) -> str:
        self.procs[w].join(timeout=5)
        return (
            f"{self._describe(w)} died with exit code {self.procs[w].exitcode}; its sub-envs are lost: "
            "reset() starts it again"
        )

    def worker_of(self, i: int) -> int:
        return i % self.n_workers

    def _scatter(self, command: str, jobs: list[tuple[int, Any]]) -> list[Any]:
        return self.receive(self.send(command, jobs))

    def send(self, command: str, jobs: list[tuple[int, Any]]) -> tuple:
        """Send each worker its share of ``jobs`` and return without waiting: the workers run while the caller
        does something else; :meth:`receive` collects the answers (workers answer in the order they were sent to,
        so several sends are received in their own order)."""
        per_worker: dict[int, list[int]] = {}
        for pos, (i, _) in enumerate(jobs):
            per_worker.setdefault(i % self.n_workers, []).append(pos)
        errors, sent = [], []
        for w, positions in per_worker.items():
            payload = [(jobs[p][0] // self.n_workers, jobs[p][1]) for p in positions]
            try:
                self.conns[w].send((command, payload))
                sent.append(w)
            except OSError:  # BrokenPipeError and the like: the worker is gone
                errors.append(self._died(w))
        self.unread.update(sent)  # until read: an interrupt (KeyboardInterrupt) in the wait leaves them unread
        return per_worker, sent, errors, len(jobs)

    def receive(self, ticket: tuple) -> list[Any]:
        """The answers of one :meth:`send`, in its jobs' order; raises (after reading every worker it sent to) when
        a sub-env raised or a worker died."""
        per_worker, sent, errors, n = ticket
        out: list[Any] = [None] * n
        raised: list[tuple[int, int, str, str]] = []  # (sub-env, worker, summary, traceback) of each that raised
        for w in sent:
            try:
                status, result = self.conns[w].recv()
            except (EOFError, OSError):
                self.unread.discard(w)
                errors.append(self._died(w))
                continue
            self.unread.discard(w)
            if status == "ok":
                for p, r in zip(per_worker[w], result):
                    out[p] = r
            else:
                local, summary, trace = result
                raised.append((local * self.n_workers + w, w, summary, trace))
        if raised:
            index, w, summary, trace = min(raised)
            others = [f"sub-env {i}: {s}" for i, _, s, _ in sorted(raised)[1:]] + errors
            where = f"{self._describe(w)}, sub-env {index}"
            raise _Raised(index, where, summary, "; ".join(others)) from RemoteTraceback(trace)
        if errors:
            raise RuntimeError("\n".join(errors))
        return out

    def reset(self, jobs):
        for w, proc in enumerate(self.procs):
            if w in self.unread and proc.is_alive():
                proc.terminate()
            if w in self.unread or not proc.is_alive():
                proc.join()
                self.conns[w].close()
                self._start(w)
        self.unread.clear()
        return self._scatter("reset", jobs)

    def step(self, jobs):
        return self._scatter("step", jobs)

    def call(self, name, indices, args):
        return self._scatter("call", [(i, (name, args)) for i in indices])

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(("close", None))
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()


def episode_step_limit(env: gym.Env) -> int | None:
    """The step limit of a made env: its spec's, or that of a ``TimeLimit`` among its wrappers (a wrapper put on by
    hand leaves no spec); None when nothing bounds its episodes."""
    if env.spec is not None and env.spec.max_episode_steps is not None:
        return int(env.spec.max_episode_steps)
    while isinstance(env, gym.Wrapper):
        if isinstance(env, gym.wrappers.TimeLimit):
            return int(env._max_episode_steps)
        env = env.env
    return None


@dataclass(frozen=True)
class _StepTicket:
    """An unreceived :meth:`GroupedVectorEnv.step_send`: its sub-envs, their actions, the backend's ticket."""

    indices: np.ndarray
    actions: dict[int, Any]
    sent: Any


class GroupedVectorEnv(VectorEnv):
    """``num_groups`` rollout groups of ``group_size`` members; every member of a group plays the same task.

    Args:
        env_fns: one factory per sub-env (``num_groups * group_size`` of them), or a single factory reused.
        num_groups: rollout groups (tasks) played at once.
        group_size: members per group; sub-env ``i`` belongs to group ``i // group_size``.
        mode: ``"sync"`` (in-process) or ``"async"`` (worker processes, pickled observations).
        task_pool: draw task seeds from ``0 .. task_pool - 1`` (a finite training set of tasks, like
            ALFWorld's train split); ``None`` draws from all 31-bit seeds.
        n_workers: worker processes for ``"async"`` (default: one per sub-env, capped at the CPU count).

    ``reset(seed=s)`` seeds the task sampler; each group then draws one task seed from it and all its members
    reset with that seed. ``reset(options={"task_seeds": [...]})`` sets the groups' task seeds explicitly
    (evaluation panels). After a reset, ``group_index``, ``episode_index`` and ``task_seeds`` describe the layout;
    episode ids are unique over the env's lifetime.
    """

    metadata = {"autoreset_mode": AutoresetMode.DISABLED}

    def __init__(
        self,
        env_fns: EnvFactory | Sequence[EnvFactory],
        num_groups: int,
        group_size: int,
        *,
        mode: str = "sync",
        n_workers: int | None = None,
        context: str | None = None,
        task_pool: int | None = None,
    ) -> None:
        if task_pool is not None and task_pool < 1:
            raise ValueError(f"task_pool must be >= 1 or None, got {task_pool}")
        self.task_pool = task_pool
        if num_groups < 1 or group_size < 1:
            raise ValueError(f"num_groups and group_size must be >= 1, got {num_groups} and {group_size}")
        self.num_groups, self.group_size = int(num_groups), int(group_size)
        self.num_envs = self.num_groups * self.group_size
        fns = [env_fns] * self.num_envs if callable(env_fns) else list(env_fns)
        if len(fns) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} env factories (num_groups * group_size), got {len(fns)}")
        if mode == "sync":
            self.workers: _InProcess | _WorkerProcesses = _InProcess(fns)
            self._describe(self.workers.envs[0])
        elif mode == "async":
            probe = fns[0]()
            self._describe(probe)
            probe.close()
            self.workers = _WorkerProcesses(fns, n_workers or min(self.num_envs, mp.cpu_count()), context)
        else:
            raise ValueError(f"mode must be 'sync' or 'async', got {mode!r}")
        self.mode = mode
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.group_index = np.repeat(np.arange(self.num_groups), self.group_size)
        self.episode_index = np.full(self.num_envs, -1, dtype=np.int64)
        self.task_seeds = np.zeros(self.num_groups, dtype=np.int64)
        self.active = np.zeros(self.num_envs, dtype=bool)
        self._observations: list[str] = [""] * self.num_envs
        self.episode_steps = np.zeros(self.num_envs, dtype=np.int64)  # steps taken in each sub-env's episode
        self._task_ids: list[Any] = [None] * self.num_envs  # each sub-env's info["task_id"], for error messages
        self._sampler = np.random.default_rng()
        self._next_episode = 0
        self._failed = False  # a sub-env raised (or its worker died) in the last reset or step
        self._in_flight = np.zeros(0, dtype=np.int64)  # sub-envs sent a step whose answer is not received yet

    def _describe(self, probe: gym.Env) -> None:
        """Spaces, spec and step limit of every sub-env, read from one of them."""
        self.single_observation_space, self.single_action_space = probe.observation_space, probe.action_space
        self.spec = probe.spec
        self.step_limit = episode_step_limit(probe)

    # ----------------------------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start a new task in every group; returns (observations, vectorised infos)."""
        if seed is not None:
            self._sampler = np.random.default_rng(seed)
        seeds = (options or {}).get("task_seeds")
        if seeds is None:
            seeds = self.draw_task_seeds(self._sampler, self.num_groups)
        seeds = np.asarray(seeds, dtype=np.int64)
        if seeds.shape != (self.num_groups,):
            raise ValueError(f"task_seeds must have one seed per group ({self.num_groups}), got {seeds.shape}")
        self.task_seeds = seeds
        self.episode_index = self._next_episode + np.arange(self.num_envs)
        self._next_episode += self.num_envs
        self.active[:] = True
        self._in_flight = np.zeros(0, dtype=np.int64)  # an unreceived step's workers restart (unread answers)
        jobs = [(i, int(seeds[self.group_index[i]])) for i in range(self.num_envs)]
        infos: dict[str, Any] = {}
        self._failed = True
        self.episode_steps[:] = 0
        self._task_ids = [None] * self.num_envs
        with self._naming_failures("reset", {i: seed for i, seed in jobs}):
            results = self.workers.reset(jobs)
        self._failed = False
        for i, (obs, info) in enumerate(results):
            self._observations[i] = obs
            self._task_ids[i] = info.get("task_id") if isinstance(info, dict) else None
            infos = self._add_info(infos, info, i)
        return tuple(self._observations), infos

    @contextlib.contextmanager
    def _naming_failures(self, command: str, jobs: dict[int, Any]) -> Iterator[None]:
        """Turn a sub-env's exception into a :class:`SubEnvError` that names the env, the sub-env's task and step."""
        try:
            yield
        except _Raised as raised:
            i = raised.index
            group = int(self.group_index[i])
            seed = int(self.task_seeds[group])
            step = int(self.episode_steps[i]) + (command == "step")
            if command == "step":
                what = f"step {step} of its episode (action {str(jobs.get(i))[:200]!r})"
            elif command == "reset":
                what = f"reset(seed={seed})"
            else:
                what = f"{jobs.get(i)}() after step {step} of its episode"
            env_id = self.spec.id if self.spec is not None else "env"
            task = f"task {self._task_ids[i]!r}, " if self._task_ids[i] is not None else ""
            others = f"; also {raised.others}" if raised.others else ""
            raise SubEnvError(
                f"{env_id}: {raised.where} raised during {what}: {raised.summary} (group {group}, {task}task seed "
                f"{seed}){others}",
                i, seed, step,
            ) from raised.__cause__  # fmt: skip

    def draw_task_seeds(self, sampler: np.random.Generator, n: int) -> np.ndarray:
        """``n`` task seeds (from the task pool when there is one): what a reset without explicit seeds plays.

        A trainer spreading groups over processes draws every group's seed with this and hands each rank its slice.
        """
        return sampler.integers(0, self.task_pool or 2**31 - 1, size=n)

    def step(self, actions: Sequence[Any]):
        """Step the active members with their actions (entries for finished members are ignored).

        Finished members keep their last observation, get reward 0 and ``terminated = truncated = False``;
        their info entries are absent (the ``_key`` masks are False).
        """
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions (one per sub-env), got {len(actions)}")
        idx = np.flatnonzero(self.active)
        return self.step_receive(self.step_send(idx, [actions[i] for i in idx]))

    def lanes(self, n: int) -> list[np.ndarray]:
        """Sub-envs in ``n`` lanes (some may be empty) that share no worker process, so that one lane steps in its
        workers while the caller computes the other's actions (:meth:`step_send`); in this process, by index."""
        owner = np.array([self.workers.worker_of(i) for i in range(self.num_envs)])
        key = owner if self.mode == "async" and self.workers.n_workers >= n else np.arange(self.num_envs)
        return [np.flatnonzero(key % n == lane) for lane in range(n)]

    def step_send(self, indices: Sequence[int], actions: Sequence[Any]) -> _StepTicket:
        """Start stepping the active sub-envs ``indices`` with ``actions`` (one each, in order) and return at once;
        :meth:`step_receive` waits for them. Lanes of :meth:`lanes` overlap: sub-envs in worker processes step
        while the caller works (in-process sub-envs step inside ``step_receive``). A sub-env may be in one
        unreceived send at a time."""
        idx = np.asarray(indices, dtype=np.int64)
        if len(actions) != idx.size:
            raise ValueError(f"expected one action per sub-env stepped ({idx.size}), got {len(actions)}")
        if self._failed:
            raise RuntimeError("a sub-env failed in the last reset or step: call reset() before stepping again")
        if not self.active[idx].all() or np.intersect1d(idx, self._in_flight).size or np.unique(idx).size < idx.size:
            raise ValueError("step_send: every sub-env must be active, listed once and not already being stepped")
        self._in_flight = np.union1d(self._in_flight, idx)
        jobs = [(int(i), a) for i, a in zip(idx, actions)]
        self._failed = True
        with self._naming_failures("step", dict(jobs)):
            ticket = self.workers.send("step", jobs)
        self._failed = False
        return _StepTicket(idx, dict(jobs), ticket)

    def step_receive(self, ticket: _StepTicket):
        """The result of one :meth:`step_send`, shaped as :meth:`step`'s: entries of the sub-envs it stepped only."""
        idx = ticket.indices
        rewards = np.zeros(self.num_envs)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        infos: dict[str, Any] = {}
        self._failed = True
        self._in_flight = np.setdiff1d(self._in_flight, idx)
        with self._naming_failures("step", ticket.actions):
            results = self.workers.receive(ticket.sent)
        self._failed = False
        self.episode_steps[idx] += 1
        for i, (obs, reward, term, trunc, info) in zip(idx, results):
            self._observations[i] = obs
            rewards[i], terminated[i], truncated[i] = reward, term, trunc
            infos = self._add_info(infos, info, int(i))
        self.active[idx] = ~(terminated[idx] | truncated[idx])
        return tuple(self._observations), rewards, terminated, truncated, infos

    def call(self, name: str, *args: Any, indices: Sequence[int] | None = None) -> tuple[Any, ...]:
        """Call ``env.unwrapped.<name>(*args)`` on the sub-envs (all, or ``indices``)."""
        indices = list(range(self.num_envs)) if indices is None else [int(i) for i in indices]
        if self.mode == "async":
            busy = {self.workers.worker_of(int(i)) for i in self._in_flight}
            if busy & {self.workers.worker_of(i) for i in indices}:
                raise RuntimeError(f"call({name!r}): a worker of these sub-envs is stepping others (step_send); "
                                   "receive that step first")  # fmt: skip
        with self._naming_failures("call", dict.fromkeys(indices, name)):
            return tuple(self.workers.call(name, indices, args))

    def close_extras(self, **kwargs: Any) -> None:
        self.workers.close()
