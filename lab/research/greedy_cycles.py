"""How an agent's greedy episodes fail: how many end in a prompt cycle, and whether its history could show the cycle.

    python -m lab.research.greedy_cycles --model results/agents/minihouse-full-search \\
        --env-kwargs '{"size": "full"}'

Each model (a warm-start prior or a saved agent's folder) plays held-out tasks (seeds from ``--offset``) once each
with greedy actions, through ``predict`` in a plain Gymnasium loop. A greedy policy that meets a prompt it has seen
before in the same episode (the same observation, history window and memory line, and the same admissible commands to
choose from) makes the same choice again; where the house is back in the same state too, it goes round the same cycle
to the time limit. The report counts the failures that end so (every prompt from some step on equal to the one a
period before, for at least a whole period), by the cycle's period. A period up to ``history_length`` leaves the
looping command in the prompt's own history (a policy could learn not to repeat it); a longer one is invisible to the
prompt (its steps look alike: aliasing, which only memory removes). Two more counts say what else goes wrong: the
failures that took an object the task does not name (``take X ...`` with X's name nowhere in the task text), and the
share of steps that lead back to a state the episode was already in (where the env gives ``info["state_key"]``).
Where the env's ``house`` says how far its agent is towards a target (MiniHouse's ``House.target_stage``), the
failures are also counted by where they stopped: the search, opening, taking, or after the take.
``--agreement-tasks N`` adds each model's teacher-forced agreement with the env's ``--expert`` per action kind, on the
N tasks after the panel (``agents.warm_start.expert_agreement``): what RL did to the choices the expert makes.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agents.cli import fail, parse_json_kwargs
from agents.prior import HELDOUT_OFFSET
from agents.reporting import atomic_write_text, markdown_table
from wrappers import CHOOSE

#: Where a failure stopped, by the highest ``target_stage`` its episode reached.
STAGES = ("search", "open", "take", "after the take")


def final_cycle(keys: Sequence[Hashable]) -> tuple[int, int] | None:
    """``(start, period)`` of the cycle an episode ends in: from ``start`` to its last step every prompt key equals
    the one ``period`` steps before, for at least one whole period; the earliest such start (then the shortest
    period). None if the episode does not end repeating itself."""
    n, best = len(keys), None
    for period in range(1, n // 2 + 1):
        start = n
        while start - 1 >= period and keys[start - 1] == keys[start - 1 - period]:
            start -= 1
        if n - start >= period and (best is None or start < best[0]):
            best = (start, period)
    return best


def load_agent(model: str, env_id: str, env_kwargs: dict[str, Any]) -> Any:
    """A saved agent (folder or archive) loads as it was saved; anything else (a prior, ``tiny``) builds a fresh one."""
    from agents.checkpoint import AGENT_FILE
    from agents.gagpo import GAGPOAgent

    if (Path(model) / AGENT_FILE).is_file() or Path(model).is_file():
        return GAGPOAgent.load(model, verbose=0)
    return GAGPOAgent(env_id, model, env_kwargs=env_kwargs, verbose=0)


def play_greedy(agent: Any, env_id: str, env_kwargs: dict[str, Any], seeds: list[int], batch: int) -> list[dict]:
    """One greedy episode per task seed, ``batch`` envs at a time: success, length, commands and prompt cycle."""
    import gymnasium as gym

    from wrappers import PlaceMemory

    config = agent.config
    episodes = []
    for start in range(0, len(seeds), batch):
        chunk = seeds[start : start + batch]
        envs = [gym.make(env_id, **env_kwargs) for _ in chunk]
        obs, infos = (list(x) for x in zip(*(env.reset(seed=s) for env, s in zip(envs, chunk))))
        states: list[list] = [[] for _ in chunk]
        keys: list[list] = [[] for _ in chunk]
        commands: list[list[str]] = [[] for _ in chunk]
        confidence: list[list[float]] = [[] for _ in chunk]  # the greedy choice's probability at each step
        tasks = [str(info.get("task", "")) for info in infos]
        visited = [{info.get("state_key")} for info in infos]  # {None} where the env keys no state
        stages = [target_stage(env) for env in envs]
        revisits = [0] * len(chunk)
        won, done = [False] * len(chunk), [False] * len(chunk)
        while not all(done):
            live = [j for j in range(len(chunk)) if not done[j]]
            prompts = []
            for j in live:  # what the choice depends on: observation, history window, memory line, candidates
                window = states[j][-config.history_length :] if config.history_length else []
                memory = PlaceMemory.of([o for o, _ in states[j]] + [obs[j]]).render() if config.memory else ""
                keys[j].append((obs[j], json.dumps(window), memory, tuple(infos[j].get("admissible_actions", ()))))
                prompts.append(agent.prompts.for_step(obs[j], infos[j], window, memory, len(states[j])))
            actions, new_states = agent.predict(
                [obs[j] for j in live], [infos[j] for j in live], state=[states[j] for j in live], deterministic=True
            )
            scored = agent.policy.act(
                prompts, [list(infos[j].get("admissible_actions", [])) for j in live], seeds=[0] * len(live),
                deterministic=True,
            )  # fmt: skip
            if config.action_mode == CHOOSE and scored.texts != actions:
                raise RuntimeError("the prompts rebuilt here are not the ones predict() chose from")
            for j, logp in zip(live, scored.logp):
                confidence[j].append(float(np.exp(np.sum(logp))))
            for j, action, state in zip(live, actions, new_states):
                states[j] = state
                commands[j].append(action)
                obs[j], _, terminated, truncated, infos[j] = envs[j].step(action)
                key = infos[j].get("state_key")
                revisits[j] += key is not None and key in visited[j] and infos[j].get("action_valid", True)
                visited[j].add(key)
                if stages[j] is not None:
                    stages[j] = max(stages[j], target_stage(envs[j]))
                if terminated or truncated:
                    done[j], won[j] = True, bool(infos[j].get("won", False))
        for env in envs:
            env.close()
        for j, seed in enumerate(chunk):
            cycle = final_cycle(keys[j])
            episodes.append({
                "task": seed, "won": won[j], "length": len(keys[j]), "task_type": infos[j].get("task_type"),
                "task_text": tasks[j], "revisits": revisits[j] if None not in visited[j] else None,
                "cycle_start": cycle and cycle[0], "period": cycle and cycle[1], "stage": stages[j],
                "commands": commands[j], "confidence": [round(c, 4) for c in confidence[j]],
            })  # fmt: skip
    return episodes


def target_stage(env: Any) -> int | None:
    """How far the agent is towards a target (0 search, 1 open, 2 take, 3 after the take): the env's own
    ``target_stage()`` (ALFWorld's, from the engine's facts) or its house's (MiniHouse); None elsewhere."""
    own = getattr(env.unwrapped, "target_stage", None) or getattr(
        getattr(env.unwrapped, "house", None), "target_stage", None
    )
    return own() if own is not None else None


def took_unnamed(episode: dict) -> bool:
    """Whether the episode took an object the task does not name (``take apple 1 from ...``, no "apple" in the task)."""
    words = set(re.findall(r"[a-z]+", episode["task_text"].lower()))
    return any(c.split()[1] not in words for c in episode["commands"] if c.startswith("take ") and len(c.split()) > 1)


def took_back(episode: dict) -> bool:
    """Whether the episode took an object back from where its previous command had just moved it (``move X to R``
    then ``take X from R``): a step undone, as in a pick2 loop that lifts the first target out of the goal again."""
    for a, b in zip(episode["commands"], episode["commands"][1:]):
        moved, to, place = a.removeprefix("move ").partition(" to ")
        if a.startswith("move ") and to and b == f"take {moved} from {place}":
            return True
    return False


def summary(name: str, episodes: list[dict], history_length: int) -> dict[str, Any]:
    """One report row: greedy success and how the failures end."""
    failures = [e for e in episodes if not e["won"]]
    keyed = [e for e in episodes if e["revisits"] is not None]
    cycles = [e for e in failures if e["period"]]
    visible = sum(e["period"] <= history_length for e in cycles)
    periods = collections.Counter(e["period"] for e in cycles)
    # Where each failure's final cycle begins (its first pass round the loop); no cycle: the episode's end.
    loop = [e["cycle_start"] - e["period"] if e["period"] and not e["won"] else e["length"] for e in episodes]
    in_cycle = [c for e, k in zip(episodes, loop) for c in e["confidence"][k:]]
    elsewhere = [c for e, k in zip(episodes, loop) for c in e["confidence"][:k]]
    return {
        "model": name, "tasks": len(episodes), "greedy success": f"{1 - len(failures) / len(episodes):.2f}",
        "failures": len(failures), "ending in a prompt cycle": len(cycles),
        f"period <= {history_length} (in the history)": visible, "longer (aliased)": len(cycles) - visible,
        "period 2": sum(e["period"] == 2 for e in cycles),
        "cycle from step (mean)": f"{sum(e['cycle_start'] for e in cycles) / len(cycles):.1f}" if cycles else "-",
        "p(greedy) in cycles (median)": f"{np.median(in_cycle):.2f}" if in_cycle else "-",
        "p(greedy) elsewhere (median)": f"{np.median(elsewhere):.2f}" if elsewhere else "-",
        "periods (count)": ", ".join(f"{p} ({n})" for p, n in sorted(periods.items())),
        "took an object the task does not name": sum(map(took_unnamed, failures)),
        "steps back to a visited state": (
            f"{sum(e['revisits'] for e in keyed) / sum(e['length'] for e in keyed):.2f}" if keyed else "-"
        ),
        "took back what it had just put down": sum(map(took_back, failures)),
        "failures by task type": ", ".join(
            f"{t} {n}" for t, n in collections.Counter(e["task_type"] for e in failures).most_common()
        ),
        f"stopped at: {' / '.join(STAGES)}": (
            " / ".join(str(sum(e["stage"] == k for e in failures)) for k in range(len(STAGES)))
            if all(e.get("stage") is not None for e in failures) else "-"
        ),
    }  # fmt: skip


def agreement_columns(agent: Any, n_tasks: int, offset: int, expert: str) -> dict[str, str]:
    """Teacher-forced agreement with the expert, over all decisions and per action kind (most frequent first)."""
    from agents.warm_start import expert_agreement

    try:
        result = expert_agreement(agent, n_tasks, offset, expert)
    except ValueError as err:  # an expert kind the env does not have
        fail(str(err))
    kinds = [f"{k} {v:.2f} ({result['decisions'][k]})" for k, v in result["per_kind"].items()]
    return {"agreement (all)": f"{result['all']:.2f}", "agreement per kind": ", ".join(kinds)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", nargs="+", required=True, help="warm-start priors or saved agents' folders")
    parser.add_argument("--env", default="gagpo_gym/MiniHouse-v0")
    parser.add_argument("--env-kwargs", default=None, help="JSON of the env's constructor arguments")
    parser.add_argument("--tasks", type=int, default=100, help="held-out tasks to play")
    parser.add_argument("--offset", type=int, default=HELDOUT_OFFSET, help="the first task seed")
    parser.add_argument("--batch", type=int, default=20, help="envs played together")
    parser.add_argument("--out", default=None, help="also write the report (markdown) and episodes (.json) here")
    parser.add_argument(
        "--agreement-tasks", type=int, default=0, help="add the teacher-forced agreement with --expert on N more tasks"
    )
    parser.add_argument("--expert", default="search", help="the env's expert kind the agreement is measured with")
    args = parser.parse_args(argv)
    if args.tasks < 1 or args.batch < 1 or args.agreement_tasks < 0:
        fail("--tasks and --batch must be >= 1, --agreement-tasks >= 0")
    import torch

    torch.set_num_threads(1)
    env_kwargs = parse_json_kwargs(args.env_kwargs)
    seeds = list(range(args.offset, args.offset + args.tasks))
    agreement_offset = seeds[-1] + 1  # the tasks after the panel
    rows, played = [], {}
    for model in args.model:
        agent = load_agent(model, args.env, env_kwargs)
        episodes = play_greedy(agent, args.env, env_kwargs, seeds, args.batch)
        rows.append(summary(model, episodes, agent.config.history_length))
        if args.agreement_tasks:
            rows[-1].update(agreement_columns(agent, args.agreement_tasks, agreement_offset, args.expert))
        played[model] = episodes
    text = (
        f"# Greedy failures: {args.env} {env_kwargs}, tasks {seeds[0]}..{seeds[-1]}\n\n{markdown_table(rows)}\n\n"
        "Ending in a prompt cycle: from some step to the time limit, every prompt (observation, history window, "
        "memory line, admissible commands) is the one its period of steps before, for at least one whole period; "
        "a period up to the history length keeps the repeated command in the prompt's own history. Took an object "
        "the task does not name: failures with a `take X ...` command whose X is nowhere in the task text. Steps "
        "back to a visited state: valid steps whose state key (the env's `info['state_key']`) the episode already "
        "had, over all steps played. Took back what it had just put down: failures with a `move X to R` followed by "
        "`take X from R`. Stopped at (where the env says how far its agent got towards a target, as "
        "MiniHouse does): the failures that never stood where a target was (search), stood at a shut receptacle "
        "holding one but never saw it (open), saw one but never held it (take), or held one and still failed (after "
        "the take).\n"
    )
    if args.agreement_tasks:
        text += (
            f"Agreement: teacher-forced, the {args.expert} expert playing tasks {agreement_offset}.."
            f"{agreement_offset + args.agreement_tasks - 1}; each decision is the model's greedy choice at a state "
            "the expert reached, with the prompt the model would see there (decisions per kind in brackets).\n"
        )
    print(text)
    if args.out:
        atomic_write_text(Path(args.out), text)
        atomic_write_text(Path(args.out).with_suffix(".json"), json.dumps(played, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
