"""Evaluation panels: play a fixed list of tasks once each with any policy (an agent, the expert, random).

Kept apart from the training loop: scripts, benchmarks and the agent's ``evaluate()`` share it; envs are made by
:mod:`agents.env_spec`.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from agents.env_spec import REFERENCE_WRAPPING, EnvSpec
from wrappers import EpisodeStatistics, GroupedVectorEnv


def info_at(infos: dict[str, Any], i: int) -> dict[str, Any]:
    """The i-th sub-env's info out of Gymnasium's vectorised info dict (``_key`` masks say who has a key)."""
    out = {}
    for key, value in infos.items():
        if key.startswith("_"):
            continue
        if isinstance(value, dict):  # a nested info (e.g. ``episode``): only the sub-envs that have it
            mask = infos.get(f"_{key}")
            if mask is None or mask[i]:
                out[key] = info_at(value, i)
        elif infos[f"_{key}"][i]:
            out[key] = value[i]
    return out


def check_reward(reward: float, env: str | None, task: str, step: int, action: Any) -> None:
    """A reward that is not finite raises one ValueError naming the env, the task, the step and the action: a mean
    or an advantage over it would be ``nan``. Training rollouts and evaluation panels both check."""
    if not math.isfinite(float(reward)):
        raise ValueError(
            f"{env} returned reward {reward} for task {task} at step {step} (action {action!r}): rewards must be finite"
        )


def recorded(make_env: Callable[[], Any]) -> Any:
    """``make_env()`` with :class:`~wrappers.EpisodeStatistics` on top unless its stack has one already (every
    :func:`~wrappers.wrap_text_env` stack has): what :func:`run_panel` reads each finished episode from."""
    env = layer = make_env()
    while not isinstance(layer, EpisodeStatistics):
        if not hasattr(layer, "env"):
            return EpisodeStatistics(env)
        layer = layer.env
    return env


#: Where :func:`run_panel` reports finished episodes when its caller passes no ``progress`` (:func:`panel_progress`).
_PANEL_PROGRESS: contextvars.ContextVar[Callable[[int], None] | None] = contextvars.ContextVar(
    "panel_progress", default=None
)


@contextlib.contextmanager
def panel_progress(report: Callable[[int], None]) -> Iterator[None]:
    """Within the block, every :func:`run_panel` (``agent.evaluate()`` included) calls ``report(k)`` as ``k``
    more episodes finish: what the scripts' progress bars count."""
    token = _PANEL_PROGRESS.set(report)
    try:
        yield
    finally:
        _PANEL_PROGRESS.reset(token)


def run_panel(
    act,
    make_env,
    n_tasks: int,
    *,
    batch_size: int = 16,
    seed_offset: int = 0,
    episodes: bool = True,
    progress: Callable[[int], None] | None = None,
    workers: int = 0,
) -> dict[str, Any]:
    """Play tasks ``seed_offset + 0 .. n_tasks - 1`` once each; ``act(obs, infos, venv, indices) -> actions``.

    Used for agents, the expert and random reference policies alike; tasks run ``batch_size`` at a time.
    ``episodes=False`` leaves the per-episode rows out of the summary. ``progress(k)`` is called as ``k`` more
    episodes finish (default: the reporter of an enclosing :func:`panel_progress`, if any). A reward that is not
    finite raises ``ValueError`` naming the env, task and step (a mean over it would be ``nan``).

    ``workers``: 0 or 1 steps the envs in this process; ``N >= 2`` steps each batch's envs in ``N`` worker
    processes (``GroupedVectorEnv(mode="async")``, started once for the whole panel), while ``act`` runs here.
    The results are the same either way: the batches, the order of the ``act`` calls and every env's task seed
    do not depend on where the envs run. One set of ``min(batch_size, n_tasks)`` envs plays every batch (each
    reset with its batch's task seeds; a short last batch leaves the rest idle): envs are made once per panel.
    """
    if n_tasks < 1 or batch_size < 1:
        raise ValueError(f"n_tasks and batch_size must be >= 1, got {n_tasks} and {batch_size}")
    if workers < 0:
        raise ValueError(f"workers must be >= 0, got {workers}")
    report = progress if progress is not None else _PANEL_PROGRESS.get()
    results: list[dict[str, Any]] = []
    size = min(batch_size, n_tasks)
    mode = {"mode": "async", "n_workers": min(workers, size)} if workers >= 2 else {}
    venv = GroupedVectorEnv(functools.partial(recorded, make_env), size, 1, **mode)
    name = getattr(venv.spec, "id", None) or "the env"
    try:
        for start in range(0, n_tasks, batch_size):
            seeds = np.arange(start, min(start + batch_size, n_tasks)) + seed_offset
            n = len(seeds)
            # A short last batch: the idle envs replay their last task (for ALFWorld a cheap reset of the loaded
            # game) and take no step.
            padded = np.concatenate([seeds, venv.task_seeds[n:]]) if n < size else seeds
            obs, infos = venv.reset(options={"task_seeds": padded})
            venv.active[n:] = False
            current = [info_at(infos, i) for i in range(n)]
            task_ids = [info.get("task_id") for info in current]
            length = np.zeros(n, dtype=int)  # steps taken, for check_reward's message
            while venv.active.any():
                idx = np.flatnonzero(venv.active)
                chosen = act([obs[i] for i in idx], [current[i] for i in idx], venv, idx)
                actions: list[Any] = [None] * venv.num_envs
                for k, i in enumerate(idx):
                    actions[i] = chosen[k]
                obs, rewards, _, _, infos = venv.step(actions)
                for i in idx:
                    current[i] = info_at(infos, i)
                    check_reward(rewards[i], name, f"{task_ids[i]!r} (seed {seeds[i]})", length[i] + 1, actions[i])
                    length[i] += 1
                finished = int(len(idx) - venv.active[idx].sum())
                if report is not None and finished:
                    report(finished)
            for i in range(n):
                info = current[i]
                episode = info["episode"]  # EpisodeStatistics' record of the finished episode
                results.append({
                    "seed": int(seeds[i]), "task_id": info.get("task_id", task_ids[i]),
                    "task_type": info.get("task_type"), "won": bool(episode["won"]), "return": float(episode["r"]),
                    "length": int(episode["l"]), "invalid": int(episode["invalid"]),
                    "revisits": int(episode["revisits"]), "score": float(episode["score"]),
                })  # fmt: skip
    finally:
        venv.close()
    summary = summarize(results)
    if not episodes:
        del summary["episodes"]
    return summary


#: Two-sided 95% normal quantile, for :func:`wilson_interval`.
Z95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a success rate (95% by default): ``(low, high)`` in [0, 1].

    Unlike the normal approximation it never leaves [0, 1] and is not empty at 0 or n successes (0/10 ->
    [0, 0.278]); ``n == 0`` gives ``(0.0, 1.0)``, knowing nothing.
    """
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Panel metrics: overall and per task type, with the counts behind every rate.

    ``wins``/``n_tasks`` give ``success_rate``; ``per_type`` (success rate), ``per_type_n`` (episodes) and
    ``per_type_wins`` give the same per task type; ``won_length`` is the mean length of the won episodes (None
    when none was won). No key is ``nan``: an empty panel gives zeros.
    """
    won = [r for r in results if r["won"]]
    out: dict[str, Any] = {
        "n_tasks": len(results),
        "wins": len(won),
        "success_rate": len(won) / len(results) if results else 0.0,
        "score": float(np.mean([r["score"] for r in results])) if results else 0.0,
        "mean_return": float(np.mean([r["return"] for r in results])) if results else 0.0,
        "mean_length": float(np.mean([r["length"] for r in results])) if results else 0.0,
        "won_length": float(np.mean([r["length"] for r in won])) if won else None,
        "invalid_rate": float(sum(r["invalid"] for r in results) / max(sum(r["length"] for r in results), 1)),
        "revisit_rate": float(sum(r["revisits"] for r in results) / max(sum(r["length"] for r in results), 1)),
        "episodes": results,
    }
    types = sorted({r["task_type"] for r in results if r["task_type"] is not None})
    of_type = {t: [r for r in results if r["task_type"] == t] for t in types}
    out["per_type"] = {t: sum(r["won"] for r in rows) / len(rows) for t, rows in of_type.items()}
    out["per_type_n"] = {t: len(rows) for t, rows in of_type.items()}
    out["per_type_wins"] = {t: int(sum(r["won"] for r in rows)) for t, rows in of_type.items()}
    return out


def reference_policy_panel(
    kind: str,
    env_id: str,
    env_kwargs: dict[str, Any],
    n_tasks: int,
    *,
    seed: int = 0,
    seed_offset: int = 0,
    progress: Callable[[int], None] | None = None,
    workers: int = 0,
) -> dict[str, Any]:
    """Panel metrics of a reference policy: ``"expert"`` (the env's oracle) or ``"random"`` (uniform admissible).

    Tasks run 16 at a time (the random policy's action stream depends on it, so its rows stay reproducible);
    ``workers >= 2`` steps the envs in that many processes (:func:`run_panel`), with the same rows. The expert is
    asked in the processes that hold the envs.
    """
    rng = np.random.default_rng(seed)
    steps: dict[int, int] = {}  # actions taken so far in each task, for the message below

    def act(obs, infos, venv, idx):
        if kind == "expert":
            return list(venv.call("expert_action", indices=idx))
        actions = []
        for i, info in zip(idx, infos):
            seed_i = int(venv.task_seeds[venv.group_index[i]])
            admissible = info.get("admissible_actions") or []
            if not admissible:  # nothing to draw from: say so, rather than numpy's "high <= 0"
                raise ValueError(
                    f"{env_id}: task {info.get('task_id')!r} (seed {seed_i}) offers no admissible actions at step "
                    f"{steps.get(seed_i, 0)}; the random policy draws among them (an env that lists none has no "
                    "random row)"
                )
            steps[seed_i] = steps.get(seed_i, 0) + 1
            actions.append(admissible[rng.integers(len(admissible))])
        return actions

    if kind not in ("expert", "random"):
        raise ValueError(f"reference policy must be 'expert' or 'random', got {kind!r}")
    return run_panel(
        act,
        EnvSpec(env_id, env_kwargs).factory(REFERENCE_WRAPPING),
        n_tasks,
        seed_offset=seed_offset,
        progress=progress,
        workers=workers,
    )
