"""What a real model needs to train correctly, checked on a tiny checkpoint loaded through the pretrained path:
fp32 master weights under bf16 autocast, sampling that no generation_config.json reaches, on-policy ratios from
recomputed log-probs, the initial policy as KL reference after load(), gradient checkpointing in both action
modes, bounded memory when sampling and scoring, and no wasted forwards."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from agent_helpers import capture_logs, first_observations, save_tiny_checkpoint
from safetensors import safe_open

from agents import GAGPOAgent
from agents.config import CLIP_CHOOSE, CLIP_GENERATE, GAGPOConfig
from agents.generation import sample_responses
from agents.loss import k3_kl

ENV = "gagpo_gym/FrozenLake-v0"
SMALL: dict[str, Any] = {
    "num_groups": 2, "group_size": 3, "minibatch_size": 6, "torch_threads": 1, "verbose": 0, "history_length": 1,
    "env_kwargs": {"max_episode_steps": 3},
}  # fmt: skip


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A 'pretrained' checkpoint: the tiny model written with save_pretrained."""
    return save_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "model", ENV, **SMALL)


def moved_share(before: dict[str, torch.Tensor], model: torch.nn.Module) -> float:
    params = dict(model.named_parameters())
    changed = sum(int((params[n].detach().float() != b.float()).sum()) for n, b in before.items())
    return changed / sum(b.numel() for b in before.values())


# ----- 1. precision -------------------------------------------------------------------------------------
def test_bf16_compute_trains_fp32_master_weights_that_move_at_the_default_lr(checkpoint: Path, tmp_path) -> None:
    # Three steps rarely reach the goal, so the entropy bonus guarantees a gradient.
    agent = GAGPOAgent(ENV, model=str(checkpoint), dtype="bfloat16", action_mode="choose", ent_coef=0.01, **SMALL)
    assert agent.config.learning_rate == 1e-6  # the pretrained default
    assert agent.precision.compute_dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in agent.policy.parameters() if p.requires_grad)
    before = {n: p.detach().clone() for n, p in agent.policy.model.named_parameters()}
    logs = capture_logs(agent)
    agent.learn(1)
    assert logs.dumps[-1]["train/grad_norm"] > 0
    # bf16 weights moved 1.8% of their entries at lr 1e-6; fp32 master weights move (almost) all of them.
    assert moved_share(before, agent.policy.model) > 0.95
    # The checkpoint holds the fp32 weights, so resume is exact.
    agent.save(tmp_path / "a")
    with safe_open(str(tmp_path / "a" / "model" / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float32}  # noqa: SIM118 (a safetensors handle)
    loaded = GAGPOAgent.load(tmp_path / "a", verbose=0)
    for (name, p), q in zip(agent.policy.named_parameters(), loaded.policy.parameters()):
        assert q.dtype == torch.float32 and torch.equal(p, q), name


@pytest.mark.parametrize("mode", ["choose", "generate"])
def test_lora_adapters_are_fp32_on_a_frozen_bf16_base(checkpoint: Path, tmp_path: Path, mode: str) -> None:
    """With gradient checkpointing, in both action modes; a pretrained model's run of the same (SmolLM2, choose mode,
    its KL reference) is tests/test_smollm2.py's."""
    agent = GAGPOAgent(ENV, model=str(checkpoint), dtype="bfloat16", action_mode=mode, lora_r=4, ent_coef=0.01,
                       gradient_checkpointing=True, **SMALL)  # fmt: skip
    assert agent.policy.model.is_gradient_checkpointing
    named = dict(agent.policy.model.named_parameters())
    trainable = {n for n, p in named.items() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert all(named[n].dtype == torch.float32 for n in trainable)
    base = {n: p.detach().clone() for n, p in named.items() if n not in trainable}
    assert {p.dtype for p in base.values()} == {torch.bfloat16}
    lora_b = {n: p.detach().clone() for n, p in named.items() if "lora_B" in n}
    agent.learn(1)
    assert moved_share(lora_b, agent.policy.model) > 0.95
    assert all(torch.equal(named[n], b) for n, b in base.items())  # the frozen base (the KL reference) never moves
    obs, infos = first_observations(agent, agent.env.num_envs)
    expected = agent.predict(obs, infos, deterministic=True)
    agent.save(tmp_path / "agent")
    loaded = GAGPOAgent.load(tmp_path / "agent", verbose=0)
    assert loaded.predict(obs, infos, deterministic=True) == expected
    loaded_named = dict(loaded.policy.model.named_parameters())
    assert all(torch.equal(loaded_named[n], named[n]) for n in named)  # adapters fp32, base bf16, as trained


def test_dtype_and_device_are_checked() -> None:
    with pytest.raises(ValueError, match="dtype must be one of"):
        GAGPOConfig(dtype="float8")
    with pytest.raises(ValueError, match="dtype must be one of"):
        GAGPOConfig(dtype="float16")  # fp16 needs loss scaling: bf16 is the supported low precision
    for device in ("tpu", "cuda:x", "gpu", "cuda:-1", ""):
        with pytest.raises(ValueError, match="device must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'"):
            GAGPOConfig(device=device)
    for device in ("auto", "cpu", "cuda", "cuda:1", "mps"):
        assert GAGPOConfig(device=device).device == device


# ----- 2. sampling is the agent's alone -----------------------------------------------------------------
AGGRESSIVE = {
    "do_sample": False, "temperature": 0.05, "top_k": 1, "top_p": 0.1, "repetition_penalty": 5.0,
    "no_repeat_ngram_size": 1, "min_new_tokens": 5, "max_new_tokens": 2, "bad_words_ids": [[5], [6]],
    "suppress_tokens": [7, 8, 9], "begin_suppress_tokens": [10],
}  # fmt: skip


def test_generation_config_of_the_checkpoint_never_reaches_sampling(checkpoint: Path, tmp_path: Path) -> None:
    twin = tmp_path / "twin"
    twin.mkdir()
    for f in checkpoint.iterdir():
        (twin / f.name).write_bytes(f.read_bytes())
    config = json.loads((twin / "generation_config.json").read_text())
    (twin / "generation_config.json").write_text(json.dumps({**config, **AGGRESSIVE}))
    rollouts = []
    for folder in (checkpoint, twin):
        agent = GAGPOAgent(ENV, model=str(folder), max_new_tokens=12, seed=4, **SMALL)
        if folder == twin:
            assert agent.policy.model.generation_config.top_k == 1  # the file was read; it just has no say
        obs, infos = agent.env.reset(seed=1)
        prompts = [agent.prompts.for_step(obs[0], {k: v[0] for k, v in infos.items() if not k.startswith("_")})] * 8
        rollouts.append(agent.policy.act(prompts, [[]] * 8, rng=np.random.default_rng(0)))
    plain, aggressive = rollouts
    assert plain.response_ids == aggressive.response_ids
    assert max(len(r) for r in plain.response_ids) > 2  # max_new_tokens=2 of the file did not apply
    for a, b in zip(plain.logp, aggressive.logp):
        np.testing.assert_array_equal(a, b)
    assert len({tuple(r) for r in plain.response_ids}) > 1  # sampled at temperature 1, not greedy


def test_sampling_stops_on_every_eos_id_and_on_the_action_close_tag(checkpoint: Path) -> None:
    agent = GAGPOAgent(ENV, model=str(checkpoint), max_new_tokens=10, **SMALL)
    model, tok = agent.policy.model, agent.policy.tokenizer
    prompt = agent.policy.tokenizer("Task: walk", add_special_tokens=False)["input_ids"]
    kwargs = {"max_new_tokens": 10, "temperature": 1.0, "greedy": True}
    (free,), _ = sample_responses(model, tok, [prompt], stop_ids=[tok.eos_token_id], stop_texts=(), **kwargs)
    assert len(free) == 10 and tok.eos_token_id not in free
    # Another eos id (as Qwen's generation_config lists two) ends the response at its first occurrence.
    (cut,), (logp,) = sample_responses(
        model, tok, [prompt], stop_ids=[tok.eos_token_id, free[3]], stop_texts=(), **kwargs
    )
    assert cut == free[: free.index(free[3]) + 1] and len(logp) == len(cut)
    # A stop text ends the response once the decoded text contains it (here: the text of tokens 5..6).
    text = tok.decode(free[5:7])
    (cut,), _ = sample_responses(model, tok, [prompt], stop_ids=[tok.eos_token_id], stop_texts=(text,), **kwargs)
    assert text in tok.decode(cut) and text not in tok.decode(cut[:-1]) and len(cut) <= 7


# ----- 3. on-policy ratios and 7. no waste ----------------------------------------------------------------
@pytest.mark.parametrize("mode", ["choose", "generate"])
def test_first_minibatch_ratio_is_one_in_fp32(checkpoint: Path, mode: str) -> None:
    # A small token budget splits rollouts and minibatches into different micro-batches (other padding).
    config = {**SMALL, "minibatch_size": 4, "learning_rate": 1e-3, "kl_coef": 0.1, "ent_coef": 0.01}
    agent = GAGPOAgent(ENV, model=str(checkpoint), action_mode=mode, max_new_tokens=8, token_budget=400, **config)
    calls: list[str] = []
    evaluate_rows = agent.update.evaluate_rows

    def recorded(rows, core=None, **kwargs):
        kind = "reference" if core is agent.reference_core else ("update" if torch.is_grad_enabled() else "recompute")
        calls.append(kind)
        return evaluate_rows(rows, core, **kwargs)

    agent.update.evaluate_rows = recorded
    logs = capture_logs(agent)
    agent.learn(1)
    record = logs.dumps[-1]
    assert record["train/first_ratio_dev"] <= 1e-6
    assert record["train/kl"] > 0
    # The reference ran once per rollout micro-batch, not once per minibatch and epoch.
    assert 0 < calls.count("reference") == calls.count("recompute") < calls.count("update")
    assert len(agent.buffer.rows) > 4  # so there were several minibatches per epoch


def test_no_entropy_in_the_update_without_an_entropy_bonus(checkpoint: Path) -> None:
    agent = GAGPOAgent(ENV, model=str(checkpoint), action_mode="generate", max_new_tokens=4, **SMALL)
    asked: list[tuple[bool, bool]] = []  # (with gradients, entropy asked for)
    evaluate = agent.policy.actions.evaluate
    agent.policy.actions.evaluate = lambda *a: asked.append((torch.is_grad_enabled(), a[-1])) or evaluate(*a)
    logs = capture_logs(agent)
    agent.learn(1)
    assert all(entropy for grad, entropy in asked if not grad)  # logged once per rollout, without gradients
    assert any(grad for grad, _ in asked) and not any(entropy for grad, entropy in asked if grad)  # never in the graph
    assert "rollout/entropy" in logs.dumps[-1] and "train/entropy" not in logs.dumps[-1]


def test_k3_kl_is_clamped() -> None:
    logp = torch.tensor([[-0.1, -30.0]])
    ref = torch.tensor([[-40.0, -0.1]])
    kl = k3_kl(logp, ref, torch.ones_like(logp))
    assert torch.isfinite(kl).all() and float(kl) <= 10


def test_clip_defaults_follow_the_action_mode(checkpoint: Path) -> None:
    assert GAGPOConfig(action_mode="choose").resolved(False).clip_range_low == CLIP_CHOOSE[0]
    resolved = GAGPOConfig(action_mode="generate").resolved(False)
    assert (resolved.clip_range_low, resolved.clip_range_high) == CLIP_GENERATE
    assert GAGPOConfig(action_mode="generate", ratio="token").resolved(False).clip_range_low == CLIP_CHOOSE[0]
    assert GAGPOConfig(action_mode="generate", clip_range_low=0.1).resolved(False).clip_range_low == 0.1


# ----- 4. the KL reference is the initial policy, also after load() -------------------------------------
@pytest.mark.parametrize("source", ["tiny", "checkpoint"])
def test_kl_reference_is_the_initial_policy_after_load(checkpoint: Path, tmp_path: Path, source: str) -> None:
    model = "tiny" if source == "tiny" else str(checkpoint)
    extra = {"tiny_hidden_size": 32} if source == "tiny" else {"action_mode": "choose"}
    agent = GAGPOAgent(ENV, model=model, kl_coef=0.05, ent_coef=0.05, learning_rate=1e-2, **extra, **SMALL)
    initial = {n: p.detach().clone() for n, p in agent.reference.named_parameters()}
    agent.learn(12)
    trained = dict(agent.policy.model.named_parameters())
    assert any(not torch.equal(trained[n].float(), initial[n].float()) for n in initial)
    agent.save(tmp_path / "agent")
    loaded = GAGPOAgent.load(tmp_path / "agent", verbose=0)
    ref = dict(loaded.reference.named_parameters())
    assert all(torch.equal(ref[n], initial[n]) for n in initial)


# ----- 5. gradient checkpointing -------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["choose", "generate"])
def test_gradient_checkpointing_in_both_action_modes(checkpoint: Path, mode: str) -> None:
    # Three steps on the 4x4 lake never reach the goal (every advantage 0): the entropy bonus is the gradient.
    runs = []
    for gc in (False, True):
        agent = GAGPOAgent(ENV, model=str(checkpoint), action_mode=mode, gradient_checkpointing=gc, max_new_tokens=6,
                           learning_rate=1e-3, ent_coef=0.05, seed=2, **SMALL)  # fmt: skip
        assert agent.policy.model.is_gradient_checkpointing == gc
        before = [p.detach().clone() for p in agent.policy.parameters()]
        agent.learn(1)
        runs.append([p.detach().clone() for p in agent.policy.parameters()])
        assert max(float((a - b).abs().max()) for a, b in zip(before, runs[-1])) > 1e-4  # the update moved them
    for a, b in zip(*runs):  # checkpointing recomputes, it does not change the result
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


# ----- 6. memory ------------------------------------------------------------------------------------------
def test_choose_mode_scoring_respects_the_token_budget(checkpoint: Path) -> None:
    agent = GAGPOAgent(ENV, model=str(checkpoint), action_mode="choose", **SMALL)
    obs, infos = agent.env.reset(seed=0)
    rows = [{k: v[i] for k, v in infos.items() if not k.startswith("_")} for i in range(agent.env.num_envs)]
    prompts = [agent.prompts.for_step(o, i) + [5] * k for k, (o, i) in enumerate(zip(obs, rows))]  # all distinct
    admissible = [i["admissible_actions"] for i in rows]
    widths: list[int] = []
    hook = agent.policy.backbone().register_forward_hook(lambda *_: widths.append(1))
    whole = agent.policy.act(prompts, admissible, rng=np.random.default_rng(0))
    n_whole = len(widths)
    agent.policy.token_budget = max(len(p) for p in prompts) + 40
    split = agent.policy.act(prompts, admissible, rng=np.random.default_rng(0))
    hook.remove()
    assert n_whole == 1 and len(widths) - n_whole >= 3
    assert whole.chosen == split.chosen
    np.testing.assert_allclose(np.concatenate(whole.logp), np.concatenate(split.logp), atol=1e-5)


def test_epoch_default_follows_the_model() -> None:
    # The defaults sweep (results/learning/sokoban-defaults/report.md): 4 epochs suit the tiny model; an LLM keeps 2.
    assert GAGPOConfig().resolved(True).n_epochs == 4
    assert GAGPOConfig().resolved(False).n_epochs == 2
    assert GAGPOConfig(n_epochs=1).resolved(True).n_epochs == 1
    with pytest.raises(ValueError, match="n_epochs must be >= 0"):
        GAGPOConfig(n_epochs=-1)
