"""What a study's report draws on: Student t intervals over seeds (Welch or pooled) and an exact permutation test
over seeds, success intervals that count a game played by several seeds once, training curves as each arm's mean
with a band over its seeds; and the percentile bootstrap the first ALFWorld study registered (too narrow over three
seeds: results/alfworld/corrections.md)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np


def _resampled_means(
    sides: tuple[list[float], list[float]], draws: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each side's mean and ``draws`` bootstrap means, each side's seeds resampled with replacement on its own."""
    rng = np.random.default_rng(seed)
    a, b = (np.asarray(x, dtype=float) for x in sides)
    if not len(a) or not len(b):
        raise ValueError("both sides need at least one value")
    return a, b, *(x[rng.integers(len(x), size=(draws, len(x)))].mean(1) for x in (a, b))


def bootstrap_ratio(
    num: list[float], den: list[float], *, draws: int = 10_000, level: float = 0.9, seed: int = 0
) -> tuple[float, float, float]:
    """Ratio of means ``mean(num) / mean(den)`` and its percentile bootstrap interval, resampling seeds of each side."""
    a, b, ra, rb = _resampled_means((num, den), draws, seed)
    tail = (1 - level) / 2
    ratios = ra / rb
    return float(a.mean() / b.mean()), float(np.quantile(ratios, tail)), float(np.quantile(ratios, 1 - tail))


def bootstrap_difference(
    a: list[float], b: list[float], *, draws: int = 10_000, level: float = 0.9, seed: int = 0
) -> tuple[float, float, float]:
    """Difference of means ``mean(a) - mean(b)`` and its percentile bootstrap interval, resampling each side's seeds."""
    xa, xb, ra, rb = _resampled_means((a, b), draws, seed)
    tail = (1 - level) / 2
    differences = ra - rb
    return (
        float(xa.mean() - xb.mean()),
        float(np.quantile(differences, tail)),
        float(np.quantile(differences, 1 - tail)),
    )


# ----- t intervals over seeds, success intervals over games ---------------------------------------------------
def _t_density(x: float, df: float) -> float:
    """Student's t density with ``df`` degrees of freedom."""
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(log_c - (df + 1) / 2 * math.log1p(x * x / df))


def t_cdf(x: float, df: float, *, intervals: int = 2000) -> float:
    """P(T <= x) for Student's t (any real ``df`` > 0): Simpson's rule on the density from 0 to x."""
    if df <= 0:
        raise ValueError(f"df must be > 0, got {df}")
    if x < 0:
        return 1.0 - t_cdf(-x, df, intervals=intervals)
    h = x / intervals
    inner = sum((4 if i % 2 else 2) * _t_density(i * h, df) for i in range(1, intervals))
    return 0.5 + h / 3 * (_t_density(0.0, df) + inner + _t_density(x, df))


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on :func:`t_cdf`)."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    low, high = 0.0, max(10.0, NormalDist().inv_cdf(p) * 2)
    while t_cdf(high, df) < p:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


def t_interval_difference(
    a: Sequence[float], b: Sequence[float], *, level: float = 0.9, pooled: bool = False
) -> tuple[float, float, float, float]:
    """Difference of means ``mean(a) - mean(b)``, its t interval at ``level`` and the degrees of freedom.

    Welch's interval (Welch-Satterthwaite degrees of freedom) by default; ``pooled`` assumes one variance for both
    sides (``len(a) + len(b) - 2`` degrees of freedom). Each side needs at least two values (seeds)."""
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(xa) < 2 or len(xb) < 2:
        raise ValueError("each side needs at least two values")
    va, vb, na, nb = xa.var(ddof=1), xb.var(ddof=1), len(xa), len(xb)
    diff = float(xa.mean() - xb.mean())
    if pooled:
        df = na + nb - 2
        se = math.sqrt(((na - 1) * va + (nb - 1) * vb) / df * (1 / na + 1 / nb))
    else:
        se = math.sqrt(va / na + vb / nb)
        parts = (va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1)
        df = (va / na + vb / nb) ** 2 / parts if parts > 0 else float(na + nb - 2)
    if se == 0:
        return diff, diff, diff, float(df)
    half = t_quantile(1 - (1 - level) / 2, df) * se
    return diff, diff - half, diff + half, float(df)


def game_success_interval(outcomes: Sequence[Sequence[float]], *, level: float = 0.95) -> tuple[float, float, float]:
    """Success rate over games, each game one unit: ``outcomes[g]`` holds game g's results (1 won, 0 lost) under
    every seed that played it. Each game's mean over its seeds, then a Wilson interval with n = the number of games
    (not games x seeds: the seeds share the games, so they are not independent trials). Returns (rate, low, high)."""
    if not outcomes or any(not len(o) for o in outcomes):
        raise ValueError("need at least one game, each with at least one result")
    n = len(outcomes)
    p = float(np.mean([np.mean(o) for o in outcomes]))
    z = NormalDist().inv_cdf(1 - (1 - level) / 2)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return p, max(0.0, centre - half), min(1.0, centre + half)


def permutation_test(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Difference of means ``mean(a) - mean(b)`` and its exact two-sided permutation p-value over seeds: the share
    of all ways to split the pooled values into groups of ``len(a)`` and ``len(b)`` whose difference is at least as
    far from 0. Exact, with no assumption on the spread; with 3 seeds a side there are 20 splits, so p is at least
    0.1 (2 of 20): three seeds cannot show a difference at 0.05 this way."""
    xa, xb = [float(x) for x in a], [float(x) for x in b]
    if not xa or not xb:
        raise ValueError("both sides need at least one value")
    pooled, na = xa + xb, len(xa)
    total = sum(pooled)
    observed = sum(xa) / na - sum(xb) / len(xb)
    extreme = splits = 0
    for chosen in itertools.combinations(range(len(pooled)), na):
        side = sum(pooled[i] for i in chosen)
        difference = side / na - (total - side) / len(xb)
        extreme += abs(difference) >= abs(observed) - 1e-12
        splits += 1
    return observed, extreme / splits


def seed_comparison(a: Sequence[float], b: Sequence[float], *, level: float = 0.9) -> dict[str, float]:
    """``mean(a) - mean(b)`` over seeds with Welch's t interval at ``level`` (its degrees of freedom) and the exact
    permutation p: what a registered study's report says of a comparison."""
    diff, low, high, df = t_interval_difference(a, b, level=level)
    _, p = permutation_test(a, b)
    return {"difference": diff, "low": low, "high": high, "df": df, "p": p}


def type_intervals(
    runs: Sequence[Sequence[Mapping[str, Any]]], types: Sequence[str], *, level: float = 0.95
) -> dict[str, tuple[float, float, float, int]]:
    """Success per task type over games, each game one unit (:func:`game_success_interval`): ``runs`` holds each
    seed's episodes (``task_id``, ``task_type``, ``won``). Returns ``{type: (rate, low, high, games)}`` for every
    name of ``types`` with a game (``"All"``: every game), matched to ``task_type`` case-insensitively."""
    games: dict[str, dict[str, Any]] = {}
    for episodes in runs:
        for episode in episodes:
            game = games.setdefault(episode["task_id"], {"type": str(episode["task_type"]).lower(), "won": []})
            game["won"].append(float(episode["won"]))
    out = {}
    for name in types:
        won = [g["won"] for g in games.values() if name == "All" or g["type"] == name.lower()]
        if won:
            out[name] = (*game_success_interval(won, level=level), len(won))
    return out


# ----- curves: each arm's mean and its seeds' band -------------------------------------------------------------
def curve_band(
    curves: Sequence[Sequence[Mapping[str, Any]]], window: int = 3, key: str = "rollout/success_rate"
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One logged value (``key``) of several seeds on one grid of env steps: each seed's moving mean over ``window``
    iterations, interpolated between iterations; returns (steps, mean, min, max) over the seeds."""
    series = []
    for curve in curves:
        steps = np.array([c["step"] for c in curve], dtype=float)
        values = np.array([c[key] for c in curve], dtype=float)
        smooth = np.array([values[max(0, k - window + 1) : k + 1].mean() for k in range(len(values))])
        series.append((steps, smooth))
    grid = np.linspace(max(s[0] for s, _ in series), min(s[-1] for s, _ in series), 200)
    values = np.array([np.interp(grid, s, v) for s, v in series])
    return grid, values.mean(0), values.min(0), values.max(0)


def plot_seed_bands(
    arms: Mapping[str, Sequence[Sequence[Mapping[str, Any]]]],
    path: Path,
    *,
    reference: str | None = None,
    reference_label: str | None = None,
    bar: float | None = None,
    title: str = "",
    ylabel: str = "train success, 3-iter. mean",
    columns: int = 3,
    dpi: int = 90,
) -> None:
    """One panel per arm (``arms``: its seeds' curves): the mean of its seeds with their range as a band, the
    ``reference`` arm's mean dashed in every other panel (``reference_label`` in the legend), the ``bar`` dotted;
    the legend below the panels. Single seeds' lines invite reading a lucky seed as the arm; the band shows how far
    the seeds agree."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = -(-len(arms) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3 * columns, 2.4 * rows), sharex=True, sharey=True,
                             squeeze=False)  # fmt: skip
    ref = curve_band(arms[reference]) if reference is not None else None
    for ax, (arm, curves) in zip(axes.flat, arms.items()):
        steps, mean, low, high = curve_band(curves)
        if ref is not None and arm != reference:
            label = reference_label or f"{reference}, mean of {len(arms[reference])} seeds"
            ax.plot(ref[0], ref[1], color="grey", lw=1, ls="--", label=label)
        ax.fill_between(steps, low, high, color="C0", alpha=0.25, lw=0, label="range of the seeds")
        ax.plot(steps, mean, color="C0", lw=1.6, label="mean of the seeds")
        if bar is not None:
            ax.axhline(bar, color="black", lw=0.6, ls=":", label=f"the bar ({bar})")
        ax.set_title(f"{arm} ({len(curves)} seed{'s' if len(curves) > 1 else ''})", fontsize=9)
        ax.set_ylim(0, 1)
        ax.tick_params(labelsize=8)
    for ax in axes.flat[len(arms) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("env steps", fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel, fontsize=8)
    handles, labels = axes.flat[1 if len(arms) > 1 else 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
