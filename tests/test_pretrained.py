"""A pretrained checkpoint from a local folder: full fine-tuning, LoRA with the adapter-disabled KL reference,
generate mode, and save/load of both. The "pretrained" model is the tiny model written with save_pretrained, so
the real Hugging Face loading path runs without any download."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from agent_helpers import save_tiny_checkpoint

from agents import GAGPOAgent
from wrappers import GENERATE

ENV = "gagpo_gym/FrozenLake-v0"
SMALL = {"num_groups": 2, "group_size": 2, "minibatch_size": 8, "torch_threads": 1, "verbose": 0,
         "env_kwargs": {"max_episode_steps": 4}}  # fmt: skip


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "model", ENV, **SMALL)


def test_local_checkpoint_full_finetune_uses_generate_mode(checkpoint: Path) -> None:
    agent = GAGPOAgent(ENV, model=str(checkpoint), learning_rate=1e-4, max_new_tokens=4, **SMALL)
    assert agent.config.action_mode == GENERATE and agent.config.learning_rate == 1e-4
    before = [p.detach().clone() for p in agent.policy.model.parameters()]
    agent.learn(8)
    assert agent.num_timesteps >= 8
    assert any(not torch.equal(a, b) for a, b in zip(before, agent.policy.model.parameters()))


def test_lora_trains_only_the_adapter_with_kl_to_the_disabled_adapter(checkpoint: Path, tmp_path: Path) -> None:
    # Four steps never reach the goal, so every advantage is 0: the entropy bonus is what moves the adapter.
    agent = GAGPOAgent(
        ENV,
        model=str(checkpoint),
        action_mode="choose",
        lora_r=4,
        kl_coef=0.1,
        ent_coef=0.1,
        learning_rate=1e-2,
        **SMALL,
    )
    assert agent.reference is None  # the adapter-disabled model is the reference
    base = {n: p.detach().clone() for n, p in agent.policy.model.named_parameters() if "lora_" not in n}
    lora_before = {n: p.detach().clone() for n, p in agent.policy.model.named_parameters() if "lora_B" in n}
    records: list[dict] = []
    dump = agent.logger.dump
    agent.logger.dump = lambda step=0: (records.append(dict(agent.logger.name_to_value)), dump(step))
    agent.learn(16)
    params = dict(agent.policy.model.named_parameters())
    assert all(torch.equal(base[n], params[n]) for n in base)
    assert any(not torch.equal(lora_before[n], params[n]) for n in lora_before)
    assert records and all(r["train/kl"] > 0 for r in records)  # the adapter moved the policy off its base

    obs, info = agent.env.reset(seed=3)
    infos = [{k: v[i] for k, v in info.items() if not k.startswith("_")} for i in range(2)]
    expected = agent.predict(list(obs[:2]), infos, deterministic=True)
    agent.save(tmp_path / "lora")
    assert (tmp_path / "lora" / "model" / "adapter_model.safetensors").is_file()
    loaded = GAGPOAgent.load(tmp_path / "lora", verbose=0)
    assert loaded.config.lora_r == 4 and loaded.num_timesteps == agent.num_timesteps
    assert loaded.predict(list(obs[:2]), infos, deterministic=True) == expected


def test_tiny_model_refuses_lora() -> None:
    with pytest.raises(ValueError, match="lora_r > 0 needs a pretrained model"):
        GAGPOAgent(ENV, lora_r=4, **SMALL)
