"""The paper-style results tables (success with Wilson intervals, ALFWorld's task-type columns), Markdown
tables and all-or-nothing file writes: what train.py, eval.py and warm_start.py print and write (the lab uses them
too; its intervals over seeds are lab/reporting.py)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gagpo_gym.envs.alfworld import TASK_TYPES as ALFWORLD_TASK_TYPES

#: The paper's ALFWorld columns (Pick, Look, Clean, Heat, Cool, Pick2), in its order: the envs' short task-type
#: names capitalised, from gagpo_gym.envs.alfworld.TASK_TYPES (ALFWorld's long name -> short name).
ALFWORLD_ORDER = tuple(short.capitalize() for short in ALFWORLD_TASK_TYPES.values())
#: Paper column of each task type, by short name (``pick2``) or ALFWorld's long name (``pick_two_obj_and_place``).
TASK_TYPE_COLUMNS: dict[str, str] = {
    **{short: short.capitalize() for short in ALFWORLD_TASK_TYPES.values()},
    **{long: short.capitalize() for long, short in ALFWORLD_TASK_TYPES.items()},
}
#: Envs whose table follows the paper's ALFWorld shape / WebShop shape.
HOUSEHOLD_ENVS = ("ALFWorld", "MiniHouse")
SHOP_ENVS = ("MiniShop", "WebShop")


def table_kind(env_id: str) -> str:
    """``"household"`` (per-task-type success), ``"shop"`` (score and success) or ``"generic"``."""
    name = env_id.split(":")[-1].split("/")[-1]
    if name.startswith(HOUSEHOLD_ENVS):
        return "household"
    if name.startswith(SHOP_ENVS):
        return "shop"
    return "generic"


def _rate_columns(row: dict[str, Any], column: str, wins: int, n: int) -> None:
    """``column``: success in %; ``column n``: games; ``column lo``/``column hi``: its 95% Wilson interval in %."""
    from agents.evaluation import wilson_interval

    low, high = wilson_interval(wins, n)
    row[column] = 100.0 * wins / n if n else None
    row[f"{column} n"] = n
    row[f"{column} lo"] = 100.0 * low if n else None
    row[f"{column} hi"] = 100.0 * high if n else None


def table_row(name: str, metrics: dict[str, Any], kind: str) -> dict[str, Any]:
    """One row of the paper-style table (success in %, score = 100 x mean score) as plain numbers.

    Every success rate ``C`` comes with ``C n`` (games it is over) and ``C lo``/``C hi`` (95% Wilson score
    interval, %). Reads only the panel summary (:func:`agents.evaluation.summarize`), no per-episode rows.
    """
    row: dict[str, Any] = {"agent": name}
    n_tasks = int(metrics["n_tasks"])
    wins = int(metrics.get("wins", round(metrics["success_rate"] * n_tasks)))
    if kind == "household":
        per_column = {c: [0, 0] for c in ALFWORLD_ORDER}  # wins, games
        type_n = metrics.get("per_type_n", {})
        type_wins = metrics.get("per_type_wins", {})
        for task_type, rate in metrics["per_type"].items():
            column = TASK_TYPE_COLUMNS.get(str(task_type))
            if column is not None:
                n = int(type_n.get(task_type, 0))
                per_column[column][0] += int(type_wins.get(task_type, round(rate * n)))
                per_column[column][1] += n
        for column in ALFWORLD_ORDER:
            _rate_columns(row, column, *per_column[column])
        _rate_columns(row, "All", wins, n_tasks)
        row["Won steps"] = metrics.get("won_length")
    elif kind == "shop":
        row["Score"] = 100.0 * metrics["score"]
        _rate_columns(row, "Success", wins, n_tasks)
    else:
        _rate_columns(row, "Success", wins, n_tasks)
        row["Return"] = metrics["mean_return"]
    row["Length"] = metrics["mean_length"]
    row["Invalid"] = 100.0 * metrics["invalid_rate"]
    row["Tasks"] = n_tasks
    return row


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 10 or value == 0 else f"{value:.2f}"
    return str(value)


def markdown_table(rows: list[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A GitHub Markdown table; ``None`` prints as ``-`` (no task of that type in the panel)."""
    if not rows:
        return ""
    columns = list(columns or rows[0].keys())
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def results_table(rows: list[dict[str, Any]]) -> str:
    """The printed form of :func:`table_row` rows: each success rate as ``rate [low, high]`` (95% Wilson).

    A per-task-type column's game count goes in its header (``Pick (n=35)``) when every row has the same one
    (one panel), else in each cell; overall rates are over ``Tasks`` games.
    """
    if not rows:
        return ""
    rated = [c for c in rows[0] if f"{c} n" in rows[0]]
    shown: list[dict[str, Any]] = [{} for _ in rows]
    for column in rows[0]:
        if column.endswith((" n", " lo", " hi")) and column.rsplit(" ", 1)[0] in rated:
            continue
        header = column
        if column in rated:
            counts = {r.get(f"{column} n") for r in rows}
            same = len(counts) == 1
            if same and column in ALFWORLD_ORDER:
                header = f"{column} (n={counts.pop()})"
            for out, row in zip(shown, rows):
                value, low, high = row.get(column), row.get(f"{column} lo"), row.get(f"{column} hi")
                cell = "-" if value is None else f"{_cell(value)} [{low:.1f}, {high:.1f}]"
                out[header] = cell if same or value is None else f"{cell} n={row.get(f'{column} n')}"
        else:
            for out, row in zip(shown, rows):
                out[header] = row.get(column)
    return markdown_table(shown)


def table_legend(kind: str) -> str:
    """What the columns mean, printed under the table."""
    first = {
        "household": "Pick..Pick2, All: success rate (%) per task type (n: games of that type) and overall; Won "
        "steps: mean length of the won episodes",
        "shop": "Score: 100 x mean final score; Success: % of tasks with score 1",
        "generic": "Success: % of tasks solved; Return: mean episode return (penalties included)",
    }[kind]
    return (
        f"{first}; [low, high]: 95% Wilson score interval; Length: mean episode length (steps); Invalid: % invalid "
        "actions; Tasks: panel size."
    )


_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` all or nothing: a temporary file in the same folder, then ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes the file private; a written file gets the usual mode
        with os.fdopen(fd, "w", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Rows of dicts to CSV with the union of their keys as the header (first-seen order)."""
    import csv
    import io

    header: list[str] = []
    for row in rows:
        header += [k for k in row if k not in header]
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=header)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, text.getvalue())
