"""The paper-style household table (agents/reporting.py) puts each task type's result under its own column.

The end-to-end tests play the expert, which wins every game of every type: a table with two columns swapped reads
the same there. Here every type has its own win count, so a swap (Heat and Cool, say) or a type counted under
another column changes a number.
"""

from __future__ import annotations

import pytest

from agents.evaluation import summarize
from agents.reporting import ALFWORLD_ORDER, results_table, table_row

#: (wins, games) per task type: no two types alike, and Heat and Cool far apart.
OUTCOMES = {"pick": (1, 1), "look": (0, 2), "clean": (2, 3), "heat": (3, 4), "cool": (1, 4), "pick2": (1, 5)}
#: ALFWorld's own task-type names, which the table maps to the same columns.
LONG_NAMES = {
    "pick": "pick_and_place_simple", "look": "look_at_obj_in_light", "clean": "pick_clean_then_place_in_recep",
    "heat": "pick_heat_then_place_in_recep", "cool": "pick_cool_then_place_in_recep", "pick2": "pick_two_obj_and_place",
}  # fmt: skip
COLUMN = dict(zip(OUTCOMES, ALFWORLD_ORDER))


def episodes(names: dict[str, str] | None = None) -> list[dict]:
    rows = []
    for task_type, (wins, games) in OUTCOMES.items():
        for k in range(games):
            won = k < wins
            rows.append({"won": won, "score": float(won), "return": float(won), "length": 5 if won else 50,
                         "invalid": 0, "revisits": 0,
                         "task_type": (names or {}).get(task_type, task_type)})  # fmt: skip
    return rows


@pytest.mark.parametrize("names", [None, LONG_NAMES], ids=["short", "alfworld"])
def test_each_task_type_is_counted_under_its_own_column(names) -> None:
    row = table_row("agent", summarize(episodes(names)), "household")
    for task_type, (wins, games) in OUTCOMES.items():
        column = COLUMN[task_type]
        assert (row[column], row[f"{column} n"]) == (pytest.approx(100.0 * wins / games), games), column
    assert row["Heat"] == 75.0 and row["Cool"] == 25.0
    assert row["All"] == pytest.approx(100.0 * 8 / 19) and row["Tasks"] == 19 and row["Won steps"] == 5.0


def test_the_printed_table_keeps_the_paper_column_order_and_cells() -> None:
    table = results_table([table_row("agent", summarize(episodes()), "household")])
    header, _, cells = table.splitlines()
    names = [c.strip() for c in header.strip("|").split("|")]
    values = dict(zip(names, (c.strip() for c in cells.strip("|").split("|"))))
    games = {COLUMN[t]: n for t, (_, n) in OUTCOMES.items()}
    assert names[1:7] == [f"{c} (n={games[c]})" for c in ALFWORLD_ORDER] == [
        "Pick (n=1)", "Look (n=2)", "Clean (n=3)", "Heat (n=4)", "Cool (n=4)", "Pick2 (n=5)"
    ]  # fmt: skip
    assert values["Heat (n=4)"].startswith("75.0 [") and values["Cool (n=4)"].startswith("25.0 [")
    assert values["Look (n=2)"].startswith("0.0 [") and values["Pick (n=1)"].startswith("100.0 [")


def test_bootstrap_difference_of_seed_means_with_an_interval() -> None:
    from lab.reporting import bootstrap_difference

    diff, low, high = bootstrap_difference([0.9, 0.8, 0.85], [0.6, 0.7, 0.65])
    assert diff == pytest.approx(0.2) and 0.1 <= low < 0.2 < high <= 0.3
    assert bootstrap_difference([0.9, 0.8, 0.85], [0.6, 0.7, 0.65]) == (diff, low, high)  # seeded
    assert bootstrap_difference([0.5, 0.5], [0.5]) == (0.0, 0.0, 0.0)  # no spread: a point
    same, low, high = bootstrap_difference([0.2, 0.9, 0.5], [0.3, 0.8, 0.5])  # overlapping seeds: 0 is inside
    assert low < 0 < high and same == pytest.approx(0.0)
    with pytest.raises(ValueError, match="at least one"):
        bootstrap_difference([], [0.5])
