"""Run by tests/test_distributed.py: each mode's two GAGPO iterations, as one process or as one rank of a torchrun
launch, every mode in one start (a start is most of a small run's time).

    python tests/distributed_worker.py OUT  # 4 groups in one process: OUT/plain, OUT/generate, OUT/overlap
    torchrun --standalone --nproc_per_node 2 tests/distributed_worker.py OUT  # 2 groups a rank:
        # OUT/ddp-overlap, OUT/fsdp-overlap, OUT/fsdp (and its resume), OUT/fsdp-generate

The update runs with the default settings (several epochs, several minibatches of ``minibatch_size`` actions).
Each rank writes its rows' advantages keyed by (iteration, group, member, step) to <run>/rows_<rank>.json; the agent
after the second update is saved to <run>/agent (under FSDP: gathered from the shards). ``fsdp`` also saves the
agent after the first update to <run>/mid, loads it in the same launch (resharded, the optimizer state set from the
saved full state), trains the second iteration again and saves that to <run>/resumed. The overlap runs put the
update in a thread beside the next rollout (staleness 1: the second rollout is played by the first weights), under
DDP (the wrapper, its all-reduce and the rollout's collectives on their own group) and under FSDP2 (each version's
weights gathered whole in the update thread for the acting copy).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents import GAGPOAgent  # noqa: E402
from agents.distributed import launched  # noqa: E402

# run: (fsdp, generate, resume, overlap); the one-process run each launch's run is compared with is the mode's
LAUNCH = {
    "ddp-overlap": (False, False, False, True),
    "fsdp-overlap": (True, False, False, True),
    "fsdp": (True, False, True, False),
    "fsdp-generate": (True, True, False, False),  # the first forward is the sampler's, through the inner model
}
ONE_PROCESS = {"plain": (False, False, False, False), "generate": (False, True, False, False),
               "overlap": (False, False, False, True)}  # fmt: skip


def reference(run: str) -> str:
    """The one-process run ``run`` (a launch's) is compared with."""
    return "overlap" if run.endswith("overlap") else "generate" if run.endswith("generate") else "plain"


def main(out: Path) -> None:
    for name, (fsdp, generate, resume, overlap) in (LAUNCH if launched() else ONE_PROCESS).items():
        train(out / name, fsdp, generate, resume, overlap)


def train(out: Path, fsdp: bool, generate: bool, resume: bool, overlap: bool) -> None:
    """One run (see the module's docstring)."""
    out.mkdir(parents=True, exist_ok=True)
    mode = {"action_mode": "generate", "max_new_tokens": 6} if generate else {}  # generate: the sampler runs first
    agent = GAGPOAgent(
        "gagpo_gym/FrozenLake-v0", num_groups=4, group_size=4, token_budget=2048, tiny_hidden_size=32,
        history_length=1, learning_rate=1e-2, ent_coef=0.01, normalize="batch", env_kwargs={"max_episode_steps": 8},
        torch_threads=1, verbose=0, seed=11, fsdp=fsdp, overlap=overlap, **mode,
    )  # fmt: skip
    if not agent.dist.enabled:  # the single process keeps its initial weights: how far the updates move them
        agent.policy.model.save_pretrained(out / "initial")
    rows: dict[str, float] = {}
    if overlap:  # one learn() of two iterations: the second rollout runs while the first update does
        from stable_baselines3.common.callbacks import BaseCallback

        class Rows(BaseCallback):
            def _on_step(self) -> bool:
                return True

            def _on_rollout_end(self) -> None:
                done = len({key.split("/")[0] for key in rows})  # rollouts recorded so far
                rows.update({f"{done}/{key}": a for key, a in advantages(agent).items()})

        agent.learn(10**9, max_iterations=2, callback=Rows())
    for iteration in range(0 if overlap else 2):  # the second rollout is played by the updated policy
        agent.learn(1, reset_num_timesteps=iteration == 0)
        rows |= {f"{iteration}/{key}": a for key, a in advantages(agent).items()}
        if resume and iteration == 0:
            agent.save(out / "mid")
    c = agent.config
    summary = {"rows": rows, "steps": agent.num_timesteps, "minibatch_size": c.minibatch_size, "n_epochs": c.n_epochs}
    (out / f"rows_{agent.dist.rank}.json").write_text(json.dumps(summary))
    agent.save(out / "agent")
    if resume:
        resumed = GAGPOAgent.load(out / "mid", verbose=0)
        resumed.learn(1, reset_num_timesteps=False)
        resumed.save(out / "resumed")


def advantages(agent: GAGPOAgent) -> dict[str, float]:
    """The last rollout's advantages keyed by (group, member, step)."""
    rows: dict[str, float] = {}
    members: dict[int, list[int]] = {}
    for r in agent.buffer.rows:
        members.setdefault(r.group, [])
        if r.episode not in members[r.group]:
            members[r.group].append(r.episode)
    steps: dict[tuple[int, int], int] = {}
    for r in agent.buffer.rows:
        member = sorted(members[r.group]).index(r.episode)
        t = steps.get((r.group, member), 0)
        steps[(r.group, member)] = t + 1
        rows[f"{r.group}/{member}/{t}"] = r.advantage
    return rows


if __name__ == "__main__":
    main(Path(sys.argv[1]))
