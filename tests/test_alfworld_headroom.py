"""The headroom comparison's runner (lab/studies/alfworld_headroom.py): the #49 runner's runs under its own layout."""

from __future__ import annotations

from pathlib import Path

from agent_helpers import script

ROOT = Path(__file__).resolve().parents[1]


def test_each_layout_names_the_module_its_subprocesses_run():
    """``all`` starts ``python -m <layout.module>``: under ``python -m`` a module's __name__ is "__main__", which
    names no module."""
    compare, headroom = script("lab.studies.alfworld_compare"), script("lab.studies.alfworld_headroom")
    assert compare.LAYOUT.module == "lab.studies.alfworld_compare"
    assert headroom.LAYOUT.module == "lab.studies.alfworld_headroom"
    assert headroom.LAYOUT.final_agent("gagpo-seed0") == ROOT / "runs" / "alfworld-headroom" / "gagpo-seed0" / "final"


def test_status_lists_the_registered_order_seed_by_seed(capsys):
    assert script("lab.studies.alfworld_headroom").main(["status"]) == 0
    steps = [line.split()[1:] for line in capsys.readouterr().out.splitlines() if line.startswith("pending:")]
    trains = [(arm, int(seed)) for what, arm, seed in steps if what == "train"]
    assert trains == sorted(trains, key=lambda t: t[1]) and len(trains) <= 25


def test_the_credit_agreement_reads_the_rollout_and_changes_no_training():
    """Logged beside training, never part of it: the same seed trains to the same weights with it, and GAGPO's own
    credit agrees with itself."""
    import torch
    from agent_helpers import capture_logs

    from agents import GAGPOAgent
    from lab.study import CreditAgreement

    maze = {"width": 3, "height": 3, "rooms": 0, "loops": 1, "min_path": 2, "max_path": 3, "max_episode_steps": 8}
    kwargs = dict(env_kwargs=maze, num_groups=2, group_size=4, tiny_hidden_size=32, seed=1, torch_threads=1,
                  verbose=0, advantage_scale="unit")  # fmt: skip
    plain, watched = GAGPOAgent("gagpo_gym/Maze-v0", **kwargs), GAGPOAgent("gagpo_gym/Maze-v0", **kwargs)
    logs = capture_logs(watched)
    plain.learn(10**6, max_iterations=2)
    watched.learn(10**6, max_iterations=2, callback=CreditAgreement(["gagpo", "grpo"]))
    for name, p in plain.policy.model.state_dict().items():
        assert torch.equal(watched.policy.model.state_dict()[name], p)
    row = logs.dumps[-1]
    assert row["agreement/gagpo/all_same_sign"] == 1.0
    assert -1 <= row["agreement/grpo/all_corr"] <= 1 and 0 <= row["agreement/grpo/failed_same_sign"] <= 1


def test_the_report_compares_seeds_with_t_intervals_and_counts_each_game_once(tmp_path, monkeypatch):
    """Runs written as the runner writes them (records, curves, games, every episode): the report's numbers are
    those of an independent computation, and an arm short of its seeds is left out of no table it has data for."""
    import json
    import math
    from statistics import mean, stdev

    import numpy as np

    from lab.reporting import t_quantile

    headroom = script("lab.studies.alfworld_headroom")
    compare = script("lab.studies.alfworld_compare")
    monkeypatch.setattr(headroom, "LAYOUT", compare.Layout("x", headroom.LAYOUT.settings, tmp_path, tmp_path / "w"))
    monkeypatch.setattr("builtins.print", lambda *_: None)
    from lab.study import load_settings

    settings = load_settings(headroom.LAYOUT.settings)
    rng = np.random.default_rng(0)
    games = {"valid_seen": 140, "valid_unseen": 134}
    rates = {"gagpo": 0.6, "grpo": 0.4}
    wins: dict[tuple[str, str, str], list[float]] = {}
    for arm, rate in rates.items():
        for seed in range(3):
            folder = tmp_path / "runs" / f"{arm}-seed{seed}"
            folder.mkdir(parents=True)
            result = {}
            for split, n in games.items():
                for protocol in ("greedy", "sampled"):
                    won = rng.random(n) < rate
                    episodes = [{"task_id": f"{split}/{g}", "task_type": ("pick", "heat")[g % 2], "won": bool(w)}
                                for g, w in enumerate(won)]  # fmt: skip
                    result[f"{split}/{protocol}"] = {"success_rate": float(won.mean()), "episodes": episodes}
                    wins.setdefault((arm, split, protocol), []).append(float(won.mean()))
            (folder / "eval.json").write_text(json.dumps(result))
            logged = {"rollout/success_rate": rate, "advantage/singleton_share": 0.4,
                      "advantage/singleton_set_share": 0.7, "agreement/grpo/all_corr": 0.8}  # fmt: skip
            curve = [{"step": 1000 * (i + 1), **logged} for i in range(4)]
            (folder / "curve.jsonl").write_text("".join(json.dumps(row) + "\n" for row in curve))
            (folder / "run.json").write_text(json.dumps({"num_timesteps": 4000}))
            (folder / "games.json").write_text(json.dumps({"0": ["a", "b"], "1": ["b", "c"]}))
    text = headroom.write_report(settings).read_text()
    a, b = wins["gagpo", "valid_seen", "greedy"], wins["grpo", "valid_seen", "greedy"]
    va, vb = stdev(a) ** 2 / 3, stdev(b) ** 2 / 3
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)
    half = t_quantile(0.975, df) * math.sqrt(va + vb)
    diff = mean(a) - mean(b)
    low, high = 100 * (diff - half), 100 * (diff + half)
    row = f"| gagpo - grpo | valid_seen | greedy | {100 * diff:+.1f} | [{low:+.1f}, {high:+.1f}] |"
    assert row in text
    assert "| gagpo-seed0 |" in text and "| 3 | 4000 |" in text  # three distinct train games, its env steps
    pick = [np.mean([e["won"] for e in json.loads((tmp_path / "runs" / f"gagpo-seed{s}" / "eval.json").read_text())[
        "valid_seen/greedy"]["episodes"] if e["task_type"] == "pick"]) for s in range(3)]  # fmt: skip
    assert f"| gagpo | {100 * np.mean(pick):.1f} [" in text  # per type: each game one unit over the seeds
    assert (tmp_path / "curves.png").is_file()
