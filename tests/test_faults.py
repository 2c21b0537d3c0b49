"""Faults and bad input that once passed silently: a reused save dir, mixed state-key types, a save after an
interrupted update, logs under a launch, groups of one, envs without a step limit, orphaned env workers, concurrent
saves, unreadable errors, checkpoint format versions; and that sampling follows softmax(logits / temperature)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
from agent_helpers import call, save_tiny_checkpoint, script

from gagpo_gym.core import TextEnv

ROOT = Path(__file__).resolve().parents[1]
TINY_MAZE = json.dumps(
    {"width": 3, "height": 3, "rooms": 0, "loops": 1, "min_path": 2, "max_path": 3, "max_episode_steps": 10}
)
TINY_AGENT = ["--num-groups", "2", "--group-size", "2", "--torch-threads", "1", "--tiny-hidden-size", "32", "--quiet"]


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


# ----- 1. one save dir, one run ---------------------------------------------------------------------------------
def test_a_save_dir_belongs_to_one_run(tmp_path: Path) -> None:
    """Before: a second run into a used --save-dir interleaved its checkpoints with the first's and replaced its
    run.json and final; Ctrl-C then named whichever checkpoint had the most steps."""
    run = tmp_path / "run"
    new = ["--env", "gagpo_gym/Maze-v0", "--env-kwargs", TINY_MAZE, *TINY_AGENT, "--save-dir", str(run)]
    code, _, stderr = call("train", *new, "--total-timesteps", "8", "--checkpoint-freq", "4")
    assert code == 0, stderr
    first = json.loads((run / "run.json").read_text())["run_id"]
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())

    code, _, stderr = call("train", *new, "--total-timesteps", "8")  # another run into the same folder
    line = one_error_line(stderr)
    assert code == 2 and f"holds another run (run id {first}" in line and "--overwrite-save-dir" in line
    assert json.loads((run / "run.json").read_text())["run_id"] == first  # untouched
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == checkpoints

    resume = ["--resume", str(run / "final"), *TINY_AGENT[-1:], "--save-dir", str(run)]  # the same run goes on
    code, _, stderr = call("train", *resume, "--total-timesteps", "4")
    assert code == 0, stderr
    assert json.loads((run / "run.json").read_text())["run_id"] == first

    code, _, stderr = call("train", *resume, "--total-timesteps", "4", "--overwrite-save-dir")
    assert code == 2 and "would remove --resume" in one_error_line(stderr)
    code, _, stderr = call("train", *new, "--total-timesteps", "4", "--overwrite-save-dir")
    assert code == 0, stderr
    assert json.loads((run / "run.json").read_text())["run_id"] != first
    assert not (run / "checkpoints").exists()  # the earlier run's checkpoints went with it


def test_a_live_run_holds_its_save_dir(tmp_path: Path) -> None:
    train = script("train")
    run_id, lock = train.claim_save_dir(tmp_path, None, False)
    try:
        code, _, stderr = call("train", "--env", "gagpo_gym/Maze-v0", *TINY_AGENT, "--save-dir", str(tmp_path))
        assert code == 2 and "in use by another train.py that is still running" in one_error_line(stderr)
    finally:
        import os

        os.close(lock)


def test_ctrl_c_names_this_runs_checkpoint_not_the_highest_in_the_folder(tmp_path: Path) -> None:
    """A run resumed from an early checkpoint of its folder: the later ones are an abandoned branch."""
    from types import SimpleNamespace

    train = script("train")
    (tmp_path / "agent_900_steps").mkdir()  # higher, but not this run's
    ours = tmp_path / "agent_120_steps"
    state = {"agent": SimpleNamespace(num_timesteps=130), "checkpoint": SimpleNamespace(last_path=ours),
             "resumed": "x", "recipe": None}  # fmt: skip
    assert train.resume_hint(state) == f"at 130 env steps; last checkpoint: {ours} (resume with --resume {ours})"


# ----- 2. mixed state-key types ---------------------------------------------------------------------------------
def buffer_row(state_key: Any, next_state_key: Any = None, episode: int = 0, done: bool = False) -> Any:
    import numpy as np

    from agents.buffer import Row

    next_key = state_key if next_state_key is None else next_state_key
    return Row(group=0, episode=episode, prompt_ids=[1], rollout_logp=np.zeros(1), reward=0.0, state_key=state_key,
               next_state_key=next_key, terminated=done, done=done, won=False)  # fmt: skip


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ([7, "7"], "state_key is int on some steps and str on others"),
        (["a", 3], "state_key is str on some steps and int on others"),
        ([(1, 2)], "state_key must be an int64 or a str, got tuple"),
        ([["x"]], "state_key must be an int64 or a str, got list"),
        ([2**70], "does not fit in int64"),
        ([True], "state_key must be an int64 or a str, got bool"),
    ],
)
def test_the_buffer_refuses_keys_that_would_split_or_break_states(keys: list, message: str) -> None:
    """Before: ints and strs in one rollout became an array of strs ('<U21'): the state 7 and "7" counted as two."""
    from agents.buffer import GroupRolloutBuffer
    from agents.config import GAGPOConfig

    buffer = GroupRolloutBuffer(GAGPOConfig(group_size=2))
    buffer.start_group(0, [0, 1])
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        for i, key in enumerate(keys):
            buffer.add(buffer_row(key, episode=i % 2))
    buffer.reset()  # a new rollout may use the other type, consistently
    buffer.start_group(0, [0])
    buffer.add(buffer_row("s", "t"))
    with pytest.raises(ValueError, match="int on others"):
        buffer.add(buffer_row("s", 5))  # the next state's key counts too


# ----- 3. a save holds an iteration boundary, or refuses ---------------------------------------------------------
SMALL: dict[str, Any] = {
    "num_groups": 2, "group_size": 2, "minibatch_size": 2, "torch_threads": 1, "verbose": 0,
    "tiny_hidden_size": 32, "history_length": 1, "learning_rate": 3e-3, "env_kwargs": {"max_episode_steps": 4},
}  # fmt: skip
FROZEN = "gagpo_gym/FrozenLake-v0"


def test_a_save_after_ctrl_c_inside_the_update_is_refused(tmp_path: Path) -> None:
    """Before: it wrote half-updated weights with the last boundary's counters and RNG."""
    from agents import GAGPOAgent

    agent = GAGPOAgent(FROZEN, seed=1, **SMALL)
    steps: list[int] = []

    def ctrl_c_after_the_first_step(*_: Any) -> None:
        steps.append(1)
        if len(steps) == 1:
            raise KeyboardInterrupt

    hook = agent.optimizer.register_step_post_hook(ctrl_c_after_the_first_step)
    with pytest.raises(KeyboardInterrupt):
        agent.learn(8)
    hook.remove()
    with pytest.raises(RuntimeError, match="stopped inside iteration 1's update.*call learn\\(\\) again"):
        agent.save(tmp_path / "agent")
    assert not (tmp_path / "agent").exists()
    agent.learn(4, reset_num_timesteps=False)  # the next boundary
    agent.save(tmp_path / "agent")
    assert GAGPOAgent.load(tmp_path / "agent", verbose=0).iteration == agent.iteration == 1


def test_ctrl_c_mid_rollout_does_not_count_the_abandoned_steps() -> None:
    """Before: num_timesteps kept the steps of the rollout that was dropped (and train.py's Ctrl-C line said so)."""
    from stable_baselines3.common.callbacks import BaseCallback

    from agents import GAGPOAgent

    class CtrlC(BaseCallback):
        def _on_step(self) -> bool:
            if self.n_calls == 2:  # the rollout, part-way
                self.counted = self.model.num_timesteps
                raise KeyboardInterrupt
            return True

    agent = GAGPOAgent(FROZEN, seed=1, **SMALL)
    agent.learn(4)
    boundary, ctrl_c = agent.num_timesteps, CtrlC()
    with pytest.raises(KeyboardInterrupt):
        agent.learn(100, callback=ctrl_c, reset_num_timesteps=False)
    assert ctrl_c.counted > boundary  # steps were taken, then dropped
    assert agent.num_timesteps == boundary == agent.boundary["num_timesteps"]


# ----- 4. one writer per log folder under a launch; the update's metrics over every rank ------------------------
LOGGING_WORKER = """
import json, sys
from pathlib import Path
from agents import GAGPOAgent

out = Path(sys.argv[1])
agent = GAGPOAgent("gagpo_gym/FrozenLake-v0", num_groups=4, group_size=2, tiny_hidden_size=32, history_length=1,
                   minibatch_size=4, learning_rate=1e-2, env_kwargs={"max_episode_steps": 6}, torch_threads=1,
                   verbose=0, seed=3, log_dir=str(out / "logs"))
local = []
step = agent.update.minibatch_step
def recording(minibatch, logs=None):
    local.append(logs)
    return step(minibatch, logs)
agent.update.minibatch_step = recording
agent.learn(1)
(out / f"local_{agent.dist.rank}.json").write_text(json.dumps(local[-1]))
"""


def test_under_a_launch_rank_0_alone_writes_the_logs_and_they_hold_every_ranks_mean(tmp_path: Path) -> None:
    """Before: every rank wrote --log-dir (two tfevents files, CSV rows of mixed widths, broken JSON lines) and
    train/policy_loss, kl, clip_fraction were rank 0's own values."""
    import csv
    import os
    import subprocess
    import sys

    import numpy as np

    (tmp_path / "worker.py").write_text(LOGGING_WORKER)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(tmp_path / "worker.py"), str(tmp_path)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    logs = tmp_path / "logs"
    assert len(list(logs.glob("events.out.tfevents.*"))) <= 1
    with (logs / "progress.csv").open() as handle:
        (row,) = list(csv.DictReader(handle))  # one iteration, one writer
    assert [json.loads(line) for line in (logs / "progress.json").read_text().splitlines()]
    ranks = [json.loads((tmp_path / f"local_{r}.json").read_text()) for r in range(2)]
    for key in ("policy_loss", "clip_fraction", "approx_kl"):
        pooled = np.concatenate([r[key] for r in ranks])
        assert float(row[f"train/{key}"]) == pytest.approx(pooled.mean(), rel=1e-6, abs=1e-9), key
    assert not np.isclose(np.mean(ranks[0]["policy_loss"]), np.mean(ranks[1]["policy_loss"]))  # the ranks differ


# ----- 5. a group of one ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_group_relative_estimators_refuse_a_group_of_one(estimator: str) -> None:
    """Before: accepted; every advantage was 0, the logs looked normal and the policy never moved."""
    from agents.config import GAGPOConfig

    with pytest.raises(ValueError, match=f"estimator '{estimator}' needs group_size >= 2: .* advantage 0"):
        GAGPOConfig(estimator=estimator, group_size=1)
    GAGPOConfig(estimator="ppo", group_size=1)  # a critic's baseline needs no group
    GAGPOConfig(estimator=estimator, group_size=2)


# ----- 6. an env without a step limit ----------------------------------------------------------------------------
def test_an_env_without_a_step_limit_is_refused_with_the_way_out() -> None:
    """Before: learn() played on forever (a rollout waits for every episode) while the rows piled up in memory."""
    import gymnasium as gym

    import gagpo_gym
    from agents import GAGPOAgent
    from gagpo_gym.envs.toy_text import TextFrozenLake

    gagpo_gym.register_text_env("UnlimitedLake-v0", TextFrozenLake)
    with pytest.raises(ValueError, match="has no step limit.*max_episode_steps"):
        GAGPOAgent("gagpo_gym/UnlimitedLake-v0", num_groups=1, group_size=2, verbose=0)
    with pytest.raises(ValueError, match="has no step limit"):
        GAGPOAgent(gym.make("gagpo_gym/UnlimitedLake-v0"), num_groups=1, group_size=2, verbose=0)
    small = {k: v for k, v in SMALL.items() if k != "env_kwargs"}
    made = gym.make("gagpo_gym/UnlimitedLake-v0", max_episode_steps=4)
    assert GAGPOAgent(made, **small).env_spec.step_limit() == 4
    agent = GAGPOAgent("gagpo_gym/UnlimitedLake-v0", env_kwargs={"max_episode_steps": 3}, **small)
    assert agent.env_spec.step_limit() == 3


def unbounded_lake():
    from gagpo_gym.envs.toy_text import TextFrozenLake
    from wrappers import wrap_text_env

    return wrap_text_env(TextFrozenLake())


def bounded_lake():  # a TimeLimit put on by hand: no spec records it
    from gagpo_gym.envs.toy_text import TextFrozenLake
    from wrappers import wrap_text_env

    return wrap_text_env(gym.wrappers.TimeLimit(TextFrozenLake(), 5))


def test_a_vector_env_from_the_users_own_factory_needs_a_step_limit_too(tmp_path: Path) -> None:
    """Before: a GroupedVectorEnv built from the user's factory skipped the check and hung learn() the same way."""
    from agents import GAGPOAgent
    from wrappers import GroupedVectorEnv

    small = {k: v for k, v in SMALL.items() if k not in ("env_kwargs", "num_groups", "group_size", "tiny_hidden_size")}
    small["model"] = str(
        save_tiny_checkpoint(tmp_path / "model", FROZEN, torch_threads=1, verbose=0)
    )  # no spec: no env text to train a tokenizer on
    unbounded = GroupedVectorEnv(unbounded_lake, 1, 2)
    assert unbounded.step_limit is None
    with pytest.raises(ValueError, match="from your factory has no step limit.*TimeLimit"):
        GAGPOAgent(unbounded, num_groups=1, group_size=2, **small)
    for mode in ("sync", "async"):
        bounded = GroupedVectorEnv(bounded_lake, 1, 2, mode=mode)
        assert bounded.step_limit == 5
        agent = GAGPOAgent(bounded, num_groups=1, group_size=2, **small)
        agent.learn(8)
        assert agent.num_timesteps >= 8
        bounded.close()


# ----- 7. env workers end with their parent ----------------------------------------------------------------------
ASYNC_PARENT = """
import functools, sys, time
import gagpo_gym
from wrappers import GroupedVectorEnv

env = GroupedVectorEnv(functools.partial(gagpo_gym.make, "gagpo_gym/FrozenLake-v0"), 2, 2, mode="async",
                       n_workers=3)
env.reset(seed=0)
print(" ".join(str(p.pid) for p in env.workers.procs), flush=True)
time.sleep(600)
"""


def test_async_env_workers_exit_when_their_parent_is_killed(tmp_path: Path) -> None:
    """Before: kill -9 (an OOM kill, a preemption) of the parent left its env workers alive for ever: each held
    the parent's end of its own pipe, and the earlier workers', so no recv() ever saw the pipe close."""
    import os
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "parent.py").write_text(ASYNC_PARENT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen([sys.executable, str(tmp_path / "parent.py")], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT, env=env)  # fmt: skip
    try:
        workers = [int(pid) for pid in parent.stdout.readline().split()]
        assert len(workers) == 3 and all(alive(pid) for pid in workers)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in workers if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"workers {left} outlived their parent"


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (an orphan is reaped by init once it exits)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# ----- 8. concurrent saves into one folder ---------------------------------------------------------------------
def test_concurrent_saves_into_one_folder_take_turns(tmp_path: Path) -> None:
    """Before: about 70% failed with SafetensorError / FileNotFoundError: each save removed the other's
    in-progress .saving-* folder as left over by a killed save."""
    import threading

    from agents import GAGPOAgent

    agent = GAGPOAgent(FROZEN, seed=1, **SMALL)
    errors: list[BaseException] = []

    def save(name: str) -> None:
        try:
            for _ in range(3):
                agent.save(tmp_path / name)
        except BaseException as err:  # noqa: BLE001  (any failure fails the test)
            errors.append(err)

    threads = [threading.Thread(target=save, args=(name,)) for name in ("a", "b", "a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for name in ("a", "b"):
        GAGPOAgent.verify_checkpoint(tmp_path / name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]  # nothing left over


# ----- 9. first contact ----------------------------------------------------------------------------------------
HUB_ID = "Qwen/Qwen2.5-1.5B-Instruct"


def test_a_hub_model_that_cannot_be_downloaded_is_named_at_once(tmp_path: Path, monkeypatch) -> None:
    """Before: with no network, a dry run of a Qwen recipe (or an agent on a hub id) let huggingface_hub retry for
    about a minute before failing; now a hub id missing from the cache whose host does not resolve is one line."""
    import socket
    import time

    from agents import GAGPOAgent
    from agents.models import PROXY_VARIABLES, check_hub_reachable

    def no_name_resolution(*_: Any, **__: Any) -> None:
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_name_resolution)
    for variable in (*PROXY_VARIABLES, "HF_HUB_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)
    start = time.monotonic()
    code, _, err = call("train", "--env", FROZEN, "--model", HUB_ID, "--dry-run")
    assert code and "cannot be reached" in err and f"hf download {HUB_ID}" in err and len(err.splitlines()) == 1
    with pytest.raises(OSError, match="not in the local Hugging Face cache"):
        GAGPOAgent(FROZEN, model=HUB_ID, **SMALL)
    assert time.monotonic() - start < 30  # no retries
    check_hub_reachable(str(save_tiny_checkpoint(tmp_path / "model", FROZEN, torch_threads=1, verbose=0)))  # a folder
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    check_hub_reachable(HUB_ID)  # a proxy resolves names itself: left to huggingface_hub


# ----- 10. errors that say what went wrong ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "failure",
    [
        RuntimeError(
            "[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file data/0: "
            "file write failed"
        ),  # fmt: skip
        OSError(28, "No space left on device"),
    ],
)
def test_a_full_disk_is_named_and_the_previous_save_stays(tmp_path: Path, monkeypatch, failure: Exception) -> None:
    """Before: ``[enforce fail at inline_container.cc:672]``, and nothing said the previous checkpoint was whole."""
    import torch

    from agents import GAGPOAgent

    agent = GAGPOAgent(FROZEN, seed=1, **SMALL)
    agent.save(tmp_path / "agent")

    def full(*_: Any, **__: Any) -> None:
        raise failure

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(OSError, match=r"cannot save to .*agent: (no space left on device|a file write failed \(is "
                                      r"the disk full\?\)); what was there is untouched"):  # fmt: skip
        agent.save(tmp_path / "agent")
    GAGPOAgent.verify_checkpoint(tmp_path / "agent")
    assert [p.name for p in tmp_path.iterdir()] == ["agent"]


def test_bad_input_to_the_agent_is_named_in_one_line() -> None:
    """Before: TypeError: argument of type 'NoneType' is not iterable; 'int' object is not iterable; numpy's
    'expected non-negative integer'; an env without an expert: 'expert kind must be one of (), got None'."""
    from agents import GAGPOAgent
    from agents.config import GAGPOConfig
    from wrappers import wrap_text_env

    agent = GAGPOAgent(FROZEN, seed=1, **SMALL)
    obs, info = gym.make(FROZEN).reset(seed=0)
    with pytest.raises(TypeError, match="predict takes the env's info dict beside the observation.*got NoneType"):
        agent.predict(obs, None)
    with pytest.raises(TypeError, match="predict takes an observation str .*got int"):
        agent.predict(5, info)
    with pytest.raises(ValueError, match="seed must be >= 0"):
        GAGPOConfig(seed=-1)
    env = wrap_text_env(Answers(3, {}), key="observation")
    with pytest.raises(ValueError, match="env Answers returned a int observation from reset\\(\\): .* are str"):
        env.reset(seed=0)
    env = wrap_text_env(Answers("a room", None), key="observation")
    with pytest.raises(ValueError, match="env Answers returned info None from reset\\(\\): .* return a dict"):
        env.reset(seed=0)
    with pytest.raises(ValueError, match="NoExpert has no expert"):
        NoExpert().expert_action()


class Answers(gym.Env):
    """An env that answers every call with the same observation and info."""

    def __init__(self, obs: Any, info: Any) -> None:
        self.obs, self.info = obs, info

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, Any]:
        return self.obs, self.info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, Any]:
        return self.obs, 0.0, False, False, self.info


class NoExpert(TextEnv):
    """An env whose expert_action checks its kind, with no EXPERTS declared."""

    def expert_action(self, kind: str | None = None) -> str:
        return self._expert_kind(kind)


def test_an_unwritable_save_dir_and_an_unknown_user_env_are_one_line(tmp_path: Path) -> None:
    """Before: a PermissionError traceback from train.py; eval.py listed the 32 built-in ids with no word of
    Gymnasium's module:EnvId form for an env of the user's own."""
    import os

    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where a folder should go: unwritable for root too
    code, _, stderr = call("train", "--env", "gagpo_gym/Maze-v0", *TINY_AGENT, "--save-dir", str(blocked / "run"))
    assert code == 2 and f"cannot write to --save-dir {blocked / 'run'}" in one_error_line(stderr)
    code, _, stderr = call("eval", "--env", "gagpo_gym/MyLamp-v0", "--expert")
    line = one_error_line(stderr)
    assert code == 2 and "module:EnvId form (e.g. my_envs:MyLamp-v0" in line
    assert os.listdir(tmp_path) == ["file"]


# ----- 11. the checkpoint format's version ----------------------------------------------------------------------
def rewrite_agent_json(folder: Path, change: Any) -> None:
    from agents.checkpoint import write_manifest

    meta = json.loads((folder / "agent.json").read_text())
    change(meta)
    (folder / "agent.json").write_text(json.dumps(meta))
    write_manifest(folder)


def test_a_newer_format_is_refused_and_an_older_one_migrated_explicitly(tmp_path: Path) -> None:
    """Before: a newer file failed as 'unknown hyperparameters', an older one with a bare KeyError or silently took
    today's defaults for the fields it lacked."""
    import shutil

    from agents import GAGPOAgent
    from agents.checkpoint import FORMAT, MIGRATIONS

    agent = GAGPOAgent(FROZEN, seed=1, **SMALL)
    agent.save(tmp_path / "now")
    assert json.loads((tmp_path / "now" / "agent.json").read_text())["format"] == FORMAT

    shutil.copytree(tmp_path / "now", tmp_path / "newer")
    rewrite_agent_json(tmp_path / "newer", lambda m: m.update(format=FORMAT + 1, config={**m["config"], "new": 1}))
    with pytest.raises(ValueError, match=f"saved by a newer gagpo-gym \\(format {FORMAT + 1} > {FORMAT}\\): upgrade"):
        GAGPOAgent.load(tmp_path / "newer", verbose=0)
    code, _, stderr = call("train", "--resume", str(tmp_path / "newer"), "--total-timesteps", "4")
    assert code == 2 and "saved by a newer gagpo-gym" in one_error_line(stderr)

    def to_format_1(meta: dict) -> None:  # as the first saves wrote them: no format, fewer hyperparameters
        del meta["format"]
        for key in MIGRATIONS[1]:
            meta["config"].pop(key)

    def to_format_2(meta: dict) -> None:  # saved before the overlapped update existed
        meta["format"] = 2
        for key in MIGRATIONS[2]:
            meta["config"].pop(key)

    shutil.copytree(tmp_path / "now", tmp_path / "two")
    rewrite_agent_json(tmp_path / "two", to_format_2)
    two = GAGPOAgent.load(tmp_path / "two", verbose=0)
    assert {k: getattr(two.config, k) for k in MIGRATIONS[2]} == MIGRATIONS[2] == {"overlap": False, "max_staleness": 1}

    shutil.copytree(tmp_path / "now", tmp_path / "older")
    rewrite_agent_json(tmp_path / "older", to_format_1)
    old = GAGPOAgent.load(tmp_path / "older", verbose=0)
    assert {k: getattr(old.config, k) for k in MIGRATIONS[1]} == MIGRATIONS[1]

    rewrite_agent_json(tmp_path / "older", lambda m: m["config"].pop("gamma"))  # a field with no migration
    with pytest.raises(ValueError, match=r"\(format 1\) lacks the hyperparameters \['gamma'\] .*give each"):
        GAGPOAgent.load(tmp_path / "older", verbose=0)
    assert GAGPOAgent.load(tmp_path / "older", verbose=0, gamma=0.9).config.gamma == 0.9
    rewrite_agent_json(tmp_path / "older", lambda m: m.pop("iteration"))
    with pytest.raises(ValueError, match=r"agent.json \(format 1\) lacks \['iteration'\]: it is damaged"):
        GAGPOAgent.load(tmp_path / "older", verbose=0)


# ----- 12. small ones ----------------------------------------------------------------------------------------------
def test_a_huge_admissible_list_in_choose_mode_says_what_a_step_costs() -> None:
    """Before: 10,000 candidates scored per action (10.6 s each), told only by a counter in the logs."""
    import warnings

    from agents.policy import MANY_CANDIDATES, warn_many_candidates

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_many_candidates([3, MANY_CANDIDATES], [50, 9000], [40, 40])  # at the limit: quiet
    with pytest.warns(UserWarning, match=f"scores all {MANY_CANDIDATES + 1} admissible actions of a step: 12000 "
                                         "tokens in the forward for one action .*action_mode='generate'"):  # fmt: skip
        warn_many_candidates([3, MANY_CANDIDATES + 1], [50, 12000], [40, 40])


def test_the_fetched_model_folder_gets_mkdirs_mode(tmp_path: Path) -> None:
    """Before: mkdtemp's 0700 stayed on the model folder once renamed into place."""
    import os

    umask = os.umask(0o022)
    try:
        folder = script("fetch_smollm2").folder_of_own(tmp_path, "model.partial-")
    finally:
        os.umask(umask)
    assert folder.stat().st_mode & 0o777 == 0o755


def test_eval_names_where_the_env_kwargs_came_from(tmp_path: Path) -> None:
    """Before: 'warning: --env-kwargs {} differ ...' when no --env-kwargs was given."""
    from types import SimpleNamespace

    eval_script = script("eval")
    metas = {"a": {"env_id": "gagpo_gym/Maze-v0", "env_kwargs": {}},
             "b": {"env_id": "gagpo_gym/Maze-v0", "env_kwargs": {"width": 5}}}  # fmt: skip
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        eval_script.choose_env(SimpleNamespace(env="gagpo_gym/Maze-v0", env_kwargs=None), metas)
    assert err.getvalue() == (
        "warning: the first agent's env kwargs {} differ from b's training env kwargs {\"width\": 5}\n"
    )
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        eval_script.choose_env(SimpleNamespace(env="gagpo_gym/Maze-v0", env_kwargs='{"width": 5}'), metas)
    assert err.getvalue() == 'warning: --env-kwargs {"width": 5} differ from a\'s training env kwargs {}\n'


# ----- 13. sampling follows softmax(logits / temperature) ---------------------------------------------------------
def chi_square_limit(df: int, z: float = 3.719) -> float:
    """The chi-square statistic that df degrees of freedom exceed with probability 1e-4 (z: that normal quantile;
    Wilson-Hilferty's approximation)."""
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


def chi_square(counts: Any, probs: Any) -> tuple[float, int]:
    """Pearson's statistic of ``counts`` against ``probs``, the cells expecting fewer than 5 pooled into one."""
    import numpy as np

    expected = probs * counts.sum()
    big = expected >= 5
    observed = np.append(counts[big], counts[~big].sum())
    expected = np.append(expected[big], expected[~big].sum())
    keep = expected > 0
    return float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum()), int(keep.sum()) - 1


def sharpened_agent(**mode: Any) -> Any:
    """A tiny agent whose output layer is scaled up: its distributions are far from uniform, so a temperature
    changes them a lot (a sampler that ignored it would be told apart)."""
    import torch

    from agents import GAGPOAgent

    agent = GAGPOAgent(FROZEN, seed=4, **SMALL, **mode)
    with torch.no_grad():
        agent.policy.model.get_output_embeddings().weight.mul_(6.0)
    return agent


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_choose_mode_samples_softmax_of_scores_over_temperature(temperature: float) -> None:
    """Before: a sampler that ignored its temperature passed the whole suite."""
    import numpy as np
    import torch

    agent = sharpened_agent(action_mode="choose", choose_score="sum")
    policy, model = agent.policy, agent.policy.model
    prompt = policy.tokenizer.encode("You are on the frozen lake.")
    actions = ["ice", "go", "east", "a"]  # with this model and prompt: about 0.33, 0.30, 0.27, 0.08 at temperature 1
    scores = []
    with torch.no_grad():  # each candidate's sequence log-prob from a plain forward of prompt + candidate
        for action in actions:
            ids = prompt + policy.action_tokens(action)
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
            scores.append(sum(float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(ids[len(prompt) :])))
    reference = torch.log_softmax(torch.tensor(scores, dtype=torch.float64) / temperature, -1).numpy()
    n = 3000
    with policy.sampling_at(temperature):
        out = policy.act([prompt] * n, [actions] * n, seeds=list(range(n)))
    assert np.allclose([lp[0] for lp in out.logp], reference[out.chosen], atol=1e-4)  # the log-probs it reports
    counts = np.bincount(out.chosen, minlength=len(actions))
    stat, df = chi_square(counts, np.exp(reference))
    assert stat < chi_square_limit(df), (counts, np.exp(reference) * n)
    untempered = torch.softmax(torch.tensor(scores, dtype=torch.float64), -1).numpy()
    assert chi_square(counts, untempered)[0] > chi_square_limit(df)  # the test tells the two apart


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_generate_mode_samples_softmax_of_logits_over_temperature(temperature: float) -> None:
    import numpy as np
    import torch

    agent = sharpened_agent(action_mode="generate", max_new_tokens=1)
    policy, model = agent.policy, agent.policy.model
    prompt = policy.tokenizer.encode("You are on the frozen lake.")
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1].double()
    reference = torch.log_softmax(logits / temperature, -1).numpy()
    n = 3000
    with policy.sampling_at(temperature):
        out = policy.act([prompt] * n, [[]] * n, seeds=list(range(n)))
    first = np.array([r[0] for r in out.response_ids])
    assert np.allclose([lp[0] for lp in out.logp], reference[first], atol=1e-4)
    counts = np.bincount(first, minlength=reference.size)
    stat, df = chi_square(counts, np.exp(reference))
    assert stat < chi_square_limit(df), stat
    untempered = torch.softmax(logits, -1).numpy()
    assert chi_square(counts, untempered)[0] > chi_square_limit(chi_square(counts, untempered)[1])
    # Greedy needs no random stream: without seeds it plays the argmax (it once indexed the missing seeds).
    greedy = policy.act([prompt] * 2, [[]] * 2, deterministic=True)
    assert [r[0] for r in greedy.response_ids] == [int(logits.argmax())] * 2
