"""The user-facing scripts end to end, as a user runs them (subprocesses, tiny budgets, a 3x3 maze).

train.py: every GAGPOConfig field is a flag; train -> checkpoint -> save -> resume continues the step count; bad
values and unknown envs exit 2 with one readable line. eval.py: the paper-style table with expert and random rows,
CSV/JSON written, a saved agent as a row, clear failures. lab.bench.learning: a micro run writes its tables and plot.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from agent_helpers import call, script

from agents.config import GAGPOConfig
from agents.gagpo import GAGPOAgent

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
TINY_MAZE = json.dumps(
    {"width": 3, "height": 3, "rooms": 0, "loops": 1, "min_path": 2, "max_path": 3, "max_episode_steps": 10}
)
TINY_AGENT = ["--num-groups", "2", "--group-size", "2", "--torch-threads", "1", "--tiny-hidden-size", "32"]


def run(script: str, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    """``python scripts/<script> ARGS``, or ``python -m <script> ARGS`` for a lab module (``lab.bench.learning``)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    command = ["-m", script] if script.startswith("lab.") else [str(SCRIPTS / script)]
    return subprocess.run(
        [sys.executable, *command, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


def parse_table(stdout: str, nth: int = 0) -> list[dict[str, str]]:
    """The rows of the ``nth`` Markdown table in a script's output."""
    blocks = re.findall(r"(?m)(?:^\|.*\n?)+", stdout)
    lines = blocks[nth].splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def test_no_script_is_named_as_an_installed_module():
    """Python puts a script's own folder first on ``sys.path``: a ``scripts/dev/openenv.py`` (or one in
    ``lab/bench/``, where three scripts run by path) is what the ``import openenv`` of gagpo_gym's OpenEnv bridge
    would then find, not the package."""
    import importlib.machinery

    mine = (SCRIPTS, ROOT / "lab", ROOT / "tests")  # the folders the tests put on sys.path; the installed packages stay
    outside = [
        p
        for p in sys.path
        if p and Path(p).resolve() != ROOT and not any(Path(p).resolve().is_relative_to(m) for m in mine)
    ]
    for path in [*SCRIPTS.rglob("*.py"), *(ROOT / "lab" / "bench").glob("*.py")]:
        spec = importlib.machinery.PathFinder.find_spec(path.stem, outside)
        assert spec is None, f"{path.relative_to(ROOT)} shadows the installed {path.stem} ({spec.origin})"


def test_train_help_lists_every_hyperparameter_with_its_default():
    result = run("train.py", "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # argparse wraps lines
    assert "--help" in text
    for f in dataclasses.fields(GAGPOConfig):
        flag = "--" + f.name.replace("_", "-")
        assert flag in text, f"{flag} missing from --help"
        assert f"default: {f.default})" in text.split(flag, 1)[1], f"{flag} has no default in --help"
    for flag in ("--env", "--env-kwargs", "--total-timesteps", "--checkpoint-freq", "--resume", "--log-dir"):
        assert flag in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "gagpo_gym/NoSuchEnv-v0"], "unknown env 'gagpo_gym/NoSuchEnv-v0'"),
        (["--env", "gagpo_gym/Maze-v0", "--gamma", "1.5"], "gamma must be in [0, 1]"),
        (["--env", "gagpo_gym/Maze-v0", "--env-kwargs", "{width: 3}"], "--env-kwargs is not valid JSON"),
        (["--env", "gagpo_gym/Maze-v0", "--env-kwargs", '{"width": 1}'], "width must be an int >= 2"),
        (["--resume", "/nonexistent/agent"], "no saved agent at /nonexistent/agent"),
    ],
)
def test_train_rejects_bad_input_with_one_line_and_exit_2(args, message):
    code, _, stderr = call("train", *args, "--total-timesteps", "10")
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], stderr


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A tiny agent trained for one short run, with checkpoints and CSV logs."""
    out = tmp_path_factory.mktemp("train")
    result = run(
        "train.py", "--env", "gagpo_gym/Maze-v0", "--env-kwargs", TINY_MAZE, *TINY_AGENT,
        "--total-timesteps", "30", "--checkpoint-freq", "10", "--save-dir", str(out / "run"),
        "--log-dir", str(out / "logs"), "--eval-tasks", "3", "--quiet",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "| gagpo |" in result.stdout  # the end-of-training evaluation table
    return out


def test_train_saves_checkpoints_and_logs(trained):
    meta = json.loads((trained / "run" / "final" / "agent.json").read_text())
    assert meta["num_timesteps"] >= 30
    assert meta["config"]["num_groups"] == 2 and meta["config"]["tiny_hidden_size"] == 32
    assert meta["env_kwargs"] == json.loads(TINY_MAZE)
    checkpoints = sorted((trained / "run" / "checkpoints").iterdir())
    assert checkpoints and all((c / "agent.json").is_file() for c in checkpoints)
    with (trained / "logs" / "progress.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert rows and "rollout/success_rate" in rows[0] and "advantage/iqr" in rows[0]


def test_resume_continues_the_step_count_and_applies_overrides(trained, tmp_path):
    before = json.loads((trained / "run" / "final" / "agent.json").read_text())["num_timesteps"]
    result = run(
        "train.py", "--resume", str(trained / "run" / "final"), "--total-timesteps", "15",
        "--learning-rate", "0.0005", "--save-dir", str(tmp_path), "--quiet",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"resumed {trained / 'run' / 'final'} at {before} env steps" in result.stdout
    meta = json.loads((tmp_path / "final" / "agent.json").read_text())
    assert meta["num_timesteps"] >= before + 15
    assert meta["config"]["learning_rate"] == 0.0005
    assert meta["config"]["num_groups"] == 2  # kept from the saved agent


def test_eval_defaults_to_expert_and_random_and_writes_csv_json(tmp_path):
    result = run("eval.py", "--env", "gagpo_gym/Maze-v0", "--n-tasks", "6", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "| agent | Success | Return | Length | Invalid | Tasks |" in result.stdout
    # the maze expert walks a shortest path on every task; 6/6 has the 95% Wilson interval [61.0, 100.0]
    assert "| expert | 100.0 [61.0, 100.0] |" in result.stdout
    assert "| random |" in result.stdout
    with (tmp_path / "eval.csv").open() as handle:
        rows = {r["agent"]: r for r in csv.DictReader(handle)}
    assert set(rows) == {"expert", "random"} and float(rows["expert"]["Success"]) == 100.0
    payload = json.loads((tmp_path / "eval.json").read_text())
    expert = next(r for r in payload["results"] if r["agent"] == "expert")
    assert [e["seed"] for e in expert["episodes"]] == list(range(6))
    assert float(rows["random"]["Length"]) > float(rows["expert"]["Length"])
    _, again, _ = call("eval", "--env", "gagpo_gym/Maze-v0", "--n-tasks", "6", "--random", "--workers", "2")
    assert next(line for line in again.splitlines() if line.startswith("| random")) == next(
        line for line in result.stdout.splitlines() if line.startswith("| random")
    ), "the random reference row must be reproducible, also with the envs in 2 worker processes"


def test_eval_household_table_has_the_paper_columns():
    code, stdout, stderr = call(
        "eval", "--env", "gagpo_gym/MiniHouse-v0", "--env-kwargs", '{"size": "small"}', "--n-tasks", "6", "--expert"
    )
    assert code == 0, stderr
    header = next(line for line in stdout.splitlines() if line.startswith("| agent"))
    assert [c.strip().split(" (n=")[0] for c in header.strip("|").split("|")][:10] == [
        "agent", "Pick", "Look", "Clean", "Heat", "Cool", "Pick2", "All", "Won steps", "Length"
    ]  # fmt: skip
    (expert,) = parse_table(stdout)
    counts = {c.split(" (n=")[0]: int(c.split(" (n=")[1].rstrip(")")) for c in expert if " (n=" in c}
    assert sum(counts.values()) == 6  # every game counted under its type
    played = [c for c in expert if " (n=" in c and expert[c] != "-"]
    assert played and all(expert[c].startswith("100.0 [") for c in played) and expert["All"].startswith("100.0 [")


def test_eval_puts_a_saved_agent_beside_the_references(trained):
    code, stdout, stderr = call("eval", "--env", "gagpo_gym/Maze-v0", "--env-kwargs", TINY_MAZE, "--n-tasks", "3",
                                "--agent", str(trained / "run" / "final"), "--name", "tiny", "--expert")  # fmt: skip
    assert code == 0, stderr
    rows = parse_table(stdout)
    assert [r["agent"] for r in rows] == ["tiny", "expert"]
    assert rows[1]["Success"] == "100.0 [43.9, 100.0]"
    # The agent's row is what the saved agent itself plays on those tasks (greedy, seeds 0-2), not any number in range.
    own = GAGPOAgent.load(trained / "run" / "final", verbose=0, kl_coef=0.0).evaluate(n_tasks=3)
    assert float(rows[0]["Success"].split()[0]) == pytest.approx(100 * own["success_rate"], abs=0.05)
    assert float(rows[0]["Length"]) == pytest.approx(own["mean_length"], abs=0.05)


def test_eval_takes_the_env_and_its_kwargs_from_the_saved_agent(trained):
    code, stdout, stderr = call("eval", "--agent", str(trained / "run" / "final"), "--name", "tiny", "--n-tasks", "3")
    assert code == 0, stderr
    assert stdout.startswith(f"gagpo_gym/Maze-v0 {json.dumps(json.loads(TINY_MAZE))} | tasks 0..2")
    assert "warning" not in stderr and [r["agent"] for r in parse_table(stdout)] == ["tiny"]


def test_eval_env_flags_override_the_saved_env_with_a_warning(trained):
    other = json.dumps({**json.loads(TINY_MAZE), "width": 4})
    agent = str(trained / "run" / "final")
    code, stdout, stderr = call("eval", "--agent", agent, "--env-kwargs", other, "--n-tasks", "2", "--expert")
    assert code == 0, stderr
    assert stdout.startswith(f"gagpo_gym/Maze-v0 {other} | tasks 0..1")
    assert f"warning: --env-kwargs {other} differ from {agent}'s training env kwargs" in stderr
    code, stdout, stderr = call("eval", "--agent", agent, "--env", "FrozenLake-v0", "--n-tasks", "2", "--expert")
    assert code == 0, stderr
    assert stdout.startswith("gagpo_gym/FrozenLake-v0  | tasks 0..1")
    assert f"warning: --env gagpo_gym/FrozenLake-v0 differs from the env {agent} was trained on" in stderr
    _, _, stderr = call(
        "eval", "--agent", agent, "--env", "Maze-v0", "--env-kwargs", TINY_MAZE, "--n-tasks", "1", "--expert"
    )
    assert "warning" not in stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "gagpo_gym/Maze-v0", "--agent", "/nonexistent/ckpt"], "no saved agent at /nonexistent/ckpt"),
        (["--env", "NoSuchEnv-v0"], "unknown env 'NoSuchEnv-v0'"),
        (["--expert"], "give --env"),
        (["--env", "gagpo_gym/Maze-v0", "--workers", "-1"], "--workers must be >= 0, got -1"),
    ],
)
def test_eval_fails_clearly(args, message):
    code, _, stderr = call("eval", *args)
    assert code != 0
    assert stderr.strip().startswith("error: ") and message in stderr, stderr


def test_bench_learning_micro_run_writes_tables_and_plot(tmp_path):
    result = run(
        "lab.bench.learning", "--envs", "maze", "--env-kwargs", TINY_MAZE, "--estimators", "gagpo", "grpo",
        "--seeds", "0", "--total-steps", "40", "--eval-every", "20", "--eval-tasks", "2", "--out", str(tmp_path),
        *TINY_AGENT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    png = tmp_path / "maze" / "curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    with (tmp_path / "maze" / "steps.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {r["estimator"] for r in rows} == {"gagpo", "grpo"}
    assert [int(r["target_steps"]) for r in rows if r["estimator"] == "gagpo"] == [0, 20, 40]
    assert all(0.0 <= float(r["success"]) <= 1.0 for r in rows)
    with (tmp_path / "maze" / "iterations.csv").open() as handle:
        iterations = list(csv.DictReader(handle))
    assert iterations and all(r["advantage/iqr"] != "" for r in iterations)
    summary = (tmp_path / "maze" / "report.md").read_text()
    assert "| gagpo | " in summary and "| grpo | " in summary and "adv IQR" in summary
    assert "![learning curves](curve.png)" in summary  # the plot beside the report, in the study's folder
    payload = json.loads((tmp_path / "maze" / "runs.json").read_text())
    assert payload["runs"][0]["config"]["num_groups"] == 2  # CLI hyperparameters reach every run


def test_bench_learning_bootstrap_ratio_is_the_ratio_of_means_with_an_interval():
    bench = script("lab.bench.learning")
    ratio, low, high = bench.bootstrap_ratio([1000, 2000, 3000], [4000, 4000, 4000])
    assert ratio == pytest.approx(0.5) and 0.25 <= low < 0.5 < high <= 0.75
    assert bench.bootstrap_ratio([1000, 2000, 3000], [4000, 4000, 4000]) == (ratio, low, high)  # seeded
    assert bench.bootstrap_ratio([5.0, 5.0], [5.0, 5.0]) == (1.0, 1.0, 1.0)
    runs = [
        {"label": label, "curve": [{"steps": k * 500, "success": v} for k, v in enumerate((0.1, s, s))],
         "iterations": [{"steps": k * 500, "rollout/success_rate": v} for k, v in enumerate((0.1, s, s))]}
        for label, s in (("gagpo", 0.9), ("gagpo", 0.2), ("grpo", 0.3), ("grpo", 0.3))
    ]  # fmt: skip
    (row,) = bench.ratio_table(runs, bar=0.8)  # gagpo: 500 and 1000 (censored: all its steps); grpo: 1000 twice
    assert row["ratio"] == "gagpo / grpo" and row["panel: steps to bar"].startswith("0.75x [0.50, 1.00]")
    assert row["rollouts: steps to bar"] == "1.00x [1.00, 1.00]"  # a moving average of 3 reaches 0.8 nowhere
    # A GAGPO variant is compared with the same variant of a baseline when one ran, else with the plain baseline.
    assert bench.parse_variants(['ex={"expert_members": 1}', 'grpo:ex={"expert_members": 1}']) == [
        ("gagpo ex", "gagpo", {"expert_members": 1}), ("grpo ex", "grpo", {"expert_members": 1})
    ]  # fmt: skip
    with pytest.raises(SystemExit):
        bench.parse_variants(['sac:ex={"expert_members": 1}'])
    relabel = {"gagpo": "gagpo ex", "grpo": "grpo ex"}
    more = [{**r, "label": relabel[r["label"]]} for r in runs] + [{**runs[0], "label": "gigpo"}]
    assert [r["ratio"] for r in bench.ratio_table(more, bar=0.8)] == ["gagpo ex / gigpo", "gagpo ex / grpo ex"]
    rivals = runs + [{**r, "label": label} for r in runs[2:] for label in ("g2po", "rloo")]  # every estimator that ran
    assert [r["ratio"] for r in bench.ratio_table(rivals, bar=0.8)] == ["gagpo / grpo", "gagpo / rloo", "gagpo / g2po"]


def test_bench_learning_runs_only_the_variants_when_no_estimator_is_named(tmp_path):
    code, _, stderr = call("lab.bench.learning", "--envs", "maze", "--estimators")
    assert code == 2 and "nothing to run" in stderr
    result = run(
        "lab.bench.learning", "--envs", "maze", "--env-kwargs", TINY_MAZE, "--estimators", "--variant",
        'coef1={"episode_coef": 1.0}', "--seeds", "0", "--total-steps", "20", "--eval-every", "20", "--eval-tasks",
        "2", "--out", str(tmp_path), "--save-agents", str(tmp_path / "agents"), *TINY_AGENT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (run_,) = json.loads((tmp_path / "maze" / "runs.json").read_text())["runs"]
    assert run_["label"] == "gagpo coef1" and run_["config"]["episode_coef"] == 1.0
    saved = GAGPOAgent.load(tmp_path / "agents" / "gagpo_coef1-seed0")  # the trained agent, as it ended
    assert saved.config.episode_coef == 1.0 and saved.num_timesteps >= 20
    # A baseline run made apart, then one report of both with the ratios between them.
    budget = ("--seeds", "0", "--total-steps", "20", "--eval-every", "20", "--eval-tasks", "2")
    base = tmp_path / "baseline"
    result = run(
        "lab.bench.learning", "--envs", "maze", "--env-kwargs", TINY_MAZE, "--estimators", "grpo", *budget,
        "--out", str(base), *TINY_AGENT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    files = [str(tmp_path / "maze" / "runs.json"), str(base / "maze" / "runs.json")]
    code, _, stderr = call("lab.bench.learning", "--envs", "maze", "--env-kwargs", TINY_MAZE, "--merge", *files,
                           "--out", str(tmp_path / "merged"))  # fmt: skip
    assert code == 0, stderr
    merged = json.loads((tmp_path / "merged" / "maze" / "runs.json").read_text())
    assert [r["label"] for r in merged["runs"]] == ["gagpo coef1", "grpo"]
    (ratio,) = merged["ratios"]
    assert ratio["ratio"] == "gagpo coef1 / grpo" and "x [" in ratio["panel: final success"]
    other = json.loads(Path(files[1]).read_text())
    other["budget"]["total_steps"] = 40
    Path(files[1]).write_text(json.dumps(other))
    code, _, stderr = call("lab.bench.learning", "--envs", "maze", "--env-kwargs", TINY_MAZE, "--merge", *files)
    assert code == 2 and "another budget" in stderr


def test_bench_learning_paper_preset_needs_a_setup_with_a_prior():
    code, _, stderr = call("lab.bench.learning", "--paper", "--envs", "maze", "--estimators", "gagpo")
    assert code == 2 and "warm-start prior" in stderr


def test_warm_start_script_trains_saves_and_evaluates_training_and_heldout_tasks(tmp_path):
    code, stdout, stderr = call(
        "warm_start", "--env", "gagpo_gym/Maze-v0", "--env-kwargs", TINY_MAZE, "--out", str(tmp_path),
        "--episodes", "6", "--epochs", "1", "--task-pool", "4", "--heldout-tasks", "3", "--tiny-hidden-size", "32",
        "--agreement-tasks", "2",
    )  # fmt: skip
    assert code == 0, stderr
    rows = parse_table(stdout)
    assert [r["panel"] for r in rows] == ["training tasks (seeds 0..3)", "held-out tasks (seeds 100000..100002)"]
    record = json.loads((tmp_path / "prior.json").read_text())
    assert record["episodes"] == 6 and record["task_pool"] == 4 and len(record["evaluation"]) == 2
    # Teacher-forced agreement on two more held-out tasks, the expert playing: one row per action kind.
    agreement = record["agreement"]
    assert agreement["tasks"] == "100003..100004" and set(agreement["per_kind"]) == set(agreement["decisions"])
    assert set(agreement["decisions"]) <= {"go"} and agreement["decisions"]["go"] >= 6  # Maze: "go <direction>"
    table = {r["action"]: r for r in parse_table(stdout, 1)}
    assert int(table["all"]["decisions"]) == sum(agreement["decisions"].values())
    assert float(table["all"]["agreement"]) == pytest.approx(agreement["all"], abs=0.005)
    code, _, stderr = call("warm_start", "--env", "gagpo_gym/Maze-v0", "--task-pool", "8", "--heldout-offset", "4")
    assert code == 2 and "held-out" in stderr
    # Fresh tasks, the choice loss, the memory and no admissible list reach the prior's record; no training panel.
    code, stdout, stderr = call(
        "warm_start", "--env", "gagpo_gym/MiniHouse-v0", "--env-kwargs", '{"size": "small"}', "--out",
        str(tmp_path / "memory"), "--task-pool", "0", "--expert", "search", "--objective", "choice", "--memory",
        "--no-show-admissible", "--episodes", "2", "--epochs", "1", "--heldout-tasks", "2", "--agreement-tasks", "0",
        "--tiny-hidden-size", "32",
    )  # fmt: skip
    assert code == 0, stderr
    assert [r["panel"] for r in parse_table(stdout)] == ["held-out tasks (seeds 100000..100001)"]
    record = json.loads((tmp_path / "memory" / "prior.json").read_text())
    assert record["task_pool"] == 0 and record["objective"] == "choice" and "agreement" not in record
    assert record["prompt"]["memory"] is True and record["prompt"]["show_admissible"] is False


def test_train_takes_key_backoff_as_a_list_of_keys():
    train = script("train")
    parser, names = train.build_parser()
    args = parser.parse_args(["--env", "gagpo_gym/Maze-v0", "--key-backoff", "observation", "group"])
    overrides = train.config_overrides(args, names)
    assert overrides == {"key_backoff": ["observation", "group"]}
    assert GAGPOConfig.from_dict(overrides).key_backoff == ("observation", "group")


def test_fingerprint_estimators_are_deterministic_and_written_to_out(tmp_path):
    code, stdout, stderr = call("lab/bench/fingerprint", "--only", "estimators", "--out", str(tmp_path / "fp.txt"))
    assert code == 0, stderr
    entries = dict(line.split("  ") for line in stdout.splitlines())
    assert len(entries) > 20 and all(len(v) == 64 and int(v, 16) >= 0 for v in entries.values()), entries
    assert entries["estimators/gagpo"] == entries["estimators/gagpo_str_keys"]  # the same partition of the rows
    assert entries["estimators/gagpo"] != entries["estimators/gagpo_no_bootstrap"]
    assert (tmp_path / "fp.txt").read_text() == stdout
    assert f"measuring the checkout at {ROOT}" in stderr
    assert call("lab/bench/fingerprint", "--only", "estimators")[1] == stdout


# ----- issue 22: train.py's evaluation table, --until, your own env, Ctrl-C ------------------------------------
def test_train_eval_tasks_prints_the_household_table(tmp_path):
    """Before: ``KeyError: 'episodes'`` after training on MiniHouse (and ALFWorld): the table read episode rows
    that ``evaluate()`` leaves out by default."""
    code, stdout, stderr = call(
        "train", "--env", "gagpo_gym/MiniHouse-v0", "--env-kwargs", '{"size": "small"}', *TINY_AGENT,
        "--total-timesteps", "20", "--eval-tasks", "6", "--quiet",
    )  # fmt: skip
    assert code == 0, stderr
    (row,) = parse_table(stdout.split("Evaluation on", 1)[1])
    assert row["agent"] == "gagpo" and row["Tasks"] == "6" and row["All"].endswith("]")  # rate [low, high]
    counts = [int(c.split(" (n=")[1].rstrip(")")) for c in row if " (n=" in c]
    assert sum(counts) == 6


def test_resume_total_timesteps_means_more_and_until_means_up_to(trained, tmp_path):
    help_text = " ".join(run("train.py", "--help").stdout.split())
    assert "with --resume, this many MORE steps" in help_text and "--until N" in help_text
    final = trained / "run" / "final"
    before = json.loads((final / "agent.json").read_text())["num_timesteps"]
    code, stdout, stderr = call("train", "--resume", str(final), "--until", str(before + 10), "--save-dir",
                                str(tmp_path / "a"), "--quiet")  # fmt: skip
    assert code == 0, stderr
    after = json.loads((tmp_path / "a" / "final" / "agent.json").read_text())["num_timesteps"]
    assert before + 10 <= after < before + 10 + 60  # up to the target, finishing the iteration in progress
    code, stdout, stderr = call("train", "--resume", str(tmp_path / "a" / "final"), "--until", str(after),
                                "--save-dir", str(tmp_path / "b"), "--quiet")  # fmt: skip
    assert code == 0, stderr
    assert f"already at {after} env steps (--until {after}): nothing to train" in stdout
    assert json.loads((tmp_path / "b" / "final" / "agent.json").read_text())["num_timesteps"] == after
    code, _, stderr = call("train", "--resume", str(final), "--until", "5", "--total-timesteps", "5")
    assert code == 2 and "not allowed with argument" in stderr


USER_ENV_MODULE = '''
import gagpo_gym
from gagpo_gym.core import TextEnv


class Lamp(TextEnv):
    """Turn the lamp on."""

    def _new_task(self, seed, options):
        self.on, self.task, self.task_id = False, "Turn the lamp on.", "lamp"
        return "The lamp is off."

    def _execute(self, command):
        self.on = self.won = command == "switch"
        return ("The lamp is on." if self.on else "Nothing changes."), float(self.on), self.on

    def admissible_actions(self):
        return ["switch", "wait"]

    def state_string(self):
        return str(self.on)

    def expert_action(self):
        return "switch"


gagpo_gym.register_text_env("UserLamp-v0", Lamp, max_episode_steps=4)
'''


def test_scripts_take_gymnasium_module_env_ids_and_agents_trained_on_them(tmp_path):
    """``train.py --env my_envs:MyEnv-v0`` imports ``my_envs`` first (as ``gymnasium.make`` does); the saved agent keeps
    the module in its env id, so ``eval.py`` rebuilds the env from the agent alone. Before: "unknown env"."""
    (tmp_path / "lamp_envs.py").write_text(USER_ENV_MODULE)
    env = {"PYTHONPATH": str(tmp_path)}
    result = run_with(env, "train.py", "--env", "lamp_envs:UserLamp-v0", *TINY_AGENT, "--total-timesteps", "16",
                      "--vec-mode", "async", "--save-dir", str(tmp_path / "run"), "--quiet")  # fmt: skip
    assert result.returncode == 0, result.stderr
    meta = json.loads((tmp_path / "run" / "final" / "agent.json").read_text())
    assert meta["env_id"] == "lamp_envs:gagpo_gym/UserLamp-v0"
    result = run_with(env, "eval.py", "--agent", str(tmp_path / "run" / "final"), "--name", "lamp", "--expert",
                      "--n-tasks", "3", "--out", str(tmp_path / "eval"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("lamp_envs:gagpo_gym/UserLamp-v0  | tasks 0..2")
    assert [r["agent"] for r in parse_table(result.stdout)] == ["lamp", "expert"]
    assert parse_table(result.stdout)[1]["Success"].startswith("100.0 [")
    result = run_with(env, "eval.py", "--env", "lamp_envs:NoSuchEnv-v0", "--expert")
    assert result.returncode == 2 and "importing 'lamp_envs' did not register it" in result.stderr
    result = run("eval.py", "--env", "no_such_module_xyz:Lamp-v0", "--expert")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "cannot import 'no_such_module_xyz', the module part of env id" in result.stderr


def run_with(extra_env: dict[str, str], script: str, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", **extra_env}
    return subprocess.run([sys.executable, str(SCRIPTS / script), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)  # fmt: skip


def test_ctrl_c_in_async_mode_ends_with_one_line_and_exit_130(tmp_path):
    """Before: three tracebacks (the main process and each env worker) and a death by SIGINT."""
    import selectors
    import signal
    import time

    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "train.py"), "--env", "gagpo_gym/Maze-v0", "--env-kwargs", TINY_MAZE,
         *TINY_AGENT, "--vec-mode", "async", "--total-timesteps", "100000", "--save-dir", str(tmp_path),
         "--checkpoint-freq", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"},
        start_new_session=True,  # a process group of its own, as a terminal's job: Ctrl-C reaches every process
        # A terminal's foreground job starts with SIGINT's default action; a test run launched in the background
        # of a non-interactive shell (`make test &`) ignores SIGINT, and a child would inherit that.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        selector = selectors.DefaultSelector()
        selector.register(proc.stdout, selectors.EVENT_READ)
        deadline, lines = time.monotonic() + 90, []
        while len(lines) < 2 and time.monotonic() < deadline:  # two iterations: one checkpoint exists
            if selector.select(timeout=1):
                lines.append(proc.stdout.readline())
        assert len(lines) == 2 and lines[-1].startswith("iter 2"), lines
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    (line,) = stderr.strip().splitlines()
    assert line.startswith("interrupted: at ") and f"last checkpoint: {tmp_path / 'checkpoints'}" in line
    checkpoint = line.split("--resume ")[1].rstrip(")")
    assert (Path(checkpoint) / "agent.json").is_file()


# ----- issue 24: lab/bench/throughput.py -----------------------------------------------------------------------
def test_bench_throughput_counts_flops_from_the_shapes_by_hand():
    from types import SimpleNamespace

    from transformers import Qwen2Config, Qwen2ForCausalLM

    bench = script("lab/bench/throughput")
    # 2 x 1000 x 5 matmul, 2 x 2 x 5^2 x 8 x 2 attention (a dense square), 2 x 40 x 3 head
    flops = bench.forward_flops(5, 3, matmul_params=1000, layers=2, attn_dim=8, head_params=40)
    assert flops == {"matmul": 10_000, "attention": 1_600, "head": 240, "total": 11_840}
    config = Qwen2Config(vocab_size=100, hidden_size=16, intermediate_size=24, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    dims = bench.model_dims(Qwen2ForCausalLM(config))
    # per layer: q and o 16 x 16, k and v 16 x 8 (2 key/value heads of 4), gate, up and down 16 x 24; no embeddings
    per_layer = 2 * 16 * 16 + 2 * 16 * 8 + 3 * 16 * 24
    assert dims == {"matmul_params": 3 * per_layer, "layers": 3, "attn_dim": 16, "head_params": 1600, "hidden": 16,
                    "vocab": 100}  # fmt: skip
    choose = SimpleNamespace(prompt_ids=[1, 2, 3, 4], candidate_ids=[[5, 6], [7]], response_ids=[])
    generate = SimpleNamespace(prompt_ids=[1, 2, 3, 4], candidate_ids=[], response_ids=[5, 6, 7])
    assert bench.row_shape(choose) == (4, 3, 7, 2) and bench.row_shape(generate) == (4, 3, 7, 0)


def test_bench_throughput_micro_run_reports_steps_flops_and_the_peak(tmp_path):
    config = json.dumps({"num_groups": 1, "group_size": 2, "tiny_hidden_size": 32})
    code, stdout, stderr = call(
        "lab/bench/throughput", "--settings", "maze", "--steps", "1", "--config", config, "--env-kwargs", TINY_MAZE,
        "--peak-sizes", "128", "256", "--out", str(tmp_path / "t.md"), "--json", str(tmp_path / "t.json"),
    )  # fmt: skip
    assert code == 0, stderr + stdout
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["peak"]["peak_gflops"] > 0
    (entry,) = data["entries"]
    result, derived = entry["result"], entry["derived"]
    assert result["checkout"] == str(ROOT) and result["config"]["group_size"] == 2
    assert result["steps_per_s"] > 0 and result["num_timesteps"] == result["rows"] > 0
    assert result["width_mean"] > result["prompt_mean"] > 0  # choose mode: the candidates follow the prompt
    assert result["flops"]["update"] == result["config"]["n_epochs"] * 3 * result["flops"]["forward"]["total"] > 0
    assert derived["update_gflops"] > 0 and derived["update_peak_pct"] > 0
    assert all(derived["per_1k_s"][k] > 0 for k in ("rollout_s", "recompute_s", "update_s"))
    (row,) = parse_table(stdout)
    assert row["setting"] == "maze" and float(row["steps/s"]) > 0 and row["% peak"] != "n/a"
    assert (tmp_path / "t.md").read_text() == stdout


def test_bench_learning_paper_preset_fine_tunes_the_committed_full_house_prior(tmp_path):
    prior = ROOT / "results" / "agents" / "minihouse-full-search"
    assert (prior / "prior.json").is_file() and (prior / "model.safetensors").is_file()
    result = run(
        "lab.bench.learning", "--paper", "--envs", "minihouse-full", "--estimators", "gagpo", "--seeds", "0",
        "--total-steps", "30", "--eval-every", "30", "--eval-tasks", "2", "--num-groups", "1", "--group-size", "2",
        "--out", str(tmp_path), timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "the committed prior results/agents/minihouse-full-search" in result.stdout
    (run_,) = json.loads((tmp_path / "minihouse-full" / "runs.json").read_text())["runs"]
    assert run_["model"] == str(prior) and run_["eval_offset"] == 100_000  # held-out houses, never trained on
    assert (
        run_["config"]["task_pool"] == 0 and run_["config"]["n_epochs"] == 1 and run_["config"]["history_length"] == 4
    )
    assert "train_success" not in run_["curve"][0]  # fresh tasks: no training-task panel to tell apart
    assert "a fresh task for every rollout group" in (tmp_path / "minihouse-full" / "report.md").read_text()


def test_credit_check_finds_the_zero_credit_of_a_failing_tail_no_winner_shared():
    import numpy as np

    from agents.buffer import Row

    credit = script("lab.research.credit_check")

    def episode(episode: int, states: list[str], won: bool) -> list[Row]:
        rows = []
        for t, (s, s_next) in enumerate(zip(states, states[1:])):
            last = t == len(states) - 2
            rows.append(Row(
                group=0, episode=episode, prompt_ids=[], rollout_logp=np.zeros(1), reward=float(won and last),
                state_key=s, next_state_key=s_next, terminated=won and last, done=last, won=won and last,
            ))  # fmt: skip
        return rows

    # A winner s0 -> s1 -> goal; a loser leaves s0 for s2 and loops s2 <-> s3 until the time limit.
    rows = episode(0, ["s0", "s1", "goal"], True) + episode(1, ["s0", "s2", "s3", "s2", "s3", "s2"], False)
    table = {row["rows"]: row for row in credit.credit_table(rows, [0.0, 1.0])}
    assert table["failing-episode rows"]["n"] == 5 and table["failing revisit rows"]["n"] == 2
    assert table["failing revisit rows"]["raw A = 0"] == "1.00"  # the loop: no TD residual at all
    assert table["failing-episode rows"]["raw A = 0"] == "0.80"  # only the step that left s0 is blamed
    plain, with_episode = (float(table["failing revisit rows"][f"mean A, episode_coef {c}"]) for c in ("0", "1"))
    assert with_episode < plain - 0.5  # the episode term pushes the loop down
    assert float(table["winning-episode rows"]["mean A, episode_coef 0"]) > 0
    # --compare: on these rows GAGPO with its episode term gives every action GRPO's sign (only the step leaving s0
    # and the loop's size differ), without it most rows get a sign of their own (0 on the loop, GRPO's -1 there).
    agree = {(r["gagpo vs"], r["rows"]): r for r in credit.agreement_table(rows, ["gigpo", "grpo"], 1.0)}
    assert (
        agree[("grpo", "all rows")]["same sign"] == "1.00" and float(agree[("gigpo", "all rows")]["correlation"]) > 0.9
    )
    plain = {(r["gagpo vs"], r["rows"]): r for r in credit.agreement_table(rows, ["grpo"], 0.0)}
    assert float(plain[("grpo", "failing rows")]["same sign"]) < 0.5
    # The 2026 rivals compare too, fed the winner's success: G2PO's success node and GraphGPO's goal give every action
    # GAGPO's sign and GraphGPO a correlation above 0.9 (with no success marked: G2PO's signs 0.86, GraphGPO's 0.85).
    rivals = {(r["gagpo vs"], r["rows"]): r for r in credit.agreement_table(rows, ["hgpo", "graphgpo", "g2po"], 1.0)}
    assert rivals[("graphgpo", "all rows")]["same sign"] == rivals[("g2po", "all rows")]["same sign"] == "1.00"
    assert float(rivals[("graphgpo", "all rows")]["correlation"]) > 0.9
    assert rivals[("hgpo", "all rows")]["n"] == 7
    with pytest.raises(ValueError, match="--compare takes"):
        credit.agreement_table(rows, ["ppo"], 1.0)


def test_credit_check_reports_one_rollout_of_a_prior(tmp_path):
    result = run(
        "lab.research.credit_check", "--model", str(ROOT / "results" / "agents" / "minihouse-full-search"),
        "--env-kwargs", '{"size": "small"}', "--groups", "1", "--group-size", "2", "--seeds", "0",
        "--state-keys", "state", "--compare", "gigpo", "grpo", "--out", str(tmp_path / "credit.md"), timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = (tmp_path / "credit.md").read_text()
    assert "seed 0, state_key 'state': 2 episodes" in report and "| winning-episode rows |" in report
    assert "GAGPO (episode_coef 1) against the others on these rows:" in report and "| gigpo | all rows | " in report


def test_final_cycle_is_the_loop_an_episode_ends_in():
    cycles = script("lab.research.greedy_cycles")
    assert cycles.final_cycle(list("abcbcbc")) == (3, 2)  # "b c" from step 1 to the end: repeats from step 3
    assert cycles.final_cycle(list("abcabcab")) == (3, 3)
    assert cycles.final_cycle(list("xaaaa")) == (2, 1)
    assert cycles.final_cycle(list("abcbcbd")) is None  # it left the loop
    assert cycles.final_cycle(list("abcb")) is None  # one repeated prompt, not a whole period
    episode = {"task_text": "put some statue on shelf.", "commands": ["go to shelf 1", "take statue 1 from shelf 1"]}
    assert not cycles.took_unnamed(episode)
    assert cycles.took_unnamed({**episode, "commands": ["take pencil 2 from desk 1", "take statue 1 from desk 1"]})
    put_back = ["take statue 1 from desk 1", "go to shelf 1", "move statue 1 to shelf 1", "take statue 1 from shelf 1"]
    assert cycles.took_back({**episode, "commands": put_back})
    assert not cycles.took_back({**episode, "commands": put_back[:3] + ["take statue 1 from desk 1"]})
    assert not cycles.took_back({**episode, "commands": put_back[:3] + ["go to desk 1", "take statue 1 from shelf 1"]})


def test_greedy_cycles_reports_a_prior_and_its_saved_agent_alike(tmp_path):
    prior = str(ROOT / "results" / "agents" / "minihouse-full-search")
    GAGPOAgent("gagpo_gym/MiniHouse-v0", prior, env_kwargs={"size": "small"}, verbose=0).save(tmp_path / "agent")
    out = tmp_path / "cycles.md"
    code, stdout, stderr = call(
        "lab.research.greedy_cycles", "--model", prior, str(tmp_path / "agent"), "--env-kwargs", '{"size": "small"}',
        "--tasks", "6", "--batch", "3", "--out", str(out), "--agreement-tasks", "2",
    )  # fmt: skip
    assert code == 0, stderr
    report = out.read_text()
    rows = [line for line in report.splitlines() if line.startswith("| ") and not line.startswith("| model |")]
    agreement = [line.split(" | ")[-2:] for line in rows]
    assert len(agreement) == 2 and agreement[0] == agreement[1]  # the saved agent agrees as its prior does
    assert 0 <= float(agreement[0][0]) <= 1 and "go " in agreement[0][1]
    assert "Agreement: teacher-forced, the search expert playing tasks 100006..100007" in report
    played = json.loads(out.with_suffix(".json").read_text())
    prior_episodes, agent_episodes = played[prior], played[str(tmp_path / "agent")]
    assert [e["task"] for e in prior_episodes] == list(range(100_000, 100_006))
    assert prior_episodes == agent_episodes  # greedy: the saved agent plays its prior's commands
    for e in prior_episodes:
        assert len(e["commands"]) == len(e["confidence"]) == e["length"] >= 1
        assert all(0 < c <= 1 for c in e["confidence"])  # the greedy choice's probability, step by step
        if e["period"]:  # the commands repeat from the cycle on, as the prompts (which show all but the last) do
            tail = e["commands"][e["cycle_start"] - e["period"] : -1]
            assert tail[e["period"] :] == tail[: len(tail) - e["period"]] and not e["won"]
            assert e["revisits"] >= 1  # round the loop the house is back in a state it was in
        assert e["task_text"] and 0 <= e["revisits"] <= e["length"]
        assert e["stage"] in (0, 1, 2, 3) and (e["stage"] == 3 or not e["won"])  # a win held a target
    failures = [e for e in prior_episodes if not e["won"]]
    header = next(line for line in report.splitlines() if line.startswith("| model |")).split(" | ")
    stopped = rows[0].split(" | ")[header.index("stopped at: search / open / take / after the take")]
    assert [int(n) for n in stopped.split(" / ")] == [sum(e["stage"] == k for e in failures) for k in range(4)]
    assert "| model | tasks | greedy success |" in out.read_text() and stdout.startswith("# Greedy failures")
    assert "| took an object the task does not name | steps back to a visited state |" in out.read_text()
