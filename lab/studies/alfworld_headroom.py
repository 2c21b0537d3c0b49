"""The estimators compared where the policy has room to improve: from the low-data ALFWorld imitation prior, 5 seeds.

    python -m lab.studies.alfworld_headroom status                          # the settings and what is pending
    python -m lab.studies.alfworld_headroom train --arm gagpo --seed 0      # one run; resumes from its last iteration
    python -m lab.studies.alfworld_headroom evaluate --arm gagpo --seed 0   # its final agent on both splits
    python -m lab.studies.alfworld_headroom all --jobs 2                    # every pending step, seed by seed
    python -m lab.studies.alfworld_headroom report                          # results/alfworld-headroom/report.md

The settings are ``lab/studies/alfworld-headroom.yaml``, registered in ``results/alfworld-headroom/preregistration.md``
under the protocol of ``lab/study.py``: a run starts only from a clean tree whose committed pre-registration names
the settings' sha256 as current, and records the code's commit. The runs are those of
``lab/studies/alfworld_compare.py`` (its :class:`Layout` says where this study keeps them): every arm starts from
``results/agents/alfworld-bc100-from-minihouse`` (the MiniHouse prior imitating the handcoded expert on 100 train
games), trains on train games at one advantage scale (``advantage_scale: unit``), and logs each iteration how the
other estimators would have credited its own rollout (``agreement/...``). Final agents stay in the ignored
``runs/alfworld-headroom/<run>/final``: results/ keeps each run's record, curve, games and evaluations.
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import mean, stdev
from typing import Any

from agents.reporting import ALFWORLD_ORDER, atomic_write_text, markdown_table
from lab.reporting import plot_seed_bands, seed_comparison, t_quantile, type_intervals
from lab.studies import alfworld_compare as runner
from lab.study import ROOT, read_json, train_games

LAYOUT = runner.Layout(
    __spec__.name,  # as imported, also under ``python -m`` (where __name__ is "__main__")
    Path(__file__).resolve().parent / "alfworld-headroom.yaml",
    ROOT / "results" / "alfworld-headroom",
    ROOT / "runs" / "alfworld-headroom",
)
SPLITS = ("valid_seen", "valid_unseen")


def pct(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def success(run: dict[str, Any], split: str, protocol: str) -> float | None:
    result = run["eval"].get(f"{split}/{protocol}")
    return None if result is None else float(result["success_rate"])


def arm_runs(settings: dict[str, Any], data: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Each arm's runs that have every evaluation, in seed order."""
    keys = [f"{s}/{p}" for s in settings["evaluation"]["splits"] for p in settings["evaluation"]["protocols"]]
    out: dict[str, list[dict[str, Any]]] = {}
    for run in data["runs"].values():
        if all(k in run["eval"] for k in keys):
            out.setdefault(run["arm"], []).append(run)
    return {arm: sorted(out[arm], key=lambda r: r["seed"]) for arm in runner.arm_names(settings) if arm in out}


def power_note(values: dict[str, list[float]], level: float) -> str:
    """The difference two arms of n seeds could have told from 0 with 80% power at ``level``, at the pooled spread
    of the arms' seeds (the normal-theory two-sample formula with t quantiles)."""
    spreads = [stdev(v) for v in values.values() if len(v) > 1]
    ns = [len(v) for v in values.values() if len(v) > 1]
    if not spreads:
        return ""
    n, sd = min(ns), math.sqrt(mean(s * s for s in spreads))
    df = 2 * n - 2
    mdd = (t_quantile(1 - (1 - level) / 2, df) + t_quantile(0.8, df)) * sd * math.sqrt(2 / n)
    return (f"At the pooled seed spread ({100 * sd:.1f} points) and {n} seeds an arm, a difference of about "
            f"{100 * mdd:.1f} points is what this design detects with 80% power at {level:.0%}.")  # fmt: skip


def rollout_table(arms: dict[str, list[dict[str, Any]]], analysis: dict[str, Any]) -> list[dict[str, Any]]:
    """Per arm, over the last 4 iterations of every seed: the singleton shares (labelled by what they count), how
    the other estimators' credit of the same actions correlates with GAGPO's, and each seed's env steps to the bar."""
    table = []
    for arm, runs in arms.items():
        last = [row for r in runs for row in r["curve"][-4:]]
        agree = sorted({k for row in last for k in row if k.startswith("agreement/") and k.endswith("all_corr")})
        to_bar = [runner.steps_to_bar(r["curve"], analysis["bar"], analysis["bar_window"]) for r in runs]
        table.append({
            "arm": arm,
            "singleton rows": pct(mean(row["advantage/singleton_share"] for row in last)),
            "singleton sets": pct(mean(row.get("advantage/singleton_set_share", math.nan) for row in last)),
            **{k.split("/")[1] + " corr": f"{mean(row[k] for row in last if k in row):.2f}" for k in agree},
            "steps to bar": ", ".join(str(n) for n in to_bar),
        })  # fmt: skip
    return table


def write_report(settings: dict[str, Any]) -> Path:
    """results/alfworld-headroom/report.md (and curves.png) from the runs that are done; the comparisons and the
    headline follow the pre-registered rules (preregistration.md), whatever the numbers."""
    data = runner.collect(settings, LAYOUT.out)
    arms = arm_runs(settings, data)
    analysis = settings["analysis"]
    level = float(analysis["interval"])
    protocols = list(settings["evaluation"]["protocols"])
    lines = [f"# {settings['question']}", "",
             f"Settings sha256 `{settings['sha256']}`, pre-registered in `preregistration.md`. Final checkpoints only;"
             " every valid_seen (140) and valid_unseen (134) game once per protocol. Arms with every evaluation: "
             + (", ".join(f"{a} ({len(r)} seeds)" for a, r in arms.items()) or "none yet") + ".", ""]  # fmt: skip
    prior = data["prior"]
    rows = [
        {
            "run": "prior (no RL)",
            **{f"{s} {p}": pct(prior.get(f"{s}/{p}", {}).get("success_rate")) for s in SPLITS for p in protocols},
            "train games": "-",
            "env steps": 0,
        }
    ]
    for arm, runs in arms.items():
        for run in runs:
            name = runner.run_name(arm, run["seed"])
            games = train_games(read_json(LAYOUT.out / "runs" / name / "games.json", {}))
            steps = (run["record"] or {}).get("num_timesteps")
            rows.append({"run": name, **{f"{s} {p}": pct(success(run, s, p)) for s in SPLITS for p in protocols},
                         "train games": len(games), "env steps": steps})  # fmt: skip
    lines += ["## Every run", "", markdown_table(rows), ""]
    means = []
    for arm, runs in arms.items():
        row: dict[str, Any] = {"arm": arm, "seeds": len(runs)}
        for s in SPLITS:
            for p in protocols:
                v = [success(r, s, p) for r in runs]
                row[f"{s} {p}"] = pct(mean(v))
                if len(v) > 1:
                    half = t_quantile(1 - (1 - level) / 2, len(v) - 1) * stdev(v) / math.sqrt(len(v))
                    row[f"{s} {p}"] += f" ± {100 * half:.1f}"
        means.append(row)
    lines += [f"## Arms: mean over seeds ± the {level:.0%} t half-width", "", markdown_table(means), ""]
    reference = analysis["reference"]
    if reference in arms:
        comparisons, greedy = [], {}
        for s in SPLITS:
            greedy[s] = {a: [success(r, s, "greedy") for r in runs] for a, runs in arms.items()}
        for arm in arms:
            if arm == reference or len(arms[arm]) < 2 or len(arms[reference]) < 2:
                continue
            for s in SPLITS:
                for p in protocols:
                    c = seed_comparison([success(r, s, p) for r in arms[reference]],
                                        [success(r, s, p) for r in arms[arm]], level=level)  # fmt: skip
                    comparisons.append({"comparison": f"{reference} - {arm}", "split": s, "protocol": p,
                                        "difference": f"{100 * c['difference']:+.1f}",
                                        f"{level:.0%} Welch t": f"[{100 * c['low']:+.1f}, {100 * c['high']:+.1f}]",
                                        "permutation p": f"{c['p']:.3f}",
                                        "excludes 0": "yes" if c["low"] > 0 or c["high"] < 0 else "no"})  # fmt: skip
        lines += [f"## {reference} against each arm (final success, points)", "", markdown_table(comparisons), "",
                  power_note(greedy[SPLITS[0]], level), ""]  # fmt: skip
    for s in SPLITS:
        types = [*ALFWORLD_ORDER, "All"]
        table = []
        for arm, runs in arms.items():
            found = type_intervals([r["eval"][f"{s}/greedy"]["episodes"] for r in runs], types)
            table.append({"arm": arm, **{t: (f"{pct(found[t][0])} [{pct(found[t][1])}, {pct(found[t][2])}]"
                                             if t in found else "-") for t in types}})  # fmt: skip
        lines += [f"## Greedy success per task type, {s} (each game one unit over the seeds, 95% Wilson)", "",
                  markdown_table(table), ""]  # fmt: skip
    lines += ["## On the arms' own rollouts (last 4 iterations of every seed)", "",
              "singleton rows: the share of actions whose (group, state) set holds no other action; singleton sets: "
              "the share of (group, state) sets of one action. `<estimator> corr`: the correlation of that "
              "estimator's credit with GAGPO's on the same actions. Steps to bar: env steps until the 3-iteration "
              f"mean of training success first reaches {analysis['bar']} (None: never).", "",
              markdown_table(rollout_table(arms, analysis)), ""]  # fmt: skip
    conduct = LAYOUT.out / "conduct.md"  # what happened while the study ran (stops, pauses), kept by hand
    if conduct.is_file():
        lines += [conduct.read_text(encoding="utf-8").strip(), ""]
    figure = LAYOUT.out / "curves.png"
    if arms:
        plot_seed_bands({a: [r["curve"] for r in runs] for a, runs in arms.items()}, figure,
                        reference=reference if reference in arms else None,
                        bar=analysis["bar"], title="ALFWorld train games from the bc100 imitation prior")  # fmt: skip
        lines += ["![curves](curves.png)", ""]
    path = LAYOUT.out / "report.md"
    atomic_write_text(path, "\n".join(lines) + "\n")
    print(path.read_text())
    return path


def main(argv: list[str] | None = None) -> int:
    return runner.main(argv, LAYOUT, write_report, __doc__.split("\n")[0])


if __name__ == "__main__":
    raise SystemExit(main())
