"""What the command-line scripts share: one-line failures, argument checks, GAGPOConfig as flags, Ctrl-C.

Each function ends a script the way a user expects (``error: ...`` on stderr and exit 2, no traceback), so the
scripts in ``scripts/`` stay thin and behave alike.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import gagpo_gym  # noqa: F401  (registers the built-in envs)

# The scripts print their own progress; Hugging Face's per-save shard bars are noise here. The variable is read when
# huggingface_hub is first imported (by transformers), so it costs no model import in a script that needs none.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


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
    """Build the env once so that a bad constructor argument, missing data (an absent ALFWorld split) or a missing
    extra is reported in the env's own one line before any work starts, not as a traceback."""
    from agents.env_spec import make_env

    try:
        make_env(env_id, env_kwargs, None).close()
    except (TypeError, ValueError, OSError, ImportError) as err:
        fail(f"cannot make {env_id} with {env_kwargs}: {first_line(err)}")


def first_line(err: BaseException) -> str:
    """An exception's message, first line only (what ``error: ...`` shows); its type where the message is empty."""
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


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

    from agents.advantages import REGISTRY
    from agents.config import GAGPOConfig

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
            kwargs["choices"] = tuple(REGISTRY)
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
