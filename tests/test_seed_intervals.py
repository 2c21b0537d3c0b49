"""Intervals over seeds and over games (lab/reporting.py) and the ALFWorld study's corrections written with them
(lab/studies/alfworld_corrections.py), which must match the committed results/alfworld/corrections.md."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from agents.evaluation import wilson_interval
from lab.reporting import game_success_interval, t_cdf, t_interval_difference, t_quantile

RESULTS = Path(__file__).resolve().parents[1] / "results" / "alfworld"


@pytest.mark.parametrize(
    ("p", "df", "expected"),
    [(0.95, 1, 6.313752), (0.95, 2, 2.919986), (0.95, 4, 2.131847), (0.975, 10, 2.228139), (0.95, 30, 1.697261)],
)
def test_t_quantile_matches_the_tables(p: float, df: float, expected: float):
    assert t_quantile(p, df) == pytest.approx(expected, abs=1e-5)
    assert t_quantile(1 - p, df) == pytest.approx(-expected, abs=1e-5)
    assert t_cdf(expected, df) == pytest.approx(p, abs=1e-6)


def test_welch_and_pooled_intervals_by_hand():
    a, b = [59.3, 61.4, 64.3], [54.3, 56.4, 59.3]
    diff, low, high, df = t_interval_difference(a, b, level=0.9, pooled=True)
    assert df == 4 and diff == pytest.approx(5.0)
    # equal spreads: Welch's degrees of freedom are the pooled ones and the intervals agree
    welch = t_interval_difference(a, b, level=0.9)
    assert welch[3] == pytest.approx(4.0) and welch[1:3] == pytest.approx((low, high))
    se = math.sqrt(sum((x - sum(a) / 3) ** 2 for x in a) / 2 * 2 / 3)
    assert high - diff == pytest.approx(2.131847 * se, rel=1e-5)

    c = [50.0, 60.0, 70.0]  # a wider side: Welch's df fall below 4 and its interval widens
    _, wlow, whigh, wdf = t_interval_difference(a, c, level=0.9)
    _, plow, phigh, _ = t_interval_difference(a, c, level=0.9, pooled=True)
    assert 2 <= wdf < 4 and whigh - wlow > phigh - plow
    with pytest.raises(ValueError, match="two values"):
        t_interval_difference([1.0], [1.0, 2.0])


def test_a_game_counts_once_however_many_seeds_played_it():
    games = [[1, 1, 1]] * 6 + [[0, 0, 0]] * 4  # 10 games, 3 seeds each, the seeds agree
    rate, low, high = game_success_interval(games, level=0.95)
    assert rate == pytest.approx(0.6)
    assert (low, high) == pytest.approx(wilson_interval(6, 10))  # 10 units, not 30 trials
    assert high - low > wilson_interval(18, 30)[1] - wilson_interval(18, 30)[0]
    mixed = game_success_interval([[1, 0, 1], [0, 0, 1]])
    assert mixed[0] == pytest.approx(0.5)
    with pytest.raises(ValueError):
        game_success_interval([])


def test_the_committed_corrections_are_what_the_runs_give(tmp_path: Path):
    from lab.studies import alfworld_corrections as corrections

    written = corrections.write(out=tmp_path, figure=False).read_text()
    assert written == (RESULTS / "corrections.md").read_text()
    assert "Welch's intervals exclude 0 in 2 of the 14 comparisons (the registered bootstrap in 5)" in written
    assert "| grpo | valid_seen | **+5.0 [+0.6, +9.4]** |" in written
    assert "| g2po | valid_seen | **-5.5 [-9.5, -1.5]** |" in written
    runs = corrections.run_rows(corrections.load_runs(RESULTS / "runs"))
    choose = [r for r in runs if not r["run"].startswith("gagpo-generate")]
    assert min(r["distinct train games"] for r in choose) == 71 and max(r["distinct train games"] for r in choose) == 91
    assert all(r["distinct train games"] <= r["groups"] for r in runs)


@pytest.mark.parametrize(
    ("page", "arms"),
    [
        ("README.md", ("gagpo", "gigpo", "grpo", "rloo", "ppo", "hgpo", "graphgpo", "g2po")),
        ("docs/results/alfworld.md", ("gagpo", "rloo", "ppo", "hgpo", "graphgpo", "g2po")),
        ("docs/rivals.md", ("gagpo", "g2po", "graphgpo", "hgpo", "gigpo", "grpo")),
    ],
)
def test_the_pages_quote_the_generated_tables(page: str, arms: tuple[str, ...]):
    from agents.reporting import markdown_table
    from lab.studies import alfworld_corrections as corrections

    table = markdown_table(corrections.summary_rows(corrections.load_runs(RESULTS / "runs"), arms))
    assert table in (RESULTS.parents[1] / page).read_text()
