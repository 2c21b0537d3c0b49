"""Learning-speed benchmark: GAGPO against GiGPO, GRPO, RLOO and PPO on the same tasks, seeds and step budget.

    python -m lab.bench.learning --quick                       # Maze, all five estimators, 3 seeds
    python -m lab.bench.learning --quick --envs minihouse
    python -m lab.bench.learning --full --envs maze minihouse --lam-sweep 0 0.5 0.8 0.95 1

Every run trains the tiny model from the same initial weights (per seed) with one estimator, and every
``eval_every`` env steps plays a fixed panel of tasks (seeds ``0..eval_tasks-1``, greedy actions). Reported per
estimator: success against env steps, env steps to reach the success bar, final success, mean episode length, the
area under the success curve, and the advantage diagnostics the agent logs (IQR, share of |A| > 1, singleton
share, gradient norm), averaged over iterations and seeds. Outputs: one folder per study,
``<--out>/<env><--tag>/`` (``--out`` default ``results/learning``) with ``report.md`` (the tables), ``steps.csv`` (one
row per evaluation), ``iterations.csv`` (one row per training iteration, from the agent's logger), ``runs.json``
(everything) and ``curve.png`` (mean +- std curves).

The named setups are ``lab/bench/setups/<name>.yaml`` (:mod:`lab.benchmark`).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3.common.logger import Logger

from agents.cli import add_config_arguments, config_overrides, fail, parse_json_kwargs, resolve_env_id, validated_config
from agents.config import ESTIMATORS
from agents.prior import HELDOUT_OFFSET
from agents.reporting import markdown_table, write_csv
from lab.benchmark import PRESETS, EnvSetup, load_setups, rollout_curve, rollout_steps_to_bar, setup_names
from lab.recorder import Recorder
from lab.reporting import bootstrap_ratio

ROOT = Path(__file__).resolve().parents[2]


#: Hyperparameters that shape a warm-start prior (the training tasks, the prompt, the model's size).
PRIOR_SHAPING = (
    "task_pool",
    "history_length",
    "show_admissible",
    "max_prompt_tokens",
    "tiny_hidden_size",
    "tiny_layers",
)
#: Baselines that every GAGPO run (plain, with back-off, each --variant) is compared with, with bootstrap intervals:
#: every other estimator that ran, in ESTIMATORS' order.
RATIO_BASELINES = tuple(e for e in ESTIMATORS if e != "gagpo")
DIAGNOSTICS = {
    "advantage/iqr": "adv IQR",
    "advantage/share_abs_gt_1": "share abs(A)>1",
    "advantage/singleton_share": "singleton share",
    "advantage/level_share_0": "rows at level 0",
    "train/grad_norm": "grad norm",
    "train/clip_fraction": "clip frac",
    "rollout/revisit_rate": "rollout revisits",
}


SUMMARY_NOTE = (
    "steps to bar (reached): mean env steps at the first evaluation at or above the bar, over the runs that reached"
    " it; censored: unreached runs counted as all the env steps they took. Rollout steps to bar: the same on the"
    " training rollouts' sampled success (moving average of 3 iterations), mean over the runs that reached it;"
    " rollout final: that success over the last 3 iterations. AUC: mean panel success over all evaluations."
    " Diagnostics: means over training iterations of the agent's logged values."
)
RATIO_NOTE = (
    "Ratio of mean env steps to the bar (unreached runs count as all the env steps they took, the budget or a little"
    " more), with a 90% percentile bootstrap interval over seeds (10,000 resamples of each side's seeds); below 1"
    " means GAGPO is faster. Panel: the evaluation panel above; training tasks: the first tasks of the training pool,"
    " greedy, at the same points; rollouts: the training rollouts' sampled success (as rollout steps to bar)."
    " Final success: the means at the last evaluation and their ratio, with the same kind of interval (above 1 means"
    " GAGPO ends higher)."
)


@dataclass(frozen=True)
class RunSpec:
    """One training run of the benchmark (picklable: runs may go to worker processes)."""

    env_name: str
    setup: EnvSetup
    label: str
    estimator: str
    seed: int
    config: dict[str, Any]
    total_steps: int
    eval_every: int
    eval_tasks: int
    sampled_eval: bool
    model: str = "tiny"
    eval_offset: int = 0
    save_dir: str = ""  # where the trained agent is saved (<save_dir>/<label>-seed<seed>); "" saves nothing


def run_one(spec: RunSpec) -> dict[str, Any]:
    """Train one agent, the panel evaluated every ``eval_every`` env steps (``agents.callbacks.PanelEvaluation``)."""
    from agents.callbacks import PanelEvaluation
    from agents.gagpo import GAGPOAgent

    started = time.perf_counter()
    agent = GAGPOAgent(
        spec.setup.env_id,
        spec.model,
        estimator=spec.estimator,
        env_kwargs=spec.setup.env_kwargs,
        verbose=0,
        seed=spec.seed,
        **spec.config,
    )
    recorder = Recorder(step_key="steps")
    agent.set_logger(Logger(folder=None, output_formats=[recorder]))
    build_s = time.perf_counter() - started
    extra = {}
    if spec.eval_offset and agent.config.task_pool:  # held-out panel: also the training tasks, learning vs generalising
        n_train = min(spec.eval_tasks, agent.config.task_pool)
        extra["train"] = {"n_tasks": n_train, "batch_size": min(n_train, 50), "deterministic": True, "seed_offset": 0}
    evaluation = PanelEvaluation(
        spec.eval_every, spec.eval_tasks, deterministic=not spec.sampled_eval, batch_size=min(spec.eval_tasks, 50),
        seed_offset=spec.eval_offset, extra_panels=extra,
    )  # fmt: skip
    learn_started = time.perf_counter()
    agent.learn(spec.total_steps, callback=evaluation, log_interval=1)
    wall = time.perf_counter() - started
    if spec.save_dir:
        agent.save(Path(spec.save_dir) / f"{spec.label.replace(' ', '_')}-seed{spec.seed}")
    curve = [
        {"target_steps": target, **_curve_point(point),
         "wall_s": learn_started - started + point["elapsed_s"]}
        for target, point in _points_due(evaluation.history, spec.total_steps, spec.eval_every)
    ]  # fmt: skip
    eval_s = sum(point["seconds"] for point in evaluation.history)
    return {
        "env": spec.env_name, "label": spec.label, "estimator": spec.estimator, "seed": spec.seed,
        "config": agent.config.to_dict(), "model": spec.model, "eval_tasks": spec.eval_tasks,
        "eval_offset": spec.eval_offset, "curve": curve, "iterations": iterations(recorder.rows),
        "wall_s": wall, "build_s": build_s, "eval_s": eval_s, "train_s": wall - build_s - eval_s,
    }  # fmt: skip


def iterations(rows: list[dict[str, float]]) -> list[dict[str, float]]:
    """The training iterations' rows; PanelEvaluation's own dumps (no ``time/iterations``) are in the run's curve."""
    return [row for row in rows if "time/iterations" in row]


def _points_due(history: list[dict[str, Any]], total: int, every: int) -> list[tuple[int, dict[str, Any]]]:
    """One curve point per target (0, every, 2 every, ..., total): the first evaluation at or past it.

    Every run then has the same targets (the tables and plots average seeds target by target), even where one
    iteration took the agent past two of them (one evaluation stands for both).
    """
    targets = [*range(0, total, every), total]
    return [(t, next(p for p in history if p["steps"] >= t)) for t in targets]


def _curve_point(point: dict[str, Any]) -> dict[str, Any]:
    out = {
        "steps": point["steps"], "success": point["success_rate"], "score": point["score"],
        "mean_length": point["mean_length"], "invalid_rate": point["invalid_rate"],
        "revisit_rate": point["revisit_rate"],
    }  # fmt: skip
    if "train/success_rate" in point:  # a held-out panel beside a finite training pool
        out["train_success"] = point["train/success_rate"]
    return out


# ----- summaries -------------------------------------------------------------------------------------------
def steps_to_bar(curve: list[dict[str, Any]], bar: float, key: str = "success") -> int | None:
    """Env steps at the first evaluation whose success (``key``: the panel) reaches ``bar`` (None if none does)."""
    for point in curve:
        if point[key] >= bar - 1e-12:
            return int(point["steps"])
    return None


def _all_steps(run: dict[str, Any]) -> int:
    """The env steps a run took (its last iteration may overshoot the budget): an unreached run's censored cost."""
    return int(run["curve"][-1]["steps"])


def _rollout_final(iterations: list[dict[str, float]], window: int = 3) -> float:
    """Sampled success of the training rollouts, mean of the last ``window`` iterations."""
    success = rollout_curve(iterations)[1]
    return float(np.mean(success[-window:])) if len(success) else float("nan")


def _reached_mean(steps: list[int | None]) -> str:
    reached = [s for s in steps if s is not None]
    return f"{np.mean(reached):.0f} ({len(reached)}/{len(steps)})" if reached else f"- (0/{len(steps)})"


def _mean_sd(values: list[float]) -> str:
    if not values:
        return "-"
    mean = float(np.mean(values))
    return f"{mean:.2f} +- {float(np.std(values, ddof=1)):.2f}" if len(values) > 1 else f"{mean:.2f}"


def summarize(
    runs: list[dict[str, Any]], labels: list[str], bar: float, train_bar: float = 0.8
) -> list[dict[str, Any]]:  # fmt: skip
    """One row per estimator label: learning speed, final quality, diagnostics (means over seeds)."""
    rows = []
    for label in labels:
        mine = [r for r in runs if r["label"] == label]
        if not mine:
            continue
        reached = [s for s in (steps_to_bar(r["curve"], bar) for r in mine) if s is not None]
        # Unreached runs count as all the steps they took in the censored mean (a lower bound on their true cost).
        censored = [steps_to_bar(r["curve"], bar) or _all_steps(r) for r in mine]
        finals = [r["curve"][-1]["success"] for r in mine]
        rollout = [rollout_steps_to_bar(r["iterations"], bar) for r in mine]
        row: dict[str, Any] = {
            "estimator": label,
            "reached": f"{len(reached)}/{len(mine)}",
            f"steps to {bar:g} (reached)": f"{np.mean(reached):.0f}" if reached else "-",
            "steps (censored)": f"{np.mean(censored):.0f}",
            "rollout steps to bar": _reached_mean(rollout),
            "rollout final": _mean_sd([_rollout_final(r["iterations"]) for r in mine]),
            "final success": _mean_sd(finals),
            "AUC": f"{np.mean([np.mean([p['success'] for p in r['curve']]) for r in mine]):.3f}",
            "final length": f"{np.mean([r['curve'][-1]['mean_length'] for r in mine]):.1f}",
        }
        revisits = [r["curve"][-1]["revisit_rate"] for r in mine if "revisit_rate" in r["curve"][-1]]
        row["final revisits"] = f"{np.mean(revisits):.3f}" if revisits else "-"  # runs from before the count: -
        for key, name in DIAGNOSTICS.items():
            per_run = [np.mean([it[key] for it in r["iterations"] if key in it]) for r in mine]
            per_run = [v for v in per_run if np.isfinite(v)]
            row[name] = f"{np.mean(per_run):.3f}" if per_run else "-"
        if "train_success" in mine[0]["curve"][0]:
            train = [steps_to_bar(r["curve"], train_bar, "train_success") or _all_steps(r) for r in mine]
            row["training tasks: steps (censored)"] = f"{np.mean(train):.0f}"
            row["training tasks: final"] = _mean_sd([r["curve"][-1]["train_success"] for r in mine])
        row["train s/run"] = f"{np.mean([r['train_s'] for r in mine]):.0f}"
        rows.append(row)
    return rows


def _baseline(gagpo_label: str, baseline: str, labels: list[str]) -> str | None:
    """The run a GAGPO label is compared with: the baseline's run of the same variant (``gagpo X`` against
    ``gigpo X``) when there is one, else the plain baseline, else None (the baseline did not run)."""
    same = baseline + gagpo_label.removeprefix("gagpo")
    return same if same in labels else baseline if baseline in labels else None


def ratio_table(runs: list[dict[str, Any]], bar: float, train_bar: float = 0.8) -> list[dict[str, Any]]:
    """Each GAGPO label against each of RATIO_BASELINES: env steps to the bar (censored) and final success, per panel.

    Panels: the evaluation panel, the training tasks (held-out runs) and the training rollouts' sampled success.
    """
    rows = []
    labels = list(dict.fromkeys(r["label"] for r in runs))
    pairs = [(num, den) for num in labels if num.startswith("gagpo")
             for den in (_baseline(num, b, labels) for b in RATIO_BASELINES) if den]  # fmt: skip
    for num, den in pairs:
        a = [r for r in runs if r["label"] == num]
        b = [r for r in runs if r["label"] == den]
        row = {"ratio": f"{num} / {den}"}
        for key, panel, level in (("success", "panel", bar), ("train_success", "training tasks", train_bar)):
            if key not in a[0]["curve"][0]:
                continue
            reach = functools.partial(_curve_steps_to_bar, bar=level, key=key)
            row[f"{panel}: steps to bar"] = _steps_ratio(a, b, reach)
            finals = [[r["curve"][-1][key] for r in side] for side in (a, b)]
            ratio, low, high = bootstrap_ratio(*finals)
            row[f"{panel}: final success"] = (
                f"{np.mean(finals[0]):.3f} vs {np.mean(finals[1]):.3f} ({ratio:.2f}x [{low:.2f}, {high:.2f}])"
            )
        row["rollouts: steps to bar"] = _steps_ratio(a, b, lambda r: rollout_steps_to_bar(r["iterations"], bar))
        rows.append(row)
    return rows


def _curve_steps_to_bar(run: dict[str, Any], bar: float, key: str) -> int | None:
    return steps_to_bar(run["curve"], bar, key)


def _steps_ratio(a: list[dict[str, Any]], b: list[dict[str, Any]], steps_of: Any) -> str:
    """``ratio x [low, high]`` of the mean censored steps to the bar of runs ``a`` over runs ``b``."""
    ratio, low, high = bootstrap_ratio(*([steps_of(r) or _all_steps(r) for r in side] for side in (a, b)))
    return f"{ratio:.2f}x [{low:.2f}, {high:.2f}]"


def curve_table(runs: list[dict[str, Any]], labels: list[str]) -> list[dict[str, Any]]:
    """Mean greedy success at each evaluation point (columns: target env steps)."""
    rows = []
    for label in labels:
        mine = [r for r in runs if r["label"] == label]
        if not mine:
            continue
        row: dict[str, Any] = {"estimator": label}
        for k, point in enumerate(mine[0]["curve"]):
            row[str(point["target_steps"])] = f"{np.mean([r['curve'][k]['success'] for r in mine]):.2f}"
        rows.append(row)
    return rows


def plot(runs: list[dict[str, Any]], labels: list[str], bar: float, title: str, mode: str, path: Path) -> None:
    """Panel success (left) and training-rollout success (right) against env steps, mean +- std over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, label in enumerate(labels):
        mine = [r for r in runs if r["label"] == label]
        if not mine:
            continue
        color = colors[i % len(colors)]
        x = np.array([p["target_steps"] for p in mine[0]["curve"]])
        y = np.array([[p["success"] for p in r["curve"]] for r in mine])
        axes[0].plot(x, y.mean(0), label=label, color=color)
        axes[0].fill_between(x, y.mean(0) - y.std(0), y.mean(0) + y.std(0), color=color, alpha=0.15)
        grid = np.linspace(0, x[-1], 60)
        dense = []
        for r in mine:
            steps, success = rollout_curve(r["iterations"])
            if len(steps):
                dense.append(np.interp(grid, steps, success, left=np.nan))
        if dense:
            d = np.array(dense)
            with warnings.catch_warnings():  # grid points before a run's first iteration are all-NaN
                warnings.simplefilter("ignore", RuntimeWarning)
                mean, sd = np.nanmean(d, 0), np.nanstd(d, 0)
            axes[1].plot(grid, mean, color=color, label=label)
            axes[1].fill_between(grid, mean - sd, mean + sd, color=color, alpha=0.15)
    for ax, name in zip(axes, (f"panel success ({mode})", "training rollout success (sampled)")):
        ax.axhline(bar, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("env steps")
        ax.set_title(name)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("success rate")
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----- command line ----------------------------------------------------------------------------------------
def build_parser() -> tuple[argparse.ArgumentParser, list[str]]:
    parser = argparse.ArgumentParser(
        description="Env steps to a success bar for GAGPO and its baselines (same envs, seeds and budgets).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    preset = parser.add_mutually_exclusive_group()
    preset.add_argument("--quick", action="store_true", help=f"preset {PRESETS['quick']} (the default)")
    preset.add_argument("--full", action="store_true", help=f"preset {PRESETS['full']}")
    preset.add_argument(
        "--paper", action="store_true", help=f"preset {PRESETS['paper']}: from each env's warm-start prior"
    )
    parser.add_argument(
        "--envs", nargs="+", default=["maze"], help=f"named setups {setup_names()} (lab/bench/setups) or env ids"
    )
    parser.add_argument("--env-kwargs", default=None, help="JSON merged into every env's constructor arguments")
    parser.add_argument(
        "--estimators", nargs="*", default=list(ESTIMATORS), choices=ESTIMATORS,
        help="estimators to run (none with --estimators alone: only the --variant/--backoff/--lam-sweep runs)",
    )  # fmt: skip
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="seeds (preset: 3 or 5)")
    parser.add_argument(
        "--backoff", nargs="+", default=None, help="extra GAGPO runs with key_backoff set to these keys (e.g. group)"
    )
    parser.add_argument(
        "--variant", action="append", default=[], metavar="[ESTIMATOR:]LABEL=JSON",
        help="an extra run (GAGPO unless ESTIMATOR: is given) with these hyperparameters, e.g. "
        'coef0.5=\'{"episode_coef": 0.5}\' or grpo:ex=\'{"expert_members": 1}\'; a GAGPO variant is compared '
        "with the same variant of a baseline when there is one (repeatable)",
    )  # fmt: skip
    parser.add_argument("--lam-sweep", nargs="+", type=float, default=None, help="extra GAGPO runs at these lambdas")
    parser.add_argument("--total-steps", type=int, default=None, help="env-step budget per run (preset)")
    parser.add_argument("--eval-every", type=int, default=None, help="env steps between evaluations (preset)")
    parser.add_argument("--eval-tasks", type=int, default=None, help="panel size: tasks 0..N-1 (preset)")
    parser.add_argument("--eval-sampled", action="store_true", help="sample actions in evaluation (default greedy)")
    parser.add_argument("--bar", type=float, default=None, help="success bar (default: per env setup)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (1 thread each)")
    parser.add_argument("--out", default=str(ROOT / "results" / "learning"), help="folder of the study folders")
    parser.add_argument(
        "--save-agents", default=None, metavar="DIR", help="save each trained agent to DIR/<label>-seed<seed>"
    )
    parser.add_argument(
        "--merge", nargs="+", default=None, metavar="JSON",
        help="write one report from the runs of these runs.json files (same env and budget) instead of running",
    )  # fmt: skip
    parser.add_argument(
        "--tag",
        default="",
        help="suffix of the study folder's name (<env><tag>; one starting with '-' is given as --tag=-name)",
    )
    names = add_config_arguments(parser, skip=("estimator", "seed"))
    return parser, names


def _setups(args: argparse.Namespace) -> dict[str, EnvSetup]:
    extra = parse_json_kwargs(args.env_kwargs)
    known = _named_setups()
    out = {}
    for name in args.envs:
        if name in known:
            setup = known[name]
        else:
            env_id = resolve_env_id(name)
            setup = EnvSetup(env_id)
            name = env_id.split("/")[-1].lower()
        setup = dataclasses.replace(setup, env_kwargs={**setup.env_kwargs, **extra})
        _check_env(setup)
        out[name] = setup
    return out


def _check_env(setup: EnvSetup) -> None:
    import gagpo_gym

    try:
        gagpo_gym.make(setup.env_id, **setup.env_kwargs).close()
    except (TypeError, ValueError) as err:
        fail(f"cannot make {setup.env_id} with {setup.env_kwargs}: {err}")


def _runs_for(
    name: str, setup: EnvSetup, args: argparse.Namespace, overrides: dict[str, Any], budget: dict, model: str
):  # fmt: skip
    """The run list: every estimator x seed, plus GAGPO with back-off and at each lambda of the sweep."""
    variants: list[tuple[str, str, dict[str, Any]]] = []
    base = {"torch_threads": 1, **setup.config, **overrides}
    default_lam = base.get("lam", 0.8)
    for estimator in args.estimators:
        label = f"gagpo (lam={default_lam:g})" if estimator == "gagpo" and args.lam_sweep else estimator
        variants.append((label, estimator, base))
    if args.backoff:
        variants.append((f"gagpo+backoff({','.join(args.backoff)})", "gagpo", {**base, "key_backoff": args.backoff}))
    for label, estimator, extra in parse_variants(args.variant):
        variants.append((label, estimator, {**base, **extra}))
    for lam in args.lam_sweep or []:
        if "gagpo" in args.estimators and abs(lam - default_lam) < 1e-12:
            continue
        variants.append((f"gagpo (lam={lam:g})", "gagpo", {**base, "lam": lam}))
    if not variants:
        fail("nothing to run: name an estimator, a --variant, --backoff or --lam-sweep")
    for _, estimator, config in variants:
        validated_config({**config, "estimator": estimator})
    pool = base.get("task_pool", 0)
    heldout = budget.get("heldout", False)
    # Training tasks: the pool's tasks, each once; held-out: tasks never drawn in training.
    eval_tasks = min(budget["eval_tasks"], pool) if pool and not heldout else budget["eval_tasks"]
    specs = [
        RunSpec(name, setup, label, estimator, seed, config, budget["total_steps"], budget["eval_every"],
                eval_tasks, args.eval_sampled, model, HELDOUT_OFFSET if heldout else 0, args.save_agents or "")
        for label, estimator, config in variants
        for seed in budget["seeds"]
    ]  # fmt: skip
    return specs, [label for label, _, _ in variants]


def main(argv: list[str] | None = None) -> int:
    parser, names = build_parser()
    args = parser.parse_args(argv)
    if any(v is not None and v < 1 for v in (args.total_steps, args.eval_every, args.eval_tasks)) or args.jobs < 1:
        fail("--total-steps, --eval-every, --eval-tasks and --jobs must be >= 1")
    if any(not 0 <= lam <= 1 for lam in args.lam_sweep or []):
        fail(f"--lam-sweep values must be in [0, 1], got {args.lam_sweep}")
    overrides = config_overrides(args, names)
    setups = _setups(args)
    if args.merge:
        return merge_reports(args, setups)
    out = Path(args.out)
    total_started = time.perf_counter()
    preset = "full" if args.full else "paper" if args.paper else "quick"
    for name, setup in setups.items():
        budget = {**PRESETS[preset], **setup.budget.get(preset, {})}
        for key in ("total_steps", "eval_every", "eval_tasks", "seeds"):
            if getattr(args, key) is not None:
                budget[key] = getattr(args, key)
        if budget.get("heldout") and not setup.has_prior:
            fail(f"--paper starts from a warm-start prior: {name} has none (use one of {_with_prior()})")
        model = build_prior(name, setup, overrides) if budget.get("heldout") else "tiny"
        specs, labels = _runs_for(name, setup, args, overrides, budget, model)
        bar = args.bar if args.bar is not None else setup.bar
        print(f"== {name}: {setup.env_id} {json.dumps(setup.env_kwargs)}; {len(specs)} runs "
              f"({len(labels)} estimators x {len(budget['seeds'])} seeds), {budget['total_steps']} env steps each, "
              f"panel of {budget['eval_tasks']} tasks every {budget['eval_every']} steps", flush=True)  # fmt: skip
        started = time.perf_counter()
        runs = list(_execute(specs, args.jobs))
        elapsed = time.perf_counter() - started
        write_outputs(out, f"{name}{args.tag}", setup, runs, labels, bar, budget, elapsed, args)
    print(f"total time {time.perf_counter() - total_started:.0f}s")
    return 0


def merge_reports(args: argparse.Namespace, setups: dict[str, EnvSetup]) -> int:
    """One report (tables, ratios, plot) from runs made by separate invocations on the same env and budget."""
    if len(setups) != 1:
        fail("--merge takes one --envs setup")
    ((name, setup),) = setups.items()
    payloads = []
    for file in args.merge:
        try:
            payloads.append(json.loads(Path(file).read_text()))
        except (OSError, ValueError) as err:
            fail(f"--merge: cannot read {file}: {err}")
    first = payloads[0]
    same = ("env_id", "env_kwargs", "bar", "eval")
    for file, payload in zip(args.merge, payloads):
        if payload.get("env_id") != setup.env_id or any(payload.get(k) != first.get(k) for k in same):
            fail(f"--merge: {file} is not a run of {setup.env_id} with the kwargs, bar and evaluation of the first")
        budget = {k: v for k, v in payload["budget"].items() if k != "seeds"}
        if budget != {k: v for k, v in first["budget"].items() if k != "seeds"}:
            fail(f"--merge: {file} has another budget ({payload['budget']}) than {args.merge[0]} ({first['budget']})")
    runs = [run for payload in payloads for run in payload["runs"]]
    labels = list(dict.fromkeys(run["label"] for run in runs))
    seeds = sorted({run["seed"] for run in runs})
    elapsed = sum(payload["wall_s"] for payload in payloads)
    write_outputs(Path(args.out), f"{name}{args.tag}", setup, runs, labels, first["bar"],
                  {**first["budget"], "seeds": seeds}, elapsed, args)  # fmt: skip
    return 0


def parse_variants(specs: list[str]) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, estimator, hyperparameters) of each ``[ESTIMATOR:]LABEL=JSON`` of --variant (GAGPO by default)."""
    out = []
    for spec in specs:
        head, sep, text = spec.partition("=")
        estimator, colon, label = head.rpartition(":")
        estimator = estimator if colon else "gagpo"
        if not sep or not label:
            fail(f"--variant takes [ESTIMATOR:]LABEL=JSON, got {spec!r}")
        if estimator not in ESTIMATORS:
            fail(f"--variant {spec!r}: unknown estimator {estimator!r}; known: {', '.join(ESTIMATORS)}")
        out.append((f"{estimator} {label}", estimator, parse_json_kwargs(text, "--variant")))
    return out


def _with_prior() -> list[str]:
    return sorted(name for name, setup in _named_setups().items() if setup.has_prior)


def _named_setups() -> dict[str, EnvSetup]:
    """The setups (lab/bench/setups), or exit with the one line naming the file that does not load."""
    try:
        return load_setups()
    except ValueError as err:
        fail(str(err))


def build_prior(name: str, setup: EnvSetup, overrides: dict[str, Any]) -> str:
    """The env setup's committed prior, or its warm-start prior at priors/<name>, built once (reused while its
    recipe is unchanged)."""
    from agents.prior import read_prior, update_prior
    from agents.warm_start import warm_start

    if setup.prior_path:
        if read_prior(ROOT / setup.prior_path) is None:
            fail(f"{name}: the committed prior {setup.prior_path} is missing (no prior.json there)")
        print(f"== {name}: the committed prior {setup.prior_path}", flush=True)
        return str(ROOT / setup.prior_path)
    path = ROOT / "priors" / name
    shaping = {k: v for k, v in {**setup.config, **overrides}.items() if k in PRIOR_SHAPING}
    recipe = {"env_id": setup.env_id, "env_kwargs": setup.env_kwargs, **setup.prior, **shaping}
    old = read_prior(path)
    if old is not None and old.get("recipe") == recipe:
        print(f"== {name}: warm-start prior {path} (built before)", flush=True)
        return str(path)
    print(f"== {name}: building the warm-start prior {path}: {json.dumps(setup.prior)}", flush=True)
    warm_start(setup.env_id, path, env_kwargs=setup.env_kwargs, torch_threads=1, **setup.prior, **shaping)
    update_prior(path, recipe=recipe)
    return str(path)


def _execute(specs: list[RunSpec], jobs: int):
    if jobs == 1:
        for spec in specs:
            result = run_one(spec)
            _report(result)
            yield result
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import multiprocessing as mp

    with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
        for result in pool.map(run_one, specs):
            _report(result)
            yield result


def _report(result: dict[str, Any]) -> None:
    curve = " ".join(f"{p['success']:.2f}" for p in result["curve"])
    if "train_success" in result["curve"][0]:
        curve += "; training tasks " + " ".join(f"{p['train_success']:.2f}" for p in result["curve"])
    times = f"{result['wall_s']:.0f}s: train {result['train_s']:.0f}s, eval {result['eval_s']:.0f}s"
    print(f"  {result['label']:<18} seed {result['seed']}: success [{curve}] ({times})", flush=True)


def write_outputs(
    out: Path, stem: str, setup: EnvSetup, runs: list[dict[str, Any]], labels: list[str], bar: float,
    budget: dict[str, Any], elapsed: float, args: argparse.Namespace,
) -> None:  # fmt: skip
    """<out>/<stem>/: report.md, steps.csv, iterations.csv, runs.json, curve.png."""
    summary = summarize(runs, labels, bar, setup.train_bar)
    curves = curve_table(runs, labels)
    mode = "sampled" if args.eval_sampled else "greedy"
    pool = runs[0]["config"].get("task_pool", 0)
    first, offset = runs[0], runs[0]["eval_offset"]
    start = "tiny model from scratch" if first["model"] == "tiny" else f"the warm-start prior `{_rel(first['model'])}`"
    panel = "held-out tasks " if offset else "tasks "
    ratios = ratio_table(runs, bar, setup.train_bar)
    header = (
        f"# Learning speed on {setup.env_id}\n\n"
        f"- env kwargs: `{json.dumps(setup.env_kwargs)}`{' (' + setup.note + ')' if setup.note else ''}\n"
        f"- runs: {len(labels)} estimators x seeds {budget['seeds']}, {budget['total_steps']} env steps each, "
        f"{start}; shared hyperparameters: `{json.dumps(_shared_config(runs))}`\n"
        + (
            f"- task pool: training draws tasks 0..{pool - 1} only (a finite training set, as ALFWorld's list of "
            f"training games); the panel is {'tasks never trained on' if offset else 'those tasks'}\n"
            if pool
            else "- tasks: a fresh task for every rollout group\n"
        )
        + f"- evaluation: {mode} actions on {panel}{offset}..{offset + first['eval_tasks'] - 1}, each once, every "
        f"{budget['eval_every']} env steps; success bar {bar:g}"
        + (f" (training tasks: {setup.train_bar:g})" if offset and pool else "")
        + "\n"
        f"- wall time: {elapsed:.0f}s for all runs ({os.cpu_count()} CPUs, torch threads 1, jobs {args.jobs})\n"
    )
    text = (
        header
        + "\n## Summary (means over seeds)\n\n"
        + markdown_table(summary)
        + (f"\n\n## GAGPO against the baselines\n\n{markdown_table(ratios)}\n\n{RATIO_NOTE}" if ratios else "")
        + f"\n\n{SUMMARY_NOTE}\n"
        + f"\n## Panel success ({mode}) vs env steps (mean over seeds)\n\n"
        + markdown_table(curves)
        + "\n\n![learning curves](curve.png)\n"
    )
    out = out / stem
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(text)
    write_csv(out / "steps.csv", [
        {"estimator": r["label"], "seed": r["seed"], **p} for r in runs for p in r["curve"]
    ])  # fmt: skip
    write_csv(out / "iterations.csv", [
        {"estimator": r["label"], "seed": r["seed"], **it} for r in runs for it in r["iterations"]
    ])  # fmt: skip
    payload = {
        "env_id": setup.env_id, "env_kwargs": setup.env_kwargs, "bar": bar, "budget": budget,
        "eval": mode, "wall_s": elapsed, "summary": summary, "ratios": ratios, "runs": runs,
    }  # fmt: skip
    (out / "runs.json").write_text(json.dumps(payload, indent=1))
    title = f"{setup.env_id} {json.dumps(setup.env_kwargs)}"
    plot(runs, labels, bar, title, f"{mode}, {panel.strip()}", out / "curve.png")
    print("\n" + text)
    print(f"wrote {out}/: report.md, steps.csv, iterations.csv, runs.json, curve.png", flush=True)


def _rel(path: str) -> str:
    return str(Path(path).relative_to(ROOT)) if Path(path).is_relative_to(ROOT) else path


def _shared_config(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The hyperparameters every run had in common and that differ from GAGPOConfig's defaults."""
    from agents.config import GAGPOConfig

    defaults = GAGPOConfig().resolved(tiny=True).to_dict()
    keys = [k for k in runs[0]["config"] if k not in ("estimator", "seed")]
    return {
        k: runs[0]["config"][k]
        for k in keys
        if all(r["config"][k] == runs[0]["config"][k] for r in runs) and runs[0]["config"][k] != defaults[k]
    }


if __name__ == "__main__":
    sys.exit(main())
