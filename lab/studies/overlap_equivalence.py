"""Does the overlapped loop learn as much per env step as the sequential one? (#58; the plan:
``results/learning/minihouse-full-overlap/preregistration.md``.)

    python -m lab.studies.overlap_equivalence        # results/learning/minihouse-full-overlap/equivalence.md

It reads the merged ``runs.json`` of ``lab.bench.learning`` (GAGPO with ``overlap`` off, label ``gagpo``, and on,
label ``gagpo overlap``, the same seeds and budget) and writes, per registered measure (final greedy success on the
held-out panel, the area under the panel curve, env steps to the bar with unreached runs censored at their budget),
each seed's values and the difference on - off with its 95% Welch t interval and the exact permutation p.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from agents.reporting import atomic_write_text, markdown_table
from lab.reporting import seed_comparison

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "results" / "learning" / "minihouse-full-overlap"
OFF, ON = "gagpo", "gagpo overlap"
LEVEL = 0.95


def measures(run: dict[str, Any], bar: float) -> dict[str, float]:
    """A run's registered measures from its panel curve."""
    curve = run["curve"]
    reached = [point["steps"] for point in curve if point["success"] >= bar]
    return {
        "final success": curve[-1]["success"],
        "AUC": sum(point["success"] for point in curve) / len(curve),
        "steps to bar": float(reached[0] if reached else curve[-1]["steps"]),
    }


def report(payload: dict[str, Any]) -> str:
    """The equivalence page: each seed's measures in both modes, then on - off with intervals."""
    bar = payload["bar"]
    by_mode: dict[str, dict[int, dict[str, float]]] = {OFF: {}, ON: {}}
    wall: dict[str, dict[int, float]] = {OFF: {}, ON: {}}
    for run in payload["runs"]:
        if run["label"] in by_mode:
            by_mode[run["label"]][run["seed"]] = measures(run, bar)
            wall[run["label"]][run["seed"]] = run["train_s"]
    seeds = sorted(set(by_mode[OFF]) & set(by_mode[ON]))
    if not seeds:
        raise ValueError(f"no seed has both a {OFF!r} and a {ON!r} run")
    names = list(by_mode[OFF][seeds[0]])
    rows = []
    for mode in (OFF, ON):
        for s in seeds:
            values = by_mode[mode][s]
            rows.append({"run": f"{mode} seed {s}", **{m: fmt(m, values[m]) for m in names},
                         "train s": round(wall[mode][s])})  # fmt: skip
    comparisons = []
    for m in names:
        c = seed_comparison([by_mode[ON][s][m] for s in seeds], [by_mode[OFF][s][m] for s in seeds], level=LEVEL)
        comparisons.append({
            "measure": m, "on - off": fmt(m, c["difference"], sign=True),
            f"{LEVEL:.0%} interval": f"[{fmt(m, c['low'], sign=True)}, {fmt(m, c['high'], sign=True)}]",
            "half-width": fmt(m, (c["high"] - c["low"]) / 2), "df": f"{c['df']:.1f}", "p": f"{c['p']:.2f}",
            "reading": "differs" if c["low"] > 0 or c["high"] < 0 else "no difference detected",
        })  # fmt: skip
    budget = payload["budget"]
    return (
        "# Overlap on vs off: learning per env step (#58)\n\n"
        f"{payload['env_id']} {json.dumps(payload['env_kwargs'])}, GAGPO from the committed prior, "
        f"{budget['total_steps']} env steps a run, {payload['eval']} on {budget['eval_tasks']} held-out tasks every "
        f"{budget['eval_every']} steps, seeds {seeds}; the plan: [preregistration.md](preregistration.md).\n\n"
        + markdown_table(rows)
        + f"\n\nOn - off over the seeds, {LEVEL:.0%} Welch t interval and the exact permutation p "
        f"(bar {bar} for the steps; a run that never reached it counts its whole budget):\n\n"
        + markdown_table(comparisons)
        + f"\n\nThe half-width is the size of difference {len(seeds)} seeds could resolve: a smaller one, either way, "
        "would read as no difference detected.\n\n"
        "Training seconds were measured beside other jobs on a 2-core machine: not a benchmark.\n"
    )


def fmt(measure: str, value: float, sign: bool = False) -> str:
    """Steps as whole numbers, rates to three places."""
    return f"{value:{'+' if sign else ''}.{0 if measure == 'steps to bar' else 3}f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", nargs="?", type=Path, default=FOLDER, help="the study folder with its runs.json")
    folder = parser.parse_args(argv).folder
    if not (folder / "runs.json").is_file():
        parser.error(f"{folder} has no runs.json: merge the seeds' runs first (lab.bench.learning --merge)")
    payload = json.loads((folder / "runs.json").read_text())
    atomic_write_text(folder / "equivalence.md", report(payload))
    print(f"wrote {folder / 'equivalence.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
