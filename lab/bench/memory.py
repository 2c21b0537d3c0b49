"""Peak CPU memory of one rollout step with Qwen2.5's 151,936-token vocabulary, for any checkout of this repo.

    python lab/bench/memory.py                        # this checkout
    python lab/bench/memory.py --repo /tmp/old --repo .   # an older checkout against this one

One step is ``LLMPolicy.act`` on 64 prompts of about 200 tokens with a tiny random Qwen2 (hidden 64, 2 layers,
vocabulary 151,936) on CPU: (a) generate mode, 64 new tokens; (b) choose mode, 20 admissible actions per prompt.
With a vocabulary this size the model is small and the logits are what costs memory, which is what a real
model's rollout pays too. Each (checkout, mode) runs in a fresh subprocess with that checkout on ``PYTHONPATH``
(ahead of the installed package); the step's memory is the process's peak RSS (``ru_maxrss``) after the step minus
its RSS just before it, with the peak reset first (``/proc/self/clear_refs``) where the kernel allows it. Only the
API both old and new checkouts share is used: ``LLMPolicy(model, tokenizer, action_mode=..., max_new_tokens=...)``,
``act(prompts, admissible, rng=...)`` and ``agents.tiny.train_tokenizer``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MODES = ("generate", "choose")
OBJECTS = ["apple", "mug", "knife", "sponge", "potato", "fridge", "cabinet", "drawer", "countertop", "sinkbasin"]
VERBS = ["go to", "take", "open", "close", "examine", "clean", "heat", "cool", "put", "use"]


def rss_mib() -> float:
    """The process's resident set size now."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def reset_peak() -> bool:
    """Start the peak from the current RSS (Linux: clear_refs 5), so set-up cannot mask the step's own peak."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def run_case(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """One rollout step of ``mode`` in this process, with the agents package ``PYTHONPATH`` names (``--repo``)."""
    import numpy as np
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import agents
    from agents.policy import LLMPolicy
    from agents.tiny import train_tokenizer

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    actions = [f"{v} {o} {k}" for v in VERBS for o in OBJECTS for k in range(1, 4)]
    tokenizer = train_tokenizer([" | ".join(actions)] * 4 + [f"You see a {o} {k}." for o in OBJECTS for k in range(9)])
    config = Qwen2Config(
        vocab_size=args.vocab, hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    policy = LLMPolicy(model, tokenizer, action_mode=mode, max_new_tokens=args.new_tokens)
    low = len(tokenizer.all_special_ids)
    lengths = rng.integers(args.prompt_tokens - 10, args.prompt_tokens + 11, size=args.prompts)
    prompts = [rng.integers(low, len(tokenizer), size=n).tolist() for n in lengths]
    admissible = [list(rng.choice(actions, size=args.actions, replace=False)) for _ in prompts]
    candidate_tokens = [len(tokenizer(a, add_special_tokens=False)["input_ids"]) + 1 for a in actions]
    gc.collect()
    reset = reset_peak()
    before, peak_before = rss_mib(), peak_rss_mib()
    t0 = time.perf_counter()
    rollout = policy.act(prompts, admissible if mode == "choose" else [[] for _ in prompts], rng=rng)
    seconds = time.perf_counter() - t0
    return {
        "agents": str(Path(agents.__file__).parent),
        "mode": mode,
        "rss_before_mib": before,
        "peak_before_mib": peak_before,
        "step_peak_mib": peak_rss_mib() - before,
        "peak_reset": reset,
        "seconds": seconds,
        "new_tokens": sum(len(r) for r in rollout.response_ids),
        "candidate_tokens_max": max(candidate_tokens),
    }


def describe(repo: str) -> str:
    """The checkout's short commit (and ``+dirty`` when it has uncommitted changes)."""
    git = ["git", "-C", repo]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    return (commit or repo) + ("+dirty" if dirty.stdout.strip() else "")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", action="append", help="checkout whose agents/ to measure (repeatable; default: .)")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=200, help="mean prompt length (+-10)")
    parser.add_argument("--new-tokens", type=int, default=64, help="generate mode: tokens per response")
    parser.add_argument("--actions", type=int, default=20, help="choose mode: admissible actions per prompt")
    parser.add_argument("--vocab", type=int, default=151936, help="model vocabulary (Qwen2.5's by default)")
    parser.add_argument("--case", choices=MODES, help=argparse.SUPPRESS)  # internal: run one case, print JSON
    args = parser.parse_args(argv)
    if args.case is not None:
        print(json.dumps(run_case(args.case, args)))
        return
    options = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in ("prompts", "prompt_tokens", "new_tokens",
                                                                        "actions", "vocab")]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    print("| checkout | mode | step peak RSS (MiB) | RSS before (MiB) | seconds |")
    print("|---|---|---|---|---|")
    for repo in args.repo or [str(ROOT)]:
        for mode in MODES:
            proc = subprocess.run(
                [sys.executable, __file__, "--case", mode, "--repo", repo, *options],
                capture_output=True, text=True, env={**env, "PYTHONPATH": str(Path(repo).resolve())},
            )  # fmt: skip
            if proc.returncode != 0:
                print(f"| {describe(repo)} | {mode} | failed: {proc.stderr.strip().splitlines()[-1]} | | |")
                continue
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            if Path(r["agents"]) != Path(repo).resolve() / "agents":
                raise SystemExit(f"error: {repo}'s run imported {r['agents']}; is {repo} a checkout of this repo?")
            if not r["peak_reset"] and r["peak_before_mib"] > r["rss_before_mib"]:
                print(f"warning: peak RSS could not be reset; {mode} on {repo} is a lower bound", file=sys.stderr)
            print(f"| {describe(repo)} | {mode} | {r['step_peak_mib']:.0f} | "
                  f"{r['rss_before_mib']:.0f} | {r['seconds']:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
