"""GAGPO against its rivals on the real ALFWorld games: train on the 3,553 train games, judge the final checkpoints.

    python -m lab.studies.alfworld_compare status                          # the settings and what is done
    python -m lab.studies.alfworld_compare train --arm gagpo --seed 0      # one run; resumes from its last iteration
    python -m lab.studies.alfworld_compare evaluate --arm gagpo --seed 0   # its final agent on both splits
    python -m lab.studies.alfworld_compare all --jobs 2                    # every pending run and evaluation, in order
    python -m lab.studies.alfworld_compare report                          # results/alfworld/report.md

The settings are ``lab/studies/alfworld-compare.yaml``, registered in ``results/alfworld/preregistration.md``.
That record predates the protocol of ``lab/study.py`` (its digests are written ``sha256 `<digest>```, with no
``settings sha256:`` line): ``status`` and ``report`` read the committed runs through the legacy check
(:func:`lab.study.load_legacy_settings`), while ``train``, ``evaluate`` and ``all`` start runs only under the
protocol (:func:`lab.study.start_run`), so they refuse this record until it names its current digest that way.

Every run starts from the same MiniHouse prior and trains on train-split games only (``make alfworld-train`` unpacks
them). Its result is its final checkpoint: no point of the curve is picked, nothing is selected on an evaluation
split. Each final agent (and the prior, as the starting row) plays every valid_seen and valid_unseen game once, in
three protocols: greedy and sampled in choose mode (the policy ranks the admissible commands), and greedy in generate
mode (it writes the command; text that is no admissible command wastes the step, as in verl-agent). A variant arm
(``variant_arms``) changes more than the estimator: ``gagpo-generate`` trains in generate mode from a prior taught to
write its commands, since choose-mode training leaves the tiny model unable to.

A run's checkpoint goes to ``runs/alfworld/<arm>-seed<k>/checkpoint`` (ignored) after every iteration, so a stopped
run continues where it was; the final agent (about 2 MB) goes to ``results/agents/alfworld-<arm>-seed<k>``, and
the rest of what is kept to ``results/alfworld/runs/<arm>-seed<k>/``: ``curve.jsonl`` (the logged values of every
iteration), ``eval.json`` (every episode of every split and protocol) and ``run.json``; a run started under the
protocol adds ``starts.jsonl`` (each process's registration) and ``games.json`` (the train games it played).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
from stable_baselines3.common.logger import Logger

from agents.checkpoint import drop_optimizer_state
from agents.cli import fail
from agents.evaluation import wilson_interval
from agents.reporting import ALFWORLD_ORDER, atomic_write_text, markdown_table
from lab.benchmark import rollout_steps_to_bar
from lab.recorder import Recorder
from lab.reporting import bootstrap_difference, bootstrap_ratio
from lab.study import (
    GAMES,
    ROOT,
    CreditAgreement,
    GamesPlayed,
    add_allow_dirty,
    load_legacy_settings,
    read_curve,
    read_json,
    read_starts,
    record_start,
    run_rows,
    shown,
    start_run,
    study_parser,
    write_record,
)

SETTINGS = Path(__file__).resolve().parent / "alfworld-compare.yaml"
OUT = ROOT / "results" / "alfworld"
PREREGISTRATION = OUT / "preregistration.md"
WORK = ROOT / "runs" / "alfworld"
PRIOR_ARM = "prior"


@dataclass(frozen=True)
class Layout:
    """Where a study of this runner's shape keeps things: this one (#49) and the ones that reuse its runs."""

    module: str  # the runner ``all`` starts its subprocesses with (``python -m <module>``)
    settings: Path
    out: Path  # results/<study>: the pre-registration, runs/<name>/ (records, curves, evaluations), the report
    work: Path  # ignored: checkpoints (a stopped run resumes), the prior's copy
    # Committed final agents go to results/agents/<prefix><name>; None keeps them in work/<name>/final (a study
    # whose agents results/ has no room for: run.json and the evaluations say what they did).
    agents_prefix: str | None = None

    @property
    def preregistration(self) -> Path:
        return self.out / "preregistration.md"

    def final_agent(self, name: str) -> Path:
        if self.agents_prefix is None:
            return self.work / name / "final"
        return ROOT / "results" / "agents" / f"{self.agents_prefix}{name}"


#: This study (#49): settings registered before the protocol, final agents committed beside the others.
LAYOUT = Layout(__spec__.name, SETTINGS, OUT, WORK, agents_prefix="alfworld-")


def load_settings(check: bool = True) -> dict[str, Any]:
    """The study's settings; with ``check``, refused unless the legacy pre-registration lists their sha256 (enough
    to report the committed runs; starting a run asks :func:`lab.study.start_run`)."""
    if check:
        return load_legacy_settings(SETTINGS, PREREGISTRATION)
    from lab.study import load_settings as read_unchecked

    return read_unchecked(SETTINGS)


def run_name(arm: str, seed: int) -> str:
    return arm if arm == PRIOR_ARM else f"{arm}-seed{seed}"


def arm_names(settings: dict[str, Any], include_extra: bool = True) -> list[str]:
    """Every arm in the pre-registered order: the primary ones, the variant ones, then the extra ones."""
    extra = settings.get("extra_arms", []) if include_extra else []
    return [*settings["arms"], *settings.get("variant_arms", {}), *extra]


def arm_spec(settings: dict[str, Any], arm: str) -> dict[str, Any]:
    """How an arm trains: its estimator, starting point, agent arguments and seeds. A primary or extra arm is an
    estimator with the shared settings; a variant arm (``variant_arms``) names its own estimator, prior, seeds and
    the agent arguments it changes."""
    variant = settings.get("variant_arms", {}).get(arm, {})
    return {
        "estimator": variant.get("estimator", arm),
        "prior": variant.get("prior", settings["prior"]),
        "agent": {**settings["agent"], **variant.get("agent", {})},
        "seeds": variant.get("seeds", settings["seeds"]),
    }


def final_agent(name: str) -> Path:
    """Where a run's final agent of this study is kept: with the other committed agents (``results/agents/``)."""
    return LAYOUT.final_agent(name)


def train(settings: dict[str, Any], arm: str, seed: int, registration: dict[str, Any], layout: Layout = LAYOUT) -> Path:
    """Train one run to its budget, one iteration per ``learn`` call with a checkpoint after each (resumable);
    ``registration`` (:func:`lab.study.start_run`) goes beside its record. Returns the final agent's folder. With
    ``analysis.agreement`` in the settings, each iteration also logs how the run's own rollout would have been
    credited by those estimators (:class:`lab.study.CreditAgreement`)."""
    from agents import GAGPOAgent

    name = run_name(arm, seed)
    out = layout.out / "runs" / name
    checkpoint, final = layout.work / name / "checkpoint", layout.final_agent(name)
    out.mkdir(parents=True, exist_ok=True)
    curve = out / "curve.jsonl"
    if (final / "agent.json").is_file():
        return final
    started = time.perf_counter()
    if (checkpoint / "agent.json").is_file():
        agent = GAGPOAgent.load(checkpoint, verbose=0)
        kept = [row for row in read_curve(curve) if row["step"] <= agent.num_timesteps]
        atomic_write_text(curve, "".join(json.dumps(row, sort_keys=True) + "\n" for row in kept))
        print(f"{name}: resumed at {agent.num_timesteps} env steps", flush=True)
    else:
        spec = arm_spec(settings, arm)
        agent = GAGPOAgent(
            settings["env_id"], model=str(ROOT / spec["prior"]), env_kwargs={"split": settings["train_split"]},
            estimator=spec["estimator"], seed=seed, verbose=0, **spec["agent"],
        )  # fmt: skip
        curve.unlink(missing_ok=True)
        (out / GAMES).unlink(missing_ok=True)
    record_start(out, registration, fresh=not (checkpoint / "agent.json").is_file())
    callbacks: list[Any] = [GamesPlayed(out / GAMES)]
    if settings.get("analysis", {}).get("agreement"):
        callbacks.append(CreditAgreement(settings["analysis"]["agreement"]))
    agent.set_logger(Logger(folder=None, output_formats=[Recorder(curve)]))  # the curve survives a stop
    budget = int(settings["total_timesteps"])
    while agent.num_timesteps < budget:
        t0 = time.perf_counter()
        agent.learn(budget - agent.num_timesteps, callback=callbacks, reset_num_timesteps=False, max_iterations=1)
        agent.save(checkpoint)
        last = read_curve(curve)[-1]
        print(f"{name}: {agent.num_timesteps} steps, train success {last.get('rollout/success_rate', 0):.3f}, "
              f"{time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
    agent.save(final)
    drop_optimizer_state(final)  # results/ keeps agents for playing (results/README.md); the checkpoint resumes
    write_record(out / "run.json", settings, registration, arm=arm, seed=seed, num_timesteps=agent.num_timesteps,
                 iterations=agent.iteration, train_s_this_process=time.perf_counter() - started)  # fmt: skip
    return final


def evaluate(
    settings: dict[str, Any],
    arm: str,
    seed: int,
    registration: dict[str, Any],
    workers: int = 0,
    layout: Layout = LAYOUT,
) -> Path:
    """Every game of both evaluation splits, once per protocol, by the run's final agent (the prior for
    ``--arm prior``); episodes into ``eval.json``, written after each (split, protocol) so a stop loses little.
    ``registration`` joins the run's ``starts.jsonl``: the evaluating process is one of the run's."""
    from agents import GAGPOAgent

    name = run_name(arm, seed)
    out = layout.out / "runs" / name
    out.mkdir(parents=True, exist_ok=True)
    path = out / "eval.json"
    done = read_json(path, {})
    record_start(out, registration)
    if arm == PRIOR_ARM:
        source = layout.work / PRIOR_ARM / "agent"
        if not (source / "agent.json").is_file():
            GAGPOAgent(settings["env_id"], model=str(ROOT / settings["prior"]), verbose=0, seed=0,
                       **settings["agent"]).save(source)  # fmt: skip
    else:
        source = layout.final_agent(name)
        if not (source / "agent.json").is_file():
            fail(f"{name} has no final agent yet: run `train --arm {arm} --seed {seed}` first")
    ev = settings["evaluation"]
    from gagpo_gym.envs import alfworld as engine

    # Every game of both splits stays translated (about 5 MB each) for the next protocols: one PDDL translation
    # (seconds) per game per process instead of one per game per protocol.
    engine.LOADED_GAMES_MAX = max(engine.LOADED_GAMES_MAX, sum(ev["splits"].values()))
    for protocol, how in ev["protocols"].items():
        agent = None
        for split, n_games in ev["splits"].items():
            key = f"{split}/{protocol}"
            if key in done:
                continue
            agent = agent or GAGPOAgent.load(source, verbose=0, action_mode=how["action_mode"])
            t0 = time.perf_counter()
            result = agent.evaluate(
                settings["env_id"], n_tasks=n_games, env_kwargs={"split": split}, deterministic=how["deterministic"],
                temperature=how.get("temperature"), batch_size=ev["batch_size"], episodes=True, workers=workers,
            )  # fmt: skip
            result["eval_s"] = time.perf_counter() - t0
            done[key] = result
            atomic_write_text(path, json.dumps(done, indent=1, default=float) + "\n")
            print(f"{name} {key}: success {result['success_rate']:.3f} ({result['eval_s']:.0f} s)", flush=True)
    return path


def pending(settings: dict[str, Any], include_extra: bool, layout: Layout = LAYOUT) -> list[tuple[str, str, int]]:
    """(what, arm, seed) still to do, in the pre-registered order: the prior's row first, then the primary arms seed
    by seed, arm by arm; then the same for the variant arms, then for the extra ones (``include_extra``). A run is
    trained once its ``run.json`` is written (the last thing its training does)."""
    extra = settings.get("extra_arms", []) if include_extra else []
    tiers = [settings["arms"], list(settings.get("variant_arms", {})), extra]
    todo: list[tuple[str, str, int]] = []
    evals = layout.out / "runs" / PRIOR_ARM / "eval.json"
    n_keys = len(settings["evaluation"]["protocols"]) * len(settings["evaluation"]["splits"])
    if not evals.is_file() or len(json.loads(evals.read_text())) < n_keys:
        todo.append(("evaluate", PRIOR_ARM, 0))
    for arms in tiers:
        for seed in settings["seeds"]:
            for arm in [a for a in arms if seed in arm_spec(settings, a)["seeds"]]:
                name = run_name(arm, seed)
                if not (layout.out / "runs" / name / "run.json").is_file():
                    todo.append(("train", arm, seed))
                evals = layout.out / "runs" / name / "eval.json"
                if not evals.is_file() or len(json.loads(evals.read_text())) < n_keys:
                    todo.append(("evaluate", arm, seed))
    return todo


def run_all(
    settings: dict[str, Any], jobs: int, include_extra: bool, allow_dirty: bool = False, layout: Layout = LAYOUT
) -> None:
    """Every pending step, ``jobs`` subprocesses at a time; a run's evaluation waits for its training."""
    todo = pending(settings, include_extra, layout)
    running: dict[tuple[str, int], subprocess.Popen] = {}
    while todo or running:
        for key, proc in list(running.items()):
            if proc.poll() is not None:
                del running[key]
                if proc.returncode:
                    print(f"{key}: exited {proc.returncode}", flush=True)
        busy = set(running)
        for step in list(todo):
            if len(running) >= jobs:
                break
            what, arm, seed = step
            if (arm, seed) in busy or (what == "evaluate" and ("train", arm, seed) in todo):
                continue
            todo.remove(step)
            cmd = [sys.executable, "-m", layout.module, what, "--arm", arm, "--seed", str(seed),
                   *(["--allow-dirty"] if allow_dirty else [])]  # fmt: skip
            running[(arm, seed)] = subprocess.Popen(cmd, cwd=ROOT)
            busy.add((arm, seed))
        time.sleep(5)


# ----- the report -----------------------------------------------------------------------------------------------
def collect(settings: dict[str, Any], out: Path | None = None) -> dict[str, Any]:
    """Every run's curve, record and evaluations that exist under ``out`` (this study's folder by default), by run
    name; arms in the settings' order."""
    out = out or OUT
    runs: dict[str, dict[str, Any]] = {}
    for arm in arm_names(settings):
        for seed in arm_spec(settings, arm)["seeds"]:
            folder = out / "runs" / run_name(arm, seed)
            if read_curve(folder / "curve.jsonl") or (folder / "eval.json").is_file():
                runs[run_name(arm, seed)] = {
                    "arm": arm, "seed": seed, "curve": read_curve(folder / "curve.jsonl"),
                    "record": read_json(folder / "run.json", None), "eval": read_json(folder / "eval.json", {}),
                }  # fmt: skip
    return {"runs": runs, "prior": read_json(out / "runs" / PRIOR_ARM / "eval.json", {})}


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def steps_to_bar(curve: list[dict[str, float]], bar: float, window: int) -> int | None:
    """Env steps at the end of the first iteration where the mean training success of the last ``window``
    iterations reaches ``bar`` (None: never); the learning benchmark's rule on this study's curve rows."""
    return rollout_steps_to_bar([{**row, "steps": row["step"]} for row in curve], bar, window)


def final_table(settings: dict[str, Any], data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per finished evaluation: success per split and protocol (the prior first)."""
    rows = []
    entries = [("prior", "-", data["prior"])] + [(r["arm"], r["seed"], r["eval"]) for r in data["runs"].values()]
    for arm, seed, ev in entries:
        if not ev:
            continue
        row: dict[str, Any] = {"arm": arm, "seed": seed}
        for protocol in settings["evaluation"]["protocols"]:
            for split in settings["evaluation"]["splits"]:
                got = ev.get(f"{split}/{protocol}")
                row[f"{split} {protocol}"] = pct(got["success_rate"]) if got else "-"
        rows.append(row)
    return rows


def mean_table(settings: dict[str, Any], data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per arm: final success per split and protocol, the mean over its evaluated seeds (the prior's own)."""
    rows = []
    for arm in (PRIOR_ARM, *arm_names(settings)):
        evals = [data["prior"]] if arm == PRIOR_ARM else [r["eval"] for r in data["runs"].values() if r["arm"] == arm]
        evals = [ev for ev in evals if ev]
        if not evals:
            continue
        row: dict[str, Any] = {"arm": arm, "seed": "-" if arm == PRIOR_ARM else f"mean of {len(evals)}"}
        for protocol in settings["evaluation"]["protocols"]:
            for split in settings["evaluation"]["splits"]:
                got = [ev[f"{split}/{protocol}"]["success_rate"] for ev in evals if f"{split}/{protocol}" in ev]
                row[f"{split} {protocol}"] = pct(float(np.mean(got))) if len(got) == len(evals) else "-"
        rows.append(row)
    return rows


def arm_values(data: dict[str, Any], arm: str, key: str) -> list[float]:
    """Final success of each finished run of ``arm`` on ``key`` (``split/protocol``), in seed order."""
    return [r["eval"][key]["success_rate"] for r in data["runs"].values() if r["arm"] == arm and key in r["eval"]]


def type_table(settings: dict[str, Any], data: dict[str, Any], split: str, protocol: str) -> list[dict[str, Any]]:
    """Success per task type, pooled over each arm's seeds, with Wilson intervals."""
    level = settings["analysis"]["type_interval"]
    z = NormalDist().inv_cdf(0.5 + level / 2)
    key = f"{split}/{protocol}"
    rows = []
    groups = [("prior", [data["prior"]])] + [
        (arm, [r["eval"] for r in data["runs"].values() if r["arm"] == arm]) for arm in arm_names(settings)
    ]
    for arm, evals in groups:
        evals = [ev[key] for ev in evals if ev and key in ev]
        if not evals:
            continue
        row: dict[str, Any] = {"arm": arm, "runs": len(evals)}
        for column in (*ALFWORLD_ORDER, "All"):
            wins = n = 0
            for ev in evals:
                if column == "All":
                    wins, n = wins + ev["wins"], n + ev["n_tasks"]
                else:
                    wins += ev["per_type_wins"].get(column.lower(), 0)
                    n += ev["per_type_n"].get(column.lower(), 0)
            low, high = wilson_interval(wins, n, z)
            row[column] = f"{pct(wins / n)} [{pct(low)}, {pct(high)}]" if n else "-"
        rows.append(row)
    return rows


def comparison_table(settings: dict[str, Any], data: dict[str, Any]) -> list[dict[str, Any]]:
    """GAGPO minus each other arm: final greedy success per split; and the ratio of env steps to the bar. A variant
    arm changes more than the estimator, so it is no term of these comparisons."""
    analysis = settings["analysis"]
    draws, level = analysis["bootstrap"], analysis["interval"]
    rows = []
    for other in [a for a in (*settings["arms"], *settings["extra_arms"]) if a != "gagpo"]:
        row: dict[str, Any] = {"comparison": f"gagpo vs {other}"}
        for split in settings["evaluation"]["splits"]:
            a, b = (arm_values(data, arm, f"{split}/greedy") for arm in ("gagpo", other))
            if a and b:
                diff, low, high = bootstrap_difference(a, b, draws=draws, level=level)
                row[f"{split}: difference (points)"] = f"{100 * diff:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"
                row[f"{split}: seeds"] = f"{len(a)} / {len(b)}"
        steps = [
            [steps_to_bar(r["curve"], analysis["bar"], analysis["bar_window"]) or int(r["curve"][-1]["step"])
             for r in data["runs"].values() if r["arm"] == arm and r["record"]]
            for arm in ("gagpo", other)
        ]  # fmt: skip
        if all(steps):
            ratio, low, high = bootstrap_ratio(*steps, draws=draws, level=level)
            row["steps to the bar: ratio"] = f"{ratio:.2f} [{low:.2f}, {high:.2f}]"
        rows.append(row)
    return rows


def curve_table(settings: dict[str, Any], data: dict[str, Any]) -> list[dict[str, Any]]:
    """Training-game success and the share of singleton state groups, per run, read every ``curve_every`` steps
    (the last iteration ending at or before each mark)."""
    every = settings["analysis"]["curve_every"]
    marks = list(range(every, int(settings["total_timesteps"]) + every, every))
    rows = []
    for name, run in data["runs"].items():
        if not run["curve"]:
            continue
        row: dict[str, Any] = {"run": name}
        for mark in marks:
            before = [c for c in run["curve"] if c["step"] <= mark]
            reached = before and run["curve"][-1]["step"] >= mark
            row[str(mark)] = f"{before[-1].get('rollout/success_rate', 0):.2f}" if reached else "-"
        singles = [c["advantage/singleton_share"] for c in run["curve"] if "advantage/singleton_share" in c]
        row["singleton share"] = f"{np.mean(singles):.2f}" if singles else "-"
        bar = steps_to_bar(run["curve"], settings["analysis"]["bar"], settings["analysis"]["bar_window"])
        row["steps to bar"] = str(bar) if bar is not None else f"> {int(run['curve'][-1]['step'])}"
        rows.append(row)
    return rows


def length_table(settings: dict[str, Any], data: dict[str, Any]) -> list[dict[str, Any]]:
    """Episode lengths by arm: on the training games (the first and last three iterations, sampled) and on each
    split (greedy: all episodes, won episodes). A per-state baseline can pay a policy that controls termination
    for ending or stretching its episodes; the lengths show whether an estimator moved them."""
    rows = []
    entries = [("prior", "-", [], data["prior"])]
    entries += [(r["arm"], r["seed"], r["curve"], r["eval"]) for r in data["runs"].values()]
    for arm, seed, curve, ev in entries:
        row: dict[str, Any] = {"arm": arm, "seed": seed}
        lengths = [c["rollout/ep_len_mean"] for c in curve if "rollout/ep_len_mean" in c]
        row["train: first 3"] = f"{np.mean(lengths[:3]):.1f}" if lengths else "-"
        row["train: last 3"] = f"{np.mean(lengths[-3:]):.1f}" if lengths else "-"
        for split in settings["evaluation"]["splits"]:
            got = ev.get(f"{split}/greedy")
            row[f"{split}: all"] = f"{got['mean_length']:.1f}" if got else "-"
            won = got and got.get("won_length")
            row[f"{split}: won"] = f"{won:.1f}" if won else "-"
        rows.append(row)
    return rows


def plot_curves(settings: dict[str, Any], data: dict[str, Any], path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in data["runs"].values() if r["curve"]]
    if not runs:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    colours = dict(zip(arm_names(settings), plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for run in runs:
        steps = [c["step"] for c in run["curve"]]
        success = [c.get("rollout/success_rate", 0) for c in run["curve"]]
        ax.plot(steps, success, color=colours[run["arm"]], alpha=0.8,
                label=run["arm"] if run["seed"] == arm_spec(settings, run["arm"])["seeds"][0] else None)  # fmt: skip
    ax.axhline(settings["analysis"]["bar"], color="grey", lw=0.8, ls="--")
    ax.set(xlabel="env steps", ylabel="training-game success (sampled)", ylim=(0, 1), title="ALFWorld train split")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def run_names(runs: list[dict[str, Any]]) -> str:
    return ", ".join(sorted(run_name(r["arm"], r["seed"]) for r in runs)) or "none"


def write_report(settings: dict[str, Any]) -> Path:
    """``results/alfworld/report.md``: every table of the pre-registered analysis that the finished runs allow."""
    data = collect(settings)
    done = [r for r in data["runs"].values() if r["record"]]
    primary = [r for r in done if r["arm"] in settings["arms"]]
    variants = [r for r in done if r["arm"] in settings.get("variant_arms", {})]
    extra = [r for r in done if r["arm"] in settings["extra_arms"]]
    lines = [
        "# GAGPO against its rivals on real ALFWorld (issue 49)",
        "",
        f"Settings: `lab/studies/alfworld-compare.yaml` (sha256 `{settings['sha256'][:12]}`), pre-registered in "
        "[preregistration.md](preregistration.md). Each run's result is its final checkpoint; every valid_seen and "
        "valid_unseen game played once. Regenerate with `python -m lab.studies.alfworld_compare report`.",
        "",
        f"Finished runs: {len(primary)} of {len(settings['arms']) * len(settings['seeds'])} primary "
        f"({run_names(primary)}); variant arms: {run_names(variants)}; extra arms: {len(extra)} of "
        f"{len(settings['extra_arms']) * len(settings['seeds'])} ({run_names(extra)}).",
        "",
        "## Final success (%), mean over seeds",
        "",
        markdown_table(mean_table(settings, data)),
        "",
        "## Final success (%) of each run, every game once",
        "",
        markdown_table(final_table(settings, data)),
    ]
    for split in settings["evaluation"]["splits"]:
        rows = type_table(settings, data, split, "greedy")
        if rows:
            lines += ["", f"## {split}, greedy, per task type (pooled over seeds; 95% Wilson intervals)", "",
                      markdown_table(rows)]  # fmt: skip
    rows = [r for r in comparison_table(settings, data) if len(r) > 1]
    if rows:
        lines += ["", "## GAGPO against each arm (90% bootstrap intervals over seeds)", ""]
        seeds = {arm: min(len(arm_values(data, arm, f"{split}/greedy")) for split in settings["evaluation"]["splits"])
                 for arm in (*settings["arms"], *settings["extra_arms"])}  # fmt: skip
        short = [arm for arm, n in seeds.items() if n < len(settings["seeds"]) and (n or arm in settings["arms"])]
        if short:
            lines += [f"**Interim** ({', '.join(short)}): fewer evaluated seeds than the pre-registered "
                      f"{len(settings['seeds'])}; a bootstrap over one or two seeds understates the uncertainty, and "
                      "these rows are not the pre-registered comparison.", ""]  # fmt: skip
        lines += [markdown_table(rows)]
    lines += ["", "## Episode length (steps; 50 is the limit)", "", markdown_table(length_table(settings, data))]
    protocol = {name: OUT / "runs" / name for name in data["runs"] if read_starts(OUT / "runs" / name)}
    if protocol:  # runs started under lab/study.py's protocol (the committed runs predate it)
        lines += ["", "## Registration and train games of the runs started under the protocol", "",
                  markdown_table(run_rows(protocol))]  # fmt: skip
    rows = curve_table(settings, data)
    if rows:
        lines += ["", "## Training-game success at fixed env steps", "", markdown_table(rows)]
    if plot_curves(settings, data, OUT / "curves.png"):
        lines += ["", "![training curves](curves.png)"]
    analyses = sorted((OUT / "analysis").glob("*.md"))
    if analyses:  # lab/research/credit_check.py and greedy_cycles.py runs on this study's policies
        lines += ["", "## Analyses", "", *(f"- [{p.stem}](analysis/{p.name})" for p in analyses)]
    path = OUT / "report.md"
    atomic_write_text(path, "\n".join(lines) + "\n")
    print(path.read_text())
    return path


def main(
    argv: list[str] | None = None,
    layout: Layout = LAYOUT,
    report: Callable[[dict[str, Any]], Path] | None = None,
    description: str = __doc__.split("\n")[0],
) -> int:
    """The command line of this study, or (``layout``, ``report``) of a study run the same way."""
    parser, commands = study_parser(
        description,
        {"train": "one run; resumes from its last iteration", "evaluate": "a final agent on both splits",
         "all": "every pending run and evaluation", "report": f"write {shown(layout.out)}/report.md from the runs"},
    )  # fmt: skip
    for command in ("train", "evaluate"):
        p = commands[command]
        p.add_argument(
            "--arm",
            required=True,
            help="an arm of the settings (an estimator or a variant arm's name), or 'prior' (evaluate)",
        )
        p.add_argument("--seed", type=int, default=0)
        add_allow_dirty(p)
        if command == "evaluate":
            p.add_argument("--workers", type=int, default=0, help="env worker processes (the same results)")
    p = commands["all"]
    p.add_argument("--jobs", type=int, default=2, help="processes at a time")
    p.add_argument("--extra", action="store_true", help="also the extra arms (after the primary and variant ones)")
    add_allow_dirty(p)
    args = parser.parse_args(argv)
    if layout == LAYOUT:
        settings = load_settings()
    else:  # the protocol's check comes with start_run; status and report read the file as it is
        from lab.study import load_settings as read_unchecked

        settings = read_unchecked(layout.settings)
    if args.command in ("train", "evaluate"):
        known = (*arm_names(settings), *((PRIOR_ARM,) if args.command == "evaluate" else ()))
        if args.arm not in known:
            fail(f"--arm must be one of {known}, got {args.arm!r}")
        seeds = arm_spec(settings, args.arm)["seeds"]
        if args.arm != PRIOR_ARM and args.seed not in seeds:
            fail(f"--seed must be one of {seeds} for {args.arm}, got {args.seed}")
    if args.command == "status":
        print(json.dumps(settings, indent=1))
        for step in pending(settings, include_extra=True, layout=layout):
            print("pending:", *step)
    elif args.command in ("train", "evaluate", "all"):
        # the protocol: a clean tree and a committed pre-registration naming these settings as current, or exit
        registration = start_run(settings, layout.preregistration, allow_dirty=args.allow_dirty, stage=args.command)
        if args.command == "train":
            train(settings, args.arm, args.seed, registration, layout)
        elif args.command == "evaluate":
            evaluate(settings, args.arm, args.seed, registration, args.workers, layout)
        else:
            run_all(settings, args.jobs, args.extra, args.allow_dirty, layout)
    else:
        (report or write_report)(settings)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
