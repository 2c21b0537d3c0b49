"""Callbacks and log output made for the agent's iteration-shaped loop (SB3's own callbacks work too; see README).

* :class:`IterationCheckpoint`: SB3's ``CheckpointCallback`` counted in env steps and saved between iterations,
  as folders named ``<prefix>_<steps>_steps``.
* :class:`StepProgressBar`: SB3's progress bar advanced by the env steps actually taken.
* :class:`OneLineOutput`: the default ``verbose=1`` log, one line per iteration instead of SB3's 30-line table.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TextIO

from stable_baselines3.common.callbacks import CheckpointCallback, ProgressBarCallback
from stable_baselines3.common.logger import KVWriter


class IterationCheckpoint(CheckpointCallback):
    """Save the agent every ``save_freq`` env steps, at the first iteration boundary past each multiple.

    SB3's ``CheckpointCallback`` saves in ``on_step``, mid-rollout; the agent then saves its last iteration
    boundary anyway, but a folder named after the step it was taken at would overstate the steps trained. This
    one saves when the next rollout starts (just after an update) and at the end of training.
    """

    def __init__(self, save_freq: int, save_path: str, name_prefix: str = "agent", verbose: int = 0) -> None:
        super().__init__(save_freq, save_path, name_prefix=name_prefix, verbose=verbose)
        self._next = save_freq

    def _on_training_start(self) -> None:
        self._next = (self.num_timesteps // self.save_freq + 1) * self.save_freq

    def _on_step(self) -> bool:
        return True

    def _on_rollout_start(self) -> None:
        self._save_if_due()

    def _on_training_end(self) -> None:
        self._save_if_due()

    def _save_if_due(self) -> None:
        if self.num_timesteps >= self._next:
            path = Path(self.save_path) / f"{self.name_prefix}_{self.num_timesteps}_steps"
            self.model.save(path)
            self._next = (self.num_timesteps // self.save_freq + 1) * self.save_freq
            if self.verbose:
                print(f"checkpoint: {path}")


class StepProgressBar(ProgressBarCallback):
    """SB3's progress bar, advanced by the env steps actually taken (finished group members take none).

    ``learn(n)`` finishes the iteration it is in, so the bar's total grows to the steps taken when it ends.
    """

    def _on_step(self) -> bool:
        self.pbar.update(int(self.locals["n_active"]))
        return True

    def _on_training_end(self) -> None:
        done = self.pbar.n
        if done > self.pbar.total:  # show n/n, not n/total
            self.pbar.total = done
            rich_bar = getattr(self.pbar, "_prog", None)  # tqdm.rich draws from its own task's total
            if rich_bar is not None:
                rich_bar.update(self.pbar._task_id, total=done)
        ProgressBarCallback._on_training_end(self)


def step_accurate(bar: ProgressBarCallback) -> None:
    """Make a plain SB3 ``ProgressBarCallback`` count env steps taken, as :class:`StepProgressBar` does."""
    bar._on_step = StepProgressBar._on_step.__get__(bar)
    bar._on_training_end = StepProgressBar._on_training_end.__get__(bar)


class OneLineOutput(KVWriter):
    """One line per logger dump: the numbers a user watches while training."""

    FIELDS = (
        ("time/iterations", "iter", "{:.0f}"),
        ("time/total_timesteps", "steps", "{:.0f}"),
        ("rollout/success_rate", "success", "{:.2f}"),
        ("rollout/ep_return_mean", "return", "{:.3g}"),
        ("rollout/ep_len_mean", "len", "{:.3g}"),
        ("rollout/invalid_rate", "invalid", "{:.2f}"),
        ("train/policy_loss", "loss", "{:.3g}"),
        ("train/clip_fraction", "clip", "{:.2f}"),
        ("time/rollout_s", "rollout_s", "{:.1f}"),
        ("time/update_s", "update_s", "{:.1f}"),
    )

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream  # None: whatever sys.stdout is when a line is written

    def write(self, key_values: dict[str, Any], key_excluded: dict, step: int = 0) -> None:
        parts = [f"{label} {fmt.format(key_values[k])}" for k, label, fmt in self.FIELDS if k in key_values]
        stream = self.stream or sys.stdout
        stream.write(" | ".join(parts) + "\n")
        stream.flush()

    def close(self) -> None:
        pass
