"""Policy throughput: packed choose-mode scoring (the prompt runs once) vs duplicated prompts, and generation.

Prompts and admissible actions come from real MiniHouse episodes (ALFWorld's grammar: 10-40 candidates per
state). Prints a Markdown table; both scoring paths must agree to 1e-4.
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import numpy as np
import torch

import gagpo_gym
from agents.policy import LLMPolicy
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


if __name__ == "__main__":
    main()
