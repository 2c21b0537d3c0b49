"""Callbacks and log output made for the agent's iteration-shaped loop (SB3's work too: docs/callbacks.md).

* :class:`IterationCheckpoint`: SB3's ``CheckpointCallback`` counted in env steps and saved between iterations,
  as folders named ``<prefix>_<steps>_steps``.
* :class:`PanelEvaluation`: SB3's ``EvalCallback`` for fixed task panels (:meth:`~agents.gagpo.GAGPOAgent.evaluate`)
  every ``eval_freq`` env steps, between iterations; its ``history`` is a learning curve.
* :class:`StepProgressBar`: SB3's progress bar advanced by the env steps actually taken, on stderr.
* :class:`ProgressBar`: the progress bar of every long loop (training, evaluation panels, warm starts).
* :class:`OneLineOutput`: the default ``verbose=1`` log, one line per iteration instead of SB3's 30-line table.
* :func:`default_logger` and :func:`init_callback`: the agent's logger and callback setup, as SB3's
  ``configure_logger`` and ``BaseAlgorithm._init_callback`` (SB3's own ``CheckpointCallback`` and progress bars are
  adapted to the iteration-shaped loop there: :func:`saves_at_boundaries`, :func:`step_accurate`).
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import sys
import time
import warnings
import weakref
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.text import Text
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, CheckpointCallback, ProgressBarCallback
from stable_baselines3.common.logger import HumanOutputFormat, KVWriter, Logger, make_output_format


class IterationCheckpoint(CheckpointCallback):
    """Save the agent every ``save_freq`` env steps, at the first iteration boundary past each multiple.

    SB3's ``CheckpointCallback`` saves in ``on_step``, mid-rollout; the agent then saves its last iteration
    boundary anyway, but a folder named after the step it was taken at would overstate the steps trained. This
    one saves when the next rollout starts (just after an update) and at the end of training. :attr:`last_path` is
    the last folder it wrote (None before the first): the checkpoint to resume this run from.

    A ``learn()`` that starts a new count (``reset_num_timesteps=True``, the default, also after ``load``) is
    refused a ``save_path`` that holds checkpoints of this ``name_prefix`` already: the two runs' names would mix
    in one folder, and equal step counts would overwrite each other. A run that continues its count
    (``reset_num_timesteps=False``) adds to its own folder.
    """

    def __init__(self, save_freq: int, save_path: str, name_prefix: str = "agent", verbose: int = 0) -> None:
        super().__init__(save_freq, save_path, name_prefix=name_prefix, verbose=verbose)
        self._next = save_freq
        self.last_path: Path | None = None

    def _on_training_start(self) -> None:
        if self.locals.get("reset_num_timesteps", True):
            pattern = re.compile(rf"{re.escape(self.name_prefix)}_(\d+)_steps")
            earlier = sorted(
                (int(m.group(1)), p.name) for p in Path(self.save_path).glob("*") if (m := pattern.fullmatch(p.name))
            )
            if earlier:
                raise ValueError(
                    f"{self.save_path} holds checkpoints of another run ({earlier[0][1]} .. {earlier[-1][1]}) and "
                    "this learn() starts a new step count at 0 (reset_num_timesteps=True, the default): pass "
                    "reset_num_timesteps=False to continue the loaded run's count, or give another save_path or "
                    "name_prefix"
                )
        self._next = (self.num_timesteps // self.save_freq + 1) * self.save_freq

    def _on_step(self) -> bool:
        return True

    def _on_rollout_start(self) -> None:
        self._save_if_due()

    def _on_training_end(self) -> None:
        self._save_if_due()

    def _save_if_due(self) -> None:
        self.num_timesteps = held_steps(self.model)
        if self.num_timesteps >= self._next:
            path = Path(self.save_path) / f"{self.name_prefix}_{self.num_timesteps}_steps"
            self.model.save(path)
            self.last_path = path
            self._next = (self.num_timesteps // self.save_freq + 1) * self.save_freq
            if self.verbose:
                print(f"checkpoint: {path}")


class PanelEvaluation(BaseCallback):
    """Evaluate a fixed panel of tasks every ``eval_freq`` env steps: SB3's ``EvalCallback`` for this agent.

    ``PanelEvaluation(2000, n_tasks=50)`` plays tasks ``seed_offset .. seed_offset + n_tasks - 1`` with
    :meth:`~agents.gagpo.GAGPOAgent.evaluate` (``deterministic``, ``batch_size``, ``env``, ``env_kwargs`` are
    passed on). Iterations are never cut, so, as :class:`IterationCheckpoint`, it evaluates at the first iteration
    boundary at or past each multiple of ``eval_freq`` (when the next rollout starts, just after an update), at the
    end of training and, with ``eval_at_start``, before the first rollout; never twice at the same step (a boundary
    past several multiples evaluates once, as does the end of training right after an evaluation).

    ``extra_panels``: more panels played at the same points, by name: keyword arguments of ``evaluate`` that
    replace the main panel's, e.g. the training tasks next to a held-out panel,
    ``{"train": {"n_tasks": 8, "seed_offset": 0}}``. ``unit="iterations"`` counts ``eval_freq`` in iterations
    instead of env steps (verl-agent validates every 5 iterations); ``temperature`` is the sampled panels'
    (``deterministic=False``; None: the training temperature).

    Each evaluation records ``eval/success_rate``, ``eval/score``, ``eval/mean_length``, ``eval/invalid_rate`` and
    ``eval/revisit_rate`` (an extra panel ``name``: ``eval/<name>/success_rate`` and so on), the main panel's success
    per task type (``eval/type/<type>``, where the env reports task types) in the agent's logger and dumps it at the
    agent's ``num_timesteps``, as SB3's ``EvalCallback`` does; and appends to :attr:`history` a dict: ``steps`` (the
    agent's ``num_timesteps``), ``target_steps`` (the point it stands for: the last multiple of ``eval_freq`` passed,
    the training's total steps at the end, the steps it started from at the start; with ``unit="iterations"`` that
    multiple in iterations), ``iteration``, those five metrics, ``type/<type>``, ``<name>/<metric>`` for the extra
    panels, ``seconds`` (the time the panels took) and ``elapsed_s`` (seconds since the first training start,
    evaluations included). :attr:`last` holds the main panel's full :meth:`~agents.gagpo.GAGPOAgent.evaluate` result.
    Sampled evaluations draw from streams of their own (one per task and step), so a run trains the same with or without
    this callback, whatever its schedule.
    """

    METRICS = ("success_rate", "score", "mean_length", "invalid_rate", "revisit_rate")

    def __init__(
        self,
        eval_freq: int,
        n_tasks: int = 50,
        *,
        seed_offset: int = 0,
        deterministic: bool = True,
        batch_size: int = 16,
        env: str | None = None,
        env_kwargs: dict[str, Any] | None = None,
        extra_panels: dict[str, dict[str, Any]] | None = None,
        eval_at_start: bool = True,
        unit: str = "steps",
        temperature: float | None = None,
        verbose: int = 0,
    ) -> None:
        super().__init__(verbose=verbose)
        if eval_freq < 1 or n_tasks < 1:
            raise ValueError(f"eval_freq and n_tasks must be >= 1, got {eval_freq} and {n_tasks}")
        if unit not in ("steps", "iterations"):
            raise ValueError(f"unit must be 'steps' or 'iterations', got {unit!r}")
        self.eval_freq, self.unit = int(eval_freq), unit
        self.panel: dict[str, Any] = {
            "env": env, "n_tasks": int(n_tasks), "seed_offset": seed_offset, "deterministic": deterministic,
            "batch_size": batch_size, "env_kwargs": env_kwargs, "temperature": temperature,
        }  # fmt: skip
        for name, kwargs in (extra_panels or {}).items():
            if unknown := set(kwargs) - set(self.panel):
                raise ValueError(f"extra panel {name!r}: unknown evaluate() arguments {sorted(unknown)}")
        self.extra_panels = {name: {**self.panel, **kwargs} for name, kwargs in (extra_panels or {}).items()}
        self.eval_at_start = eval_at_start
        self.history: list[dict[str, Any]] = []
        self.last: dict[str, Any] = {}
        self._next = self.eval_freq
        self._total = 0
        self._started: float | None = None

    def _count(self) -> int:
        """Where training is, in the unit of ``eval_freq``."""
        return self.model.iteration if self.unit == "iterations" else self.model.num_timesteps

    def _on_training_start(self) -> None:
        if self._started is None:
            self._started = time.perf_counter()
        count = self._count()
        # The step budget marks the end in env steps only (an iteration budget ends where the last one ends).
        self._total = int(self.locals.get("total_timesteps", count)) if self.unit == "steps" else count
        self._next = (count // self.eval_freq + 1) * self.eval_freq
        if self.eval_at_start:
            self._evaluate(count)

    def _on_step(self) -> bool:
        return True

    def _on_rollout_start(self) -> None:
        count = self._count()
        if count >= self._next:
            self._evaluate(count // self.eval_freq * self.eval_freq)

    def _on_training_end(self) -> None:
        count = self._count()
        due = [count // self.eval_freq * self.eval_freq, *([self._total] if count >= self._total else [])]
        self._evaluate(max(due))

    def _evaluate(self, target: int) -> None:
        steps = self.model.num_timesteps
        self._next = (self._count() // self.eval_freq + 1) * self.eval_freq
        if self.history and self.history[-1]["steps"] == steps:
            return
        t0 = time.perf_counter()
        self.last = self.model.evaluate(**self.panel)
        point: dict[str, Any] = {"steps": steps, "target_steps": int(target), "iteration": self.model.iteration}
        point.update({k: float(self.last[k]) for k in self.METRICS})
        point.update({f"type/{t}": float(v) for t, v in self.last.get("per_type", {}).items()})
        for name, kwargs in self.extra_panels.items():
            metrics = self.model.evaluate(**kwargs)
            point.update({f"{name}/{k}": float(metrics[k]) for k in self.METRICS})
        point["seconds"] = time.perf_counter() - t0
        point["elapsed_s"] = time.perf_counter() - (self._started or t0)
        self.history.append(point)
        for key, value in point.items():
            if key not in ("steps", "target_steps", "iteration", "seconds", "elapsed_s"):
                self.logger.record(f"eval/{key}", value)
        self.logger.record("time/eval_s", point["seconds"])
        self.logger.record("time/total_timesteps", steps, exclude="tensorboard")
        self.logger.dump(steps)
        if self.verbose >= 1:
            extra = "".join(f", {name} success {point[name + '/success_rate']:.2f}" for name in self.extra_panels)
            print(
                f"eval at {steps} steps: success {point['success_rate']:.2f}, score {point['score']:.3g}, "
                f"length {point['mean_length']:.3g}, invalid {point['invalid_rate']:.2f}{extra} "
                f"({point['seconds']:.1f}s)"
            )


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
        self.start_timesteps = self.num_timesteps
        total = int(self.locals["total_timesteps"]) - self.start_timesteps
        self.pbar = ProgressBar(total, "training", unit="step", enabled=True)

    def _on_step(self) -> bool:
        # The agent counts every env step taken before on_step (SB3's num_timesteps; an iteration's end adds the
        # other ranks' steps, which the total counts too).
        self.pbar.advance(self.num_timesteps - self.start_timesteps - self.pbar.n)
        return True

    def _on_training_end(self) -> None:
        self.pbar.advance(self.model.num_timesteps - self.start_timesteps - self.pbar.n)
        if self.pbar.n > self.pbar.total:  # show n/n, not n/total
            self.pbar.set_total(self.pbar.n)
        self.pbar.close()


def held_steps(model: Any) -> int:
    """The step count a save of ``model`` holds: its last iteration boundary's (what ``save()`` writes), which
    is the current count between iterations and less after training stopped inside a rollout."""
    # With an update in flight beside the rollout (overlap), a save first waits for it: it holds that boundary.
    pending = getattr(model, "pending_boundary", None)
    boundary = (pending() if callable(pending) else None) or getattr(model, "boundary", None)
    return int(boundary["num_timesteps"]) if boundary is not None else int(model.num_timesteps)


def saves_at_boundaries(checkpoint: CheckpointCallback) -> None:
    """Make a plain SB3 ``CheckpointCallback`` save between iterations, named after the steps its file holds.

    SB3's saves in ``on_step``, mid-rollout, where the agent writes its last iteration boundary: a file named
    ``rl_model_350_steps.zip`` would hold the 334-step state. Here ``on_step`` only marks a save as due (every
    ``save_freq`` calls, as SB3 counts them) and SB3's own save runs at the next boundary (the next rollout's start,
    or the end of training), with the count the save holds in its name.
    """
    save = checkpoint._on_step  # SB3's: saves when n_calls is a multiple of save_freq
    due = False

    def on_step() -> bool:
        nonlocal due
        due = due or checkpoint.n_calls % checkpoint.save_freq == 0
        return True

    def at_boundary() -> None:
        nonlocal due
        if due:
            due = False
            calls = checkpoint.n_calls
            checkpoint.n_calls, checkpoint.num_timesteps = checkpoint.save_freq, held_steps(checkpoint.model)
            try:
                save()
            finally:
                checkpoint.n_calls = calls

    checkpoint._on_step = on_step  # type: ignore[method-assign]
    checkpoint._on_rollout_start = at_boundary  # type: ignore[method-assign]
    checkpoint._on_training_end = at_boundary  # type: ignore[method-assign]


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
        ("time/recompute_s", "recompute_s", "{:.1f}"),
        ("time/update_s", "update_s", "{:.1f}"),
        ("eval/success_rate", "eval success", "{:.2f}"),  # PanelEvaluation's own lines
        ("eval/mean_length", "eval len", "{:.3g}"),
        ("time/eval_s", "eval_s", "{:.1f}"),
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


def default_logger(verbose: int, log_dir: str | None) -> Logger:
    """SB3's logger: one line per iteration at ``verbose=1``, SB3's table at 2; CSV/JSON/TB in ``log_dir``."""
    outputs: list[KVWriter] = []
    if verbose == 1:
        outputs.append(OneLineOutput())
    elif verbose >= 2:
        outputs.append(HumanOutputFormat(sys.stdout))
    if log_dir is not None:
        os.makedirs(log_dir, exist_ok=True)
        formats = ["csv", "json"] + ([] if tensorboard_missing() else ["tensorboard"])
        outputs += [make_output_format(f, log_dir) for f in formats]
    return Logger(folder=log_dir, output_formats=outputs)


@functools.cache
def tensorboard_missing() -> str | None:
    """Why TensorBoard files cannot be written (None: they can). A log folder without them is said once per process,
    with the extra that brings them, rather than left to be found empty."""
    try:  # the optional tensorboard extra
        import torch.utils.tensorboard  # noqa: F401
    except ImportError as err:
        warnings.warn(
            f"TensorBoard logging is off ({err}): install the tensorboard extra, pip install 'gagpo-gym[tensorboard]'; "
            "log folders get the CSV and JSON logs only",
            stacklevel=3,
        )
        return str(err)
    return None


#: The plain SB3 CheckpointCallbacks already adapted by :func:`saves_at_boundaries` (once, however many learn()s).
_AT_BOUNDARIES: weakref.WeakSet[CheckpointCallback] = weakref.WeakSet()


def init_callback(agent: Any, callback: BaseCallback | list[BaseCallback] | None, progress_bar: bool) -> BaseCallback:
    """One callback for :meth:`~agents.gagpo.GAGPOAgent.learn` (lists wrapped, the progress bar added), bound to it."""
    if isinstance(callback, list):
        callback = CallbackList(callback)
    elif callback is None:
        callback = CallbackList([])
    if progress_bar:
        callback = CallbackList([callback, StepProgressBar()])
    stack = [callback]
    while stack:  # SB3's own progress bars count env steps taken; its checkpoints save between iterations
        cb = stack.pop()
        stack += getattr(cb, "callbacks", [])
        if isinstance(cb, ProgressBarCallback) and not isinstance(cb, StepProgressBar):
            step_accurate(cb)
        if type(cb) is CheckpointCallback and cb not in _AT_BOUNDARIES:
            saves_at_boundaries(cb)
            _AT_BOUNDARIES.add(cb)
    callback.init_callback(agent)
    return callback
