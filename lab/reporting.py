"""Intervals over seeds for the studies' comparisons: a percentile bootstrap that resamples each side's seeds,
Student t intervals over seeds (Welch or pooled), and success intervals that count a game played by several
seeds once."""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

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
