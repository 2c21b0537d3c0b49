"""The warm start: a noisy expert's transcripts train the tiny model, and the saved prior fine-tunes as a tiny model.

Real runs on a 3x3 maze: the supervised loss falls, the prior plays the expert's moves more often than the random
model it started from, ``prior.json`` records how it was made, and ``GAGPOAgent(env, model=prior)`` takes choose
mode, the tiny learning rate and the prior's prompt settings, then trains. Envs without an expert fail clearly.

The prior is trained with the "choice" objective for 20 epochs. With the token loss alone the tiny model sits on a
plateau (it predicts "go" and the commonest direction, loss ~0.45) for a number of epochs that depends on the seed and
on float rounding: after 15 epochs its greedy success on the 16 training tasks was 0.19-0.69 over seeds 0-3 and two
CPU kernel sets (AVX512 0.50, AVX2 0.69 at seed 0: the same commit passed on one machine and failed on another). With
"choice" it was 0.75-0.94 at epoch 20 over seeds 0-9 on AVX512 and 0-3 on AVX2 (random model: 0.375).
"""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

import gagpo_gym
from agents.gagpo import GAGPOAgent
from agents.prior import FINE_TUNE, PRIOR_FILE, read_prior
from agents.warm_start import noisy_expert_transcripts, supervised_epochs, warm_start
from gagpo_gym.envs.maze import MazeEnv
from wrappers import CHOOSE, GENERATE

MAZE = "gagpo_gym/Maze-v0"
TINY_MAZE = {"width": 3, "height": 3, "rooms": 0, "loops": 1, "min_path": 2, "max_path": 3, "max_episode_steps": 10}
SMALL = {"tiny_hidden_size": 32, "torch_threads": 1, "task_pool": 16, "num_groups": 2, "group_size": 2}


@pytest.fixture(scope="module")
def prior(tmp_path_factory):
    out = tmp_path_factory.mktemp("prior")
    record = warm_start(
        MAZE, out, env_kwargs=TINY_MAZE, episodes=100, epsilon=0.2, epochs=20, learning_rate=3e-3, batch_size=16,
        seed=0, verbose=0, objective="choice",  # see the module docstring: "tokens" alone imitates by chance here
        history_length=1, **SMALL,
    )  # fmt: skip
    return out, record


def test_transcripts_mix_expert_and_random_actions_on_training_tasks():
    agent = GAGPOAgent(MAZE, env_kwargs=TINY_MAZE, verbose=0, seed=0, **SMALL)
    data = noisy_expert_transcripts(agent, 30, 0.3, np.random.default_rng(0))
    assert data.episodes == 30 and len(data.prompts) == len(data.actions) > 30
    assert 0.5 < data.expert_steps / len(data.actions) < 0.9  # about 1 - epsilon
    assert data.won > 15  # mostly the expert: most episodes end at the goal
    pure = noisy_expert_transcripts(agent, 10, 0.0, np.random.default_rng(0))
    assert pure.won == 10 and pure.expert_steps == len(pure.actions)
    # The prompts are the agent's own: the same builder, history and admissible list as in training.
    assert all(p == list(p) and len(p) > 0 for p in data.prompts)
    # Every step is labelled with the expert's choice there, also where a random action was played: replayed.
    assert sum(a != p for a, p in zip(data.actions, data.played)) > 5
    env, step = gym.make(MAZE, **TINY_MAZE), 0
    for task, length in zip(data.tasks, data.lengths):
        env.reset(seed=task)
        for _ in range(length):
            assert env.unwrapped.expert_action() == data.actions[step]
            env.step(data.played[step])
            step += 1
    assert step == len(data.actions) == sum(data.lengths) and len(data.tasks) == 30


def test_warm_start_lowers_the_loss_and_imitates_the_expert(prior):
    out, record = prior
    assert record["losses"][-1] < 0.6 * record["losses"][0]
    assert json.loads((out / PRIOR_FILE).read_text()) == record
    assert record["prompt"]["history_length"] == 1 and record["task_pool"] == 16
    assert 0.7 < record["expert_share"] < 0.9
    random_model = GAGPOAgent(MAZE, env_kwargs=TINY_MAZE, verbose=0, seed=0, action_mode="choose", **SMALL)
    warm = GAGPOAgent(MAZE, str(out), env_kwargs=TINY_MAZE, verbose=0, seed=0, torch_threads=1, task_pool=16)
    warm_success = warm.evaluate(n_tasks=16)["success_rate"]
    random_success = random_model.evaluate(n_tasks=16)["success_rate"]
    assert warm_success >= max(0.6, random_success + 0.2)


def test_an_agent_on_the_prior_takes_its_fine_tuning_and_prompt_settings(prior):
    out, _ = prior
    assert read_prior(out)["env_id"] == MAZE and read_prior("tiny") is None
    agent = GAGPOAgent(MAZE, str(out), env_kwargs=TINY_MAZE, verbose=0, seed=0, num_groups=2, group_size=2)
    c = agent.config
    assert (
        agent.tiny and c.action_mode == CHOOSE and read_prior(out)["fine_tune"] == {**FINE_TUNE, "action_mode": CHOOSE}
    )
    assert (c.choose_score, c.learning_rate, c.n_epochs) == ("sum", FINE_TUNE["learning_rate"], FINE_TUNE["n_epochs"])
    assert c.history_length == 1  # from prior.json, not the config default
    told = GAGPOAgent(MAZE, str(out), env_kwargs=TINY_MAZE, verbose=0, history_length=0, choose_score="mean").config
    assert (told.history_length, told.choose_score) == (0, "mean")
    agent.learn(40)
    assert agent.num_timesteps >= 40
    # The prior's own weights are what the optimiser steps, at the prior's learning rate. (Whether they move depends
    # on the rollouts: a prior this good often plays both episodes of a group alike, and all-zero advantages give
    # no gradient, so "the weights changed" held on one CPU and not on another.)
    assert all(group["lr"] == FINE_TUNE["learning_rate"] for group in agent.optimizer.param_groups)
    stepped = [agent.optimizer.state[p].get("step") for p in agent.policy.core.parameters()]
    assert all(step is not None and int(step) == agent.iteration * FINE_TUNE["n_epochs"] for step in stepped)


def test_transcripts_of_the_searching_expert():
    """MiniHouse's searching expert (it knows only what it has seen) wins too, in more steps than the oracle."""
    agent = GAGPOAgent("gagpo_gym/MiniHouse-v0", env_kwargs={"size": "full"}, verbose=0, seed=0, **SMALL)
    oracle = noisy_expert_transcripts(agent, 16, 0.0, np.random.default_rng(0))
    search = noisy_expert_transcripts(agent, 16, 0.0, np.random.default_rng(0), expert="search")
    assert oracle.won == search.won == 16 and search.expert_steps == len(search.actions)
    assert len(search.actions) > len(oracle.actions) + 16


def test_a_generate_prior_goes_on_from_a_choose_prior_and_writes_tagged_answers(prior, tmp_path):
    """The choose-mode prior writes bare commands, which generate mode cannot parse; a short token-loss warm start
    from it, on transcripts played through generate mode's own wrappers, teaches it the tagged answer."""
    parent, _ = prior
    before = GAGPOAgent(MAZE, str(parent), env_kwargs=TINY_MAZE, verbose=0, seed=0, action_mode="generate",
                        max_new_tokens=24, task_pool=16)  # fmt: skip
    bare = before.evaluate(n_tasks=16)
    out = tmp_path / "generate"
    record = warm_start(
        MAZE, out, model=parent, action_mode="generate", env_kwargs=TINY_MAZE, episodes=100, epsilon=0.2, epochs=12,
        learning_rate=3e-3, batch_size=16, seed=0, verbose=0, torch_threads=1, task_pool=16,
    )  # fmt: skip
    # The expert's moves were played as tagged answers through the generate-mode wrappers: the episodes still won.
    assert record["transcript_success"] > 0.6 and record["losses"][-1] < record["losses"][0]
    assert record["model"] == str(parent) and record["action_mode"] == GENERATE
    assert record["fine_tune"]["action_mode"] == GENERATE and record["prompt"]["history_length"] == 1  # the parent's
    after = GAGPOAgent(MAZE, str(out), env_kwargs=TINY_MAZE, verbose=0, seed=0, max_new_tokens=24, task_pool=16)
    assert after.config.action_mode == GENERATE  # from its prior.json
    tagged = after.evaluate(n_tasks=16)
    assert bare["invalid_rate"] > 0.9 and tagged["invalid_rate"] < 0.3, (bare, tagged)
    assert tagged["success_rate"] >= bare["success_rate"] + 0.3
    with pytest.raises(ValueError, match="generate mode trains the 'tokens' objective"):
        warm_start(MAZE, tmp_path / "x", action_mode="generate", objective="choice", env_kwargs=TINY_MAZE, verbose=0)
    with pytest.raises(ValueError, match="a warm-start prior's folder"):
        warm_start(MAZE, tmp_path / "x", model=tmp_path, env_kwargs=TINY_MAZE, verbose=0)
    with pytest.raises(ValueError, match="action_mode must be one of"):
        warm_start(MAZE, tmp_path / "x", action_mode="write", env_kwargs=TINY_MAZE, verbose=0)


class _MazeWithoutExpert(MazeEnv):
    def expert_action(self) -> str:
        raise NotImplementedError


def test_the_choice_objective_trains_the_choice_the_agent_makes():
    """Same transcripts, same steps: the "choice" loss (the choose-mode policy's cross-entropy) makes the greedy
    choice agree with the expert more often than the token loss alone, on MiniHouse's small houses."""
    agreement = {}
    for objective in ("tokens", "choice"):
        agent = GAGPOAgent(
            "gagpo_gym/MiniHouse-v0", env_kwargs={"size": "small"}, verbose=0, seed=0, action_mode="choose",
            choose_score="sum", history_length=1, tiny_hidden_size=32, torch_threads=1, task_pool=32,
        )  # fmt: skip
        data = noisy_expert_transcripts(agent, 40, 0.0, np.random.default_rng(0))
        losses = supervised_epochs(
            agent.policy, data, epochs=3, learning_rate=3e-3, batch_size=16, rng=np.random.default_rng(0),
            objective=objective,
        )  # fmt: skip
        assert losses[-1] < losses[0]
        chooser = agent.policy.actions
        with torch.no_grad():
            seq, counts, _ = chooser.score_candidates(
                data.prompts, [[agent.policy.action_tokens(a) for a in c] for c in data.admissible]
            )
        picks = [c[int(chooser.choice_log_probs(s, n).argmax())] for s, n, c in zip(seq, counts, data.admissible)]
        agreement[objective] = np.mean([p == a for p, a in zip(picks, data.actions)])
    assert agreement["choice"] > max(0.4, agreement["tokens"] + 0.15), agreement  # measured 0.50 vs 0.20


def test_warm_start_fails_clearly(tmp_path):
    env_id = gagpo_gym.register_text_env("TestMazeWithoutExpert-v0", _MazeWithoutExpert, max_episode_steps=10)
    with pytest.raises(ValueError, match="has no expert"):
        warm_start(env_id, tmp_path, env_kwargs=TINY_MAZE, episodes=2, epsilon=0.0, verbose=0, **SMALL)
    with pytest.raises(ValueError, match="has no 'search' expert"):
        warm_start(MAZE, tmp_path, env_kwargs=TINY_MAZE, episodes=2, epsilon=0.0, verbose=0, expert="search", **SMALL)
    with pytest.raises(ValueError, match="epsilon"):
        warm_start(MAZE, tmp_path, env_kwargs=TINY_MAZE, epsilon=1.5, verbose=0)
    with pytest.raises(ValueError, match="objective"):
        warm_start(MAZE, tmp_path, env_kwargs=TINY_MAZE, verbose=0, objective="imitate")
    assert not (tmp_path / PRIOR_FILE).exists()


def test_a_saved_tiny_tokenizer_reloads_with_its_own_pre_tokenizer(tmp_path):
    # AutoTokenizer would load the tiny Qwen2's tokenizer as Qwen2's class, which splits " 1" into " " and "1":
    # every MiniHouse action ("take plate 1 from sinkbasin 1") would then score as a sequence never trained on.
    from agents.models import load_tokenizer
    from agents.tiny import build_tiny_model, train_tokenizer

    corpus = ["You arrive at sinkbasin 1. On the sinkbasin 1, you see a plate 1.", "take plate 12 from cabinet 3"] * 50
    tokenizer = train_tokenizer(corpus, vocab_size=400)
    build_tiny_model(tokenizer).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    for text in ("take plate 1 from sinkbasin 1", "go to cabinet 12", "You arrive at sinkbasin 1."):
        assert (
            loaded(text, add_special_tokens=False)["input_ids"]
            == tokenizer(text, add_special_tokens=False)["input_ids"]
        )
    assert loaded.padding_side == "left" and loaded.eos_token == tokenizer.eos_token
