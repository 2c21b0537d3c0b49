"""The lab's one logger recorder: what an agent logs at each iteration, kept as rows for a study or benchmark.

It imports nothing of the repository, so the scripts that measure another checkout load it from its file
(``lab/bench/checkouts.py``) and every older agent's logger can write to it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3.common.logger import KVWriter

NUMBER = (int, float, np.integer, np.floating)


class Recorder(KVWriter):
    """SB3 logger output keeping each dump (the agent dumps once per iteration) as a row in ``rows``: the step under
    ``step_key`` and the dump's numbers (as floats) whose keys ``keep`` accepts. With ``path``, each row is also
    appended to that JSON-lines file, so a curve survives a stopped run."""

    def __init__(
        self, path: Path | None = None, keep: Callable[[str], bool] | None = None, step_key: str = "step"
    ) -> None:
        self.path, self.keep, self.step_key = path, keep, step_key
        self.rows: list[dict[str, float]] = []

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, Any], step: int = 0) -> None:
        row: dict[str, float] = {self.step_key: int(step)}
        row.update(
            (k, float(v))
            for k, v in key_values.items()
            if isinstance(v, NUMBER) and (self.keep is None or self.keep(k))
        )
        self.rows.append(row)
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row, sort_keys=True) + "\n")

    def close(self) -> None:
        pass
