"""Expert demonstrations as raw text, collected in worker processes, cached on disk, and turned into prompts later.

Imitation on a real task (ALFWorld's 3,553 train games) costs an hour of expert play on one core; the prompts a
policy is trained on are a choice made afterwards (history length, memory, the admissible list, the tokenizer). So
an episode is kept as what the env said and what was done, one JSON file per task seed, and the prompts are built
from it for whatever prompt settings an agent has (:func:`agents.warm_start.transcript_of`), exactly as the agent's
wrappers build them while it plays (history pairs of observation and played command; the memory of every observation).

* :func:`agents.warm_start.transcript_of`: the prompts of an agent's settings from them.
* :func:`collect_demonstrations`: the env's expert plays task seeds in worker processes; each finished episode is
  written at once (atomically), so a stopped collection resumes where it stopped.
* :func:`policy_demonstrations`: DAgger's rounds: the policy plays, the expert labels every state it reached.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import multiprocessing
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class Demonstration:
    """One episode as text: what the env showed before each step, what the expert advised, what was played."""

    seed: int
    task: str
    task_id: str
    task_type: str
    observations: list[str] = field(default_factory=list)  # before each step
    admissible: list[list[str]] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)  # the expert's command at each step
    played: list[str] = field(default_factory=list)  # what was played (the label, or the policy's or noise's)
    advised: list[bool] = field(default_factory=list)  # False where the expert had given up (its "look" is no advice)
    won: bool = False

    @property
    def length(self) -> int:
        return len(self.labels)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Demonstration:
        return cls(**data)

    @classmethod
    def begin(cls, seed: int, info: dict[str, Any]) -> Demonstration:
        """An empty episode of task ``seed`` from its reset info."""
        return cls(seed, info.get("task", ""), str(info.get("task_id", "")), str(info.get("task_type", "")))

    def record(self, obs: str, admissible: list[str], label: str, played: str, env: Any) -> None:
        """One step: what ``env`` (the unwrapped env, asked for its expert) showed, advised and what was played."""
        self.observations.append(obs)
        self.admissible.append(admissible)
        self.labels.append(label)
        self.played.append(played)
        self.advised.append(not getattr(env, "expert_gave_up", False))


def cache_folder(root: str | os.PathLike, env_id: str, env_kwargs: dict[str, Any], source: str) -> Path:
    """``root/<env id>-<hash of its kwargs>/<source>``: one folder per env as played and per way of playing."""
    tag = hashlib.blake2b(json.dumps(env_kwargs, sort_keys=True).encode(), digest_size=6).hexdigest()
    return Path(root) / f"{env_id.replace('/', '_')}-{tag}" / source


def _write(folder: Path, demo: Demonstration) -> None:
    tmp = folder / f".{demo.seed}.json.tmp"
    tmp.write_text(json.dumps(asdict(demo)))
    tmp.replace(folder / f"{demo.seed}.json")  # a reader never sees half a file


def read_demonstrations(folder: str | os.PathLike, seeds: Iterable[int]) -> list[Demonstration]:
    """The cached episodes of ``seeds`` (each must be there)."""
    folder = Path(folder)
    out = []
    for seed in seeds:
        path = folder / f"{seed}.json"
        if not path.is_file():
            raise FileNotFoundError(f"no demonstration for task seed {seed} in {folder}: collect it first")
        out.append(Demonstration.from_dict(json.loads(path.read_text())))
    return out


def play_expert(env: Any, seed: int, expert: str | None, epsilon: float = 0.0) -> Demonstration:
    """The expert plays task ``seed`` to its end (a random admissible command with probability ``epsilon``,
    drawn from a stream of the seed's own, so an episode is the same in any worker)."""
    rng = np.random.default_rng([seed, 7919])
    ask = {} if expert is None else {"kind": expert}
    obs, info = env.reset(seed=seed)
    base = env.unwrapped
    demo = Demonstration.begin(seed, info)
    done = False
    while not done:
        admissible = list(info.get("admissible_actions", []))
        label = base.expert_action(**ask)
        action = admissible[int(rng.integers(len(admissible)))] if rng.random() < epsilon and admissible else label
        demo.record(obs, admissible, label, action, base)
        obs, _, terminated, truncated, info = env.step(action)
        done = terminated or truncated
    demo.won = bool(info.get("won", False))
    return demo


_WORKER_ENV: Any = None


def _worker_init(env_id: str, env_kwargs: dict[str, Any]) -> None:
    global _WORKER_ENV
    import gymnasium as gym

    import gagpo_gym  # noqa: F401  (registers the ids)

    _WORKER_ENV = gym.make(env_id, **env_kwargs)


def _worker_play(seed: int, expert: str | None, epsilon: float) -> dict[str, Any]:
    return asdict(play_expert(_WORKER_ENV, seed, expert, epsilon))


def collect_demonstrations(
    env_id: str,
    seeds: Sequence[int],
    folder: str | os.PathLike,
    *,
    env_kwargs: dict[str, Any] | None = None,
    expert: str | None = None,
    epsilon: float = 0.0,
    workers: int = 2,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Play every seed of ``seeds`` with the env's expert (``expert``: its kind, None: the env's default) and write
    each episode to ``folder/<seed>.json``; seeds already there are skipped (a collection resumes). ``workers``
    processes play side by side (1: in this process). Returns counts: played now, found, won, steps."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    env_kwargs = dict(env_kwargs or {})
    todo = [s for s in seeds if not (folder / f"{s}.json").is_file()]
    played = 0
    if workers <= 1:
        _worker_init(env_id, env_kwargs)
        try:
            for seed in todo:
                _write(folder, Demonstration.from_dict(_worker_play(seed, expert, epsilon)))
                played += 1
                if progress is not None:
                    progress(1)
        finally:
            _WORKER_ENV.close()
    else:
        # spawn: the workers import the envs, not the caller's torch threads or open files
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=context, initializer=_worker_init, initargs=(env_id, env_kwargs)
        ) as pool:
            futures = [pool.submit(_worker_play, s, expert, epsilon) for s in todo]
            for future in concurrent.futures.as_completed(futures):
                _write(folder, Demonstration.from_dict(future.result()))
                played += 1
                if progress is not None:
                    progress(1)
    demos = read_demonstrations(folder, seeds)
    return {
        "played": played,
        "episodes": len(demos),
        "won": sum(d.won for d in demos),
        "steps": sum(d.length for d in demos),
        "advised_steps": sum(sum(d.advised) for d in demos),
    }


def policy_demonstrations(
    agent: Any,
    seeds: Sequence[int],
    *,
    expert: str | None = None,
    beta: float = 0.0,
    deterministic: bool = True,
    batch: int = 16,
) -> list[Demonstration]:
    """DAgger's data: the agent plays each seed (its own command, or the expert's with probability ``beta``) and
    the expert labels every state reached. ``batch`` episodes play side by side, one batched forward a step."""
    from agents.env_spec import text_wrapping

    ask = {} if expert is None else {"kind": expert}
    out: list[Demonstration] = []
    for start in range(0, len(seeds), batch):
        chunk = list(seeds[start : start + batch])
        envs = [agent.env_spec.make(text_wrapping(agent.config)) for _ in chunk]
        try:
            obs, infos, demos, states, done = [], [], [], [], []
            for env, seed in zip(envs, chunk):
                o, i = env.reset(seed=seed)
                obs.append(o)
                infos.append(i)
                demos.append(Demonstration.begin(seed, i))
                states.append(None)
                done.append(False)
            rng = np.random.default_rng([chunk[0], 104729])
            while not all(done):
                live = [j for j in range(len(chunk)) if not done[j]]
                actions, new_states = agent.predict(
                    [obs[j] for j in live], [infos[j] for j in live], state=[states[j] or [] for j in live],
                    episode_start=[states[j] is None for j in live], deterministic=deterministic,
                )  # fmt: skip
                for j, action, state in zip(live, actions, new_states):
                    env, demo = envs[j], demos[j]
                    label = env.unwrapped.expert_action(**ask)
                    play = label if rng.random() < beta else action
                    demo.record(obs[j], list(infos[j].get("admissible_actions", [])), label, play, env.unwrapped)
                    if state:
                        state[-1][1] = play  # the history holds what was played
                    states[j] = state
                    obs[j], _, terminated, truncated, infos[j] = env.step(play)
                    if terminated or truncated:
                        done[j] = True
                        demo.won = bool(infos[j].get("won", False))
            out.extend(demos)
        finally:
            for env in envs:
                env.close()
    return out
