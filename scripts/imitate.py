"""Imitation of an env's expert on its own tasks (behaviour cloning), then DAgger rounds: a prior for RL.

    python scripts/imitate.py collect --env gagpo_gym/ALFWorld-v0 --env-kwargs '{"split": "train"}' \
        --expert handcoded --seeds 0:3453 --workers 2
    python scripts/imitate.py train --env gagpo_gym/ALFWorld-v0 --env-kwargs '{"split": "train"}' \
        --expert handcoded --seeds 0:3453 --memory --history-length 2 --tiny-hidden-size 128 --tiny-layers 4 \
        --epochs 4 --out priors/alfworld-bc
    python scripts/imitate.py dagger --env gagpo_gym/ALFWorld-v0 --env-kwargs '{"split": "train"}' \
        --expert handcoded --seeds 0:3453 --model priors/alfworld-bc --rounds 2 --episodes 200 \
        --out priors/alfworld-dagger

``collect`` plays the expert on the task seeds in worker processes and caches each episode as text under
``--cache`` (an ignored folder; a stopped collection resumes). ``train`` builds the prompts the agent will be shown
from the cached episodes (its history length, memory, admissible list) and trains the tiny model on the expert's
command at every step (choose mode: the softmax over the admissible commands; generate mode: the tagged answer's
tokens), then writes a prior folder that ``GAGPOAgent(env, model=<out>)`` and ``scripts/train.py --model`` fine-tune.
``dagger`` goes on from a prior: each round the policy plays ``--episodes`` tasks drawn from ``--seeds``, the expert
labels every state it reached, and the policy trains on the expert's episodes and every round's so far. ``--heldout``
seeds (never trained on) give the greedy success printed after training. A stopped ``train`` or ``dagger`` run,
started again with the same command, goes on from its last save (after every epoch and every
``--checkpoint-minutes`` within one; the state is kept in ``<out>/progress`` until the prior is written) and writes
the prior the uninterrupted run would have.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from agents.cli import check_env_kwargs, fail, parse_json_kwargs, resolve_env_id
from wrappers import ACTION_MODES, CHOOSE

ROOT = Path(__file__).resolve().parents[1]


def seed_range(text: str) -> range:
    """``"A:B"`` -> seeds A..B-1."""
    try:
        start, stop = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected START:STOP task seeds, got {text!r}") from None
    if not 0 <= start < stop:
        raise argparse.ArgumentTypeError(f"need 0 <= START < STOP, got {text!r}")
    return range(start, stop)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Behaviour cloning of an env's expert on cached demonstrations, then DAgger rounds.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("command", choices=("collect", "train", "dagger"))
    parser.add_argument("--env", required=True, help="registered env id with an expert")
    parser.add_argument("--env-kwargs", default=None, help="env constructor arguments as JSON")
    parser.add_argument("--expert", default=None, help="the expert's kind (ALFWorld: planner, handcoded)")
    parser.add_argument("--seeds", type=seed_range, required=True, help="training task seeds START:STOP")
    parser.add_argument("--cache", default=str(ROOT / ".cache" / "demonstrations"), help="demonstration cache")
    parser.add_argument("--workers", type=int, default=2, help="collect: expert processes")
    parser.add_argument("--out", default=None, help="train/dagger: the prior folder to write")
    parser.add_argument("--model", default="tiny", help="'tiny' or a prior folder to go on from")
    parser.add_argument("--action-mode", choices=ACTION_MODES, default=CHOOSE)
    parser.add_argument("--objective", choices=("tokens", "choice"), default="choice")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--history-length", type=int, default=None)
    parser.add_argument("--memory", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--show-admissible", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--max-prompt-tokens", type=int, default=None)
    parser.add_argument("--tiny-hidden-size", type=int, default=128)
    parser.add_argument("--tiny-layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2, help="dagger: rounds")
    parser.add_argument("--episodes", type=int, default=200, help="dagger: policy episodes per round")
    parser.add_argument("--beta", type=float, default=0.0, help="dagger: probability the expert's command is played")
    parser.add_argument("--heldout", type=seed_range, default=None, help="task seeds for the greedy success printed")
    parser.add_argument(
        "--save-agent", default=None,
        help="train/dagger: also save an agent built on the prior here, for playing (no optimizer state): what "
        "eval.py --agent evaluates and results/agents/ commits",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument(
        "--checkpoint-minutes", type=float, default=10.0,
        help="train/dagger: also save the run's state this often within an epoch (a stopped run resumes from it)",
    )  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    env_id = resolve_env_id(args.env)
    env_kwargs = parse_json_kwargs(args.env_kwargs)
    check_env_kwargs(env_id, env_kwargs)
    from agents.demonstrations import cache_folder, collect_demonstrations

    source = f"{args.expert or 'default'}-eps0"
    folder = cache_folder(args.cache, env_id, env_kwargs, source)
    if args.command == "collect":
        started = time.perf_counter()
        counts = collect_demonstrations(
            env_id, args.seeds, folder, env_kwargs=env_kwargs, expert=args.expert, workers=args.workers
        )
        print(f"{folder}: {json.dumps(counts)} ({time.perf_counter() - started:.0f}s)")
        return 0
    if args.out is None:
        fail(f"{args.command} needs --out")
    from agents.warm_start import imitate

    prompt = {
        "history_length": args.history_length, "memory": args.memory, "show_admissible": args.show_admissible,
        "max_prompt_tokens": args.max_prompt_tokens,
    }  # fmt: skip
    if args.model == "tiny":
        fresh = {"history_length": 2, "memory": True, "show_admissible": False, "max_prompt_tokens": 1024}
        prompt = {k: fresh[k] if v is None else v for k, v in prompt.items()}
        prompt.update(tiny_hidden_size=args.tiny_hidden_size, tiny_layers=args.tiny_layers)
    try:
        record = imitate(
            env_id, args.out, folder, args.seeds, model=args.model, env_kwargs=env_kwargs, expert=args.expert,
            action_mode=args.action_mode, objective=args.objective, epochs=args.epochs,
            learning_rate=args.learning_rate, batch_size=args.batch_size, seed=args.seed,
            dagger_rounds=args.rounds if args.command == "dagger" else 0, dagger_episodes=args.episodes,
            beta=args.beta, heldout=args.heldout, torch_threads=args.torch_threads,
            log=lambda line: print(line, flush=True), checkpoint_every_s=60 * args.checkpoint_minutes,
            **{k: v for k, v in prompt.items() if v is not None},
        )  # fmt: skip
    except (ValueError, FileNotFoundError) as err:
        fail(str(err))
    print(json.dumps({k: v for k, v in record.items() if k not in ("losses", "rounds")}, indent=1))
    if args.save_agent:
        from agents import checkpoint
        from agents.gagpo import GAGPOAgent

        agent = GAGPOAgent(env_id, args.out, env_kwargs=env_kwargs, verbose=0, torch_threads=args.torch_threads)
        agent.save(args.save_agent)
        checkpoint.drop_optimizer_state(Path(args.save_agent))
        agent.close()
        print(f"saved an agent on the prior at {args.save_agent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
