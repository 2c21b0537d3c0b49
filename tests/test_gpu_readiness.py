"""What the first GPU run depends on, checked on CPU: the LoRA weights a vLLM engine gets in bf16, and the
truncated importance weights that correct for a sampler that is not the trainer."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from agent_helpers import capture_logs, save_tiny_checkpoint
from stable_baselines3.common.callbacks import CallbackList

from agents import GAGPOAgent, GAGPOConfig
from agents.loss import clipped_policy_loss
from agents.models import add_lora, load_causal_lm
from agents.vllm_backend import checkpoint_weights

ENV = "gagpo_gym/FrozenLake-v0"
QUICK: dict[str, Any] = {
    "num_groups": 2, "group_size": 2, "minibatch_size": 8, "torch_threads": 1, "verbose": 0,
    "env_kwargs": {"max_episode_steps": 4},
}  # fmt: skip


@pytest.fixture(scope="module")
def base_folder(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("base") / "model", ENV, torch_threads=1, verbose=0)


def test_lora_sync_folds_the_adapter_in_fp32_and_never_writes_the_bf16_base(base_folder: Path) -> None:
    pytest.importorskip("peft")
    model = add_lora(load_causal_lm(base_folder, torch.bfloat16, torch.device("cpu")), r=4, alpha=8)
    with torch.no_grad():  # a trained adapter: deltas of ~1e-4 on weights of ~0.02, below bf16's step there
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 2e-4)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    assert all(p.dtype == torch.bfloat16 for p in frozen.values())
    for _ in range(50):
        with checkpoint_weights(model) as weights:
            synced = dict(weights)
    after = dict(model.named_parameters())
    assert all(torch.equal(frozen[n], after[n]) for n in frozen)  # the base (and so the KL reference) never moves
    # Each adapted weight arrives as W + B A * scaling, exactly, in fp32; every name is the plain checkpoint's.
    plain = load_causal_lm(base_folder, torch.float32, torch.device("cpu")).state_dict()
    assert synced.keys() == plain.keys()
    folded = 0
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            key = name.removeprefix("base_model.model.") + ".weight"
            expected = module.get_base_layer().weight.float() + module.get_delta_weight("default").float()
            assert synced[key].dtype == torch.float32 and torch.equal(synced[key], expected)
            # What a bf16 engine keeps is the delta rounded once, to nearest: not lost against the stored base.
            kept = synced[key].to(torch.bfloat16).float() - module.get_base_layer().weight.float()
            assert (kept != 0).float().mean() > 0.1
            folded += 1
    assert folded > 0


# ----- the sampler/trainer mismatch -----------------------------------------------------------------------------
def test_importance_weights_scale_each_action_term() -> None:
    logp = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]])
    old = logp - torch.tensor([[0.1, 0.1], [-0.2, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    advantages = torch.tensor([1.0, -2.0])
    weights = torch.tensor([0.5, 2.0])
    plain, _ = clipped_policy_loss(logp, old, mask, advantages, clip_low=0.2, clip_high=0.2)
    weighted, _ = clipped_policy_loss(logp, old, mask, advantages, clip_low=0.2, clip_high=0.2, weights=weights)
    rho = torch.exp(torch.tensor([0.1, -0.2]))
    terms = torch.minimum(rho * advantages, rho.clamp(0.8, 1.2) * advantages)
    assert torch.allclose(plain, -terms.mean()) and torch.allclose(weighted, -(weights * terms).mean())


def test_rollout_is_defaults_on_for_vllm_only() -> None:
    assert GAGPOConfig(backend="vllm").resolved(False).rollout_is == "on"
    assert GAGPOConfig().resolved(False).rollout_is == "off"
    assert GAGPOConfig(backend="vllm", rollout_is="off").resolved(False).rollout_is == "off"
    with pytest.raises(ValueError, match="rollout_is_cap must be >= 1"):
        GAGPOConfig(rollout_is_cap=0.5)


def test_a_sampler_that_disagrees_gets_truncated_importance_weights_and_a_warning() -> None:
    agent = GAGPOAgent(ENV, rollout_is="on", rollout_is_cap=2.0, tiny_hidden_size=32, **QUICK)
    callback = CallbackList([])
    callback.init_callback(agent)
    assert agent.collect_rollouts(callback)
    # As if another engine had sampled: its log-probs below the trainer's by 0.3 nats per token on even rows
    # (weight e^0.3) and by 2 on odd rows (e^2 > the cap of 2).
    shifts = [0.3 if k % 2 == 0 else 2.0 for k in range(len(agent.buffer.rows))]
    for r, shift in zip(agent.buffer.rows, shifts):
        r.rollout_logp = r.rollout_logp - shift
    plan = agent.update_plan()
    with pytest.warns(UserWarning, match="other weights than the trainer"):
        agent.recompute_log_probs(plan)
    weights = [r.is_weight for r in agent.buffer.rows]
    assert weights == pytest.approx([min(math.exp(s), 2.0) for s in shifts], rel=1e-5)
    assert agent.logger.name_to_value["rollout/is_truncated_share"] == pytest.approx(0.5, abs=0.2)
    agent.train(plan)  # the weighted loss trains


# ----- memory ---------------------------------------------------------------------------------------------------
def test_no_gradients_outlive_the_update_and_the_reference_is_read_in_the_compute_dtype(base_folder: Path) -> None:
    agent = GAGPOAgent(
        ENV, model=str(base_folder), action_mode="choose", kl_coef=0.05, ent_coef=0.05, dtype="bfloat16", **QUICK
    )
    logs = capture_logs(agent)
    agent.learn(8)
    assert logs.dumps[-1]["train/grad_norm"] > 0  # the update ran and had gradients
    assert all(p.grad is None for p in agent.policy.parameters())  # freed before the next rollout
    source = load_causal_lm(base_folder, torch.float32, torch.device("cpu")).state_dict()
    reference = agent.reference.state_dict()
    assert all(v.dtype == torch.bfloat16 for v in reference.values())
    assert all(torch.equal(reference[k], source[k].to(torch.bfloat16)) for k in source)
