"""A trained agent outside the library's own loops: predict() in a plain Gymnasium loop plays as evaluate() does,
and a saved agent loads from its folder alone, wherever it is, with the KL reference it was trained against."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch
from agent_helpers import save_tiny_checkpoint
from safetensors.torch import load_file, save_file

import gagpo_gym  # noqa: F401  (registers the envs)
from agents import GAGPOAgent
from agents.checkpoint import REFERENCE_FILE
from agents.warm_start import warm_start
from wrappers import GENERATE

MAZE = "gagpo_gym/Maze-v0"
MAZE_KWARGS = {"max_episode_steps": 12}
SMALL: dict[str, Any] = {
    "num_groups": 2, "group_size": 2, "minibatch_size": 8, "torch_threads": 1, "verbose": 0,
    "tiny_hidden_size": 32, "history_length": 2, "env_kwargs": MAZE_KWARGS,
}  # fmt: skip


@pytest.fixture(scope="module")
def maze_agent() -> GAGPOAgent:
    return GAGPOAgent(MAZE, seed=4, **SMALL)


def play(
    agent: GAGPOAgent, seeds: list[int], *, memory: bool, env_id: str = MAZE, env_kwargs: dict = MAZE_KWARGS
) -> list[dict[str, Any]]:
    """The deployment loop of docs/predict.md: a plain ``gymnasium.make`` env, ``agent.predict`` each step."""
    env = gym.make(env_id, **env_kwargs)
    episodes = []
    for seed in seeds:
        obs, info = env.reset(seed=seed)
        state, start, done, ret, actions = None, True, False, 0.0, []
        while not done:
            if memory:
                action, state = agent.predict(obs, info, state=state, episode_start=start, deterministic=True)
            else:
                action, _ = agent.predict(obs, info, deterministic=True)
            obs, reward, terminated, truncated, info = env.step(action)
            done, start = terminated or truncated, terminated or truncated
            ret = ret + float(reward)
            actions.append(action)
        episodes.append(
            {"seed": seed, "won": bool(info["won"]), "length": len(actions), "return": ret, "actions": actions}
        )
    env.close()
    return episodes


def summary(episodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {k: round(e[k], 9) if k == "return" else e[k] for k in ("seed", "won", "length", "return")} for e in episodes
    ]


@contextlib.contextmanager
def recorded_prompts(agent: GAGPOAgent):
    """Every prompt the policy is shown while the block runs (the policy itself acts unchanged)."""
    prompts: list[tuple[int, ...]] = []
    act = agent.policy.act

    def recording(batch, *args, **kwargs):
        prompts.extend(tuple(p) for p in batch)
        return act(batch, *args, **kwargs)

    agent.policy.act = recording
    try:
        yield prompts
    finally:
        agent.policy.act = act


def test_predict_with_state_in_a_plain_gymnasium_loop_reproduces_evaluate(maze_agent: GAGPOAgent) -> None:
    seeds = list(range(10))
    with recorded_prompts(maze_agent) as seen_by_evaluate:
        evaluated = summary(maze_agent.evaluate(n_tasks=len(seeds), episodes=True)["episodes"])
    with recorded_prompts(maze_agent) as seen_by_loop:
        remembering = play(maze_agent, seeds, memory=True)
    assert summary(remembering) == evaluated
    assert sorted(seen_by_loop) == sorted(seen_by_evaluate)  # the very prompts, history included
    # Without the memory the loop shows the agent other prompts than it trained on; the warning says so.
    with recorded_prompts(maze_agent) as seen_forgetting, pytest.warns(UserWarning, match="without history"):
        play(maze_agent, seeds, memory=False)
    assert sorted(seen_forgetting) != sorted(seen_by_evaluate)


def test_predict_folds_the_episode_memory_as_the_wrappers_do() -> None:
    """With ``memory=True`` the prompt carries the episode's memory of places seen; a plain loop's predict() folds
    it from its state, the very prompts evaluate() builds from the Memory wrapper's info."""
    kwargs = {"size": "small", "max_episode_steps": 12}
    agent = GAGPOAgent("gagpo_gym/MiniHouse-v0", seed=1, **{**SMALL, "env_kwargs": kwargs, "memory": True,
                                                              "history_length": 1})  # fmt: skip
    seeds = list(range(6))
    with recorded_prompts(agent) as seen_by_evaluate:
        evaluated = summary(agent.evaluate(n_tasks=len(seeds), episodes=True)["episodes"])
    with recorded_prompts(agent) as seen_by_loop:
        played = play(agent, seeds, memory=True, env_id="gagpo_gym/MiniHouse-v0", env_kwargs=kwargs)
    assert summary(played) == evaluated
    assert sorted(seen_by_loop) == sorted(seen_by_evaluate)
    texts = [agent.policy.tokenizer.decode(list(p)) for p in seen_by_loop]
    assert sum("Memory: Seen: " in t for t in texts) >= 5  # steps after a visit remember the place
    assert agent.predict("x", {"admissible_actions": ["a"]}, state=[])[1] == [["x", "a"]]  # the whole episode


def test_batched_predict_keeps_one_history_per_env(maze_agent: GAGPOAgent) -> None:
    envs = [gym.make(MAZE, **MAZE_KWARGS) for _ in range(3)]
    first = [env.reset(seed=s) for s, env in enumerate(envs)]
    obs, infos = [o for o, _ in first], [i for _, i in first]
    actions, state = maze_agent.predict(obs, infos, state=None, episode_start=[True] * 3, deterministic=True)
    assert len(state) == 3 and all(h == [[o, a]] for h, o, a in zip(state, obs, actions))
    steps = [env.step(a) for env, a in zip(envs, actions)]
    obs2, infos2 = [s[0] for s in steps], [s[4] for s in steps]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the memory is in use: no warning
        batched, state2 = maze_agent.predict(obs2, infos2, state=state, episode_start=[False, True, False])
    assert state2[1] == [[obs2[1], batched[1]]]  # a new episode forgets env 1's history
    assert state2[0] == [*state[0], [obs2[0], batched[0]]][-2:]
    one = [maze_agent.predict(o, i, state=h, episode_start=False, deterministic=True)[0]
           for o, i, h in zip(obs2, infos2, state)]  # fmt: skip
    assert maze_agent.predict(obs2, infos2, state=state, deterministic=True)[0] == one
    with pytest.raises(ValueError, match="3 observations and 2 states"):
        maze_agent.predict(obs2, infos2, state=state[:2])


# ----- a saved agent loads from its folder alone -------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]
ENV = "gagpo_gym/FrozenLake-v0"
QUICK: dict[str, Any] = {
    "num_groups": 2, "group_size": 2, "minibatch_size": 8, "torch_threads": 1, "verbose": 0,
    "env_kwargs": {"max_episode_steps": 4}, "ent_coef": 0.05,
}  # fmt: skip
TINY_MAZE = {"width": 3, "height": 3, "rooms": 0, "loops": 1, "min_path": 2, "max_path": 3, "max_episode_steps": 10}


def reference_state(agent: GAGPOAgent) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in agent.reference.state_dict().items()}


def same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("saved", sorted(p.parent.relative_to(ROOT) for p in (ROOT / "results").rglob("agent.json")))
def test_every_committed_agent_loads_from_a_copy_outside_the_repo_and_plays(
    saved: Path, tmp_path: Path, monkeypatch
) -> None:
    env_id = json.loads((ROOT / saved / "agent.json").read_text())["env_id"]
    alfworld = "ALFWorld" in env_id
    if alfworld and not (ROOT.parent / "shared" / "alfworld").is_dir():
        pytest.skip("../shared/alfworld is absent")
    copy = shutil.copytree(ROOT / saved, tmp_path / "elsewhere" / saved.name)
    monkeypatch.chdir(tmp_path)  # nothing of the repo is reachable by a relative path
    # an ALFWorld agent's saved env plays the train split, unpacked only by `make alfworld-train`: play valid_seen
    agent = GAGPOAgent.load(copy, env=env_id, verbose=0) if alfworld else GAGPOAgent.load(copy, verbose=0)
    weights = load_file(ROOT / saved / "model" / "model.safetensors")
    assert same_tensors({k: v for k, v in agent.policy.model.state_dict().items() if k in weights}, weights)
    played = agent.evaluate(n_tasks=1, episodes=True)["episodes"][0]
    assert played["length"] > 0
    if agent.config.action_mode == GENERATE:  # free text: a malformed command is counted, never a crash
        assert 0 <= played["invalid"] <= played["length"]
    else:  # choose mode: every action picked from the admissible list
        assert played["invalid"] == 0


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A 'pretrained' model folder: the tiny model written with save_pretrained."""
    return save_tiny_checkpoint(tmp_path_factory.mktemp("src") / "model", ENV, **QUICK)


def trained_from(model: str, folder: Path, **config: Any) -> tuple[GAGPOAgent, Path]:
    agent = GAGPOAgent(ENV, model=model, seed=2, **{**QUICK, **config})
    agent.learn(8)
    agent.save(folder)
    return agent, folder


def test_a_pretrained_kl_reference_is_verified_and_can_be_pointed_at(source: Path, tmp_path: Path, monkeypatch) -> None:
    src = shutil.copytree(source, tmp_path / "work" / "src")
    monkeypatch.chdir(tmp_path / "work")
    agent, saved = trained_from("src", tmp_path / "agent", kl_coef=0.05, action_mode="choose")  # a relative path
    reference = reference_state(agent)
    monkeypatch.chdir(tmp_path)  # elsewhere: "src" would now name nothing
    assert same_tensors(reference_state(GAGPOAgent.load(saved, verbose=0)), reference)
    # The source changes under the same name: refused, naming both fingerprints.
    weights = load_file(src / "model.safetensors")
    save_file({k: v + 0.5 for k, v in weights.items()}, src / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="is not the model this agent was trained from"):
        GAGPOAgent.load(saved, verbose=0)
    # It moves: refused, saying how to point at it; pointed at, the reference is the original again.
    save_file(weights, src / "model.safetensors", metadata={"format": "pt"})
    moved = shutil.move(src, tmp_path / "moved")
    with pytest.raises(FileNotFoundError, match=r"KL reference.*load\(\.\.\., model=PATH\)"):
        GAGPOAgent.load(saved, verbose=0)
    loaded = GAGPOAgent.load(saved, model=str(moved), verbose=0)
    assert same_tensors(reference_state(loaded), reference)
    loaded.save(tmp_path / "again")  # a re-save remembers where the source is now
    assert json.loads((tmp_path / "again" / "agent.json").read_text())["model"]["path"] == str(Path(moved).resolve())
    # Without a KL term nothing of the source is needed.
    plain, plain_saved = trained_from(str(moved), tmp_path / "plain", kl_coef=0.0, action_mode="choose")
    shutil.rmtree(moved)
    assert GAGPOAgent.load(plain_saved, verbose=0).predict("x", {"admissible_actions": ["a", "b"]}, state=[])[0] in "ab"


def test_a_lora_base_is_verified_and_can_be_pointed_at(source: Path, tmp_path: Path) -> None:
    base = shutil.copytree(source, tmp_path / "base")
    agent, saved = trained_from(str(base), tmp_path / "lora", lora_r=4, action_mode="choose")
    obs, info = "You are at the start.", {"admissible_actions": ["go left", "go right", "go up"]}
    expected = agent.predict(obs, info, state=[], deterministic=True)
    moved = shutil.move(base, tmp_path / "base-moved")
    with pytest.raises(FileNotFoundError, match=r"LoRA base.*model=PATH"):
        GAGPOAgent.load(saved, verbose=0)
    assert (
        GAGPOAgent.load(saved, model=str(moved), verbose=0).predict(obs, info, state=[], deterministic=True) == expected
    )


def test_a_prior_agent_stores_its_reference_and_needs_no_prior_folder(tmp_path: Path) -> None:
    prior = tmp_path / "prior"
    warm_start(MAZE, prior, env_kwargs=TINY_MAZE, episodes=6, epochs=1, batch_size=16, seed=0, verbose=0,
               tiny_hidden_size=32, torch_threads=1, task_pool=8)  # fmt: skip
    agent = GAGPOAgent(MAZE, str(prior), env_kwargs=TINY_MAZE, kl_coef=0.05, num_groups=2, group_size=2,
                       torch_threads=1, verbose=0)  # fmt: skip
    agent.learn(10)
    agent.save(tmp_path / "agent")
    reference = reference_state(agent)
    shutil.rmtree(prior)
    loaded = GAGPOAgent.load(tmp_path / "agent", verbose=0)
    assert loaded.tiny and loaded.config == agent.config and same_tensors(reference_state(loaded), reference)
    loaded.learn(10, reset_num_timesteps=False)  # fine-tunes on against the same reference


def test_a_tiny_agent_stores_its_reference() -> None:
    agent = GAGPOAgent(ENV, kl_coef=0.05, tiny_hidden_size=32, **QUICK)
    agent.learn(8)
    with tempfile.TemporaryDirectory() as tmp:
        agent.save(Path(tmp) / "agent")
        assert (Path(tmp) / "agent" / REFERENCE_FILE).is_file()
        assert same_tensors(reference_state(GAGPOAgent.load(Path(tmp) / "agent", verbose=0)), reference_state(agent))


# ----- a save is all-or-nothing ----------------------------------------------------------------------------------
def test_an_interrupted_save_leaves_the_previous_checkpoint_whole(tmp_path: Path, monkeypatch) -> None:
    agent = GAGPOAgent(ENV, tiny_hidden_size=32, seed=1, **QUICK)
    agent.learn(8)
    path = tmp_path / "agent"
    agent.save(path)
    before = (path / "model" / "model.safetensors").read_bytes()
    agent.learn(8, reset_num_timesteps=False)
    real_save = torch.save

    def dies_midway(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        Path(f).write_bytes(Path(f).read_bytes()[:100])
        raise KeyboardInterrupt  # interrupted inside the optimizer write

    monkeypatch.setattr(torch, "save", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        agent.save(path)
    monkeypatch.setattr(torch, "save", real_save)
    assert (path / "model" / "model.safetensors").read_bytes() == before
    assert GAGPOAgent.load(path, verbose=0).num_timesteps < agent.num_timesteps  # the previous save, whole
    assert [p.name for p in tmp_path.iterdir()] == ["agent"]  # nothing left beside it
    agent.save(path)
    assert GAGPOAgent.load(path, verbose=0).num_timesteps == agent.num_timesteps


def test_saving_over_another_checkpoint_keeps_none_of_its_files(source: Path, tmp_path: Path) -> None:
    path = tmp_path / "agent"
    trained_from(str(source), path, lora_r=4, action_mode="choose")
    assert (path / "model" / "adapter_model.safetensors").is_file()
    full, _ = trained_from(str(source), path, action_mode="choose")  # a full fine-tune saved over the LoRA folder
    assert not (path / "model" / "adapter_model.safetensors").exists()
    loaded = GAGPOAgent.load(path, verbose=0)
    assert loaded.config.lora_r == 0 and loaded.num_timesteps == full.num_timesteps


# ----- damaged files are named ----------------------------------------------------------------------------------
def test_a_truncated_zip_and_a_truncated_manifest_are_named(tmp_path: Path) -> None:
    agent = GAGPOAgent(ENV, tiny_hidden_size=32, **QUICK)
    agent.save(tmp_path / "agent.zip")
    data = (tmp_path / "agent.zip").read_bytes()
    (tmp_path / "cut.zip").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="readable zip archive|zip archive is damaged"):
        GAGPOAgent.load(tmp_path / "cut.zip", verbose=0)
    agent.save(tmp_path / "folder")
    manifest = tmp_path / "folder" / "manifest.json"
    manifest.write_text(manifest.read_text()[:40])
    with pytest.raises(ValueError, match=r"manifest\.json is damaged or truncated"):
        GAGPOAgent.load(tmp_path / "folder", verbose=0)
