"""What the measuring scripts beside it (``fingerprint.py``, ``throughput.py``) share: which checkout they imported,
and how they read an agent's logs on old and new checkouts alike (the lab's one :class:`Recorder`).

Those scripts measure the checkout named by ``PYTHONPATH``, so they run by path and this module puts nothing on
``sys.path`` and imports no package of the repository: a script finds it in its own folder, which Python puts first
on ``sys.path``, and it loads ``lab/recorder.py`` from its file.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from stable_baselines3.common.logger import KVWriter, Logger

PACKAGES = ("agents", "wrappers", "gagpo_gym")

# Imported as ``lab.recorder`` it would need the repository on sys.path, ahead of the checkout PYTHONPATH names.
_SPEC = importlib.util.spec_from_file_location("lab_recorder", Path(__file__).resolve().parents[1] / "recorder.py")
_RECORDER = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_RECORDER)
Recorder = _RECORDER.Recorder


def package_root(tool: str) -> Path:
    """The one folder ``agents``, ``wrappers`` and ``gagpo_gym`` are imported from; exits with one line naming the
    problem when one cannot be imported or they come from different folders (a mix measures no commit at all)."""
    roots = {}
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            sys.exit(f"{tool}: cannot import {name!r}; set PYTHONPATH to a checkout of the repository")
        roots[name] = Path(spec.origin).resolve().parents[1]
    if len(set(roots.values())) != 1:
        sys.exit(f"{tool}: the packages come from different folders: {roots}; set PYTHONPATH to one checkout")
    return roots["agents"]


def log_to(agent: Any, writer: KVWriter) -> None:
    """Send every logger dump of ``agent`` to ``writer`` alone (checkouts before ``set_logger`` set ``logger``)."""
    logger = Logger(folder=None, output_formats=[writer])
    if hasattr(agent, "set_logger"):
        agent.set_logger(logger)
    else:
        agent.logger = logger
