"""Evaluation results that are never lost and read as researchers expect (issue 22, points 5, 7 and 8).

* ``agents.evaluation``: the Wilson interval, counts behind every rate, ``task_id`` in episode rows, a NaN reward
  reported instead of a ``nan`` mean, finished episodes reported to a progress bar.
* ``scripts/eval.py``: ``--out`` checked before any play, each row written as it finishes, a failing row named while
  the others are written, ``--resume``, a damaged agent in one line, the ALFWorld experts named for what they are.
* Progress bars: on stderr, a known total and a real rate, silent unless asked for or on a terminal.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
from test_scripts import TINY_AGENT, TINY_MAZE, call, parse_table, run

import gagpo_gym
from agents import GAGPOAgent
from agents.callbacks import ProgressBar
from agents.env_spec import make_env
from agents.evaluation import (
    panel_progress,
    reference_policy_panel,
    run_panel,
    summarize,
    wilson_interval,
)
from gagpo_gym.core import TextEnv

ROOT = Path(__file__).resolve().parents[1]
MAZE_KWARGS = json.loads(TINY_MAZE)

#: A user's env module, written into a test's tmp_path: the expert raises while $USER_ENVS_EXPERT_FAILS is set.
USER_ENVS = '''
import os

import gagpo_gym
from gagpo_gym.core import TextEnv


class Counter(TextEnv):
    """Say "up" `target` times."""

    def __init__(self, target: int = 2):
        super().__init__()
        self.target, self.count = target, 0

    def _new_task(self, seed, options):
        self.count = 0
        self.task, self.task_id = f"Count to {self.target}.", f"count-to-{self.target}"
        return f"Count to {self.target}. You are at 0."

    def _execute(self, command):
        self.count += command == "up"
        self.won = self.count >= self.target
        return f"You are at {self.count}.", float(self.won), self.won

    def admissible_actions(self):
        return ["up", "wait"]

    def state_string(self):
        return str(self.count)

    def expert_action(self):
        if os.environ.get("USER_ENVS_EXPERT_FAILS"):
            raise RuntimeError("the expert is broken today")
        return "up"


gagpo_gym.register_text_env("UserCounter-v0", Counter, max_episode_steps=6)
'''


@pytest.fixture
def user_envs(tmp_path, monkeypatch):
    """The folder holding ``user_envs.py``, on sys.path; the module and its env are gone afterwards."""
    (tmp_path / "user_envs.py").write_text(USER_ENVS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("user_envs", None)
    gym.registry.pop("gagpo_gym/UserCounter-v0", None)


# ----- the interval, the counts, the episode rows ------------------------------------------------------------
def test_wilson_interval_known_values():
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=5e-5)
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=5e-5)
    assert wilson_interval(10, 10) == pytest.approx((1 - wilson_interval(0, 10)[1], 1.0), abs=1e-12)  # mirrored
    assert wilson_interval(10, 10)[1] == 1.0  # exactly 1 at n of n
    assert wilson_interval(0, 10)[0] == 0.0
    assert wilson_interval(1, 1) == pytest.approx((0.2065, 1.0), abs=5e-5)
    assert wilson_interval(0, 0) == (0.0, 1.0)  # no games: nothing known
    with pytest.raises(ValueError, match="successes <= n"):
        wilson_interval(3, 2)


def test_summarize_counts_behind_every_rate_and_no_nan():
    rows = [
        {"won": True, "return": 1.0, "length": 4, "invalid": 0, "revisits": 0, "task_type": "pick", "score": 1.0},
        {"won": False, "return": 0.0, "length": 10, "invalid": 2, "revisits": 3, "task_type": "pick", "score": 0.0},
        {"won": True, "return": 1.0, "length": 6, "invalid": 0, "revisits": 1, "task_type": "look", "score": 1.0},
    ]
    out = summarize(rows)
    assert (out["wins"], out["n_tasks"], out["won_length"]) == (2, 3, 5.0)
    assert (out["invalid_rate"], out["revisit_rate"]) == (2 / 20, 4 / 20)
    assert out["per_type_n"] == {"look": 1, "pick": 2} and out["per_type_wins"] == {"look": 1, "pick": 1}
    assert out["per_type"] == {"look": 1.0, "pick": 0.5}
    empty = summarize([])
    assert empty["won_length"] is None and all(
        v == 0 for k, v in empty.items() if k not in ("episodes", "won_length") and not isinstance(v, dict)
    )


def test_episode_rows_carry_task_id_and_progress_counts_every_episode():
    reported: list[int] = []
    factory = functools.partial(make_env, "gagpo_gym/Maze-v0", MAZE_KWARGS, None)
    out = run_panel(
        lambda o, i, venv, idx: list(venv.call("expert_action", indices=idx)),
        factory, 7, batch_size=3, progress=reported.append,
    )  # fmt: skip
    assert sum(reported) == 7 and len(reported) >= 3  # reported as episodes finish, batch by batch
    ids = [e["task_id"] for e in out["episodes"]]
    env = gagpo_gym.make("gagpo_gym/Maze-v0", **MAZE_KWARGS)
    assert ids == [env.reset(seed=s)[1]["task_id"] for s in range(7)]
    env.close()
    # agent.evaluate() reports through panel_progress: what eval.py's bars count
    agent = GAGPOAgent("gagpo_gym/Maze-v0", env_kwargs=MAZE_KWARGS, num_groups=1, group_size=1, verbose=0,
                       torch_threads=1, tiny_hidden_size=32)  # fmt: skip
    seen: list[int] = []
    with panel_progress(seen.append):
        summary = agent.evaluate(n_tasks=5, batch_size=2, episodes=True)
    assert sum(seen) == 5 and [e["seed"] for e in summary["episodes"]] == [0, 1, 2, 3, 4]
    assert all(e["task_id"] for e in summary["episodes"])


def test_panels_in_worker_processes_give_the_serial_rows(monkeypatch):
    """Issue 24, point 3: ``workers=2`` steps the envs in 2 processes, started once per panel, with the same rows:
    reference policies (the expert asked in the workers, the random one drawing here), and an agent's evaluate(),
    sampling, so its RNG draws must follow the same batches; 7 tasks in batches of 3 end with a short batch."""
    from wrappers import GroupedVectorEnv

    made: list[dict] = []  # the vector envs each panel makes: one, whatever its batches
    init = GroupedVectorEnv.__init__

    def counted_init(self, *args, **kwargs) -> None:
        made.append(kwargs)
        init(self, *args, **kwargs)

    monkeypatch.setattr(GroupedVectorEnv, "__init__", counted_init)
    for kind in ("expert", "random"):
        serial = reference_policy_panel(kind, "gagpo_gym/Maze-v0", MAZE_KWARGS, 19, seed=3)
        assert reference_policy_panel(kind, "gagpo_gym/Maze-v0", MAZE_KWARGS, 19, seed=3, workers=2) == serial
        assert [e["seed"] for e in serial["episodes"]] == list(range(19))
    serial_made, parallel_made = made[0::2], made[1::2]  # one vector env per panel, not per batch (16 + 3 tasks)
    assert len(made) == 4 and all(m.get("mode", "sync") == "sync" for m in serial_made)
    assert all(m["mode"] == "async" and m["n_workers"] == 2 for m in parallel_made)

    agent = GAGPOAgent("gagpo_gym/Maze-v0", env_kwargs=MAZE_KWARGS, num_groups=1, group_size=1, verbose=0,
                       torch_threads=1, tiny_hidden_size=32, seed=5)  # fmt: skip
    state = agent.rng.bit_generator.state
    panel = {"n_tasks": 7, "batch_size": 3, "deterministic": False, "episodes": True}
    serial = agent.evaluate(**panel)
    agent.rng.bit_generator.state = state
    assert agent.evaluate(**panel, workers=2) == serial
    assert [e["seed"] for e in serial["episodes"]] == list(range(7))
    with pytest.raises(ValueError, match="workers must be >= 0"):
        agent.evaluate(n_tasks=2, workers=-1)


class NanReward(TextEnv):
    """The second step returns a NaN reward."""

    def _new_task(self, seed: int | None, options: dict[str, Any]) -> str:
        self.t, self.task, self.task_id = 0, "Wait.", "nan-task-3"
        return "A room."

    def _execute(self, command: str) -> tuple[str, float, bool]:
        self.t += 1
        return "A room.", float("nan") if self.t == 2 else 0.0, False

    def admissible_actions(self) -> list[str]:
        return ["wait"]

    def state_string(self) -> str:
        return str(self.t)

    def expert_action(self) -> str:
        return "wait"


@pytest.fixture
def nan_env():
    env_id = gagpo_gym.register_text_env("TestEvalNanReward-v0", NanReward, max_episode_steps=4)
    yield env_id
    gym.registry.pop(env_id, None)  # collected parametrisations over the registry must not see it


def test_a_nan_reward_is_reported_not_averaged_into_a_nan_mean(nan_env):
    """Before: evaluate() returned mean_return nan (the panel summed a NaN reward); now the step is named."""
    agent = GAGPOAgent(nan_env, num_groups=1, group_size=1, verbose=0, torch_threads=1, tiny_hidden_size=32)
    match = r"TestEvalNanReward-v0 returned reward nan for task 'nan-task-3' \(seed 0\) at step 2"
    with pytest.raises(ValueError, match=match):
        agent.evaluate(n_tasks=2)
    with pytest.raises(ValueError, match=match):
        reference_policy_panel("expert", nan_env, {}, 1)
    with pytest.raises(ValueError, match="n_tasks and batch_size must be >= 1"):
        agent.evaluate(n_tasks=0)


# ----- eval.py: output written as it goes, resumable, failures named ---------------------------------------------
def test_eval_checks_out_before_playing(tmp_path):
    (tmp_path / "a_file").write_text("")
    started = time.perf_counter()
    code, stdout, stderr = call("eval", "--env", "gagpo_gym/Maze-v0", "--n-tasks", "200", "--out",
                                str(tmp_path / "a_file" / "results"))  # fmt: skip
    assert code == 2 and stdout == ""
    assert stderr.strip() == f"error: cannot write to --out {tmp_path / 'a_file' / 'results'}: Not a directory"
    assert time.perf_counter() - started < 5  # nothing was played


def test_eval_writes_each_row_names_a_failing_one_and_resumes(user_envs, tmp_path, monkeypatch):
    out = tmp_path / "eval"
    args = ["--env", "user_envs:UserCounter-v0", "--n-tasks", "5", "--expert", "--random", "--out", str(out)]
    monkeypatch.setenv("USER_ENVS_EXPERT_FAILS", "1")
    code, stdout, stderr = call("eval", *args)
    assert code == 1
    assert "error: row 'expert' failed after" in stderr and "RuntimeError: the expert is broken today" in stderr
    assert stderr.strip().splitlines()[-1].startswith("error: 1 of 2 rows failed: 'expert'")
    assert "Traceback" not in stderr  # it is in the file
    payload = json.loads((out / "eval.json").read_text())
    assert [r["agent"] for r in payload["table"]] == ["random"] and payload["complete"] is False
    assert payload["failed"][0]["agent"] == "expert" and "Traceback" in payload["failed"][0]["traceback"]
    assert [r["agent"] for r in parse_table(stdout)] == ["random"]
    assert (out / "eval.csv").read_text().splitlines()[1].startswith("random,")
    random_first = payload["results"][0]

    monkeypatch.delenv("USER_ENVS_EXPERT_FAILS")
    code, stdout, stderr = call("eval", *args, "--resume")
    assert code == 0, stderr
    assert "random: kept from" in stderr
    payload = json.loads((out / "eval.json").read_text())
    assert [r["agent"] for r in payload["table"]] == ["expert", "random"] and payload["complete"] is True
    assert payload["results"][1] == random_first  # not played again: the same row, its timing included
    assert payload["failed"] == [] and payload["table"][0]["Success"] == 100.0
    assert [r["agent"] for r in parse_table(stdout)] == ["expert", "random"]

    code, _, stderr = call("eval", *args[:-4], "--n-tasks", "6", "--expert", "--out", str(out), "--resume")
    assert code == 2 and "was written with other settings (n_tasks 5 -> 6)" in stderr


def test_eval_without_resume_refuses_an_earlier_runs_rows_unless_told_to_replace_them(tmp_path):
    args = ["--env", "gagpo_gym/Maze-v0", "--env-kwargs", TINY_MAZE, "--n-tasks", "3", "--random", "--out"]
    assert call("eval", *args, str(tmp_path))[0] == 0
    code, _, stderr = call("eval", *args, str(tmp_path))
    assert code == 2 and "holds an earlier run's eval.json: --resume adds this run's rows to it" in stderr
    assert call("eval", *args, str(tmp_path), "--overwrite")[0] == 0


def test_eval_on_a_damaged_agent_is_one_line(tmp_path):
    result = run("train.py", "--env", "gagpo_gym/Maze-v0", "--env-kwargs", TINY_MAZE, *TINY_AGENT,
                 "--total-timesteps", "10", "--save-dir", str(tmp_path), "--quiet")  # fmt: skip
    assert result.returncode == 0, result.stderr
    agent = tmp_path / "final"
    data = (agent / "optimizer.pt").read_bytes()
    (agent / "optimizer.pt").write_bytes(data[: len(data) // 2])  # a copy cut short
    code, stdout, stderr = call("eval", "--agent", str(agent), "--n-tasks", "2")
    assert code == 2 and stdout == ""
    assert stderr.strip().splitlines() == [
        f"error: saved agent at {agent}: optimizer.pt was altered (checksum mismatch)"
    ]
    text = (agent / "agent.json").read_text()
    (agent / "agent.json").write_text(text[: len(text) // 2])
    code, _, stderr = call("eval", "--agent", str(agent), "--n-tasks", "2")
    assert code == 2 and stderr.strip().splitlines() == [
        f"error: saved agent at {agent}: agent.json was altered (checksum mismatch)"
    ]


ALFWORLD_DATA = ROOT.parent / "shared" / "alfworld" / "json_2.1.1" / "valid_seen"


@pytest.mark.skipif(not ALFWORLD_DATA.is_dir(), reason="../shared/alfworld is absent")
def test_alfworld_expert_rows_say_which_expert_and_episodes_name_the_game_file(tmp_path):
    pytest.importorskip("alfworld")
    rows = {}
    for kwargs in ({"split": "valid_seen"}, {"split": "valid_seen", "expert": "handcoded"}):
        out = tmp_path / kwargs.get("expert", "planner")
        code, stdout, stderr = call("eval", "--env", "gagpo_gym/ALFWorld-v0", "--env-kwargs", json.dumps(kwargs),
                                    "--n-tasks", "1", "--expert", "--out", str(out))  # fmt: skip
        assert code == 0, stderr
        (row,) = parse_table(stdout)
        rows[row["agent"]] = row
    assert set(rows) == {"planner expert", "handcoded expert"}
    (episode,) = json.loads((tmp_path / "planner" / "eval.json").read_text())["results"][0]["episodes"]
    game = episode["task_id"]
    assert game.startswith("json_2.1.1/valid_seen/") and game.endswith("/game.tw-pddl")
    assert (ALFWORLD_DATA.parent.parent / game).is_file()  # the game file, relative to the data root


# ----- progress bars --------------------------------------------------------------------------------------------
def test_progress_bar_is_silent_unless_asked_and_shows_total_and_rate():
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        with ProgressBar(10, "quiet", unit="task") as bar:  # default: only on a terminal; this stderr is not one
            bar.advance(10)
        assert bar.n == 10
        with ProgressBar(4, "eval tiny", unit="task", enabled=False) as bar:
            bar.advance(4)
    assert err.getvalue() == ""
    with contextlib.redirect_stderr(err), ProgressBar(4, "eval tiny", unit="task", enabled=True) as bar:
        for _ in range(4):
            time.sleep(0.01)
            bar.advance(1)
    (line,) = err.getvalue().strip().splitlines()  # off a terminal: the final state, once
    assert line.startswith("eval tiny") and "4/4 tasks" in line and "tasks/s" in line and "?" not in line


def test_learn_progress_bar_counts_env_steps_to_a_known_total_on_stderr(capsys):
    agent = GAGPOAgent("gagpo_gym/Maze-v0", env_kwargs=MAZE_KWARGS, num_groups=2, group_size=2, verbose=0,
                       torch_threads=1, tiny_hidden_size=32)  # fmt: skip
    agent.learn(30, progress_bar=True)
    captured = capsys.readouterr()
    assert captured.out == ""  # SB3's bar draws on stdout; this one on stderr
    (line,) = captured.err.strip().splitlines()
    steps = agent.num_timesteps
    assert line.startswith("training") and f"{steps}/{steps} steps" in line
    assert "steps/s" in line and "? steps/s" not in line  # was "? it/s"


def test_eval_progress_bars_per_row_only_when_asked_off_a_terminal():
    args = ["--env", "gagpo_gym/Maze-v0", "--env-kwargs", TINY_MAZE, "--n-tasks", "6", "--expert", "--random"]
    code, _, stderr = call("eval", *args)
    assert code == 0 and stderr == ""  # stderr is not a terminal here: no bars
    code, stdout, stderr = call("eval", *args, "--progress")
    assert code == 0 and "6/6 tasks" not in stdout  # bars go to stderr only
    lines = stderr.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["expert", "random"]
    assert all("6/6 tasks" in line and "?" not in line for line in lines)


def test_warm_start_shows_its_episodes_epochs_and_evaluation_when_asked(tmp_path):
    args = ["--env", "gagpo_gym/Maze-v0", "--env-kwargs", TINY_MAZE, "--out", str(tmp_path), "--episodes", "5",
            "--epochs", "2", "--task-pool", "4", "--heldout-tasks", "2", "--tiny-hidden-size", "32"]  # fmt: skip
    code, _, stderr = call("warm_start", *args)
    assert code == 0 and stderr == ""  # not a terminal: silent
    code, _, stderr = call("warm_start", *args, "--progress")
    assert code == 0, stderr
    lines = stderr.strip().splitlines()
    assert lines[0].startswith("warm start: oracle expert episodes") and "5/5 episodes" in lines[0]
    actions = json.loads((tmp_path / "prior.json").read_text())["actions"]
    assert lines[1].startswith("warm start: epoch 2/2, loss ") and f"{2 * actions}/{2 * actions} actions" in lines[1]
    panels = [line.split(" ━")[0] for line in lines[2:]]
    assert panels == ["evaluation: training tasks", "evaluation: held-out tasks"]
    assert all("?" not in line for line in lines)
