"""Run by tests/test_distributed.py: two GAGPO iterations, as one process or as one rank of a torchrun launch.

    python tests/distributed_worker.py OUT                  # 4 groups in one process
    torchrun --standalone --nproc_per_node 2 tests/distributed_worker.py OUT [--fsdp] [--generate] [--resume]
                                                                                  [--overlap]

The update runs with the default settings (several epochs, several minibatches of ``minibatch_size`` actions).
Each rank writes its rows' advantages keyed by (iteration, group, member, step) to OUT/rows_<rank>.json; the agent
after the second update is saved to OUT/agent (under FSDP: gathered from the shards). ``--resume`` also saves the
agent after the first update to OUT/mid, loads it in the same launch (under FSDP: resharded, the optimizer state
set from the saved full state), trains the second iteration again and saves that to OUT/resumed. ``--overlap``: the
update in a thread beside the next rollout (staleness 1: the second rollout is played by the first weights); under
a launch the same run is then made again with FSDP2 (``--overlap`` without ``--fsdp``: DDP first) into OUT/fsdp.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents import GAGPOAgent  # noqa: E402


def main(out: Path, fsdp: bool, generate: bool, resume: bool = False, overlap: bool = False) -> None:
    launched = train(out, fsdp, generate, resume, overlap)
    if overlap and launched and not fsdp:  # FSDP2 overlaps too: the acting copy loads whole weights gathered
        train(out / "fsdp", True, generate, False, True)


def train(out: Path, fsdp: bool, generate: bool, resume: bool, overlap: bool) -> bool:
    """One run (see the module's docstring); True under a launch."""
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
    return agent.dist.enabled


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
    flags = sys.argv[2:]
    main(Path(sys.argv[1]), "--fsdp" in flags, "--generate" in flags, "--resume" in flags, "--overlap" in flags)
