"""One rollout: every group plays its task to the end and each step becomes a buffer row.

Seeding makes a rollout a function of (seed, iteration) alone: task seeds are drawn for every group at once and
each rank plays its slice, and every action has its own random stream keyed by (seed, group, member, step), so
the rollout does not depend on batching or on how groups are spread over processes. Callbacks' ``locals`` hold
what SB3's on-policy loop shows them (``new_obs``, ``rewards``, ``dones``, ``infos``, ``actions``: None for a
member already done) plus ``n_active``, the env steps taken; their ``num_timesteps`` counts every step taken.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import Logger

from agents.buffer import GroupRolloutBuffer, Row
from agents.config import GAGPOConfig
from agents.distributed import Distributed
from agents.evaluation import check_reward, info_at
from agents.policy import LLMPolicy, Rollout
from wrappers import CHOOSE, GENERATE, GroupedVectorEnv, PromptBuilder

#: How a rollout group's members act (:meth:`RolloutCollector.role`); rollout/success_rate is the sampled ones'.
ROLES = ("sampled", "greedy", "expert")


def action_seed(seed: int, group: int, member: int, step: int) -> int:
    """The random stream of one action: a function of (seed, group id, member, step) alone."""
    return int(np.random.SeedSequence([seed, group, member, step]).generate_state(2, np.uint64)[0] >> 1)


def panel_action_seed(seed: int, task_seed: int, step: int) -> int:
    """The random stream of one action of an evaluation panel: a function of (seed, task seed, step) alone, apart
    from every training stream (its own spawn key), so evaluating never moves training's draws, and a task plays
    the same whatever panel, batch or worker count it is played in."""
    sequence = np.random.SeedSequence([seed, task_seed, step], spawn_key=(1,))
    return int(sequence.generate_state(2, np.uint64)[0] >> 1)


def iteration_sampler(seed: int, iteration: int) -> np.random.Generator:
    """Task seeds of iteration k come from (seed, k): reproducible, resumable, and unrelated across seeds."""
    return np.random.default_rng(int(np.random.SeedSequence([seed, iteration]).generate_state(1)[0]))


@dataclass
class RolloutStats:
    """What one rollout measured on this rank: time, tokens, invalid, unparsed and revisiting actions, episodes."""

    gen_s: float = 0.0
    env_s: float = 0.0
    tokens: int = 0
    invalid: int = 0  # summed over the finished episodes' records (info["episode"])
    unparsed: int = 0
    revisits: int = 0
    steps: int = 0  # env steps played, dropped groups' included
    episodes: list[dict[str, Any]] = field(default_factory=list)  # return, length, won of each finished episode
    rounds: int = 0  # rounds of num_groups tasks played (dynamic sampling: more than one)
    groups_played: int = 0  # every rank's, with dynamic sampling
    informative_groups: int = 0
    kept_groups: int = 0


class RolloutSummary(TypedDict):
    """One rollout over every rank (:meth:`RolloutCollector.log`): its finished episodes (return, length, won, group,
    role), the buffer's rows, seconds generating and stepping, and the invalid, unparsed, revisiting actions, the
    tokens scored and the env steps played."""

    episodes: list[dict[str, Any]]
    rows: int
    gen_s: float
    env_s: float
    invalid: int
    unparsed: int
    revisits: int
    tokens: int
    steps: int


class RolloutCollector:
    """Plays rollouts of this rank's groups into the buffer (SB3's ``collect_rollouts``, for grouped episodes)."""

    def __init__(
        self,
        env: GroupedVectorEnv,
        policy: LLMPolicy,
        prompts: PromptBuilder,
        buffer: GroupRolloutBuffer,
        config: GAGPOConfig,
        dist: Distributed,
        *,
        num_groups: int,
        env_id: str | None,
    ) -> None:
        self.env, self.policy, self.prompts, self.buffer, self.config, self.dist = (
            env, policy, prompts, buffer, config, dist
        )  # fmt: skip
        self.num_groups, self.env_id = num_groups, env_id  # num_groups: every rank's
        self.group_offset = dist.rank * env.num_groups  # global index of this rank's first group

    def group_id(self, iteration: int, local_group: int, round: int = 0) -> int:
        """A group's id in the buffer: unique across iterations, rounds (dynamic sampling) and ranks."""
        rounds = 1 + (self.config.max_extra_rounds if self.config.dynamic_sampling else 0)
        return (iteration * rounds + round) * self.num_groups + self.group_offset + local_group

    def collect(self, iteration: int, callback: BaseCallback, count: Callable[[int], None]) -> RolloutStats | None:
        """Play one rollout into the (reset) buffer; ``count(n)`` is told of every n env steps taken before the
        callbacks run. Returns None if a callback stopped training, else this rank's statistics.

        With ``dynamic_sampling`` a round of ``num_groups`` new tasks is played again while fewer than
        ``num_groups`` groups have a non-zero advantage (at most ``max_extra_rounds`` times); the first
        ``num_groups`` informative groups are kept (all of the first round's if none is)."""
        env, c = self.env, self.config
        self.buffer.reset()
        self.policy.eval()
        callback.on_rollout_start()
        stats = RolloutStats()
        sampler = iteration_sampler(c.seed, iteration)
        with self.dist.full_params():
            for round in range(1 + (c.max_extra_rounds if c.dynamic_sampling else 0)):
                task_seeds = env.draw_task_seeds(sampler, self.num_groups)
                mine = task_seeds[self.group_offset : self.group_offset + env.num_groups]
                if not self.play_round(iteration, round, mine, callback, count, stats):
                    return None
                stats.rounds = round + 1
                if not c.dynamic_sampling:
                    break
                flags = self.group_flags(stats)
                if stats.informative_groups >= self.num_groups:
                    break
            if c.dynamic_sampling:
                self.keep_informative(iteration, flags, stats)
        self.buffer.finalize(self.dist.sum if self.dist.enabled else None)
        return stats

    def group_flags(self, stats: RolloutStats) -> list[tuple[int, bool]]:
        """(group id, informative) of every rank's finished groups, in group order: every rank sees the same."""
        flags = [(g, self.buffer.informative(g)) for g in self.buffer.finished_groups]
        every = sorted(item for part in self.dist.gather(flags) for item in part)
        stats.groups_played, stats.informative_groups = len(every), sum(ok for _, ok in every)
        return every

    def keep_informative(self, iteration: int, flags: list[tuple[int, bool]], stats: RolloutStats) -> None:
        """Keep the first ``num_groups`` informative groups (the first round's groups if none is), drop the rest."""
        second_round = self.group_id(iteration, 0, 1) - self.group_offset  # every rank's round-1 ids start here
        informative = [g for g, ok in flags if ok]
        kept = set(informative[: self.num_groups]) or {g for g, _ in flags if g < second_round}
        self.buffer.keep_groups(kept)
        stats.kept_groups = len(kept)

    def play_round(self, iteration: int, round: int, task_seeds: np.ndarray, callback: BaseCallback,
                   count: Callable[[int], None], stats: RolloutStats) -> bool:  # fmt: skip
        """Every group of this rank plays its task (``task_seeds``) to the end; False if a callback stopped."""
        env = self.env
        obs, infos = env.reset(options={"task_seeds": task_seeds})
        if "history" not in infos:
            raise ValueError("the GroupedVectorEnv's sub-envs must be wrapped with wrappers.wrap_text_env")
        current = [info_at(infos, i) for i in range(env.num_envs)]
        for g in range(env.num_groups):
            members = np.flatnonzero(env.group_index == g)
            self.buffer.start_group(self.group_id(iteration, g, round), env.episode_index[members].tolist())
        lengths = np.zeros(env.num_envs, dtype=int)  # steps taken: the action seeds' and messages' step index
        # Each lane's actions are computed while the other lane's sub-envs step in their workers (pipeline); one
        # lane of every sub-env is the plain loop: act, step, record.
        flights: deque[tuple[np.ndarray, np.ndarray, Rollout, Any]] = deque()

        def launch(lane: np.ndarray) -> None:
            idx = lane[env.active[lane]]
            if idx.size:
                out = self.act(iteration, round, idx, obs, current, lengths, stats)
                flights.append((lane, idx, out, env.step_send(idx, list(out.texts))))

        for lane in env.lanes(2) if self.config.pipeline else [np.arange(env.num_envs)]:
            launch(lane)
        while flights:
            lane, idx, out, ticket = flights.popleft()
            t0 = time.perf_counter()
            obs, rewards, terminated, truncated, infos = env.step_receive(ticket)
            stats.env_s += time.perf_counter() - t0
            actions: list[Any] = [None] * env.num_envs
            for k, i in enumerate(idx):
                actions[i] = out.texts[k]
            if not self.record_step(iteration, round, idx, out, actions, current, lengths,
                                    (obs, rewards, terminated, truncated, infos), callback, count, stats):  # fmt: skip
                for *_, unfinished in flights:  # read what is in flight: no answer is left in a worker's pipe
                    env.step_receive(unfinished)
                return False
            launch(lane)
        return True

    def record_step(self, iteration: int, round: int, idx: np.ndarray, out: Rollout, actions: list[Any],
                    current: list[dict], lengths: np.ndarray, result: tuple, callback: BaseCallback,
                    count: Callable[[int], None], stats: RolloutStats) -> bool:  # fmt: skip
        """The rows of one step of the sub-envs ``idx`` (``result``: the vector env's answer), their finished
        episodes, and the callbacks' ``on_step``; False if a callback stopped training."""
        env = self.env
        obs, rewards, terminated, truncated, infos = result
        next_infos = {int(i): info_at(infos, i) for i in idx}
        for i in idx:
            task = repr(next_infos[i].get("task_id"))
            check_reward(rewards[i], self.env_id, task, lengths[i] + 1, actions[i])
        next_values = self.bootstrap_values(idx, obs, next_infos, truncated)
        for k, i in enumerate(idx):
            info = next_infos[i]
            done = bool(terminated[i] or truncated[i])
            self.buffer.add(
                self.row(iteration, round, i, k, out, current[i], info, float(rewards[i]), bool(terminated[i]),
                         done, next_values.get(int(i), 0.0))
            )  # fmt: skip
            lengths[i] += 1
            if done:  # every episode of a rollout ends: its record counts all of its steps
                episode = self.episode_record(info)
                stats.invalid += int(episode["invalid"])
                stats.unparsed += int(episode["unparsed"])
                stats.revisits += int(episode["revisits"])
                stats.episodes.append({
                    "return": float(episode["r"]), "length": int(episode["l"]), "won": bool(episode["won"]),
                    "group": self.buffer.rows[-1].group, "role": self.role(i),
                })  # fmt: skip
            current[i] = info
        stats.steps += len(idx)
        count(len(idx))
        # What SB3's on-policy loop offers callbacks: only the members stepped this time can be done.
        stepped = np.zeros(env.num_envs, dtype=bool)
        stepped[idx] = True
        dones = (np.asarray(terminated) | np.asarray(truncated)) & stepped
        callback.update_locals({
            "new_obs": obs, "rewards": rewards, "dones": dones, "infos": infos, "actions": actions,
            "n_active": len(idx),
        })  # fmt: skip
        return bool(callback.on_step())

    def act(self, iteration: int, round: int, idx: np.ndarray, obs, current: list[dict], lengths: np.ndarray,
            stats: RolloutStats) -> Rollout:  # fmt: skip
        """The policy's actions for the sub-envs ``idx``, each sampled with its own seed (:func:`action_seed`), or
        as its member's :meth:`role` says: the argmax, or the expert's command scored by the policy."""
        env, c = self.env, self.config
        if c.action_mode == CHOOSE:
            for i in idx:
                if not current[i].get("admissible_actions"):
                    raise ValueError(
                        f"{self.env_id}: task {current[i].get('task_id')!r} offers no admissible actions at "
                        f"step {lengths[i]}; choose mode picks among them (use action_mode={GENERATE!r})"
                    )
        t0 = time.perf_counter()
        prompts = [self.prompts.for_step(obs[i], current[i]) for i in idx]
        seeds = [
            action_seed(c.seed, self.group_id(iteration, int(env.group_index[i]), round), int(i) % env.group_size,
                        int(lengths[i]))
            for i in idx
        ]  # fmt: skip
        admissible = [current[i]["admissible_actions"] for i in idx]
        roles = [self.role(i) for i in idx]
        parts = []
        for role in ROLES:
            rows = [k for k, r in enumerate(roles) if r == role]
            if rows:
                choices = self.expert_choices([idx[k] for k in rows], [admissible[k] for k in rows]) \
                    if role == "expert" else None  # fmt: skip
                part = self.policy.act([prompts[k] for k in rows], [admissible[k] for k in rows],
                                       seeds=[seeds[k] for k in rows], deterministic=role == "greedy",
                                       choices=choices)  # fmt: skip
                parts.append((rows, part))
        out = parts[0][1] if len(parts) == 1 else Rollout.interleave(parts)
        stats.gen_s += time.perf_counter() - t0
        stats.tokens += out.scored_tokens
        return out

    def role(self, i: int) -> str:
        """How sub-env ``i`` acts: a group's first ``greedy_members`` members greedily, the next ``expert_members``
        as the env's expert, the rest by sampling."""
        member, c = int(i) % self.env.group_size, self.config
        if member < c.greedy_members:
            return "greedy"
        return "expert" if member < c.greedy_members + c.expert_members else "sampled"

    def expert_choices(self, sub_envs: list[int], admissible: list[list[str]]) -> list[int]:
        """The index, among its admissible actions, of the command each sub-env's expert plays next."""
        kind = self.config.expert
        try:
            commands = self.env.call("expert_action", *(() if kind == "oracle" else (kind,)), indices=sub_envs)
        except (AttributeError, NotImplementedError) as err:
            raise ValueError(f"{self.env_id} has no expert_action(): expert members play an env's expert") from err
        choices = []
        for command, actions in zip(commands, admissible):
            if command not in actions:
                raise ValueError(
                    f"{self.env_id}: the {kind} expert plays {command!r}, which is not among the admissible actions"
                )
            choices.append(actions.index(command))
        return choices

    def row(self, iteration: int, round: int, i: int, k: int, out: Rollout, before: dict, after: dict,
            reward: float, terminated: bool, done: bool, next_value: float) -> Row:  # fmt: skip
        """The buffer's row of sub-env ``i``'s step from the state of info ``before`` to ``after`` (``k``: its
        place in the policy's output)."""
        env = self.env
        return Row(
            group=self.group_id(iteration, int(env.group_index[i]), round),
            episode=int(env.episode_index[i]),
            prompt_ids=out.prompt_ids[k],
            rollout_logp=out.logp[k],
            reward=reward,
            state_key=before["state_key"],
            next_state_key=after["state_key"],
            terminated=terminated,
            done=done,
            won=bool(after.get("won", False)),
            response_ids=out.response_ids[k] if out.response_ids else [],
            candidate_ids=out.candidate_ids[k] if out.candidate_ids else [],
            chosen=out.chosen[k] if out.chosen else -1,
            value=out.values[k] if out.values else 0.0,
            next_value=next_value,
            backoff_keys=Row.keys_from(before, self.config.key_backoff),
            invalid=not (after.get("action_valid", True) and after.get("action_parsed", True)),
        )

    def episode_record(self, info: dict[str, Any]) -> dict[str, Any]:
        """``info["episode"]`` of a finished episode: :class:`~wrappers.EpisodeStatistics`' record (the outermost
        layer of :func:`~wrappers.wrap_text_env`); a sub-env without it raises one ValueError saying so."""
        episode = info.get("episode")
        if not episode or "invalid" not in episode:
            raise ValueError(
                f"{self.env_id}: a finished episode has no info['episode'] record of wrappers.EpisodeStatistics: the "
                "GroupedVectorEnv's sub-envs must be wrapped with wrappers.wrap_text_env (its outermost layer)"
            )
        return episode

    def bootstrap_values(self, idx, obs, infos, truncated) -> dict[int, float]:
        """V(s_T) of truncated final states, for the PPO baseline's GAE."""
        cut = [int(i) for i in idx if truncated[i]]
        if self.policy.value_head is None or not cut:
            return {}
        values = self.policy.values([self.prompts.for_step(obs[i], infos[i]) for i in cut])
        return dict(zip(cut, values))

    def log(self, logger: Logger, stats: RolloutStats) -> RolloutSummary:
        """Record the rollout's statistics over every rank's episodes and rows (advantage statistics: this rank's
        rows) and return its summary."""
        rows, dist = self.buffer.rows, self.dist
        a = self.buffer.advantages()
        episodes = stats.episodes
        counts = {
            "invalid": stats.invalid, "unparsed": stats.unparsed, "revisits": stats.revisits, "tokens": stats.tokens,
            "steps": stats.steps,
        }  # fmt: skip
        if dist.enabled:
            episodes = [e for part in dist.gather(episodes) for e in part]
            counts = dict(zip(counts, dist.sum(list(counts.values())).tolist()))
        n = int(dist.sum([len(rows)])[0])
        played = int(counts["steps"])  # every step played (dynamic sampling: the dropped groups' too)
        record = logger.record
        if self.config.dynamic_sampling:
            record("rollout/rounds", stats.rounds)
            record("rollout/groups_played", stats.groups_played)
            record("rollout/informative_group_share", stats.informative_groups / max(stats.groups_played, 1))
            record("rollout/groups_kept", stats.kept_groups)
            record("rollout/env_steps_played", played)
        sampled = [e["won"] for e in episodes if e["role"] == "sampled"]
        record("rollout/success_rate", float(np.mean(sampled)))  # the sampled members'
        for role, members in (("greedy", self.config.greedy_members), ("expert", self.config.expert_members)):
            if members:
                won = [e["won"] for e in episodes if e["role"] == role]
                record(f"rollout/{role}_success_rate", float(np.mean(won)))
        # Where the estimators find a contrast: groups with some win and some loss teach the most.
        won_by_group: dict[int, list[bool]] = {}
        for e in episodes:
            won_by_group.setdefault(e["group"], []).append(e["won"])
        record("rollout/groups_any_success", float(np.mean([any(w) for w in won_by_group.values()])))
        record("rollout/groups_all_success", float(np.mean([all(w) for w in won_by_group.values()])))
        record("rollout/ep_return_mean", float(np.mean([e["return"] for e in episodes])))
        record("rollout/ep_len_mean", float(np.mean([e["length"] for e in episodes])))
        record("rollout/invalid_rate", counts["invalid"] / max(played, 1))
        record("rollout/unparsed_rate", counts["unparsed"] / max(played, 1))
        record("rollout/revisit_rate", counts["revisits"] / max(played, 1))  # valid steps back to a visited state
        record("rollout/prompt_truncations", self.prompts.truncated_count)
        record("rollout/prompt_overflows", self.prompts.overflow_count)
        if a.size:  # a rank whose groups dynamic sampling dropped has no rows (its peers log theirs)
            record("advantage/mean", float(a.mean()))
            record("advantage/std", float(a.std()))
            q75, q25 = np.percentile(a, [75, 25])
            record("advantage/iqr", float(q75 - q25))
            record("advantage/share_abs_gt_1", float(np.mean(np.abs(a) > 1)))
            sets = self.buffer.key_stats()
            record("advantage/singleton_share", sets["singleton_row_share"])
            record("advantage/singleton_set_share", sets["singleton_set_share"])
            record("advantage/set_size_mean", sets["set_size_mean"])
            record("advantage/set_size_max", sets["set_size_max"])
            for level, share in enumerate(sets["level_shares"]):
                record(f"advantage/level_share_{level}", share)
        record("time/generate_s", stats.gen_s)
        record("time/env_s", stats.env_s)
        record("time/env_steps_per_s", played / max(stats.gen_s + stats.env_s, 1e-9))
        record("time/tokens_per_s", counts["tokens"] / max(stats.gen_s, 1e-9))
        return RolloutSummary(
            episodes=episodes, rows=n, gen_s=stats.gen_s, env_s=stats.env_s, invalid=int(counts["invalid"]),
            unparsed=int(counts["unparsed"]), revisits=int(counts["revisits"]), tokens=int(counts["tokens"]),
            steps=int(counts["steps"]),
        )  # fmt: skip
