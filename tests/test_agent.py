"""GAGPOAgent end to end on CPU with the tiny model: buffer, policy log-probs, loss, SB3 API, learning.

Most tests use ``Signs``, a small text env defined here: each task is a sequence of signposts, and the right
move at each step is the direction the current sign names. It is quick to play and a tiny model can learn it
in seconds, so the learning test can assert a wide margin over the random policy.
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from agent_helpers import capture_logs
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, CheckpointCallback, ProgressBarCallback

import gagpo_gym
from agents import GAGPOAgent, GAGPOConfig
from agents import advantages as adv
from agents.batching import candidate_tree, packed_width, padded_batches
from agents.buffer import GroupRolloutBuffer, Row
from agents.callbacks import IterationCheckpoint, PanelEvaluation
from agents.evaluation import info_at, run_panel
from agents.loss import clipped_policy_loss, k3_kl
from agents.policy import LLMPolicy
from gagpo_gym.core import TextEnv
from wrappers import GroupedVectorEnv, wrap_text_env

DIRECTIONS = ("north", "south", "east", "west")


class Signs(TextEnv):
    """Follow ``n_signs`` signposts; a wrong turn hits a wall (the state stays); the last one is the exit."""

    def __init__(self, n_signs: int = 3) -> None:
        super().__init__()
        self.n_signs = n_signs
        self.signs: list[str] = []
        self.k = 0

    def _new_task(self, seed: int | None, options: dict[str, Any]) -> str:
        self.signs = [DIRECTIONS[i] for i in self.np_random.integers(4, size=self.n_signs)]
        self.k = 0
        self.task, self.task_id = "Follow the signs to the exit.", "signs-" + "-".join(self.signs)
        return self._describe()

    def _describe(self) -> str:
        return f"Sign {self.k + 1} of {self.n_signs} points {self.signs[self.k]}."

    def _execute(self, command: str) -> tuple[str, float, bool]:
        if command != f"go {self.signs[self.k]}":
            return f"A wall blocks the way. {self._describe()}", 0.0, False
        self.k += 1
        if self.k == self.n_signs:
            self.won = True
            return "You found the exit!", 1.0, True
        return self._describe(), 0.0, False

    def admissible_actions(self) -> list[str]:
        return [f"go {d}" for d in DIRECTIONS]

    def state_string(self) -> str:
        return f"{self.task_id}|{self.k}"

    def expert_action(self) -> str:
        return f"go {self.signs[self.k]}"


SIGNS = gagpo_gym.register_text_env("TestSigns-v0", Signs, max_episode_steps=6)
SMALL = {
    "num_groups": 2,
    "group_size": 4,
    "tiny_hidden_size": 32,
    "history_length": 1,
    "minibatch_size": 16,
    "torch_threads": 1,
    "verbose": 0,
}


def wrap_signs(history_length: int = 1) -> gym.Env:
    """A Signs env wrapped as the agent wraps its envs in choose mode."""
    return wrap_text_env(gagpo_gym.make(SIGNS), history_length=history_length, tagged=False)


def make_agent(**overrides: Any) -> GAGPOAgent:
    return GAGPOAgent(SIGNS, **{**SMALL, **overrides})


def collect(agent: GAGPOAgent) -> list[Row]:
    """One rollout phase (no update), as learn() runs it."""
    callback = CallbackList([])
    callback.init_callback(agent)
    assert agent.collect_rollouts(callback)
    return agent.buffer.rows


def observations(n: int, seed: int = 0, history_length: int = 1) -> tuple[list[str], list[dict]]:
    """First observations (and infos) of n Signs tasks, wrapped as the agent wraps them."""
    env = wrap_signs(history_length)
    out = [env.reset(seed=seed + i) for i in range(n)]
    obs, infos = [o for o, _ in out], [i for _, i in out]
    # A second step gives prompts with history (and of another length).
    o, *_, i = env.step("go nowhere")
    return obs + [o], infos + [i]


@pytest.fixture(scope="module")
def agent() -> GAGPOAgent:
    return make_agent(seed=3)


# ----- the rollout buffer -------------------------------------------------------------------------------
# Two groups, staggered ends. Episode -> (group, [(state key, reward, terminated)] in time order).
EPISODES = {
    10: (0, [(1, 0.0, False), (2, 0.0, False), (3, 1.0, True)]),
    11: (0, [(1, 0.0, False), (2, 1.0, True)]),
    12: (0, [(1, -0.01, False), (1, 0.0, False), (4, 0.0, False), (4, 0.0, False)]),  # truncated at 4
    20: (1, [(7, -0.01, False), (8, 0.0, False)]),  # truncated
    21: (1, [(7, 0.0, False), (9, 0.0, False), (8, 0.0, False)]),  # truncated
}
NEXT_KEY_AFTER_TRUNCATION = {12: 4, 20: 9, 21: 5}


def staggered_rows() -> list[Row]:
    """Rows in vector-env order: at each step, every still-running episode adds one row."""
    rows, t = [], 0
    while any(t < len(steps) for _, steps in EPISODES.values()):
        for ep, (group, steps) in EPISODES.items():
            if t >= len(steps):
                continue
            key, reward, terminated = steps[t]
            last = t == len(steps) - 1
            next_key = NEXT_KEY_AFTER_TRUNCATION.get(ep, -1) if last else steps[t + 1][0]
            rows.append(
                Row(group=group, episode=ep, prompt_ids=[ep, t], rollout_logp=np.zeros(1), reward=reward,
                    state_key=key, next_state_key=next_key, terminated=terminated, done=last,
                    won=terminated and reward > 0)
            )  # fmt: skip
        t += 1
    return rows


def reference_advantages(config: GAGPOConfig, **kwargs: Any) -> dict[tuple[int, int], float]:
    """The estimator called directly on the rows laid out episode by episode -> {(episode, t): advantage}."""
    layout = [(ep, t, g, s) for ep, (g, steps) in sorted(EPISODES.items()) for t, s in enumerate(steps)]
    rewards = np.array([s[1] for *_, s in layout])
    episodes = np.array([ep for ep, *_ in layout])
    groups = np.array([g for _, _, g, _ in layout])
    keys = np.array([s[0] for *_, s in layout])
    terminated = np.array([s[2] for *_, s in layout])
    next_keys = np.array([
        EPISODES[ep][1][t + 1][0] if t + 1 < len(EPISODES[ep][1]) else NEXT_KEY_AFTER_TRUNCATION.get(ep, -1)
        for ep, t, _, _ in layout
    ])  # fmt: skip
    c = config
    if c.estimator == "gagpo":
        a = adv.gagpo_advantages(
            rewards, episodes, groups, keys, next_keys, terminated, gamma=c.gamma, lam=c.lam, eps=c.adv_eps,
            normalize=kwargs.get("normalize", c.normalize), bootstrap_truncated=c.bootstrap_truncated,
        )  # fmt: skip
    elif c.estimator == "gigpo":
        a = adv.gigpo_advantages(
            rewards, episodes, groups, keys, gamma=c.gamma, omega=c.omega, eps=c.adv_eps, std_norm=c.gigpo_std_norm
        )
    elif c.estimator == "grpo":
        a = adv.grpo_advantages(rewards, episodes, groups, eps=c.adv_eps)
    else:
        a = adv.rloo_advantages(rewards, episodes, groups)
    return {(ep, t): float(x) for (ep, t, _, _), x in zip(layout, a)}


@pytest.mark.parametrize("estimator", ["gagpo", "gigpo", "gigpo-std", "grpo", "rloo"])
def test_buffer_staggered_episode_ends(estimator: str) -> None:
    # Settings off their defaults, so that dropping one on the way to the estimator changes the advantages.
    config = GAGPOConfig(estimator=estimator.split("-")[0], lam=0.7, gamma=0.8, omega=0.6, adv_eps=0.05,
                         gigpo_std_norm=estimator == "gigpo-std")  # fmt: skip
    buffer = GroupRolloutBuffer(config)
    buffer.start_group(0, [10, 11, 12])
    buffer.start_group(1, [20, 21])
    rows = staggered_rows()
    last_row = {g: max(i for i, r in enumerate(rows) if r.group == g) for g in (0, 1)}
    assert last_row[1] < last_row[0]  # group 1 ends first, while group 0 still runs
    done_groups: list[int] = []
    for i, row in enumerate(rows):
        buffer.add(row)
        done_groups += [g for g, last in last_row.items() if i == last]
        assert buffer.finished_groups == done_groups
        for r in buffer.rows:  # advantages exist exactly for the finished groups
            assert math.isnan(r.advantage) == (r.group not in done_groups)
    assert buffer.complete and len(buffer) == len(rows) == sum(len(s) for _, s in EPISODES.values())
    # Rows keep their arrival order and ids.
    assert [(r.group, r.episode, r.prompt_ids) for r in buffer.rows] == [
        (r.group, r.episode, r.prompt_ids) for r in rows
    ]
    assert [r.prompt_ids[1] for r in buffer.rows if r.episode == 12] == [0, 1, 2, 3]
    expected = reference_advantages(config)
    got = {(r.episode, r.prompt_ids[1]): r.advantage for r in buffer.rows}
    assert got.keys() == expected.keys()
    for k in expected:
        assert got[k] == pytest.approx(expected[k], abs=1e-12), k
    assert any(abs(v) > 0.1 for v in got.values())
    buffer.finalize()  # per-group estimators: nothing left to do over the batch
    assert {(r.episode, r.prompt_ids[1]): r.advantage for r in buffer.rows} == got


@pytest.mark.parametrize(
    "settings", [{}, {"normalize": "none"}, {"normalize": "batch"}, {"estimator": "ppo"}, {"estimator": "gigpo"}]
)
def test_buffer_zero_failed_groups(settings: dict) -> None:
    """A group in which nothing succeeded gets exactly 0 in every mode; under batch normalisation (GAGPO's
    normalize="batch", the ppo estimator) it is left out of the batch's mean and std, so no shift reaches it."""
    plain, zeroed = (
        GroupRolloutBuffer(GAGPOConfig(**settings)),
        GroupRolloutBuffer(GAGPOConfig(zero_failed_groups=True, **settings)),
    )
    for buffer in (plain, zeroed):
        buffer.start_group(0, [10, 11, 12])
        buffer.start_group(1, [20, 21])
        for k, row in enumerate(staggered_rows()):
            row.value = 0.1 * (k % 3)  # the ppo estimator's critic
            buffer.add(row)
    raw = plain.advantages()
    in_failed = np.array([r.group == 1 for r in plain.rows])
    assert not any(r.won for r in plain.rows if r.group == 1) and any(r.won for r in plain.rows if r.group == 0)
    assert np.abs(raw[in_failed]).max() > 1e-3  # penalties alone give non-zero advantages there
    batch = settings.get("normalize") == "batch" or settings.get("estimator") == "ppo"
    plain.finalize()
    zeroed.finalize()
    a, z = plain.advantages(), zeroed.advantages()
    assert np.abs(z[in_failed]).max() == 0
    if batch:  # the succeeding groups are normalised among themselves
        kept = raw[~in_failed]
        expected = (kept - kept.mean()) / (kept.std(ddof=1) + GAGPOConfig().adv_eps)
        np.testing.assert_allclose(z[~in_failed], expected, atol=1e-12)
        assert np.abs(z[~in_failed] - a[~in_failed]).max() > 1e-3  # not the whole batch's statistics
    else:
        np.testing.assert_array_equal(z[~in_failed], a[~in_failed])


def test_buffer_batch_normalisation_reduced_over_ranks_equals_one_buffer() -> None:
    """finalize(reduce=...) as two ranks run it (each holds one group; reduce sums the moments of both) gives
    exactly the one-buffer normalisation, zeroed failed groups included."""
    import copy

    config = GAGPOConfig(normalize="batch", zero_failed_groups=True)
    rows = staggered_rows()
    whole, ranks = GroupRolloutBuffer(config), {0: GroupRolloutBuffer(config), 1: GroupRolloutBuffer(config)}
    for group, episodes in ((0, [10, 11, 12]), (1, [20, 21])):
        whole.start_group(group, episodes)
        ranks[group].start_group(group, episodes)
    for row in rows:
        whole.add(copy.copy(row))
        ranks[row.group].add(copy.copy(row))
    moments = {}
    for rank, buffer in ranks.items():  # what each rank hands to the all-reduce
        copy.deepcopy(buffer).finalize(lambda v, rank=rank: moments.setdefault(rank, np.asarray(v, dtype=float)))
    assert moments[1][0] == 0  # the failed group's rows are not counted
    for buffer in ranks.values():
        buffer.finalize(lambda v: moments[0] + moments[1])
    whole.finalize()
    expected = {(r.episode, r.prompt_ids[1]): r.advantage for r in whole.rows}
    got = {(r.episode, r.prompt_ids[1]): r.advantage for b in ranks.values() for r in b.rows}
    assert got.keys() == expected.keys() and max(abs(got[k] - expected[k]) for k in got) < 1e-12
    assert max(abs(v) for v in got.values()) > 0.5
    # Batches of one and two rows (one won step, then a lost one beside it): 0, then +-1/sqrt(2) either way.
    for rewards in ([1.0], [1.0, 0.0]):
        results = []
        for reduce in (None, lambda v: np.asarray(v, dtype=float)):
            buffer = GroupRolloutBuffer(config)
            buffer.start_group(0, list(range(len(rewards))))
            for ep, reward in enumerate(rewards):
                buffer.add(Row(group=0, episode=ep, prompt_ids=[ep, 0], rollout_logp=np.zeros(1), reward=reward,
                               state_key=1, next_state_key=2, terminated=True, done=True, won=reward > 0))  # fmt: skip
            buffer.finalize(reduce)
            results.append(buffer.advantages())
        np.testing.assert_allclose(results[0], results[1], atol=1e-12)
        expected = [0.0] if len(rewards) == 1 else [2**-0.5, -(2**-0.5)]
        np.testing.assert_allclose(results[1], expected, atol=1e-5)


def test_buffer_batch_normalisation() -> None:
    config = GAGPOConfig(normalize="batch", adv_eps=0.05)  # an eps that shows
    buffer = GroupRolloutBuffer(config)
    buffer.start_group(0, [10, 11, 12])
    buffer.start_group(1, [20, 21])
    for row in staggered_rows():
        buffer.add(row)
    raw = reference_advantages(config, normalize="none")
    got_raw = np.array([raw[(r.episode, r.prompt_ids[1])] for r in buffer.rows])
    np.testing.assert_allclose(buffer.advantages(), got_raw)  # unnormalised until finalize()
    buffer.finalize()
    expected = (got_raw - got_raw.mean()) / (got_raw.std(ddof=1) + config.adv_eps)
    np.testing.assert_allclose(buffer.advantages(), expected, atol=1e-12)
    assert buffer.advantages().mean() == pytest.approx(0, abs=1e-12)


def test_buffer_ppo_value_targets() -> None:
    config = GAGPOConfig(estimator="ppo", gae_lambda=0.9, gamma=0.8)
    buffer = GroupRolloutBuffer(config)
    buffer.start_group(0, [10, 11, 12])
    buffer.start_group(1, [20, 21])
    rows = staggered_rows()
    for i, row in enumerate(rows):
        row.value = 0.1 * (i % 5)
        row.next_value = 0.3 if row.done and not row.terminated else 0.0
        buffer.add(row)
    layout = sorted(range(len(rows)), key=lambda i: (rows[i].episode, rows[i].prompt_ids[1]))
    gae = adv.gae_advantages(
        np.array([rows[i].reward for i in layout]), np.array([rows[i].value for i in layout]),
        np.array([rows[i].episode for i in layout]), np.array([rows[i].terminated for i in layout]),
        last_values=np.array([rows[i].next_value for i in layout]), gamma=config.gamma, lam=0.9,
    )  # fmt: skip
    for k, i in enumerate(layout):
        assert rows[i].value_target == pytest.approx(gae[k] + rows[i].value)
        assert rows[i].advantage == pytest.approx(gae[k])
    buffer.finalize()  # the critic baseline normalises over the batch
    a = buffer.advantages()
    assert a.mean() == pytest.approx(0, abs=1e-12) and a.std(ddof=1) == pytest.approx(1, abs=1e-5)


def test_buffer_minibatches_cover_each_row_once_per_epoch_and_split_exactly_over_ranks() -> None:
    """The update's plan: every row once per epoch in ceil(rows / minibatch_size) nearly equal minibatches, drawn
    from the rng alone (not from the rows' arrival order); ranks holding some groups each get their part of the
    one-process minibatches."""

    def key(row: Row) -> tuple[int, int]:
        return row.episode, row.prompt_ids[1]

    def filled(groups: tuple[int, ...], rows: list[Row]) -> GroupRolloutBuffer:
        buffer = GroupRolloutBuffer(GAGPOConfig())
        for g in groups:
            buffer.start_group(g, sorted({r.episode for r in rows if r.group == g}))
        for row in rows:
            if row.group in groups:
                buffer.add(row)
        return buffer

    rows = staggered_rows()
    whole = filled((0, 1), rows)
    plan = [[[key(r) for r in mb] for mb in epoch] for epoch in whole.minibatches(np.random.default_rng(3), 3, 4)]
    assert len(plan) == 3 and all(len(epoch) == math.ceil(len(rows) / 4) for epoch in plan)
    for epoch in plan:
        assert sorted(k for mb in epoch for k in mb) == sorted(key(r) for r in rows)
        assert max(map(len, epoch)) - min(map(len, epoch)) <= 1
    assert plan[0] != plan[1]  # a new permutation every epoch
    assert len(whole.minibatches(np.random.default_rng(3), 1, len(rows) + 5)[0]) == 1  # one, not an empty one
    reordered = filled((0, 1), sorted(rows, key=lambda r: (-r.group, r.prompt_ids[1])))  # group 1's rows first
    assert [[[key(r) for r in mb] for mb in e] for e in reordered.minibatches(np.random.default_rng(3), 3, 4)] == plan
    # Two ranks, one group each: gather hands every rank both ranks' layouts (its own included), in rank order.
    ranks = {g: filled((g,), rows) for g in (0, 1)}
    layouts = {g: [(g, sum(r.group == g for r in rows))] for g in (0, 1)}

    def gather(obj, rank: int) -> list:
        assert obj == layouts[rank]
        return [layouts[0], layouts[1]]

    parts = {
        g: buffer.minibatches(np.random.default_rng(3), 3, 4, gather=lambda obj, g=g: gather(obj, g))
        for g, buffer in ranks.items()
    }
    for e, epoch in enumerate(plan):
        for m, minibatch in enumerate(epoch):
            assert sorted(key(r) for g in (0, 1) for r in parts[g][e][m]) == sorted(minibatch)
            assert all(r.group == g for g in (0, 1) for r in parts[g][e][m])


def test_buffer_rejects_inconsistent_use() -> None:
    buffer = GroupRolloutBuffer(GAGPOConfig())
    buffer.start_group(0, [1, 2])
    with pytest.raises(ValueError, match="already started"):
        buffer.start_group(0, [3])
    row = staggered_rows()[0]
    with pytest.raises(ValueError, match="episode 10 of group 0 is not running"):
        buffer.add(row)
    row.group = 5  # a group never started
    with pytest.raises(ValueError, match="episode 10 of group 5 is not running"):
        buffer.add(row)
    buffer.start_group(7, [30])
    buffer.add(Row(group=7, episode=30, prompt_ids=[30, 0], rollout_logp=np.zeros(1), reward=1.0, state_key=1,
                   next_state_key=2, terminated=True, done=True, won=True))  # fmt: skip
    with pytest.raises(ValueError, match="group 7 was already started"):  # finished, but still in this rollout
        buffer.start_group(7, [31])
    with pytest.raises(RuntimeError, match="still running"):
        buffer.finalize()


# ----- the policy's log-probs ---------------------------------------------------------------------------
def test_choose_mode_stored_log_probs_equal_recomputation(agent: GAGPOAgent) -> None:
    rows = collect(agent)
    assert len({len(r.prompt_ids) for r in rows}) > 1  # prompts of different lengths share batches
    with torch.no_grad():
        fresh = agent.update.evaluate_rows(rows).logp[:, 0].numpy()
    stored = np.array([r.rollout_logp[0] for r in rows])
    np.testing.assert_allclose(stored, fresh, atol=1e-4)
    # They are log-probs of a distribution over the admissible actions.
    r = rows[0]
    with torch.no_grad():
        every = [
            float(agent.policy.evaluate([r.prompt_ids], candidates=[r.candidate_ids], chosen=[k]).logp)
            for k in range(len(r.candidate_ids))
        ]
    assert sum(math.exp(x) for x in every) == pytest.approx(1.0, abs=1e-5)


def test_generate_mode_stored_log_probs_equal_recomputation() -> None:
    gen = make_agent(action_mode="generate", max_new_tokens=6, seed=1)
    rows = collect(gen)
    assert all(1 <= len(r.response_ids) <= 6 and len(r.rollout_logp) == len(r.response_ids) for r in rows)
    assert len({len(r.response_ids) for r in rows}) > 1 or len({len(r.prompt_ids) for r in rows}) > 1
    with torch.no_grad():
        ev = gen.update.evaluate_rows(rows)
    for k, r in enumerate(rows):
        n = len(r.response_ids)
        assert ev.mask[k].sum() == n
        np.testing.assert_allclose(r.rollout_logp, ev.logp[k, :n].numpy(), atol=1e-4)


def duplicated_scores(policy: LLMPolicy, prompt: list[int], candidates: list[list[int]]) -> list[float]:
    """Sequence log-prob of each candidate, running the model on prompt + candidate alone (no padding)."""
    out = []
    with torch.no_grad():
        for cand in candidates:
            logits = policy.model(torch.tensor([prompt + cand])).logits[0].float()
            logp = torch.log_softmax(logits, -1)
            out.append(sum(float(logp[len(prompt) - 1 + j, tok]) for j, tok in enumerate(cand)))
    return out


def test_choose_mode_packed_candidates_equal_duplicated_prompts(agent: GAGPOAgent) -> None:
    policy = agent.policy
    obs, infos = observations(3)
    prompts = [agent.prompts.for_step(o, i) for o, i in zip(obs, infos)]
    prompts.append(prompts[0][:11])  # a much shorter prompt in the same batch
    assert len({len(p) for p in prompts}) >= 3
    actions = [["go north", "go east"], ["go west", "go north", "go south"], ["go east"], ["go south", "go"]]
    actions = actions[: len(prompts) - 1] + [["go west", "go east"]]
    actions[1].append("go to the far far away exit")  # a candidate of another length
    actions[2] += ["go to cabinet 1", "go to cabinet 10", "go to cabinet 2", "go to the far far away exit"]
    candidates = [[policy.action_tokens(a) for a in acts] for acts in actions]
    tokens = [packed_width([], cands) for cands in candidates]
    assert tokens[2] < sum(map(len, candidates[2])) - 8  # "go to cabinet" and "go to the" are packed once
    assert len({len(c) for cands in candidates for c in cands}) >= 3
    with torch.no_grad():
        seq_logp, counts, _ = policy.actions.score_candidates(prompts, candidates)
    for p, cands, got, n in zip(prompts, candidates, seq_logp, counts):
        np.testing.assert_allclose(got.numpy(), duplicated_scores(policy, p, cands), atol=1e-4)
        assert n.tolist() == [len(c) for c in cands]
    # And evaluate() (the training path) agrees with the duplicated computation for a chosen candidate.
    with torch.no_grad():
        ev = policy.evaluate(prompts, candidates=candidates, chosen=[1, 2, 0, 1, 1][: len(prompts)])
    for k, (p, cands, c) in enumerate(zip(prompts, candidates, [1, 2, 0, 1, 1])):
        scores = np.array(duplicated_scores(policy, p, cands)) / np.array([len(x) for x in cands])  # mean
        log_pi = scores - np.logaddexp.reduce(scores)
        assert float(ev.logp[k, 0]) == pytest.approx(log_pi[c], abs=1e-4)


def test_candidate_tree_shares_prefixes_and_keeps_every_path() -> None:
    tokens, parents, paths = candidate_tree([[5, 6, 9], [5, 7, 9], [5, 6, 8, 9], [4, 9], [5, 6, 9]])
    assert tokens == [5, 6, 9, 7, 9, 8, 9, 4, 9]
    assert parents == [-1, 0, 1, 0, 3, 1, 5, -1, 7]
    assert paths == [[0, 1, 2], [0, 3, 4], [0, 1, 5, 6], [7, 8], [0, 1, 2]]  # a repeated candidate: the same path
    assert all(parents[n] < n for n in range(len(parents)))  # parents first: positions and masks in one pass
    assert packed_width([1, 2, 3], [[5, 6, 9], [5, 7, 9]]) == 3 + 5
    assert candidate_tree([]) == ([], [], [])


@pytest.mark.parametrize("score, temperature", [("sum", 1.0), ("mean", 1.0), ("sum", 0.5), ("mean", 2.0)])
def test_choose_score_sum_and_mean(agent: GAGPOAgent, score: str, temperature: float) -> None:
    base = agent.policy
    policy = LLMPolicy(base.model, base.tokenizer, action_mode="choose", choose_score=score, temperature=temperature)
    obs, infos = observations(2)
    prompt = agent.prompts.for_step(obs[0], infos[0])
    actions = ["go north", "go east", "go to the far far away exit"]
    cands = [policy.action_tokens(a) for a in actions]
    seq = np.array(duplicated_scores(policy, prompt, cands))
    lengths = np.array([len(c) for c in cands])
    s = (seq if score == "sum" else seq / lengths) / temperature
    expected = s - np.logaddexp.reduce(s)
    out = policy.act([prompt] * 40, [actions] * 40, rng=np.random.default_rng(0))
    for chosen, logp, text in zip(out.chosen, out.logp, out.texts):
        assert logp[0] == pytest.approx(expected[chosen], abs=1e-4)
        assert text == actions[chosen]
    assert len(set(out.chosen)) > 1  # sampled, not argmax
    # sum and mean really differ for candidates of different lengths
    other = seq / lengths if score == "sum" else seq
    assert not np.allclose(expected, other / temperature - np.logaddexp.reduce(other / temperature), atol=1e-3)


def test_deterministic_act_picks_the_argmax(agent: GAGPOAgent) -> None:
    policy = agent.policy
    obs, infos = observations(4)
    prompts = [agent.prompts.for_step(o, i) for o, i in zip(obs, infos)]
    admissible = [i["admissible_actions"] for i in infos]
    picks = [policy.act(prompts, admissible, rng=np.random.default_rng(s), deterministic=True) for s in (0, 1)]
    assert picks[0].chosen == picks[1].chosen
    for p, acts, chosen, text in zip(prompts, admissible, picks[0].chosen, picks[0].texts):
        scores = np.array(duplicated_scores(policy, p, [policy.action_tokens(a) for a in acts]))
        mean = scores / np.array([len(policy.action_tokens(a)) for a in acts])
        assert chosen == int(np.argmax(mean)) and text == acts[chosen]
    assert agent.predict(obs, infos, deterministic=True)[0] == picks[0].texts
    assert agent.predict(obs[0], infos[0], deterministic=True)[0] == picks[0].texts[0]  # one in, one out


# ----- the loss -----------------------------------------------------------------------------------------
# Four actions of 3, 1, 2 and 3 tokens. Per-token log-ratios chosen so that, with eps 0.2, row 0 is above
# 1 + eps with A > 0 (clipped), row 1 below 1 - eps with A > 0 (not clipped: min takes the smaller), row 2
# below 1 - eps with A < 0 (clipped), row 3 inside the range with A < 0.
LOG_RATIO = [[0.3, 0.2, 0.4], [-0.5, 9.0, 9.0], [-0.4, -0.2, 7.0], [0.05, -0.1, 0.02]]
MASK = [[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]]
ADV = [1.5, 2.0, -1.0, -0.5]


def loss_inputs() -> tuple[torch.Tensor, ...]:
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.0, -1.0], [-3.0, -0.1, -2.0], [-1.2, -0.9, -0.4]])
    logp = (old + torch.tensor(LOG_RATIO)).requires_grad_(True)
    return logp, old, torch.tensor(MASK, dtype=torch.float32), torch.tensor(ADV)


@pytest.mark.parametrize("clip_low, clip_high", [(0.2, 0.2), (0.1, 0.3)])  # asymmetric: the bounds are not swapped
def test_clipped_policy_loss_per_action_by_hand(clip_low: float, clip_high: float) -> None:
    logp, old, mask, advantage = loss_inputs()
    loss, info = clipped_policy_loss(logp, old, mask, advantage, clip_low=clip_low, clip_high=clip_high, ratio="action")
    terms, clipped, low, high = [], 0, 1 - clip_low, 1 + clip_high
    for lr, m, a in zip(LOG_RATIO, MASK, ADV):
        rho = math.exp(sum(x for x, keep in zip(lr, m) if keep) / sum(m))
        clipped += rho < low or rho > high
        terms.append(min(rho * a, min(max(rho, low), high) * a))
    assert float(loss.detach()) == pytest.approx(-sum(terms) / 4, abs=1e-6)
    assert float(info["clip_fraction"]) == pytest.approx(clipped / 4) and clipped == 3
    loss.backward()
    grad_rows = logp.grad.abs().sum(-1)
    assert grad_rows[0] == 0 and grad_rows[2] == 0  # clipped side of the min: no gradient
    assert grad_rows[1] > 0 and grad_rows[3] > 0
    assert torch.all(logp.grad[mask == 0] == 0)  # padding never matters
    # d loss / d logp of row 1, token 0 = -(1/4) * rho * A / n_tokens, n_tokens = 1
    assert float(logp.grad[1, 0]) == pytest.approx(-math.exp(-0.5) * 2.0 / 4, abs=1e-6)


def test_clipped_policy_loss_defaults_ratio_deviation_and_edges() -> None:
    logp, old, mask, advantage = loss_inputs()
    default, info = clipped_policy_loss(logp, old, mask, advantage)  # clip 0.2 / 0.2, one ratio per action
    explicit, _ = clipped_policy_loss(logp, old, mask, advantage, clip_low=0.2, clip_high=0.2, ratio="action")
    assert float(default.detach()) == float(explicit.detach())
    # The largest |ratio - 1|: per action, or per real token (the padding's log-ratio of 9 is not one).
    rhos = [math.exp(sum(x for x, keep in zip(lr, m) if keep) / sum(m)) for lr, m in zip(LOG_RATIO, MASK)]
    assert float(info["ratio_dev_max"]) == pytest.approx(max(abs(r - 1) for r in rhos), rel=1e-6)
    _, token = clipped_policy_loss(logp, old, mask, advantage, ratio="token")
    real = [math.exp(x) for lr, m in zip(LOG_RATIO, MASK) for x, keep in zip(lr, m) if keep]
    assert float(token["ratio_dev_max"]) == pytest.approx(max(abs(r - 1) for r in real), rel=1e-6)
    # A ratio exactly on the bound is not clipped (clip 0: the bound is 1, the on-policy ratio).
    for ratio in ("action", "token"):
        _, on_bound = clipped_policy_loss(old, old, mask, advantage, clip_low=0.0, clip_high=0.0, ratio=ratio)
        assert float(on_bound["clip_fraction"]) == 0.0 and float(on_bound["ratio_dev_max"]) == 0.0
    # One action of one token: every mean is over that one term.
    one = torch.tensor([[0.4]])
    loss, info = clipped_policy_loss(one, torch.zeros(1, 1), torch.ones(1, 1), torch.tensor([2.0]), ratio="token")
    assert float(loss) == pytest.approx(-1.2 * 2.0) and float(info["clip_fraction"]) == 1.0
    assert float(info["approx_kl"]) == pytest.approx(math.exp(0.4) - 1 - 0.4, rel=1e-6)


def test_clipped_policy_loss_per_token_by_hand() -> None:
    logp, old, mask, advantage = loss_inputs()
    loss, info = clipped_policy_loss(logp, old, mask, advantage, clip_low=0.1, clip_high=0.3, ratio="token")
    total, count, clipped = 0.0, 0, 0
    for lr, m, a in zip(LOG_RATIO, MASK, ADV):
        for x, keep in zip(lr, m):
            if keep:
                rho = math.exp(x)
                total += min(rho * a, min(max(rho, 0.9), 1.3) * a)
                clipped += rho < 0.9 or rho > 1.3
                count += 1
    assert float(loss.detach()) == pytest.approx(-total / count, abs=1e-6)
    assert float(info["clip_fraction"]) == pytest.approx(clipped / count)
    # approx_kl is the token-mean k3 of the log-ratio over real tokens
    k3 = [math.exp(x) - 1 - x for lr, m in zip(LOG_RATIO, MASK) for x, keep in zip(lr, m) if keep]
    assert float(info["approx_kl"]) == pytest.approx(sum(k3) / count, abs=1e-6)
    with pytest.raises(ValueError, match="ratio must be"):
        clipped_policy_loss(logp, old, mask, advantage, ratio="sequence")


def test_k3_kl_by_hand() -> None:
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -4.0, -4.0]])
    ref = torch.tensor([[-1.5, -1.0, -0.5], [-0.1, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    got = k3_kl(logp, ref, mask)

    def k3(lp: float, r: float) -> float:
        return math.exp(r - lp) - (r - lp) - 1

    assert got.tolist() == pytest.approx([(k3(-1, -1.5) + k3(-2, -1) + 0) / 3, k3(-0.3, -0.1)], abs=1e-6)
    assert torch.all(got >= 0) and float(k3_kl(logp, logp, mask).abs().max()) == 0
    # A token the policy gives probability 0 (log-prob -inf): the clamped log-ratio keeps the estimate finite.
    impossible = k3_kl(torch.tensor([[-float("inf"), -1.0]]), torch.tensor([[-1.0, -1.0]]), torch.ones(1, 2))
    assert float(impossible) == pytest.approx(10 / 2)


# ----- the agent: persistence, callbacks, reproducibility, errors, logging -------------------------------
def test_save_load_roundtrip(tmp_path: Path) -> None:
    agent = make_agent(seed=5, learning_rate=3e-3)
    agent.learn(40)
    path = tmp_path / "agent"
    agent.save(path)
    loaded = GAGPOAgent.load(path)
    assert loaded.num_timesteps == agent.num_timesteps > 0 and loaded.iteration == agent.iteration
    assert loaded.config == agent.config
    obs, infos = observations(6)
    assert loaded.predict(obs, infos, deterministic=True) == agent.predict(obs, infos, deterministic=True)
    prompts = [agent.prompts.for_step(o, i) for o, i in zip(obs, infos)]
    admissible = [i["admissible_actions"] for i in infos]
    a = agent.policy.act(prompts, admissible, rng=np.random.default_rng(0))
    b = loaded.policy.act(prompts, admissible, rng=np.random.default_rng(0))
    assert a.chosen == b.chosen
    np.testing.assert_allclose(np.concatenate(a.logp), np.concatenate(b.logp), atol=1e-6)
    for (name, p), q in zip(agent.policy.named_parameters(), loaded.policy.parameters()):
        assert torch.equal(p, q), name
    # The optimizer state is plain tensors (weights_only) and comes back as it was.
    state = torch.load(path / "optimizer.pt", weights_only=True)
    assert (
        state["state"] and loaded.optimizer.state_dict()["param_groups"] == agent.optimizer.state_dict()["param_groups"]
    )
    for k, s in agent.optimizer.state_dict()["state"].items():
        for name, value in s.items():
            assert torch.equal(loaded.optimizer.state_dict()["state"][k][name], value), (k, name)
    # Training resumes the step count.
    before = loaded.num_timesteps
    loaded.learn(10, reset_num_timesteps=False)
    assert loaded.num_timesteps >= before + 10


def test_load_missing_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=re.escape(f"no saved agent at {tmp_path / 'nope'}")):
        GAGPOAgent.load(tmp_path / "nope")


class Recorder(BaseCallback):
    """Records SB3's callback events in order."""

    def __init__(self, stop_at: int | None = None) -> None:
        super().__init__()
        self.events: list[str] = []
        self.timesteps: list[int] = []
        self.stop_at = stop_at

    def _on_training_start(self) -> None:
        self.events.append("training_start")

    def _on_rollout_start(self) -> None:
        self.events.append("rollout_start")

    def _on_step(self) -> bool:
        self.events.append("step")
        self.timesteps.append(self.num_timesteps)
        return self.stop_at is None or self.n_calls < self.stop_at

    def _on_rollout_end(self) -> None:
        self.events.append("rollout_end")

    def _on_training_end(self) -> None:
        self.events.append("training_end")


def squeeze(events: list[str]) -> list[str]:
    return [e for i, e in enumerate(events) if i == 0 or e != events[i - 1]]


def test_callbacks_fire_in_order(agent: GAGPOAgent) -> None:
    first, second = Recorder(), Recorder()
    agent.learn(60, callback=[first, second])  # an iteration takes 24..48 steps: two or three iterations
    assert agent.iteration >= 2
    expected = ["training_start"] + ["rollout_start", "step", "rollout_end"] * agent.iteration + ["training_end"]
    for recorder in (first, second):
        assert squeeze(recorder.events) == expected
        assert recorder.model is agent and recorder.training_env is agent.get_env()
        assert recorder.n_calls == recorder.events.count("step")
        assert recorder.timesteps == sorted(set(recorder.timesteps)) and recorder.timesteps[-1] == agent.num_timesteps


def test_callback_returning_false_stops_training() -> None:
    agent = make_agent(seed=2)
    before = [p.detach().clone() for p in agent.policy.parameters()]
    recorder = Recorder(stop_at=2)
    agent.learn(10_000, callback=recorder)
    assert squeeze(recorder.events) == ["training_start", "rollout_start", "step", "training_end"]
    assert recorder.events.count("step") == 2
    assert agent.num_timesteps == 2 * agent.env.num_envs  # Signs takes >= 3 steps: all members still active
    assert agent.iteration == 0
    assert all(torch.equal(p, q) for p, q in zip(before, agent.policy.parameters()))  # no update happened


def test_sb3_checkpoint_callback_saves_the_last_iteration_boundary(tmp_path: Path) -> None:
    agent = make_agent(seed=4)
    boundaries: list[int] = []
    train = agent.train
    agent.train = lambda plan: (train(plan), boundaries.append(agent.num_timesteps))
    callback = CheckpointCallback(save_freq=4, save_path=str(tmp_path), name_prefix="ck", save_vecnormalize=True)
    agent.learn(30, callback=callback)
    saved = sorted(tmp_path.glob("ck_*_steps.zip"), key=lambda p: int(p.name.split("_")[1]))
    assert saved and all(p.is_file() for p in saved)  # real zip files, as SB3 names them
    for path in (saved[0], saved[-1]):
        loaded = GAGPOAgent.load(path, verbose=0)
        # Saved mid-rollout, it holds the last trained state: steps at an iteration boundary, never more.
        assert loaded.num_timesteps in [0, *boundaries] and loaded.num_timesteps <= int(path.name.split("_")[1])
        assert loaded.config == agent.config


def test_iteration_checkpoint_names_the_steps_it_holds(tmp_path: Path) -> None:
    agent = make_agent(seed=4)
    agent.learn(60, callback=IterationCheckpoint(save_freq=10, save_path=str(tmp_path), name_prefix="it"))
    saved = sorted(tmp_path.glob("it_*_steps"), key=lambda p: int(p.name.split("_")[1]))
    assert len(saved) >= 2 and saved[-1].name == f"it_{agent.num_timesteps}_steps"
    for path in saved:
        assert GAGPOAgent.load(path, verbose=0).num_timesteps == int(path.name.split("_")[1])


TINY_MAZE = {"width": 3, "height": 3, "rooms": 0, "loops": 1, "min_path": 2, "max_path": 3, "max_episode_steps": 10}


def tiny_maze_agent(**overrides: Any) -> GAGPOAgent:
    config = {"num_groups": 2, "group_size": 2, "tiny_hidden_size": 32, "history_length": 0, "torch_threads": 1}
    return GAGPOAgent("gagpo_gym/Maze-v0", env_kwargs=TINY_MAZE, verbose=0, **{**config, **overrides})


def test_panel_evaluation_runs_at_the_first_boundary_past_each_multiple_once() -> None:
    with pytest.raises(ValueError, match="unknown evaluate"):
        PanelEvaluation(10, 2, extra_panels={"train": {"tasks": 2}})
    agent = tiny_maze_agent(seed=1)
    logs = capture_logs(agent)
    boundaries: list[int] = []
    train = agent.train
    agent.train = lambda plan: (train(plan), boundaries.append(agent.num_timesteps))
    freq, total = 10, 50
    evaluation = PanelEvaluation(freq, 2, batch_size=2)
    agent.learn(total, callback=evaluation)
    # Expected from the boundaries alone: the start, the first boundary at or past each multiple, the end.
    past = [min(b for b in boundaries if b >= k * freq) for k in range(1, boundaries[-1] // freq + 1)]
    expected = sorted({0, *past, boundaries[-1]})
    assert [p["steps"] for p in evaluation.history] == expected
    assert any(b - a > freq for a, b in zip([0, *boundaries], boundaries))  # one boundary passed two multiples
    targets = [p["target_steps"] for p in evaluation.history]
    assert targets == [0, *(s // freq * freq for s in expected[1:-1]), max(expected[-1] // freq * freq, total)]
    # Each evaluation is dumped at its step with the eval/ keys, apart from the iterations' records.
    dumps = [d for d in logs.dumps if "eval/success_rate" in d]
    assert [d["time/total_timesteps"] for d in dumps] == expected
    assert all(not any(k.startswith("rollout/") for k in d) for d in dumps)
    for dump, point in zip(dumps, evaluation.history):
        assert {k: dump[f"eval/{k}"] for k in PanelEvaluation.METRICS} == {k: point[k] for k in PanelEvaluation.METRICS}
    # Reused on a resumed run: no second evaluation at the step the last one was at, start or end.
    agent.learn(0, callback=evaluation, reset_num_timesteps=False)
    assert len(evaluation.history) == len(expected)
    agent.learn(5, callback=evaluation, reset_num_timesteps=False)
    assert [p["steps"] for p in evaluation.history] == [*expected, agent.num_timesteps]


def test_panel_evaluation_records_what_the_trained_agent_plays(tmp_path: Path) -> None:
    agent = tiny_maze_agent(seed=2, learning_rate=1e-2)
    evaluation = PanelEvaluation(
        15, 3, seed_offset=7, batch_size=2, extra_panels={"train": {"n_tasks": 2, "seed_offset": 0}}
    )
    saves = IterationCheckpoint(save_freq=15, save_path=str(tmp_path), name_prefix="at")
    agent.learn(45, callback=[saves, evaluation])
    points = evaluation.history[1:]  # the checkpoints: the same boundaries, past the start
    saved_steps = sorted(int(p.name.split("_")[1]) for p in tmp_path.glob("at_*_steps"))
    assert saved_steps == [p["steps"] for p in points]
    lengths = []
    for point in points:
        saved = GAGPOAgent.load(tmp_path / f"at_{point['steps']}_steps", verbose=0)
        main, train = saved.evaluate(n_tasks=3, seed_offset=7), saved.evaluate(n_tasks=2)
        assert {k: point[k] for k in PanelEvaluation.METRICS} == {k: main[k] for k in PanelEvaluation.METRICS}
        assert {k: point[f"train/{k}"] for k in PanelEvaluation.METRICS} == {
            k: train[k] for k in PanelEvaluation.METRICS
        }
        lengths.append((point["mean_length"], point["train/mean_length"]))
    assert len(set(lengths)) > 1  # the panels changed with training: the points tell the states apart


def test_progress_bars(agent: GAGPOAgent) -> None:
    agent.learn(20, progress_bar=True)  # the agent's own bar: advanced by the env steps actually taken
    first = agent.num_timesteps
    assert first >= 20
    bar = ProgressBarCallback()  # SB3's own class: counts env steps taken, ends at n/n
    agent.learn(20, callback=bar, reset_num_timesteps=False)
    assert bar.pbar.n == bar.pbar.total == agent.num_timesteps - first >= 20


def test_seeded_runs_are_reproducible() -> None:
    runs = []
    for seed in (7, 7, 8):
        agent = make_agent(seed=seed, learning_rate=3e-3)
        agent.learn(40)
        episodes = [(e["return"], e["length"], e["won"]) for e in agent.last_rollout["episodes"]]
        runs.append((agent.num_timesteps, episodes, [p.detach().clone() for p in agent.policy.parameters()]))
    (n0, ep0, p0), (n1, ep1, p1), (_, ep2, p2) = runs
    assert n0 == n1 and ep0 == ep1
    assert all(torch.equal(a, b) for a, b in zip(p0, p1))
    assert ep0 != ep2 or not all(torch.equal(a, b) for a, b in zip(p0, p2))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"gamma": 1.5}, r"gamma must be in \[0, 1\]"),
        ({"estimator": "a2c"}, "estimator must be one of"),
        ({"clip_range_low": 1.0}, "clip_range_low must be in \\(0, 1\\)"),
        ({"state_key": "history:0"}, "state key must be"),
        ({"action_mode": "talk"}, "action_mode must be"),
        ({"learning_rate": -1.0}, "learning_rate must be > 0"),
        ({"num_groups": 0}, "num_groups and group_size"),
        ({"task_pool": -1}, "task_pool must be >= 0"),
        ({"lr_schedule": "step"}, "lr_schedule must be one of"),
    ],
)
def test_bad_hyperparameter_gives_one_readable_error(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=f"GAGPOConfig: {match}"):
        GAGPOAgent(SIGNS, **{**SMALL, **kwargs})


def test_unknown_hyperparameter_and_env() -> None:
    with pytest.raises(ValueError, match=r"unknown hyperparameters \['gama'\]"):
        GAGPOAgent(SIGNS, gama=0.9)
    with pytest.raises(ValueError, match=r"unknown hyperparameters \['gama'\]"):
        GAGPOConfig.from_dict({"gama": 0.9})
    with pytest.raises(ValueError, match="unknown env id 'gagpo_gym/NoSuchEnv-v0'"):
        GAGPOAgent("gagpo_gym/NoSuchEnv-v0", **SMALL)


def test_ppo_estimator_trains_its_value_head() -> None:
    agent = make_agent(estimator="ppo", seed=6)
    head = agent.policy.value_head
    assert head is not None and torch.count_nonzero(head.weight) == 0
    logs = capture_logs(agent)
    agent.learn(30)
    assert torch.count_nonzero(head.weight) > 0
    assert all("train/value_loss" in d and np.isfinite(d["train/value_loss"]) for d in logs.dumps)
    targets = [r.value_target for r in agent.buffer.rows]
    assert np.std(targets) > 0


def test_generate_mode_iteration_with_an_untrained_model() -> None:
    agent = make_agent(action_mode="generate", max_new_tokens=8, seed=0)
    logs = capture_logs(agent)
    agent.learn(20)
    record = logs.dumps[-1]
    rows = agent.buffer.rows
    assert record["rollout/invalid_rate"] > 0.5 and record["rollout/unparsed_rate"] > 0.5  # garbage text
    assert {r.reward for r in rows} <= {-0.01, 0.0, 1.0, 0.99} and -0.01 in {r.reward for r in rows}
    assert all(r.response_ids and len(r.old_logp) == len(r.response_ids) for r in rows)
    assert np.isfinite(record["train/policy_loss"]) and record["train/skipped_updates"] == 0


def test_revisit_penalty_reaches_the_rollout_rewards_and_the_log() -> None:
    agent = make_agent(seed=4, revisit_penalty=0.3)
    logs = capture_logs(agent)
    agent.learn(40, log_interval=1)
    rows = agent.buffer.rows
    seen: dict[int, set] = {}
    revisits = 0
    for r in rows:  # the true state keys (the default state_key): back to one the episode was in, or not
        states = seen.setdefault(r.episode, {r.state_key})
        back = r.next_state_key in states and r.reward != pytest.approx(-0.01)
        states.add(r.next_state_key)
        revisits += back
        assert min(abs(r.reward - base - (-0.3 if back else 0.0)) for base in (0.0, 1.0, -0.01)) < 1e-9, r
    assert revisits > 0
    assert logs.dumps[-1]["rollout/revisit_rate"] == pytest.approx(revisits / len(rows))


def test_greedy_members_play_the_policys_argmax_and_are_logged_apart() -> None:
    agent = make_agent(seed=5, greedy_members=1)
    rows, env, actions = collect(agent), agent.env, agent.policy.actions  # no update: the rollout's policy
    member = {int(e): i % env.group_size for i, e in enumerate(env.episode_index)}
    greedy_rows, sampled_off_argmax = 0, 0
    for r in rows:
        with torch.no_grad():
            seq, counts, _ = actions.score_candidates([r.prompt_ids], [r.candidate_ids])
            log_pi = actions.choice_log_probs(seq[0], counts[0]).numpy()
        assert log_pi[r.chosen] == pytest.approx(float(r.rollout_logp[0]), abs=1e-4)
        argmax = r.chosen == int(np.argmax(log_pi))
        if member[r.episode] == 0:
            greedy_rows += 1
            assert argmax, r
        else:
            sampled_off_argmax += not argmax
    assert greedy_rows > 0 and sampled_off_argmax > 0  # the other members still sample
    logs = capture_logs(agent)
    agent.learn(40, log_interval=1)
    episodes = agent.last_rollout["episodes"]
    assert [e["role"] for e in episodes].count("greedy") == agent.config.num_groups
    d = logs.dumps[-1]
    won = {role: [e["won"] for e in episodes if e["role"] == role] for role in ("greedy", "sampled")}
    assert d["rollout/greedy_success_rate"] == pytest.approx(np.mean(won["greedy"]))
    assert d["rollout/success_rate"] == pytest.approx(np.mean(won["sampled"]))
    assert "rollout/expert_success_rate" not in d
    with pytest.raises(ValueError, match="greedy_members"):
        make_agent(greedy_members=4)  # group_size 4: no member would sample


def test_expert_members_play_the_envs_expert_scored_by_the_policy() -> None:
    agent = make_agent(seed=6, greedy_members=1, expert_members=1)
    rows, env, actions = collect(agent), agent.env, agent.policy.actions
    member = {int(e): i % env.group_size for i, e in enumerate(env.episode_index)}
    by_episode: dict[int, list[Row]] = {}
    for r in rows:
        with torch.no_grad():
            seq, counts, _ = actions.score_candidates([r.prompt_ids], [r.candidate_ids])
            log_pi = actions.choice_log_probs(seq[0], counts[0]).numpy()
        assert log_pi[r.chosen] == pytest.approx(float(r.rollout_logp[0]), abs=1e-4)  # the policy's own log-prob
        by_episode.setdefault(r.episode, []).append(r)
    expert = [e for e in by_episode.values() if member[e[0].episode] == 1]
    sampled = [e for e in by_episode.values() if member[e[0].episode] > 1]
    assert len(expert) == agent.config.num_groups
    assert all(len(e) == 3 and e[-1].won for e in expert)  # three signs, each followed at the first try
    assert any(len(e) > 3 or not e[-1].won for e in sampled)  # the untrained policy's members still err
    logs = capture_logs(agent)
    agent.learn(40, log_interval=1)
    episodes = agent.last_rollout["episodes"]
    d = logs.dumps[-1]
    assert [e["role"] for e in episodes].count("expert") == agent.config.num_groups
    assert d["rollout/expert_success_rate"] == 1.0
    assert d["rollout/success_rate"] == pytest.approx(np.mean([e["won"] for e in episodes if e["role"] == "sampled"]))
    with pytest.raises(ValueError, match="expert_members"):
        make_agent(greedy_members=1, expert_members=3)  # group_size 4: no member would sample
    with pytest.raises(ValueError, match="expert_members needs action_mode='choose'"):
        make_agent(expert_members=1, action_mode="generate")


def test_logged_keys() -> None:
    agent = make_agent(seed=9)
    logs = capture_logs(agent)
    agent.learn(60, log_interval=1)
    assert len(logs.dumps) == agent.iteration >= 2
    keys = set(logs.dumps[0])
    expected = {
        "rollout/success_rate", "rollout/ep_return_mean", "rollout/ep_len_mean", "rollout/invalid_rate",
        "rollout/unparsed_rate", "rollout/prompt_truncations", "advantage/mean", "advantage/std",
        "advantage/iqr", "advantage/share_abs_gt_1", "advantage/singleton_share", "advantage/set_size_mean",
        "advantage/set_size_max", "train/policy_loss", "train/clip_fraction",
        "train/approx_kl", "train/grad_norm", "train/first_ratio_dev", "rollout/entropy",
            "rollout/logp_gap_max", "time/rollout_s", "time/recompute_s", "time/update_s", "time/generate_s",
        "time/env_steps_per_s", "time/tokens_per_s", "time/iterations", "time/total_timesteps",
    }  # fmt: skip
    assert expected <= keys, expected - keys
    d = logs.dumps[-1]
    assert 0 <= d["rollout/success_rate"] <= 1 and 0 <= d["advantage/singleton_share"] <= 1
    assert d["time/total_timesteps"] == agent.num_timesteps and d["time/update_s"] > 0
    won = [e["won"] for e in agent.last_rollout["episodes"]]
    assert d["rollout/success_rate"] == pytest.approx(np.mean(won))
    by_group: dict[int, list[bool]] = {}
    for e in agent.last_rollout["episodes"]:
        by_group.setdefault(e["group"], []).append(e["won"])
    sizes = {len(w) for w in by_group.values()}
    assert len(by_group) == agent.config.num_groups and sizes == {agent.config.group_size}
    assert d["rollout/groups_any_success"] == pytest.approx(np.mean([any(w) for w in by_group.values()]))
    assert d["rollout/groups_all_success"] == pytest.approx(np.mean([all(w) for w in by_group.values()]))
    with_kl = make_agent(seed=9, kl_coef=0.1)
    kl_logs = capture_logs(with_kl)
    with_kl.learn(10)
    # 0 on the first minibatch (the policy is the reference), positive once an update has moved it away.
    assert kl_logs.dumps[0]["train/kl"] > 0


def test_info_at_reads_vectorised_infos() -> None:
    venv = GroupedVectorEnv(lambda: wrap_text_env(gagpo_gym.make(SIGNS)), num_groups=1, group_size=2)
    try:
        venv.reset(options={"task_seeds": [3]})
        while venv.active[0]:  # member 0 follows the signs; member 1 sends nothing parsable
            (expert,) = venv.call("expert_action", indices=[0])
            _, _, terminated, _, infos = venv.step([f"<action>{expert}</action>", None])
        assert info_at(infos, 0)["won"] and info_at(infos, 0)["action_valid"]
        assert not info_at(infos, 1)["action_parsed"] and not info_at(infos, 1)["action_valid"]
        _, _, _, _, infos = venv.step([None, "<action>go south</action>"])
        assert info_at(infos, 0) == {}  # finished: not stepped, no info
        assert info_at(infos, 1)["action_parsed"] and len(info_at(infos, 1)["history"]) == 2
    finally:
        venv.close()


# ----- learning -----------------------------------------------------------------------------------------
def learning_run(seed: int, budget: int = 5000, **overrides: Any) -> dict[str, float]:
    """Success on 100 unseen tasks: random policy, agent before and after ``budget`` env steps."""
    # All candidates have the same length here, so the summed score is fair and moves 3x faster than the mean.
    config = {"num_groups": 8, "group_size": 4, "minibatch_size": 16, "learning_rate": 1e-3, "choose_score": "sum",
              "show_admissible": False, "tiny_hidden_size": 64, "history_length": 0, "torch_threads": 1,
              "verbose": 0}  # fmt: skip
    agent = GAGPOAgent(SIGNS, seed=seed, **{**config, **overrides})
    panel = {"n_tasks": 100, "batch_size": 50, "seed_offset": 10**6}  # tasks never drawn in training
    rng = np.random.default_rng(seed)

    def uniform(observations: list[str], infos: list[dict], venv: Any, indices: Any) -> list[str]:
        return [str(rng.choice(info["admissible_actions"])) for info in infos]

    random_policy = run_panel(uniform, functools.partial(wrap_signs, history_length=0), **panel)
    before = agent.evaluate(deterministic=False, **panel)["success_rate"]
    agent.learn(budget)
    return {
        "random": random_policy["success_rate"],
        "before": before,
        "after": agent.evaluate(deterministic=False, **panel)["success_rate"],
        "greedy": agent.evaluate(deterministic=True, **panel)["success_rate"],
    }


def learned(result: dict[str, float]) -> bool:
    """Far above random on unseen tasks, sampled and greedy, from a start at random."""
    return (
        result["random"] < 0.35
        and result["after"] >= result["random"] + 0.45
        and result["after"] >= result["before"] + 0.45
        and result["greedy"] >= result["random"] + 0.45
    )


def test_agent_learns_signs_well_above_random() -> None:
    """A short budget takes the sampled policy from random (about 0.2) to far above it on unseen tasks.

    Measured on an AVX-512 CPU, seeds 0-5 at 5000 env steps: random 0.14-0.22, after 0.82-1.0 (four of six at 1.0);
    on another machine of the same kind seed 0 stayed at 0.33 (sampled and greedy) while seeds 1 and 2 reached 1.0:
    which seed is unlucky depends on the CPU's kernels (their rounding), not on the code. So the claim is made of
    the first seed that learns, of two: learning that is broken fails both.
    """
    results = []
    for seed in (0, 1):
        results.append(learning_run(seed=seed))
        if learned(results[-1]):
            break
    assert learned(results[-1]), f"neither seed learned: {results}"


# ----- micro-batches ------------------------------------------------------------------------------------------
def test_padded_batches_sort_by_size_and_keep_each_padded_batch_within_the_budget() -> None:
    assert padded_batches([5, 1, 3, 3, 8], 9) == [[1, 2, 3], [0], [4]]  # 3 x 3 = 9 fits; 4 x 5 does not
    assert padded_batches([20, 2], 9) == [[1], [0]]  # an oversized item goes alone
    assert padded_batches([], 9) == []
    assert padded_batches([4, 4, 4], 100) == [[0, 1, 2]]


def test_micro_batches_group_similar_rows_and_leave_the_update_exact() -> None:
    """The update's micro-batches: sorted by packed length, padded within the budget, identical rows side by side;
    how a minibatch is cut changes the gradient only by float rounding (the loss is a sum over rows)."""
    config = {**SMALL, "minibatch_size": 64, "n_epochs": 1}
    agents = [GAGPOAgent("gagpo_gym/Maze-v0", seed=3, token_budget=budget, **config) for budget in (256, 10**6)]
    for agent in agents:
        callback = CallbackList([])
        callback.init_callback(agent)
        agent.collect_rollouts(callback)
    rows = agents[0].buffer.rows
    micros = agents[0].update.micro_batches(rows)
    size = [[packed_width(r.prompt_ids, r.candidate_ids) for r in m] for m in micros]
    assert len(micros) > 2 and sorted(map(id, (r for m in micros for r in m))) == sorted(map(id, rows))
    assert all(len(s) == 1 or len(s) * max(s) <= 256 for s in size)
    flat = [n for s in size for n in s]
    assert flat == sorted(flat)
    keys = [(tuple(r.prompt_ids), tuple(map(tuple, r.candidate_ids))) for m in micros for r in m]
    assert all(keys.index(k) == i or keys[i - 1] == k for i, k in enumerate(keys))  # duplicates are adjacent
    assert len(agents[1].update.micro_batches(agents[1].buffer.rows)) == 1
    for agent in agents:
        plan = agent.update_plan()
        agent.recompute_log_probs(plan)
        agent.policy.train()
        assert agent.update.minibatch_step(plan[0][0]).ratio_dev == 0.0  # the recompute's own micro-batches
    # Adam's first moment after one step is 0.1 x the (clipped) gradient: the gradients of the two cuts agree.
    grads = [torch.cat([a.optimizer.state[p]["exp_avg"].flatten() for p in a.update.params]) for a in agents]
    assert grads[0].abs().max() > 1e-6
    assert (grads[0] - grads[1]).abs().max() <= 1e-5 * grads[0].abs().max()


def test_sampled_evaluation_leaves_training_alone_and_plays_each_task_the_same_in_any_panel() -> None:
    agent = GAGPOAgent("gagpo_gym/Maze-v0", seed=5, **SMALL)
    state = agent.rng.bit_generator.state
    whole = agent.evaluate(n_tasks=6, deterministic=False, batch_size=6, episodes=True)
    assert agent.rng.bit_generator.state == state  # the training stream did not move
    trained = GAGPOAgent("gagpo_gym/Maze-v0", seed=5, **SMALL).learn(100)
    trained_with_panels = GAGPOAgent("gagpo_gym/Maze-v0", seed=5, **SMALL)
    trained_with_panels.learn(100, callback=PanelEvaluation(20, n_tasks=3, deterministic=False))
    assert all(torch.equal(a, b) for a, b in zip(trained.policy.core.parameters(),
                                                 trained_with_panels.policy.core.parameters()))  # fmt: skip
    split = agent.evaluate(n_tasks=6, deterministic=False, batch_size=4, episodes=True)
    tail = agent.evaluate(n_tasks=2, deterministic=False, seed_offset=4, episodes=True)
    assert split["episodes"] == whole["episodes"] and tail["episodes"] == whole["episodes"][4:]
    lengths = {e["length"] for e in whole["episodes"]}
    assert len(lengths) > 1  # the panel is not trivially the same everywhere
    other = GAGPOAgent("gagpo_gym/Maze-v0", seed=6, **SMALL).evaluate(n_tasks=6, deterministic=False, episodes=True)
    assert other["episodes"] != whole["episodes"]  # another agent seed, other draws


def test_learn_stops_after_max_iterations_whatever_the_step_budget():
    agent = make_agent()
    agent.learn(10**9, max_iterations=2)
    assert agent.iteration == 2 and 0 < agent.num_timesteps < 10**9
    steps = agent.num_timesteps
    agent.learn(1, reset_num_timesteps=False, max_iterations=5)  # the step budget comes first: one iteration
    assert agent.iteration == 3 and agent.num_timesteps > steps
    with pytest.raises(ValueError, match="max_iterations"):
        agent.learn(100, max_iterations=0)


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_lr_schedule_decays_from_the_learning_rate_to_zero_over_each_learn_call(schedule: str) -> None:
    agent = make_agent(lr_schedule=schedule, learning_rate=1e-3)
    logs = capture_logs(agent)
    agent.learn(150)
    lrs = [d["train/learning_rate"] for d in logs.dumps]
    # Each update steps at the rate of the progress where its iteration began: the first at the full rate.
    starts = np.array([0] + [d["time/total_timesteps"] for d in logs.dumps[:-1]]) / 150
    factor = 1 - starts if schedule == "linear" else 0.5 * (1 + np.cos(np.pi * starts))
    assert len(lrs) >= 3 and lrs[0] == 1e-3 and np.allclose(lrs, 1e-3 * factor)
    assert all(a > b > 0 for a, b in zip(lrs, lrs[1:])) and agent.optimizer.param_groups[0]["lr"] == lrs[-1]
    # Past the budget the rate is 0 (clamped, not negative): an update there leaves the weights alone.
    before = [p.detach().clone() for p in agent.policy.model.parameters()]
    agent.update.set_progress(1.5)
    agent.train()
    assert all(torch.equal(p, b) for p, b in zip(agent.policy.model.parameters(), before))
    constant = make_agent(learning_rate=1e-3)
    constant_logs = capture_logs(constant)
    constant.learn(60)
    assert {d["train/learning_rate"] for d in constant_logs.dumps} == {1e-3}


def test_panel_evaluation_counts_iterations_and_samples_at_its_temperature():
    agent = make_agent()
    evaluation = PanelEvaluation(2, 4, batch_size=4, unit="iterations", deterministic=False, temperature=1e-3)
    agent.learn(10**9, callback=evaluation, max_iterations=5)
    # Before the first iteration, after the 2nd and the 4th, and at the end (the 5th).
    assert [p["iteration"] for p in evaluation.history] == [0, 2, 4, 5]
    assert [p["target_steps"] for p in evaluation.history] == [0, 2, 4, 4]
    assert agent.policy.temperature == 1.0  # the panel's temperature lasts as long as the panel
    # Sampled at a near-zero temperature, a panel plays as the greedy one; at the training temperature it does not.
    greedy = agent.evaluate(n_tasks=6, episodes=True)
    cold = agent.evaluate(n_tasks=6, episodes=True, deterministic=False, temperature=1e-3)
    warm = agent.evaluate(n_tasks=6, episodes=True, deterministic=False)
    assert [e["length"] for e in cold["episodes"]] == [e["length"] for e in greedy["episodes"]]
    assert cold["success_rate"] == greedy["success_rate"] and warm["episodes"] != greedy["episodes"]
    with pytest.raises(ValueError, match="temperature"):
        agent.evaluate(n_tasks=2, deterministic=False, temperature=0.0)
    with pytest.raises(ValueError, match="unit"):
        PanelEvaluation(2, 4, unit="epochs")
