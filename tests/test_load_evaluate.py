"""Loading and evaluating do what they say, visibly (issue 59): the env evaluate() plays is the one named, a saved
agent loads without its training data, counters and checkpoint names after load, SB3's zip checkpoints, eval.py's
--out held by one run, and one clear line for the misuses that used to end in a traceback."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import script
from stable_baselines3.common.callbacks import CheckpointCallback
from test_scripts import TINY_MAZE, call, parse_table

import gagpo_gym
from agents import GAGPOAgent, checkpoint
from agents.callbacks import IterationCheckpoint, default_logger, tensorboard_missing
from agents.evaluation import reference_policy_panel
from gagpo_gym.core import TextEnv

ROOT = Path(__file__).resolve().parents[1]
MAZE = "gagpo_gym/Maze-v0"
MAZE_KWARGS = json.loads(TINY_MAZE)
SMALL: dict[str, Any] = {
    "num_groups": 2, "group_size": 2, "tiny_hidden_size": 32, "history_length": 0, "torch_threads": 1, "verbose": 0,
}  # fmt: skip


def maze_agent(**overrides: Any) -> GAGPOAgent:
    return GAGPOAgent(MAZE, env_kwargs=MAZE_KWARGS, **{**SMALL, **overrides})


# ----- 1. evaluate() plays the env it is given -------------------------------------------------------------
def test_env_kwargs_without_env_go_over_the_agents_own_env() -> None:
    """Before: evaluate(env_kwargs=...) without env ignored them and played the training env (10-step episodes
    here, never 1)."""
    agent = maze_agent(seed=3)
    short = agent.evaluate(n_tasks=3, env_kwargs={"max_episode_steps": 1}, episodes=True)
    assert [e["length"] for e in short["episodes"]] == [1, 1, 1]  # min_path 2: no task ends sooner by itself
    named = agent.evaluate(MAZE, n_tasks=3, env_kwargs={**MAZE_KWARGS, "max_episode_steps": 1}, episodes=True)
    assert named == short  # the same env: the agent's own kwargs with the given ones on top
    assert agent.evaluate(n_tasks=3, episodes=True)["mean_length"] > 1  # the agent's own env is unchanged


# ----- 2. a saved agent loads without its training env's data ----------------------------------------------
ALFWORLD_AGENT = ROOT / "results" / "agents" / "alfworld-gagpo-seed1"
SHARED_ALFWORLD = ROOT.parent / "shared" / "alfworld" / "json_2.1.1"


@pytest.mark.skipif(not (SHARED_ALFWORLD / "valid_seen").is_dir(), reason="../shared/alfworld is absent")
def test_a_saved_alfworld_agent_plays_valid_seen_without_its_train_split(tmp_path: Path, monkeypatch) -> None:
    """Before: GAGPOAgent.load built the training env first, so the agent (trained on the train split) and
    eval.py --agent stopped with 'ALFWorld split folder .../train is missing' on a machine without it."""
    pytest.importorskip("alfworld")
    data = tmp_path / "data" / "json_2.1.1"  # the evaluation splits only, as a user without the train games has
    data.mkdir(parents=True)
    for split in ("valid_seen", "valid_unseen"):
        (data / split).symlink_to(SHARED_ALFWORLD / split)
    monkeypatch.setenv("ALFWORLD_DATA", str(data.parent))
    assert json.loads((ALFWORLD_AGENT / "agent.json").read_text())["env_kwargs"]["split"] == "train"
    with pytest.raises(FileNotFoundError, match="train is missing"):
        gagpo_gym.make("gagpo_gym/ALFWorld-v0", split="train")  # the train split really is absent

    agent = GAGPOAgent.load(ALFWORLD_AGENT, verbose=0, torch_threads=1)
    played = agent.evaluate(n_tasks=2, env_kwargs={"split": "valid_seen"}, episodes=True)
    assert all(e["task_id"].startswith("json_2.1.1/valid_seen/") for e in played["episodes"])

    out = tmp_path / "eval"
    code, stdout, stderr = call("eval", "--env", "gagpo_gym/ALFWorld-v0", "--env-kwargs", '{"split": "valid_seen"}',
                                "--agent", str(ALFWORLD_AGENT), "--n-tasks", "2", "--out", str(out))  # fmt: skip
    assert code == 0, stderr
    assert len(parse_table(stdout)) == 1
    (result,) = json.loads((out / "eval.json").read_text())["results"]
    assert result["episodes"] == played["episodes"]  # eval.py plays the panel's env as evaluate() does


def test_the_training_env_is_built_when_learn_first_needs_it(tmp_path: Path) -> None:
    """A loaded agent makes no env until learn() (SB3's callbacks get it through get_env()); close() lets go of a
    built one and a later learn() builds it again."""
    agent = maze_agent(seed=1)
    agent.save(tmp_path / "agent")
    loaded = GAGPOAgent.load(tmp_path / "agent", verbose=0)
    loaded.close()  # nothing built: nothing to close
    ck = CheckpointCallback(save_freq=100, save_path=str(tmp_path / "ck"))
    loaded.learn(8, callback=ck)
    assert ck.training_env is loaded.get_env() and loaded.get_env().num_envs == 4
    loaded.close()
    loaded.learn(4, reset_num_timesteps=False)
    assert loaded.num_timesteps >= 12


# ----- 8. learn() after load: the count, and checkpoint names that never mix ------------------------------
def test_a_new_count_is_refused_a_folder_of_another_runs_checkpoints(tmp_path: Path) -> None:
    """Before: load(...).learn(n) restarted the count at 0 and wrote it_<n>_steps into the folder of the run it
    came from, between (and over) that run's checkpoints."""
    folder = tmp_path / "checkpoints"
    agent = maze_agent(seed=2)
    agent.learn(20, callback=IterationCheckpoint(10, str(folder), name_prefix="it"))
    agent.save(tmp_path / "final")
    first = sorted(p.name for p in folder.iterdir())
    assert first

    loaded = GAGPOAgent.load(tmp_path / "final", verbose=0)
    assert loaded.num_timesteps == agent.num_timesteps
    with pytest.raises(ValueError, match="holds checkpoints of another run .* reset_num_timesteps=False"):
        loaded.learn(20, callback=IterationCheckpoint(10, str(folder), name_prefix="it"))
    assert sorted(p.name for p in folder.iterdir()) == first  # nothing written, nothing overwritten

    loaded = GAGPOAgent.load(tmp_path / "final", verbose=0)
    loaded.learn(20, callback=IterationCheckpoint(10, str(folder), name_prefix="it"), reset_num_timesteps=False)
    steps = sorted(int(p.name.split("_")[1]) for p in folder.iterdir())
    assert steps[: len(first)] == sorted(int(n.split("_")[1]) for n in first)  # the run goes on after its own
    assert steps[-1] == loaded.num_timesteps > agent.num_timesteps
    # A new count into a folder of its own is a new run, as in SB3.
    GAGPOAgent.load(tmp_path / "final", verbose=0).learn(4, callback=IterationCheckpoint(1, str(tmp_path / "new")))


# ----- 10. SB3's CheckpointCallback: its files hold the steps they name, and eval.py reads them -------------
def test_sb3_checkpoint_zips_hold_the_steps_they_name_and_eval_reads_them(tmp_path: Path) -> None:
    """Before: SB3's CheckpointCallback saved mid-rollout, so rl_model_350_steps.zip held the 334-step state, and
    eval.py --agent refused a .zip (no agent.json inside a file)."""
    agent = maze_agent(seed=4)
    agent.learn(40, callback=CheckpointCallback(save_freq=3, save_path=str(tmp_path), name_prefix="ck"))
    saved = sorted(tmp_path.glob("ck_*_steps.zip"), key=lambda p: int(p.name.split("_")[1]))
    assert len(saved) >= 2
    for path in saved:
        meta, _ = checkpoint.read_saved(path)
        assert meta["num_timesteps"] == int(path.name.split("_")[1])
    code, stdout, stderr = call("eval", "--agent", str(saved[-1]), "--n-tasks", "2")
    assert code == 0, stderr
    (row,) = parse_table(stdout)
    assert row["agent"] == f"gagpo @ {saved[-1].name.split('_')[1]} steps ({saved[-1]})"


# ----- 6. one eval.py run per --out ---------------------------------------------------------------------------
def test_eval_out_holds_one_runs_rows(tmp_path: Path) -> None:
    """Before: a second eval.py run into the same --out (at the same time, or after) exited 0 and printed 'wrote',
    while the files held the other run's rows, or a mix."""
    out = tmp_path / "eval"
    args = ["--env", MAZE, "--env-kwargs", TINY_MAZE, "--n-tasks", "3", "--random", "--out", str(out)]
    assert call("eval", *args)[0] == 0
    first = (out / "eval.json").read_text()

    code, stdout, stderr = call("eval", *args, "--random-seed", "7")
    assert code == 2 and stdout == "" and "holds an earlier run's eval.json: --resume adds" in stderr
    assert (out / "eval.json").read_text() == first

    eval_script = script("eval")
    with eval_script.claim_out(out, eval_script.build_parser().parse_args(["--resume"])):  # a run that is still going
        code, _, stderr = call("eval", *args, "--resume")
    assert code == 2 and "another eval.py run is writing to --out" in stderr
    assert (out / "eval.json").read_text() == first

    code, _, stderr = call("eval", *args, "--random-seed", "7", "--overwrite")
    assert code == 0, stderr
    payload = json.loads((out / "eval.json").read_text())
    assert payload["settings"]["random_seed"] == 7 and len(payload["results"]) == 1
    assert call("eval", *args, "--resume", "--overwrite")[0] == 2


# ----- 12. visible defaults and budgets ------------------------------------------------------------------------
def test_a_log_dir_without_tensorboard_says_so_once(tmp_path: Path, monkeypatch) -> None:
    """Before: without the tensorboard extra the TensorBoard files were left out silently."""
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as where the extra is not installed
    tensorboard_missing.cache_clear()
    try:
        with pytest.warns(UserWarning, match=r"TensorBoard logging is off.*gagpo-gym\[tensorboard\]"):
            default_logger(0, str(tmp_path / "a"))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            logger = default_logger(0, str(tmp_path / "b"))  # once per process
    finally:
        tensorboard_missing.cache_clear()
    logger.record("x", 1.0)
    logger.dump(0)
    assert (tmp_path / "b" / "progress.csv").is_file() and (tmp_path / "b" / "progress.json").is_file()
    assert not list((tmp_path / "b").glob("events.out.tfevents*"))


@pytest.mark.parametrize("steps", [-5, 2.5, "100", True, float("nan")])
def test_learn_refuses_a_budget_that_is_not_a_count_of_steps(steps: Any) -> None:
    """Before: learn(-5) ran (no iteration, callbacks called; with reset_num_timesteps=False, fewer steps)."""
    agent = maze_agent(seed=0)
    with pytest.raises(ValueError, match="total_timesteps must be a whole number of env steps >= 0"):
        agent.learn(steps)
    assert agent.num_timesteps == 0


# ----- 13. one clear line, or working behaviour ----------------------------------------------------------------
def test_loading_across_ppo_and_the_others_is_one_clear_error(tmp_path: Path) -> None:
    """Before: a raw FileNotFoundError for value_head.safetensors (to PPO) or an optimizer group mismatch (from it)."""
    maze_agent(seed=0).save(tmp_path / "gagpo")
    maze_agent(seed=0, estimator="ppo").save(tmp_path / "ppo")
    with pytest.raises(ValueError, match="trained with estimator 'gagpo'; it cannot be loaded as 'ppo'"):
        GAGPOAgent.load(tmp_path / "gagpo", estimator="ppo", verbose=0)
    with pytest.raises(ValueError, match="trained with estimator 'ppo'; it cannot be loaded as 'grpo'"):
        GAGPOAgent.load(tmp_path / "ppo", estimator="grpo", verbose=0)
    assert GAGPOAgent.load(tmp_path / "gagpo", estimator="grpo", verbose=0).config.estimator == "grpo"


def test_predict_takes_an_empty_batch_and_says_what_an_info_must_hold() -> None:
    """Before: predict([], []) raised IndexError, and predict(obs, {}) failed in choose mode although predict's
    own message suggested {}."""
    agent = maze_agent(seed=0)
    assert agent.predict([], []) == ([], [])
    env = gagpo_gym.make(MAZE, **MAZE_KWARGS)
    obs, info = env.reset(seed=0)
    assert agent.predict(obs, info)[0] in info["admissible_actions"]
    with pytest.raises(ValueError, match=r"chooses among info\['admissible_actions'\].*lists none"):
        agent.predict(obs, {})
    generating = maze_agent(seed=0, action_mode="generate", max_new_tokens=8)
    action, _ = generating.predict(obs, {})  # generate mode needs no info: {} plays
    assert isinstance(action, str)


class NoChoice(TextEnv):
    """A room whose admissible list is empty: free-text commands only."""

    def _new_task(self, seed: int | None, options: dict[str, Any]) -> str:
        self.task, self.task_id = "Say hello.", "no-choice-1"
        return "A quiet room."

    def _execute(self, command: str) -> tuple[str, float, bool]:
        return "Silence.", 0.0, False

    def admissible_actions(self) -> list[str]:
        return []

    def state_string(self) -> str:
        return "room"


NO_CHOICE = gagpo_gym.register_text_env("TestNoChoice-v0", NoChoice, max_episode_steps=3)


def test_the_random_row_on_an_env_without_admissible_actions_is_one_line() -> None:
    """Before: numpy's 'high <= 0' from the random policy's draw."""
    with pytest.raises(ValueError, match="no-choice-1' .* offers no admissible actions at step 0; the random policy"):
        reference_policy_panel("random", NO_CHOICE, {}, 2)
    code, _, stderr = call("eval", "--env", NO_CHOICE, "--random", "--n-tasks", "2")
    assert code == 1 and "high <= 0" not in stderr
    assert "error: row 'random' failed after" in stderr and "offers no admissible actions" in stderr


def test_the_helper_that_reads_a_saved_agent_takes_folders_and_zips(tmp_path: Path) -> None:
    """checkpoint.read_saved: what a script checks before loading (train.py --resume can use it too)."""
    agent = maze_agent(seed=0)
    agent.save(tmp_path / "agent")
    agent.save(tmp_path / "agent.zip")
    folder_meta, folder_print = checkpoint.read_saved(tmp_path / "agent")
    zip_meta, zip_print = checkpoint.read_saved(tmp_path / "agent.zip")
    assert folder_meta == zip_meta and folder_meta["env_id"] == MAZE
    assert len(folder_print) == len(zip_print) == 64
    with pytest.raises(FileNotFoundError, match="no saved agent"):
        checkpoint.read_saved(tmp_path / "missing")
