"""Warm-start the tiny model on a noisy expert's transcripts of training tasks, then measure its greedy success.

    python scripts/warm_start.py --env gagpo_gym/Maze-v0 --env-kwargs '{"max_episode_steps": 30}' --out priors/maze
    python scripts/warm_start.py --env gagpo_gym/MiniHouse-v0 --env-kwargs '{"size": "small"}' --epsilon 0.2
    python scripts/warm_start.py --env gagpo_gym/MiniHouse-v0 --expert search --out priors/minihouse-search
    python scripts/warm_start.py --env gagpo_gym/MiniHouse-v0 --env-kwargs '{"size": "full"}' --task-pool 0 \
        --expert search --objective choice --memory --history-length 1 --no-show-admissible --episodes 800 \
        --epsilon 0.2 --epochs 12 --batch-size 16 --out priors/minihouse-full-memory
    python scripts/warm_start.py --env gagpo_gym/MiniHouse-v0 --env-kwargs '{"size": "full"}' --task-pool 0 \
        --model results/agents/minihouse-full-search --action-mode generate --expert search --episodes 800 \
        --epsilon 0.2 --epochs 2 --batch-size 16 --out priors/minihouse-full-search-generate

Training tasks are seeds ``0 .. task_pool - 1`` (``--task-pool 0``: a fresh task every episode); the held-out
panel is ``--heldout-tasks`` seeds from ``--heldout-offset`` on, never seen in training, and the teacher-forced
agreement with the expert per action kind is measured on the ``--agreement-tasks`` held-out seeds after them. The
folder written is what ``GAGPOAgent(env, model=<out>)`` and ``scripts/train.py --model <out>`` fine-tune (in the
prior's action mode, with its fine-tuning and prompt settings). ``--model`` goes on from a prior: the last example
teaches the committed full-house prior, which ranks commands, to write them as generate mode's tagged answer.
Progress bars (expert episodes, epochs with the running loss, the evaluation panels) go to stderr when it is a
terminal (``--progress`` / ``--no-progress`` to force them on or off).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from agents.cli import check_env_kwargs, fail, parse_json_kwargs, resolve_env_id
from agents.prior import HELDOUT_OFFSET, update_prior
from agents.reporting import markdown_table
from wrappers import ACTION_MODES, CHOOSE

ROOT = Path(__file__).resolve().parents[1]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Supervised warm start of the tiny model on noisy-expert transcripts (a language prior).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--env", required=True, help="registered env id with an expert, e.g. gagpo_gym/Maze-v0")
    parser.add_argument("--env-kwargs", default=None, help="env constructor arguments as JSON")
    parser.add_argument("--out", default=str(ROOT / "priors" / "prior"), help="folder for the warm-started model")
    parser.add_argument(
        "--model", default="tiny",
        help="'tiny' (a fresh tiny model) or a prior's folder to go on from (its prompt settings are the defaults)",
    )  # fmt: skip
    parser.add_argument(
        "--action-mode", choices=ACTION_MODES, default=CHOOSE,
        help="what the prior learns: to score the expert's command (choose) or to write it as the tagged answer "
        "(generate; the tokens objective)",
    )  # fmt: skip
    parser.add_argument("--episodes", type=int, default=400, help="noisy-expert episodes on training tasks")
    parser.add_argument("--epsilon", type=float, default=0.3, help="probability of a random admissible action")
    parser.add_argument(
        "--expert", choices=("oracle", "search", "sweep"), default="oracle",
        help="whose transcripts: the env's expert, or (MiniHouse) one that searches, knowing only what it has seen, "
        "or one that searches in a fixed cyclic order, remembering no place",
    )  # fmt: skip
    parser.add_argument("--epochs", type=int, default=10, help="passes over the transcripts")
    parser.add_argument("--learning-rate", type=float, default=1e-3, help="AdamW learning rate of the warm start")
    parser.add_argument("--batch-size", type=int, default=32, help="actions per optimiser step")
    parser.add_argument(
        "--task-pool", type=int, default=64, help="training tasks: seeds 0..N-1 (0: a fresh task every episode)"
    )
    parser.add_argument("--objective", choices=("tokens", "choice"), default="tokens", help="warm-start loss")
    parser.add_argument(
        "--show-admissible", action=argparse.BooleanOptionalAction, default=None,
        help="list the admissible actions in the prompt (unset: the --model prior's setting, else on)",
    )  # fmt: skip
    parser.add_argument(
        "--history-length", type=int, default=None,
        help="recent steps shown in the prompt (unset: the --model prior's setting, else 0)",
    )  # fmt: skip
    parser.add_argument(
        "--memory", action=argparse.BooleanOptionalAction, default=None,
        help="the prompt carries the episode's memory of places seen (wrappers.memory; unset: the --model prior's "
        "setting, else off)",
    )  # fmt: skip
    parser.add_argument("--tiny-hidden-size", type=int, default=64, help="width of the tiny model")
    parser.add_argument("--tiny-layers", type=int, default=2, help="decoder layers of the tiny model")
    parser.add_argument("--seed", type=int, default=0, help="model initialisation, task draws and noise")
    parser.add_argument("--heldout-tasks", type=int, default=100, help="held-out panel size (0: skip evaluation)")
    parser.add_argument("--heldout-offset", type=int, default=HELDOUT_OFFSET, help="first held-out task seed")
    parser.add_argument(
        "--agreement-tasks", type=int, default=40,
        help="held-out tasks on which the prior's greedy choice is compared with the expert's, who plays (0: skip)",
    )  # fmt: skip
    parser.add_argument("--torch-threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=argparse.SUPPRESS,  # neither flag: bars only when stderr is a terminal
        help="progress bars on stderr: on, or off (neither flag: only when stderr is a terminal)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.task_pool < 0 or args.heldout_tasks < 0:
        fail("--task-pool and --heldout-tasks must be >= 0")
    if args.heldout_tasks and args.heldout_offset < args.task_pool:
        fail(f"--heldout-offset ({args.heldout_offset}) must be >= --task-pool ({args.task_pool}): held-out tasks")
    env_id = resolve_env_id(args.env)
    env_kwargs = parse_json_kwargs(args.env_kwargs)
    check_env_kwargs(env_id, env_kwargs)

    from agents.callbacks import ProgressBar
    from agents.evaluation import panel_progress
    from agents.gagpo import GAGPOAgent
    from agents.warm_start import expert_agreement, warm_start

    # The prompt settings given; the rest come from the --model prior, or for a fresh tiny model these defaults.
    prompt = {"show_admissible": args.show_admissible, "history_length": args.history_length, "memory": args.memory}
    fresh = {"show_admissible": True, "history_length": 0, "memory": False}
    if args.model == "tiny":
        prompt = {k: fresh[k] if v is None else v for k, v in prompt.items()}
        prompt.update(tiny_hidden_size=args.tiny_hidden_size, tiny_layers=args.tiny_layers)
    try:
        warm_start(
            env_id, args.out, model=args.model, action_mode=args.action_mode, env_kwargs=env_kwargs,
            episodes=args.episodes, epsilon=args.epsilon, epochs=args.epochs, learning_rate=args.learning_rate,
            batch_size=args.batch_size, seed=args.seed, expert=args.expert, objective=args.objective,
            task_pool=args.task_pool, torch_threads=args.torch_threads, progress=getattr(args, "progress", None),
            **{k: v for k, v in prompt.items() if v is not None},
        )  # fmt: skip
    except ValueError as err:
        fail(str(err))
    if not args.heldout_tasks:
        return 0
    started = time.perf_counter()
    agent = GAGPOAgent(env_id, args.out, env_kwargs=env_kwargs, verbose=0, torch_threads=args.torch_threads)
    rows = []
    panels = [("training tasks", min(args.task_pool, 100), 0)] if args.task_pool else []  # 0: no fixed pool
    for name, n, offset in [*panels, ("held-out tasks", args.heldout_tasks, args.heldout_offset)]:
        bar = ProgressBar(n, f"evaluation: {name}", unit="task", enabled=getattr(args, "progress", None))
        with bar, panel_progress(bar.advance):
            m = agent.evaluate(n_tasks=n, seed_offset=offset, batch_size=50)
        rows.append({
            "panel": f"{name} (seeds {offset}..{offset + n - 1})", "greedy success": f"{m['success_rate']:.2f}",
            "mean length": f"{m['mean_length']:.1f}", "invalid rate": f"{m['invalid_rate']:.3f}",
            **{f"{t}": f"{v:.2f}" for t, v in sorted(m["per_type"].items())},
        })  # fmt: skip
    update_prior(args.out, evaluation=rows)
    print(f"\nGreedy evaluation of the prior ({time.perf_counter() - started:.0f}s):\n")
    print(markdown_table(rows))
    if args.agreement_tasks:
        offset = args.heldout_offset + args.heldout_tasks  # tasks the panel above did not play
        agreement = expert_agreement(agent, args.agreement_tasks, offset, args.expert)
        update_prior(args.out, agreement={"tasks": f"{offset}..{offset + args.agreement_tasks - 1}", **agreement})
        print(f"\nTeacher-forced agreement with the {args.expert} expert ({args.agreement_tasks} held-out tasks):\n")
        counts = {"all": sum(agreement["decisions"].values()), **agreement["decisions"]}
        shares = {"all": agreement["all"], **agreement["per_kind"]}
        print(markdown_table([{"action": k, "decisions": counts[k], "agreement": f"{shares[k]:.2f}"} for k in shares]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
