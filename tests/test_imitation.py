"""Imitation from cached demonstrations: collected in worker processes and resumable, turned into exactly the prompts
the agent's wrappers show while it plays, trained on, and extended by DAgger rounds; ALFWorld's handcoded expert
says when it gave up.

Real envs throughout: MiniHouse's small houses (ALFWorld's command grammar, with an expert and the place memory's
phrasing) and, where the extra is installed, ALFWorld's own engine on a train-split game.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agents.demonstrations import (
    cache_folder,
    collect_demonstrations,
    play_expert,
    policy_demonstrations,
    read_demonstrations,
)
from agents.env_spec import text_wrapping
from agents.gagpo import GAGPOAgent
from agents.prior import PRIOR_FILE, read_prior
from agents.warm_start import ImitationProgress, imitate, step_prompts, transcript_of

ROOT = Path(__file__).resolve().parents[1]
HOUSE = "gagpo_gym/MiniHouse-v0"
SMALL_HOUSE = {"size": "small"}
AGENT = {"tiny_hidden_size": 32, "torch_threads": 1, "num_groups": 1, "group_size": 2, "history_length": 2}


def test_collection_is_the_same_in_workers_and_resumes(tmp_path):
    """Two worker processes write the same episodes as this process; a second call plays nothing, and a folder
    missing one episode plays only that one."""
    one, two = tmp_path / "one", tmp_path / "two"
    counts = collect_demonstrations(HOUSE, range(4), one, env_kwargs=SMALL_HOUSE, workers=1)
    assert counts["played"] == 4 and counts["episodes"] == 4 and counts["won"] == 4
    collect_demonstrations(HOUSE, range(4), two, env_kwargs=SMALL_HOUSE, workers=2)
    for seed in range(4):
        assert json.loads((one / f"{seed}.json").read_text()) == json.loads((two / f"{seed}.json").read_text())
    assert collect_demonstrations(HOUSE, range(4), two, env_kwargs=SMALL_HOUSE, workers=2)["played"] == 0
    (two / "2.json").unlink()
    again = collect_demonstrations(HOUSE, range(4), two, env_kwargs=SMALL_HOUSE, workers=1)
    assert again["played"] == 1 and json.loads((two / "2.json").read_text()) == json.loads((one / "2.json").read_text())
    assert not list(two.glob(".*.tmp"))  # written atomically
    with pytest.raises(FileNotFoundError, match="task seed 9"):
        read_demonstrations(one, [9])


def test_the_cache_folder_names_the_env_as_played():
    a = cache_folder("c", HOUSE, {"size": "small"}, "oracle-eps0")
    assert a == cache_folder("c", HOUSE, {"size": "small"}, "oracle-eps0")
    assert a != cache_folder("c", HOUSE, {"size": "full"}, "oracle-eps0")
    assert a.name == "oracle-eps0" and "/" not in a.parent.name


@pytest.mark.parametrize("memory", [False, True])
def test_prompts_from_a_demonstration_are_the_ones_the_wrappers_show(memory):
    """The prompt built afterwards from the cached text equals the one the agent's own wrappers (history, memory)
    build while the same commands are played, step by step, including noise's commands in the history."""
    agent = GAGPOAgent(HOUSE, env_kwargs=SMALL_HOUSE, verbose=0, seed=0, memory=memory, **AGENT)
    import gymnasium as gym

    plain = gym.make(HOUSE, **SMALL_HOUSE)
    demo = play_expert(plain, seed=3, expert=None, epsilon=0.3)
    plain.close()
    assert demo.played != demo.labels  # the noise played something else somewhere
    env = agent.env_spec.make(text_wrapping(agent.config))
    obs, info = env.reset(seed=3)
    live = []
    for action in demo.played:
        live.append(agent.prompts.for_step(obs, info))
        obs, _, terminated, truncated, info = env.step(action)
    env.close()
    assert terminated or truncated
    assert step_prompts(agent, demo) == live
    if memory:
        assert any("Memory:" in agent.policy.tokenizer.decode(p) for p in live)


def test_transcripts_keep_only_advice():
    """Steps where the expert had given up, or advised a command that was not admissible, teach nothing."""
    agent = GAGPOAgent(HOUSE, env_kwargs=SMALL_HOUSE, verbose=0, seed=0, **AGENT)
    import gymnasium as gym

    env = gym.make(HOUSE, **SMALL_HOUSE)
    demos = [play_expert(env, seed=s, expert=None) for s in range(2)]
    env.close()
    full = transcript_of(agent, demos)
    assert len(full.actions) == sum(d.length for d in demos) and full.won == 2
    demos[0].advised[1] = False
    demos[1].labels[0] = "fly to the moon"
    cut = transcript_of(agent, demos)
    assert len(cut.actions) == len(full.actions) - 2
    assert cut.lengths == [demos[0].length - 1, demos[1].length - 1]


def test_imitation_then_dagger_writes_a_prior_an_agent_fine_tunes(tmp_path, monkeypatch):
    """Behaviour cloning lowers the loss; a DAgger round plays the policy, labels its states with the expert and
    trains on both; the folder is a prior that GAGPOAgent fine-tunes with its prompt settings. A run stopped within
    an epoch of the DAgger round's fit resumes from its last save and writes the uninterrupted run's prior, bit for
    bit."""
    folder = tmp_path / "demos"
    collect_demonstrations(HOUSE, range(12), folder, env_kwargs=SMALL_HOUSE, workers=1)
    out = tmp_path / "prior"
    settings = {
        "env_kwargs": SMALL_HOUSE, "epochs": 2, "learning_rate": 3e-3, "batch_size": 8, "dagger_rounds": 1,
        "dagger_episodes": 4, "heldout": range(100, 104), "seed": 0, **AGENT,
    }  # fmt: skip
    record = imitate(HOUSE, out, folder, range(12), **settings)
    assert not (out / "progress").exists() and not (out / "start").exists()  # a finished run keeps the prior alone

    # Saving after every batch, stopped right after the first save within round 1's second epoch.
    save = ImitationProgress.save

    def stop_within_the_last_epoch(self, *args, **kwargs):
        save(self, *args, **kwargs)
        fitting = kwargs["current"]
        if fitting and fitting["round"] == 1 and len(fitting["losses"]) == 1 and fitting["within"]:
            raise KeyboardInterrupt

    monkeypatch.setattr(ImitationProgress, "save", stop_within_the_last_epoch)
    stopped, lines = tmp_path / "stopped", []
    with pytest.raises(KeyboardInterrupt):
        imitate(HOUSE, stopped, folder, range(12), **settings, checkpoint_every_s=0, log=lines.append)
    monkeypatch.undo()
    ends = [line for line in lines if " of " not in line]  # the lines of finished epochs
    assert [line.split(":")[0] for line in ends] == ["round 0, epoch 1/2", "round 0, epoch 2/2", "round 1, epoch 1/2"]
    assert lines[1].startswith("round 0, epoch 1/2: loss ") and "(16 of " in lines[1]  # two batches of the first
    assert lines[-1] == ends[-1]  # the stopping save (one batch into the last epoch) is written, then logged
    state = json.loads((stopped / "progress" / "state.json").read_text())
    fitting = state["current"]
    assert fitting["round"] == 1 and len(fitting["losses"]) == 1 and len(state["played"]) == 4
    assert fitting["within"]["next"] == fitting["within"]["seen"] == 8 < fitting["actions"]
    with pytest.raises(ValueError, match="other settings"):
        imitate(HOUSE, stopped, folder, range(12), **{**settings, "epochs": 3})
    lines = []
    resumed = imitate(HOUSE, stopped, folder, range(12), **settings, log=lines.append)
    done = "1 round(s) and 1 epoch(s) done, and 8 actions of the next"
    assert lines[0] == f"resuming the stopped run in {stopped}: {done}"
    assert len(lines) == 2 and lines[1].startswith("round 1, epoch 2/2: loss ")  # the rest of the last epoch
    timing = {"train_s": None, "heldout": {**record["heldout"], "eval_s": None}}
    assert {**resumed, **timing, "heldout": {**resumed["heldout"], "eval_s": None}} == {**record, **timing}
    a, b = (load_file(d / "model.safetensors") for d in (out, stopped))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not (stopped / "progress").exists() and not (stopped / "start").exists()

    first, second = record["rounds"]
    assert first["losses"][-1] < first["losses"][0]
    assert second["episodes"] == 4 and second["actions"] > first["actions"] and 0 <= second["policy_success"] <= 1
    assert record["distinct_tasks"] == 12 and record["expert_success"] == 1.0
    assert 0 <= record["heldout"]["greedy_success"] <= 1 and record["prompt"]["history_length"] == 2
    assert read_prior(out)["parameters"] == record["parameters"]
    agent = GAGPOAgent(HOUSE, str(out), env_kwargs=SMALL_HOUSE, verbose=0, num_groups=1, group_size=2)
    assert agent.config.history_length == 2 and agent.config.learning_rate == 1e-4  # the prior's fine-tuning
    agent.learn(8)
    with pytest.raises(ValueError, match="held-out"):
        imitate(HOUSE, tmp_path / "x", folder, range(12), env_kwargs=SMALL_HOUSE, heldout=range(10, 14), **AGENT)
    with pytest.raises(ValueError, match="consecutive"):  # a panel is start..start+n-1, not any seeds
        imitate(HOUSE, tmp_path / "x", folder, range(12), env_kwargs=SMALL_HOUSE, heldout=[100, 102], **AGENT)


def test_dagger_labels_the_states_the_policy_reached():
    agent = GAGPOAgent(HOUSE, env_kwargs=SMALL_HOUSE, verbose=0, seed=0, **AGENT)
    demos = policy_demonstrations(agent, [0, 1, 2], batch=2)
    assert [d.seed for d in demos] == [0, 1, 2]
    for demo in demos:
        assert demo.length == len(demo.observations) == len(demo.admissible) == len(demo.played)
        assert all(a in adm for a, adm in zip(demo.labels, demo.admissible))  # the oracle's advice is admissible
    # beta 1: the expert plays its own advice, and wins
    expert_led = policy_demonstrations(agent, [0, 1], beta=1.0)
    assert all(d.won and d.played == d.labels for d in expert_led)


def test_imitate_command_line(tmp_path):
    """collect then train through scripts/imitate.py; a bad seed range is one line."""
    cache = tmp_path / "cache"
    base = [sys.executable, "scripts/imitate.py"]
    env = ["--env", HOUSE, "--env-kwargs", json.dumps(SMALL_HOUSE), "--cache", str(cache)]
    run = subprocess.run(
        [*base, "collect", *env, "--seeds", "0:3", "--workers", "1"], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert '"episodes": 3' in run.stdout
    out = tmp_path / "prior"
    run = subprocess.run(
        [*base, "train", *env, "--seeds", "0:3", "--epochs", "1", "--tiny-hidden-size", "32", "--tiny-layers", "1",
         "--out", str(out), "--save-agent", str(tmp_path / "agent")], cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "round 0, epoch 1/1: loss " in run.stdout  # a line per epoch
    assert (out / PRIOR_FILE).is_file() and read_prior(out)["distinct_tasks"] == 3
    # the saved agent is for playing: no optimizer state, and eval.py plays it on held-out houses
    assert not (tmp_path / "agent" / "optimizer.pt").exists()
    run = subprocess.run(
        [sys.executable, "scripts/eval.py", "--agent", str(tmp_path / "agent"), "--n-tasks", "2",
         "--seed-offset", "100", "--out", str(tmp_path / "eval")], cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert json.loads((tmp_path / "eval" / "eval.json").read_text())
    bad = subprocess.run([*base, "train", *env, "--seeds", "5:2"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode != 0 and "START < STOP" in bad.stderr and "Traceback" not in bad.stderr


def test_alfworld_handcoded_expert_says_when_it_gave_up():
    """The handcoded expert advises admissible commands on a real train game; after noise it may give up, and the
    env says so (its "look" is then no advice)."""
    pytest.importorskip("alfworld")
    import gymnasium as gym

    from gagpo_gym.envs.alfworld import find_data_root

    try:
        find_data_root(split="valid_seen")
    except FileNotFoundError:
        pytest.skip("no ALFWorld data")
    env = gym.make("gagpo_gym/ALFWorld-v0", split="valid_seen", expert="handcoded")
    demo = play_expert(env, seed=0, expert="handcoded")
    assert demo.won and all(demo.advised)
    assert all(a in adm for a, adm in zip(demo.labels[1:], demo.admissible[1:]))
    noisy = [play_expert(env, seed=s, expert="handcoded", epsilon=0.5) for s in range(6)]
    env.close()
    gave_up = [d for d in noisy if not all(d.advised)]
    for d in gave_up:  # once given up, it stays so for the episode, and advises only "look"
        first = d.advised.index(False)
        assert not any(d.advised[first:]) and set(d.labels[first:]) == {"look"}
