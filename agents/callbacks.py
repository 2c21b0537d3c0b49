"""Callbacks and log output made for the agent's iteration-shaped loop (SB3's own callbacks work too; see README).

* :class:`IterationCheckpoint`: SB3's ``CheckpointCallback`` counted in env steps and saved between iterations,
  as folders named ``<prefix>_<steps>_steps``.
* :class:`StepProgressBar`: SB3's progress bar advanced by the env steps actually taken, on stderr.
* :class:`ProgressBar`: the progress bar of every long loop (training, evaluation panels, warm starts).
* :class:`OneLineOutput`: the default ``verbose=1`` log, one line per iteration instead of SB3's 30-line table.
"""

from __future__ import annotations

import atexit
import sys
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, TextIO

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


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ProgressBar:
    """A progress bar on stderr (rich): ``with ProgressBar(n, "eval gagpo", unit="task") as bar: bar.advance(1)``.

    ``enabled``: ``None`` (default) shows it only when stderr is a terminal, the convention of tqdm
    (``disable=None``), pip and git, so that logs and pipes stay clean; ``True`` always (where stderr is not a
    terminal, rich prints the final state once, at :meth:`close`); ``False`` never. It shows ``done/total``, the
    elapsed time, the time left and the mean rate since the start (never ``?`` once something was done). Lines
    printed to a terminal stdout while it runs appear above it; a redirected stdout is left alone.
    """

    _open: ClassVar[list[ProgressBar]] = []  # drawn now: close_all() ends them (Ctrl-C), atexit at the latest

    def __init__(self, total: int, description: str, *, unit: str = "step", enabled: bool | None = None) -> None:
        self.total, self.n, self.unit, self.description = max(0, int(total)), 0, unit, description
        self.enabled = sys.stderr.isatty() if enabled is None else bool(enabled)
        self._progress: Any = None
        if not self.enabled:
            return
        from rich.console import Console
        from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
        from rich.text import Text

        class Counts(ProgressColumn):
            def render(self, task: Any) -> Text:
                return Text(f"{int(task.completed)}/{int(task.total or 0)} {unit}s", style="progress.download")

        class Left(ProgressColumn):  # from the mean rate: rich's own estimate forgets its samples on a new total
            def render(self, task: Any) -> Text:
                elapsed, done, total = task.elapsed or 0.0, task.completed, task.total or 0
                left = (total - done) * elapsed / done if done and total > done else 0.0
                return Text(f"< {_clock(left)}" if done else "< -:--:--", style="progress.remaining")

        class Rate(ProgressColumn):
            def render(self, task: Any) -> Text:
                elapsed, done = task.elapsed or 0.0, task.completed
                if not done or elapsed <= 0:
                    return Text(f"? {unit}s/s", style="progress.data.speed")
                rate = done / elapsed
                text = f"{rate:.1f} {unit}s/s" if rate >= 1 else f"{elapsed / done:.1f} s/{unit}"
                return Text(text, style="progress.data.speed")

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=30),
            Counts(),
            TimeElapsedColumn(),
            Left(),
            Rate(),
            # off a terminal (a log file) the one final line gets room for every column, not rich's 80
            console=Console(stderr=True, width=None if sys.stderr.isatty() else 160),
            redirect_stdout=sys.stdout.isatty(),
            redirect_stderr=False,
        )
        self._task = self._progress.add_task(description, total=self.total)
        self._progress.start()
        ProgressBar._open.append(self)
        atexit.register(self.close)  # a bar left open (an exception) still restores the terminal's cursor

    def advance(self, k: int = 1) -> None:
        self.n += int(k)
        if self._progress is not None:
            self._progress.update(self._task, completed=self.n)

    def set_total(self, total: int) -> None:
        self.total = max(0, int(total))
        if self._progress is not None:
            self._progress.update(self._task, total=self.total)

    def restart_clock(self) -> None:
        """Count time (and the rate) from now: after a set-up (loading a model) that the rate should not include."""
        if self._progress is not None:
            self._progress.reset(self._task, total=self.total, completed=self.n, description=self.description)

    def set_description(self, description: str) -> None:
        self.description = description
        if self._progress is not None:
            self._progress.update(self._task, description=description)

    def close(self) -> None:
        if self._progress is not None:
            progress, self._progress = self._progress, None
            progress.refresh()
            progress.stop()
            atexit.unregister(self.close)
            if self in ProgressBar._open:
                ProgressBar._open.remove(self)

    @classmethod
    def close_all(cls) -> None:
        """End every bar still drawn (before a last message, e.g. on Ctrl-C, so that it is not drawn over)."""
        for bar in list(cls._open):
            bar.close()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, kind: type | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class StepProgressBar(ProgressBarCallback):
    """SB3's progress bar, advanced by the env steps actually taken (finished group members take none).

    It knows the run's total (``learn(n)``: ``n`` steps, ``n`` more when resuming), shows the mean rate in
    steps/s, and draws on stderr (SB3's draws on stdout). ``learn(n)`` finishes the iteration it is in, so the
    bar can pass its total and ends at ``n/n``, ``n`` the steps taken.
    """

    def _on_training_start(self) -> None:
        total = int(self.locals["total_timesteps"]) - int(self.model.num_timesteps)
        self.pbar = ProgressBar(total, "training", unit="step", enabled=True)

    def _on_step(self) -> bool:
        self.pbar.advance(int(self.locals["n_active"]))
        return True

    def _on_training_end(self) -> None:
        if self.pbar.n > self.pbar.total:  # show n/n, not n/total
            self.pbar.set_total(self.pbar.n)
        self.pbar.close()


def step_accurate(bar: ProgressBarCallback) -> None:
    """Make a plain SB3 ``ProgressBarCallback`` count env steps taken, as :class:`StepProgressBar` does."""
    for name in ("_on_training_start", "_on_step", "_on_training_end"):
        setattr(bar, name, getattr(StepProgressBar, name).__get__(bar))


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
