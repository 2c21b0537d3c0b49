"""Policy throughput: packed choose-mode scoring (the prompt runs once) vs duplicated prompts, and generation.

Prompts and admissible actions come from real MiniHouse episodes (ALFWorld's grammar: 10-40 candidates per
state). Prints a Markdown table; both scoring paths must agree to 1e-4.

``--backend vllm`` (the ``[vllm]`` extra) adds the vLLM rollout backend against HF generation on the same weights and
prompts: generated tokens/s at each ``--concurrency``, the weight-sync time, the largest gap between vLLM's
sampled-token log-probs and the trainer's, and choose-mode scoring through vLLM's ``prompt_logprobs`` against the
packed forward. ``--model`` takes a checkpoint folder (default: the tiny model with 2 heads, vLLM's CPU minimum).

    python -m lab.bench.policy --backend vllm --model .cache/smollm2-135m-instruct --concurrency 8 32 128
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import numpy as np
import torch

import gagpo_gym
from agents.generation import HFGenerationBackend
from agents.models import load_causal_lm, load_tokenizer
from agents.policy import LLMPolicy
from agents.precision import Precision
from agents.tiny import TinyModelSpec, build_tiny_model, collect_env_text, train_tokenizer
from wrappers import PromptBuilder


def sample_states(env_id: str, env_kwargs: dict, n: int, seed: int) -> list[tuple[str, dict]]:
    """(observation, info) pairs from random admissible walks."""
    env = gagpo_gym.make(env_id, **env_kwargs)
    rng = np.random.default_rng(seed)
    states: list[tuple[str, dict]] = []
    obs, info = env.reset(seed=seed)
    while len(states) < n:
        states.append((obs, info))
        obs, _, terminated, truncated, info = env.step(rng.choice(info["admissible_actions"]))
        if terminated or truncated:
            obs, info = env.reset()
    env.close()
    return states


def duplicated_scores(policy: LLMPolicy, prompts, candidates) -> list[torch.Tensor]:
    """Reference: one (prompt + candidate) sequence per candidate, the prompt recomputed every time."""
    flat_p = [p for p, cands in zip(prompts, candidates) for _ in cands]
    flat_c = [c for cands in candidates for c in cands]
    scorer = LLMPolicy(policy.model, policy.tokenizer, action_mode="generate")  # temperature 1: plain log-probs
    ev = scorer.evaluate(flat_p, responses=flat_c, entropy=False)
    return list((ev.logp * ev.mask).sum(-1).split([len(c) for c in candidates]))


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--env", default="gagpo_gym/MiniHouse-v0")
    parser.add_argument("--env-kwargs", default='{"size": "medium"}')
    parser.add_argument("--batch", type=int, default=16, help="prompts per forward")
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 256], help="tiny model widths to test")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backend", choices=["hf", "vllm"], default="hf", help="vllm: compare it with HF generation")
    parser.add_argument("--model", default=None, help="vllm comparison: a checkpoint folder (default: tiny, 2 heads)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32, 128], help="prompts per generate call")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    env_kwargs = json.loads(args.env_kwargs)
    tokenizer = train_tokenizer(collect_env_text(lambda: gagpo_gym.make(args.env, **env_kwargs), episodes=16))
    states = sample_states(args.env, env_kwargs, args.batch, seed=0)
    builder = PromptBuilder(tokenizer, "choose", max_prompt_tokens=2048)
    prompts = [builder.build(i["task"], [], o, i["admissible_actions"]) for o, i in states]
    n_cands = [len(i["admissible_actions"]) for _, i in states]
    mean_prompt = np.mean([len(p) for p in prompts])
    print(f"{args.env} {env_kwargs}: {args.batch} prompts, mean prompt {mean_prompt:.0f} tokens, "
          f"mean {np.mean(n_cands):.1f} candidates; torch threads {args.threads}\n")  # fmt: skip
    print("| model | packed (s) | duplicated prompts (s) | speed-up | max abs diff | generate tokens/s |")
    print("|---|---|---|---|---|---|")
    for hidden in args.hidden:
        spec = TinyModelSpec(
            hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=4 if hidden > 64 else 2
        )
        model = build_tiny_model(tokenizer, spec).eval()
        policy = LLMPolicy(model, tokenizer, action_mode="choose")
        candidates = [[policy.action_tokens(a) for a in i["admissible_actions"]] for _, i in states]
        with torch.no_grad():
            shared = policy.actions.score_candidates(prompts, candidates)[0]
            dup = duplicated_scores(policy, prompts, candidates)
            diff = max(float((a - b).abs().max()) for a, b in zip(shared, dup))
            t_shared = timed(functools.partial(policy.actions.score_candidates, prompts, candidates), args.repeats)
            t_dup = timed(functools.partial(duplicated_scores, policy, prompts, candidates), args.repeats)
            gen = LLMPolicy(model, tokenizer, action_mode="generate", max_new_tokens=32)
            t0 = time.perf_counter()
            out = gen.act(prompts, [], rng=np.random.default_rng(0))
            n_new = sum(len(r) for r in out.response_ids)
            gen_rate = n_new / (time.perf_counter() - t0)
        n_params = sum(p.numel() for p in model.parameters()) / 1e6
        print(f"| tiny Qwen2 h={hidden} ({n_params:.2f}M) | {t_shared:.3f} | {t_dup:.3f} | {t_dup / t_shared:.1f}x "
              f"| {diff:.1e} | {gen_rate:.0f} |")  # fmt: skip
    if args.backend == "vllm":
        compare_vllm(args, env_kwargs, tokenizer)


def compare_vllm(args: argparse.Namespace, env_kwargs: dict, tiny_tokenizer) -> None:
    """vLLM against HF generation on the same fp32 weights and prompts (one engine, reused at every concurrency)."""
    from agents.vllm_backend import VLLMGenerationBackend

    if args.model:
        tokenizer, model = load_tokenizer(args.model), load_causal_lm(args.model, torch.float32, torch.device("cpu"))
        name = args.model
    else:
        tokenizer = tiny_tokenizer
        model = build_tiny_model(tokenizer, TinyModelSpec(num_attention_heads=2, num_key_value_heads=1))
        name = "tiny Qwen2 h=64, 2 heads"
    model.eval()
    precision = Precision(torch.device("cpu"), torch.float32)
    states = sample_states(args.env, env_kwargs, max(args.concurrency), seed=1)
    builder = PromptBuilder(tokenizer, "generate", max_prompt_tokens=1024)
    prompts = [builder.build(i["task"], [], o, i["admissible_actions"]) for o, i in states]
    hf = HFGenerationBackend(model, tokenizer, precision)
    engine = VLLMGenerationBackend(model, tokenizer, precision, max_model_len=1024 + args.max_new_tokens)
    engine.generate(prompts[:2], max_new_tokens=4, temperature=1.0, greedy=False, seeds=[0, 1])  # first sync, warm-up
    syncs = []
    for _ in range(args.repeats):
        engine.release()
        engine.sync_weights(model)
        syncs.append(engine.last_sync_s)
    print(f"\n### vLLM backend vs HF generation: {name}, fp32, {args.max_new_tokens} new tokens max, temperature 1, "
          f"mean prompt {np.mean([len(p) for p in prompts]):.0f} tokens; torch threads {args.threads}\n")  # fmt: skip
    print(f"weight sync (reload_weights + prefix-cache reset): median {np.median(syncs):.3f}s of {args.repeats}\n")
    print("| concurrent prompts | HF tokens/s | vLLM tokens/s | speed-up | max abs log-prob gap (vLLM vs trainer) |")
    print("|---|---|---|---|---|")
    scorer = LLMPolicy(model, tokenizer, action_mode="generate")
    for n in args.concurrency:
        batch, seeds = prompts[:n], list(range(n))
        rates = {}
        for label, backend in (("hf", hf), ("vllm", engine)):
            t0 = time.perf_counter()
            responses, logps = backend.generate(
                batch, max_new_tokens=args.max_new_tokens, temperature=1.0, greedy=False, seeds=seeds
            )
            rates[label] = sum(map(len, responses)) / (time.perf_counter() - t0)
        with torch.no_grad():  # vLLM's last responses, scored by the trainer's forward
            trainer = scorer.evaluate(batch, responses=responses, entropy=False).logp.numpy()
        gap = max(float(np.abs(trainer[b, : len(lp)] - lp).max(initial=0.0)) for b, lp in enumerate(logps))
        print(f"| {n} | {rates['hf']:.0f} | {rates['vllm']:.0f} | {rates['vllm'] / rates['hf']:.1f}x | {gap:.1e} |")
    compare_vllm_choose(engine, model, tokenizer, states[:16], args.repeats)


def compare_vllm_choose(engine, model, tokenizer, states, repeats: int) -> None:
    """Choose mode's candidate scores: vLLM's prompt_logprobs (one request per candidate) vs the packed forward."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    policy = LLMPolicy(model, tokenizer, action_mode="choose", choose_score="sum")
    builder = PromptBuilder(tokenizer, "choose", max_prompt_tokens=1024)
    prompts = [builder.build(i["task"], [], o, i["admissible_actions"]) for o, i in states]
    candidates = [[policy.action_tokens(a) for a in i["admissible_actions"]] for _, i in states]
    requests = [TokensPrompt(prompt_token_ids=p + c) for p, cands in zip(prompts, candidates) for c in cands]
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, top_p=1.0, top_k=0)

    def vllm_scores() -> list[float]:
        outputs = engine.llm.generate(requests, params, use_tqdm=False)
        flat = [c for cands in candidates for c in cands]
        return [sum(step[t].logprob for step, t in zip(o.prompt_logprobs[-len(c) :], c)) for o, c in zip(outputs, flat)]

    with torch.no_grad():
        packed = torch.cat(policy.actions.score_candidates(prompts, candidates)[0]).numpy()
        diff = float(np.abs(np.array(vllm_scores()) - packed).max())
        t_packed = timed(functools.partial(policy.actions.score_candidates, prompts, candidates), repeats)
    t_vllm = timed(vllm_scores, repeats)
    print(
        f"\nchoose mode, {len(prompts)} states, {len(requests)} candidates: packed HF forward {t_packed:.3f}s, "
        f"vLLM prompt_logprobs {t_vllm:.3f}s ({t_vllm / t_packed:.1f}x the packed time), max abs diff {diff:.1e}"
    )


if __name__ == "__main__":
    main()
