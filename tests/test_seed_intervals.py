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


def test_the_overlap_equivalence_page_compares_on_and_off_by_hand(tmp_path: Path):
    """lab/studies/overlap_equivalence.py on three made-up seeds: each run's final success, AUC and steps to the
    bar (censored at the budget) from its curve, and on - off with Welch's 95% t interval computed here."""
    import json

    from lab.studies import overlap_equivalence as eq

    def run(label: str, seed: int, successes: list[float]) -> dict:
        curve = [{"steps": 2000 * i, "success": s} for i, s in enumerate(successes)]
        return {"label": label, "seed": seed, "curve": curve, "train_s": 100.0}

    off = {0: [0.70, 0.74, 0.76], 1: [0.70, 0.72, 0.73], 2: [0.70, 0.77, 0.80]}
    on = {0: [0.70, 0.73, 0.79], 1: [0.70, 0.76, 0.78], 2: [0.70, 0.71, 0.74]}
    payload = {
        "env_id": "gagpo_gym/MiniHouse-v0", "env_kwargs": {"size": "full"}, "bar": 0.75, "eval": "greedy",
        "budget": {"total_steps": 4000, "eval_every": 2000, "eval_tasks": 100},
        "runs": [run(eq.OFF, s, c) for s, c in off.items()] + [run(eq.ON, s, c) for s, c in on.items()],
    }  # fmt: skip
    (tmp_path / "runs.json").write_text(json.dumps(payload))
    assert eq.main([str(tmp_path)]) == 0
    page = (tmp_path / "equivalence.md").read_text()
    seed1 = eq.measures(payload["runs"][1], 0.75)
    assert seed1 == {"final success": 0.73, "AUC": pytest.approx(2.15 / 3), "steps to bar": 4000.0}  # censored
    assert eq.measures(payload["runs"][0], 0.75)["steps to bar"] == 4000.0  # 0.76 first at 4000
    assert (
        eq.measures(payload["runs"][3], 0.75)["steps to bar"] == 4000.0
        and eq.measures(run(eq.ON, 9, [0.7, 0.8, 0.7]), 0.75)["steps to bar"] == 2000.0
    )
    a, b = [0.79, 0.78, 0.74], [0.76, 0.73, 0.80]
    va, vb = (sum((x - sum(v) / 3) ** 2 for x in v) / 2 for v in (a, b))
    se = math.sqrt(va / 3 + vb / 3)
    df = se**4 / ((va / 3) ** 2 / 2 + (vb / 3) ** 2 / 2)
    diff = sum(a) / 3 - sum(b) / 3
    half = t_quantile(0.975, df) * se
    assert f"| final success | {diff:+.3f} | [{diff - half:+.3f}, {diff + half:+.3f}] | {half:.3f} | {df:.1f} |" in page
    assert "no difference detected" in page and "| gagpo overlap seed 2 | 0.740 |" in page
