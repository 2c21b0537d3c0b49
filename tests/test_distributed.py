"""Data-parallel training on CPU with gloo: two torchrun processes x 2 groups equal one process x 4 groups."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from distributed_worker import LAUNCH, reference
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
WORKER = str(ROOT / "tests" / "distributed_worker.py")


def run(command: list[str], out: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with (out / "log.txt").open("a") as log:
        log.write(done.stdout + done.stderr)


def rows_of(folder: Path) -> dict[str, float]:
    rows: dict[str, float] = {}
    for file in sorted(folder.glob("rows_*.json")):
        part = json.loads(file.read_text())["rows"]
        assert not set(part) & set(rows)  # a group never spans ranks
        rows.update(part)
    return rows


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every mode's one-process run, then every launch's, each in one start (tests/distributed_worker.py)."""
    out = tmp_path_factory.mktemp("distributed")
    run([sys.executable, WORKER, str(out / "one")], out)
    run([*TORCHRUN, WORKER, str(out / "two")], out)
    return out


# The update overlapped with the next rollout (each rank its own; docs/overlap.md) under DDP and FSDP2; the FSDP2
# runs without it, sequential, check the default group's rollout collectives, and one resumes its checkpoint.
@pytest.mark.parametrize("engine", LAUNCH)
def test_two_processes_equal_one_process(runs: Path, engine: str) -> None:
    two = runs / "two" / engine
    check_equal(engine, runs / "one" / reference(engine), two)
    if LAUNCH[engine][2]:  # loaded under FSDP (weights resharded, optimizer state set from the full state), trained on
        b = load_file(two / "agent" / "model" / "model.safetensors")
        mid, resumed = (load_file(two / d / "model" / "model.safetensors") for d in ("mid", "resumed"))
        assert max(float((b[k] - mid[k]).abs().max()) for k in b) > 1e-3  # the second iteration moved them
        gap = max(float((resumed[k] - b[k]).abs().max()) for k in b)
        print(f"fsdp resume: max parameter difference to the uninterrupted launch {gap:.3g}")
        assert gap == 0.0


def check_equal(engine: str, one: Path, two: Path) -> None:
    """The launch's two ranks played the one process's tasks and steps, with its advantages and, to rounding, its
    updated weights."""
    single, split = rows_of(one), rows_of(two)
    assert len(list(two.glob("rows_*.json"))) == 2 and all(
        json.loads(f.read_text())["rows"] for f in two.glob("rows_*")
    )
    assert single.keys() == split.keys()  # together, exactly the single process's tasks and steps
    assert max(abs(single[k] - split[k]) for k in single) < 1e-9  # batch-normalised advantages, reduced exactly
    summaries = [json.loads(f.read_text()) for f in [*one.glob("rows_*"), *two.glob("rows_*")]]
    assert {s["steps"] for s in summaries} == {len(single)}  # num_timesteps counts every rank's steps
    # The defaults: several epochs of several minibatches, where the split over ranks must not change the steps.
    assert summaries[0]["n_epochs"] > 1 and sum(k.startswith("1/") for k in single) > summaries[0]["minibatch_size"]
    a, b = (load_file(d / "agent" / "model" / "model.safetensors") for d in (one, two))
    assert a.keys() == b.keys()
    initial = load_file(one / "initial" / "model.safetensors")
    diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    moved = max(float((a[k] - initial[k]).abs().max()) for k in a)
    print(f"\n{engine}: max parameter difference, 2 processes vs 1: {diff:.3g} (the updates moved them {moved:.3g})")
    assert moved > 1e3 * diff  # rounding only: three orders of magnitude below what the updates move
    if not engine.endswith("generate"):  # short choose-mode rows: within 1e-5 on AVX512 and AVX2 kernels alike
        assert diff < 1e-5  # (generate mode: 9.7e-6 with AVX512 kernels, 5.0e-5 with AVX2)


@pytest.mark.parametrize("launcher", ["plain", "torchrun"])
def test_train_script_runs_with_and_without_the_launcher(tmp_path: Path, launcher: str) -> None:
    args = ["scripts/train.py", "--env", "gagpo_gym/FrozenLake-v0", "--env-kwargs", '{"max_episode_steps": 4}',
            "--num-groups", "2", "--group-size", "2", "--tiny-hidden-size", "32", "--total-timesteps", "1",
            "--torch-threads", "1", "--save-dir", str(tmp_path / "run"), "--quiet"]  # fmt: skip
    command = [sys.executable, *args] if launcher == "plain" else [*TORCHRUN, *args]
    run(command, tmp_path)
    saved = json.loads((tmp_path / "run" / "final" / "agent.json").read_text())
    assert saved["num_timesteps"] > 0 and saved["config"]["num_groups"] == 2
    shutil.rmtree(tmp_path / "run")
