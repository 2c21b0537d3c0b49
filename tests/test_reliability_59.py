"""What a user could not see (issue #59): a missing ALFWorld split, a prompt that lost its task, a SIGTERM, bf16 on
a CPU, an env that raises, a resume onto another env, duplicated admissible actions, a missing extra, a recipe's
``extends`` beside its file, and SB3's ``.zip`` checkpoints given to ``--resume``. Each test failed before its fix."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from agent_helpers import call

import gagpo_gym
from gagpo_gym.core import TextEnv

ROOT = Path(__file__).resolve().parents[1]
TINY_MAZE = {"width": 3, "height": 3, "rooms": 0, "loops": 1, "min_path": 2, "max_path": 3, "max_episode_steps": 10}
TINY_AGENT = ["--num-groups", "2", "--group-size", "2", "--torch-threads", "1", "--tiny-hidden-size", "32"]


def train_process(*args: str, pythonpath: Path | None = None) -> subprocess.Popen:
    """``python scripts/train.py ARGS`` as a process of its own session (its group: the workers it starts)."""
    path = os.pathsep.join(str(p) for p in (ROOT, pythonpath) if p is not None)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, "PYTHONWARNINGS": "ignore"}
    command = [sys.executable, str(ROOT / "scripts" / "train.py"), *args]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip


def wait_for_line(process: subprocess.Popen, start: str, timeout: float = 240) -> str:
    """The first stdout line of ``process`` that starts with ``start`` (the run's per-iteration log)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if line.startswith(start):
            return line
        if not line and process.poll() is not None:
            break
    process.kill()
    raise AssertionError(f"no line starting {start!r}; stderr: {process.stderr.read()}")


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``: what a finished run left behind."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(stat.parent.name))
    return members


# ----- 4. a missing ALFWorld split is the env's one line ------------------------------------------------------
def test_a_missing_alfworld_split_in_a_recipe_dry_run_is_one_line(tmp_path: Path, monkeypatch) -> None:
    """Before: FileNotFoundError's 20-line traceback (check_env_kwargs caught TypeError and ValueError only)."""
    pytest.importorskip("alfworld")
    (tmp_path / "json_2.1.1" / "valid_seen").mkdir(parents=True)  # the recipe's split, train, is absent
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    code, _, stderr = call("train", "--recipe", "alfworld-gagpo-qwen2.5-1.5b", "--model", "tiny", "--dry-run")
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1, stderr
    assert lines[0].startswith("error: cannot make gagpo_gym/ALFWorld-v0 with {'split': 'train'}: ")
    assert f"ALFWorld split folder {tmp_path / 'json_2.1.1' / 'train'} is missing" in lines[0]


# ----- 5. a prompt that cannot hold its task says so --------------------------------------------------------------
def test_a_prompt_that_loses_its_task_warns_once_with_the_fix() -> None:
    """Before: 250 admissible actions against a 1,024-token budget kept the prompt's last tokens (``47 | wait 4748
    | ...``), the task and the observation gone, told only by a counter outside the one-line log."""
    from agents.tiny import train_tokenizer
    from wrappers.prompt import PromptBuilder, PromptOverflowWarning

    actions = [f"wait {i}" for i in range(250)]
    tokenizer = train_tokenizer(["Reach the TARGET room. You are in the hall.", " | ".join(actions)], vocab_size=300)
    builder = PromptBuilder(tokenizer, action_mode="choose", max_prompt_tokens=1024)
    with pytest.warns(PromptOverflowWarning, match=r"needs (\d+) tokens .* over max_prompt_tokens=1024: .*without "
                      r"seeing the task or the observation \(250 admissible actions listed\)\. Raise max_prompt_tokens "
                      r"to at least \d+, or list fewer actions: show_admissible=False") as record:  # fmt: skip
        ids = builder.build("Reach the TARGET room.", [], "You are in the hall.", actions)
    needed = int(str(record[0].message).split("needs ")[1].split()[0])
    assert len(ids) == 1024 < needed and "TARGET" not in tokenizer.decode(ids)  # what the warning says happened
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per builder; the counter goes on
        builder.build("Reach the TARGET room.", [], "You are in the hall.", actions)
        assert builder.overflow_count == 2
        # The fix it names: a budget as large as it says, or the list left out.
        bigger = PromptBuilder(tokenizer, action_mode="choose", max_prompt_tokens=needed)
        assert "TARGET" in tokenizer.decode(bigger.build("Reach the TARGET room.", [], "You are in the hall.", actions))
        unlisted = PromptBuilder(tokenizer, action_mode="choose", max_prompt_tokens=1024, show_admissible=False)
        unlisted.build("Reach the TARGET room.", [], "You are in the hall.", actions)
        assert bigger.overflow_count == unlisted.overflow_count == 0


# ----- 7. SIGTERM saves at the boundary -----------------------------------------------------------------------------
def test_sigterm_saves_the_agent_at_its_boundary_and_says_how_to_resume(tmp_path: Path) -> None:
    """Before: exit 143, no message, no save (with the default --checkpoint-freq 0 the whole run was lost)."""
    from agents import GAGPOAgent

    run = tmp_path / "run"
    process = train_process("--env", "gagpo_gym/Maze-v0", "--env-kwargs", json.dumps(TINY_MAZE), *TINY_AGENT,
                            "--total-timesteps", "1000000", "--save-dir", str(run))  # fmt: skip
    try:
        wait_for_line(process, "iter 2 ")
        process.send_signal(signal.SIGTERM)
        process.send_signal(signal.SIGTERM)  # `timeout` signals the process, then its group: one counts
        _, stderr = process.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 143, stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("terminated (SIGTERM): at ") and "; saved " in line, stderr
    steps = int(line.split("at ")[1].split()[0])
    saved = run / "checkpoints" / f"agent_{steps}_steps"
    assert f"(resume with --resume {saved} --save-dir {run})" in line
    agent = GAGPOAgent.load(saved, verbose=0)
    assert agent.num_timesteps == steps > 0 and agent.iteration >= 2


# ----- 9. bf16 on a CPU -------------------------------------------------------------------------------------
def test_bf16_on_a_cpu_warns_where_the_precision_is_resolved() -> None:
    """Before: bf16 on a CPU ran about 18x slower than fp32 without a word."""
    from agents.precision import resolve_dtype

    with pytest.warns(UserWarning, match=r"dtype='bfloat16' on a CPU: .*about 18x slower than float32.*float32"):
        assert resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_dtype("float32", torch.device("cpu")) == torch.float32
        assert resolve_dtype("auto", torch.device("cpu")) == torch.float32


# ----- 11. an env that raises names its env, task, seed and step -------------------------------------------------
class Brittle(TextEnv):
    """Walks right; raises in the step after the ``fail_after``-th of an episode (None: never), or, with
    ``trigger``, in every step taken while that file exists (a run made to fail part-way)."""

    def __init__(self, fail_after: int | None = None, trigger: str | None = None) -> None:
        super().__init__()
        self.fail_after, self.trigger = fail_after, trigger

    def _new_task(self, seed: int | None, options: dict[str, Any]) -> str:
        self.task, self.task_id, self.pos = "Walk right.", f"walk-{seed}", 0
        return "You are at 0."

    def _execute(self, command: str) -> tuple[str, float, bool]:
        if (self.fail_after is not None and self.pos >= self.fail_after) or (
            self.trigger is not None and Path(self.trigger).exists()
        ):
            raise KeyError("the engine lost its map")
        self.pos += command == "right"
        return f"You are at {self.pos}.", float(self.pos >= 6), self.pos >= 6

    def admissible_actions(self) -> list[str]:
        return ["left", "right"]

    def state_string(self) -> str:
        return str(self.pos)


BRITTLE = gagpo_gym.register_text_env("Brittle59-v0", Brittle, max_episode_steps=8)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_env_error_names_env_task_seed_and_step_chained_to_the_original(mode: str) -> None:
    """Before: the env's bare KeyError (sync) or a RuntimeError holding a worker's traceback (async), naming no env
    id, task or step."""
    from wrappers import GroupedVectorEnv
    from wrappers.grouped_vector_env import RemoteTraceback, SubEnvError

    fns = [functools.partial(gagpo_gym.make, BRITTLE, fail_after=2 if i == 3 else None) for i in range(4)]
    venv = GroupedVectorEnv(fns, num_groups=2, group_size=2, mode=mode, n_workers=2)
    try:
        _, infos = venv.reset(options={"task_seeds": [11, 22]})
        for _ in range(2):
            venv.step(["right"] * 4)
        with pytest.raises(SubEnvError) as failure:
            venv.step(["right", "left", "right", "right"])
        where = "sub-env 3" if mode == "sync" else f"sub-env worker 1 (pid {venv.workers.procs[1].pid}), sub-env 3"
        assert str(failure.value) == (
            f"{BRITTLE}: {where} raised during step 3 of its episode (action 'right'): KeyError: 'the engine lost its "
            "map' (group 1, task 'walk-22', task seed 22)"
        )
        assert (failure.value.sub_env, failure.value.task_seed, failure.value.step) == (3, 22, 3)
        cause = failure.value.__cause__
        if mode == "sync":
            assert isinstance(cause, KeyError)  # the env's own exception, with its own traceback
        else:
            assert isinstance(cause, RemoteTraceback) and 'raise KeyError("the engine lost its map")' in str(cause)
        with pytest.raises(RuntimeError, match="call reset"):
            venv.step(["right"] * 4)
        venv.reset(options={"task_seeds": [11, 22]})  # and it plays again
    finally:
        venv.close()


def brittle_module() -> str:
    """A module registering :class:`Brittle` as ``BrittleRun-v0``: what ``--env brittle_run:BrittleRun-v0`` imports."""
    import inspect

    head = "from pathlib import Path\nfrom typing import Any\n\nimport gagpo_gym\nfrom gagpo_gym.core import TextEnv\n"
    register = '\n\ngagpo_gym.register_text_env("BrittleRun-v0", Brittle, max_episode_steps=8)\n'
    return f"{head}\n\n{inspect.getsource(Brittle)}{register}"


def test_train_py_ends_an_env_error_with_one_line_a_save_and_no_orphans(tmp_path: Path) -> None:
    """Before: a 107-line traceback (async) naming no env id, task or step, and nothing saved to resume from."""
    (tmp_path / "brittle_run.py").write_text(brittle_module())
    trigger, run = tmp_path / "fail-now", tmp_path / "run"
    process = train_process("--env", "brittle_run:BrittleRun-v0", "--env-kwargs", json.dumps({"trigger": str(trigger)}),
                            *TINY_AGENT, "--vec-mode", "async", "--total-timesteps", "1000000", "--save-dir", str(run),
                            pythonpath=tmp_path)  # fmt: skip
    try:
        wait_for_line(process, "iter 1 ")
        trigger.touch()
        _, stderr = process.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 1, stderr
    lines = stderr.strip().splitlines()
    assert 'raise KeyError("the engine lost its map")' in stderr  # the env's own traceback, where to fix it
    error = lines[-2]
    assert error.startswith("error: gagpo_gym/BrittleRun-v0: sub-env worker ") and " raised during step " in error
    assert "KeyError: 'the engine lost its map' (group " in lines[-2] and ", task 'walk-" in lines[-2]
    assert ", task seed " in lines[-2] and ("(action 'left')" in lines[-2] or "(action 'right')" in lines[-2])
    assert lines[-1].startswith("stopped at ") and "; saved " in lines[-1] and "(resume with --resume " in lines[-1]
    assert Path(lines[-1].split("; saved ")[1].split(" (resume")[0]).is_dir()
    time.sleep(0.5)
    assert not group_members(process.pid), "env workers outlived train.py"


# ----- 12. --resume onto another env; duplicated admissible actions ---------------------------------------------
def test_resume_onto_another_env_is_refused_in_its_own_save_dir_and_a_zip_resumes(tmp_path: Path) -> None:
    """Before: --resume with another --env trained on without a word and replaced the run's final agent; and
    --resume refused SB3's ``<prefix>_<steps>_steps.zip`` (no agent.json inside a folder of that name)."""
    from agents import GAGPOAgent

    run = tmp_path / "run"
    maze = ["--env", "gagpo_gym/Maze-v0", "--env-kwargs", json.dumps(TINY_MAZE)]
    code, _, stderr = call("train", *maze, *TINY_AGENT, "--quiet", "--iterations", "1", "--save-dir", str(run))
    assert code == 0, stderr
    final = run / "final"
    before = (final / "manifest.json").read_bytes()
    frozen = ["--env", "gagpo_gym/FrozenLake-v0", "--env-kwargs", '{"max_episode_steps": 4}']
    code, _, stderr = call("train", "--resume", str(final), *frozen, "--quiet", "--iterations", "1",
                           "--save-dir", str(run))  # fmt: skip
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1, stderr
    assert lines[0].startswith(f"error: --resume {final} trained on gagpo_gym/Maze-v0; --env gagpo_gym/FrozenLake-v0 ")
    assert "pass another --save-dir" in lines[0] and (final / "manifest.json").read_bytes() == before

    steps = GAGPOAgent.load(final, verbose=0).num_timesteps
    archive = tmp_path / "sb3" / f"agent_{steps}_steps.zip"  # as SB3's CheckpointCallback names its saves
    GAGPOAgent.load(final, verbose=0).save(archive)
    code, stdout, stderr = call("train", "--resume", str(archive), *frozen, "--quiet", "--iterations", "1")
    assert code == 0, stderr
    assert f"resumed {archive} at {steps} env steps" in stdout
    assert f"warning: --resume {archive} trained on gagpo_gym/Maze-v0; now training it on gagpo_gym/FrozenLake-v0" in (
        stderr
    )
    code, _, stderr = call("train", "--resume", str(tmp_path / "sb3" / "agent_1_steps.zip"), "--quiet")
    assert code == 2 and stderr.strip() == (
        f"error: no saved agent at {tmp_path / 'sb3' / 'agent_1_steps.zip'} (a folder with agent.json inside, or a "
        ".zip of one)"
    )


class Repeats(TextEnv):
    """An env that lists 'wait' twice (as an env assembling its commands from two sources might)."""

    def _new_task(self, seed: int | None, options: dict[str, Any]) -> str:
        self.task, self.task_id, self.done = "Go.", "go", False
        return "Here."

    def _execute(self, command: str) -> tuple[str, float, bool]:
        self.done = command == "go"
        return ("There." if self.done else "Here."), float(self.done), self.done

    def admissible_actions(self) -> list[str]:
        return ["wait", "go", "wait"]

    def state_string(self) -> str:
        return str(self.done)


def test_choose_mode_scores_each_distinct_action_once_and_the_checker_flags_repeats() -> None:
    """Before: an action listed twice got twice its probability (an untrained policy picked the duplicated 'wait'
    65.5% of the time against 55.3%), and check_text_env said nothing."""
    from agents import GAGPOAgent

    agent = GAGPOAgent("gagpo_gym/FrozenLake-v0", action_mode="choose", tiny_hidden_size=32, num_groups=1,
                       group_size=2, torch_threads=1, verbose=0)  # fmt: skip
    prompt = agent.prompts.build("Go.", [], "Here.", ["wait", "go"])
    policy = agent.policy
    once = policy.act([prompt], [["wait", "go"]], seeds=[0])
    twice = policy.act([prompt], [["wait", "go", "wait"]], seeds=[0])
    assert len(twice.candidate_ids[0]) == 2 and twice.candidate_ids == once.candidate_ids
    assert np.allclose(twice.logp[0], once.logp[0]) and twice.texts == once.texts
    greedy = policy.act([prompt] * 200, [["wait", "go", "wait"]] * 200, seeds=list(range(200)))
    reference = policy.act([prompt] * 200, [["wait", "go"]] * 200, seeds=list(range(200)))
    assert greedy.texts == reference.texts  # the same draws: 'wait' is no likelier for being listed twice
    # A demonstrator's choice indexes the list as given; it is recorded against the distinct list.
    shown = policy.act([prompt], [["wait", "wait", "go"]], choices=[2])
    assert shown.texts == ["go"] and shown.chosen == [1]

    env_id = gagpo_gym.register_text_env("Repeats59-v0", Repeats, max_episode_steps=3)
    try:
        with pytest.raises(AssertionError, match=r"lists \['wait'\] more than once: list each command once"):
            gagpo_gym.check_text_env(gym.make(env_id))
    finally:
        gym.registry.pop(env_id, None)


# ----- 13. a missing extra, a user's recipe, the TextArena ids -----------------------------------------------------
def test_textarena_ids_without_the_extra_say_how_to_install_it() -> None:
    """Before: Gymnasium's NameNotFound, no install hint (the ids were registered only where textarena is)."""
    code = (
        "import sys; sys.modules['textarena'] = None\n"  # textarena absent, whether installed here or not
        "import gymnasium as gym, gagpo_gym\n"
        "assert not [i for i in gagpo_gym.registered_text_envs() if 'TextArena' in i]\n"
        "try:\n    gym.make('gagpo_gym/TextArena-Nim-v0')\nexcept ImportError as err:\n    print(err)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "gagpo_gym/TextArena-Nim-v0 needs TextArena, an optional extra: pip install 'gagpo-gym[textarena]'"
    )


def test_a_vllm_run_without_vllm_is_one_line_naming_both_ways_out() -> None:
    """Before: an ImportError traceback (train.py caught OSError and ValueError only)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    maze = ["--env", "gagpo_gym/Maze-v0", "--env-kwargs", json.dumps(TINY_MAZE)]
    code, _, stderr = call("train", *maze, *TINY_AGENT, "--backend", "vllm", "--action-mode", "generate", "--quiet")
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1, stderr
    assert lines[0].startswith("error: backend='vllm' needs vLLM: pip install 'gagpo-gym[vllm]'")
    assert lines[0].endswith("(or pass --backend hf: the trainer samples itself, no vLLM needed)")


def test_a_recipes_extends_path_is_read_beside_the_extending_file(tmp_path: Path, monkeypatch) -> None:
    """Before: ``extends: base.yaml`` was looked for in the working directory, not beside the recipe."""
    from agents.recipes import load_recipe

    mine = tmp_path / "my-recipes"
    mine.mkdir()
    (mine / "base.yaml").write_text("extends: verl-agent-alfworld\nestimator: grpo\nlearning_rate: 0.002\n")
    (mine / "mine.yaml").write_text("extends: base.yaml\nlearning_rate: 0.001\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    values, _ = load_recipe(str(mine / "mine.yaml"))
    assert values["estimator"] == "grpo" and values["learning_rate"] == 0.001 and values["backend"] == "vllm"
    monkeypatch.chdir(tmp_path)
    assert load_recipe("my-recipes/mine.yaml")[0] == values  # a relative --recipe: from the working directory
