"""Shared pieces of the command-line scripts: argument checks, config flags, the paper-style table, atomic writes,
Ctrl-C handling."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python scripts/x.py` from a checkout that is not pip-installed
    sys.path.insert(0, str(ROOT))

import gagpo_gym  # noqa: E402, F401  (registers the built-in envs)
from gagpo_gym.envs.alfworld import TASK_TYPES as ALFWORLD_TASK_TYPES  # noqa: E402

# The scripts print their own progress; Hugging Face's per-save shard bars are noise here. The variable is read when
# huggingface_hub is first imported (by transformers), so it costs no model import in a script that needs none.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

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


def fail(message: str, code: int = 2) -> NoReturn:
    """One readable line on stderr and a non-zero exit: what a user needs, no traceback."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def resolve_env_id(env_id: str) -> str:
    """The full registered id (``Maze-v0`` -> ``gagpo_gym/Maze-v0``), or exit with the list of known ids.

    Gymnasium's ``module:EnvId`` form is accepted as ``gymnasium.make`` accepts it: the module is imported first
    (it registers the env) and kept in the returned id (``my_envs:MyEnv-v0`` -> ``my_envs:gagpo_gym/MyEnv-v0``),
    so that an agent trained on it saves an id that imports its module again wherever it is loaded.
    """
    from agents.env_spec import canonical_env_id

    try:
        return canonical_env_id(env_id)
    except ValueError as err:
        fail(str(err).replace("unknown env id", "unknown env", 1))


def parse_json_kwargs(text: str | None, flag: str = "--env-kwargs") -> dict[str, Any]:
    """A JSON object from the command line, or exit with a readable message."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        fail(f"{flag} is not valid JSON ({err.msg} at char {err.pos}): {text!r}")
    if not isinstance(value, dict):
        fail(f'{flag} must be a JSON object like \'{{"size": "small"}}\', got {text!r}')
    return value


def check_env_kwargs(env_id: str, env_kwargs: dict[str, Any]) -> None:
    """Build the env once so that a bad constructor argument is reported before any work starts."""
    from agents.env_spec import make_env

    try:
        make_env(env_id, env_kwargs, None).close()
    except (TypeError, ValueError) as err:
        fail(f"cannot make {env_id} with {env_kwargs}: {err}")


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


def check_writable(folder: str | Path, flag: str = "--out") -> Path:
    """Create ``folder`` if needed and write a probe file in it, or exit with one line saying why not."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        fail(f"cannot write to {flag} {folder}: {err.strerror or err}")
    return folder


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


# ----- Ctrl-C ----------------------------------------------------------------------------------------------
def interrupted(message: str) -> NoReturn:
    """End a script stopped by Ctrl-C: one line on stderr and exit code 130 (128 + SIGINT), as shells do."""
    from agents.callbacks import ProgressBar

    ProgressBar.close_all()  # the line goes below the bars, not into them
    print(f"interrupted: {message}", file=sys.stderr)
    raise SystemExit(130)


# ----- GAGPOConfig -> command-line flags -------------------------------------------------------------------
def _optional_float(text: str) -> float | None:
    if text.lower() in ("none", "auto"):
        return None
    return float(text)


def add_config_arguments(parser: Any, skip: Sequence[str] = ()) -> list[str]:
    """One flag per GAGPOConfig field (``num_groups`` -> ``--num-groups``), typed, with its default and the help
    text from the field's ``metadata["help"]``.

    Defaults are not stored in the namespace (``argparse.SUPPRESS``): :func:`config_overrides` returns exactly
    the values the user gave, so a resumed run keeps its saved hyperparameters unless a flag overrides one.
    """
    import argparse
    import dataclasses
    import typing

    from agents.config import ESTIMATORS, GAGPOConfig

    hints = typing.get_type_hints(GAGPOConfig)
    group = parser.add_argument_group("hyperparameters (agents.config.GAGPOConfig)")
    names = []
    for field in dataclasses.fields(GAGPOConfig):
        if field.name in skip:
            continue
        names.append(field.name)
        hint = hints[field.name]
        text = field.metadata["help"]  # every GAGPOConfig field carries its help (agents/config.py)
        kwargs: dict[str, Any] = {"dest": field.name, "default": argparse.SUPPRESS}
        if hint is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
            type_name = "bool"
        elif hint in (int, float, str):
            kwargs["type"], type_name = hint, hint.__name__
            kwargs["metavar"] = type_name.upper()
        elif hint is tuple:  # key_backoff: a list of key specs
            kwargs["nargs"], type_name, kwargs["metavar"] = "*", "keys", "KEY"
        else:  # float | None
            kwargs["type"], type_name = _optional_float, "float|none"
            kwargs["metavar"] = "FLOAT"
        if field.name == "estimator":
            kwargs["choices"] = ESTIMATORS
        kwargs["help"] = f"{text} ({type_name}, default: {field.default})"
        group.add_argument("--" + field.name.replace("_", "-"), **kwargs)
    return names


def config_overrides(args: Any, names: Sequence[str]) -> dict[str, Any]:
    """The hyperparameters given on the command line."""
    return {name: getattr(args, name) for name in names if hasattr(args, name)}


def validated_config(values: dict[str, Any]) -> Any:
    """GAGPOConfig(**values), or exit with its one-line message."""
    from agents.config import GAGPOConfig

    try:
        return GAGPOConfig(**values)
    except ValueError as err:
        fail(str(err))


# ----- recipes ----------------------------------------------------------------------------------------------
RECIPES = ROOT / "configs" / "recipes"
#: Recipe keys that are run settings of scripts/train.py rather than GAGPOConfig fields.
RECIPE_RUN_KEYS = (
    "env", "env_kwargs", "model", "iterations", "total_timesteps", "eval_tasks", "eval_freq", "eval_split",
    "eval_temperature",
)  # fmt: skip


def recipe_names() -> list[str]:
    return sorted(path.stem for path in RECIPES.glob("*.yaml"))


def load_recipe(name: str) -> tuple[dict[str, Any], dict[str, str]]:
    """A recipe's values and the source of each (``configs/recipes/<name>.yaml``, or a path to a YAML file), its
    ``extends`` chain resolved: a file's own values and sources replace those of the recipe it extends."""
    import dataclasses

    import yaml

    from agents.config import GAGPOConfig

    known = {f.name for f in dataclasses.fields(GAGPOConfig)} | set(RECIPE_RUN_KEYS)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    chain: list[Path] = []
    while name:
        path = (Path(name) if name.endswith((".yaml", ".yml")) else RECIPES / f"{name}.yaml").resolve()
        if not path.is_file():
            fail(f"no recipe {name!r} (a file {path}); recipes: {', '.join(recipe_names())}")
        if path in chain:
            fail(f"recipe {path} extends itself (through {' -> '.join(p.stem for p in chain)})")
        chain.append(path)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            fail(f"recipe {path} is not valid YAML: {str(err).splitlines()[0]}")
        if not isinstance(data, dict):
            fail(f"recipe {path} must be a mapping of settings, got {type(data).__name__}")
        own_sources = data.pop("sources", {}) or {}
        parent = data.pop("extends", "")
        unknown = sorted(set(data) - known)
        if unknown:
            fail(f"recipe {path}: unknown key(s) {', '.join(unknown)} (GAGPOConfig fields or {RECIPE_RUN_KEYS})")
        values = {**data, **values}  # what a file sets wins over what it extends
        sources = {**{k: str(v) for k, v in own_sources.items()}, **sources}
        name = str(parent)
    try:  # each value of its field's type and range, named by the recipe (not by a flag the user never gave)
        GAGPOConfig(**{k: v for k, v in values.items() if k not in RECIPE_RUN_KEYS})
    except (TypeError, ValueError) as err:
        fail(f"recipe {chain[0]}: {str(err).splitlines()[0]}")
    return values, sources
