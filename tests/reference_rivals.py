"""Slow references for HGPO, GraphGPO and G2PO, re-implemented from their authors' published code.

Each function follows the authors' computation step by step, in their data layout: a batch of rows with a task
id ``index`` (``uid``), a trajectory id ``traj_index`` (``traj_uid``), the observation acted from
(``anchor_obs``), per-row scalars, and Python loops over tasks, trajectories and dicts of clusters. Tensors
become float64 numpy arrays; nothing else changes, except where a docstring says so.

- HGPO: ``recipe/hgpo/core_hgpo.py`` of verl-agent (``hgpo_advantage_estimate``, ``trajectory_advantages``,
  ``compute_step_discounted_returns``).
- GraphGPO: ``recipe/GraphGPO/core_graph.py`` of verl-agent (``ComplexGraph.from_data``,
  ``all_to_target_shortest_paths``, ``compute_graph_path_returns``, ``compute_graphgpo_outcome_advantage``)
  with GiGPO's ``build_step_group``, ``step_norm_reward`` and ``episode_norm_reward`` (``gigpo/core_gigpo.py``).
- G2PO: ``g2po/core_g2po.py`` of the G2PO repository (``compute_group_aggregation_values``,
  ``compute_step_level_advantage``, ``episode_norm_reward``, ``compute_g2po_outcome_advantage``).
- GiGPO: ``gigpo/core_gigpo.py`` of verl-agent (``compute_gigpo_outcome_advantage``), the trainer the other three
  recipes share.
- What every one of these trainers feeds its estimator: ``verl/trainer/ppo/ray_trainer.py`` of verl-agent
  (``apply_invalid_action_penalty`` after ``compute_step_discounted_returns`` and the episode reward manager).
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict

import numpy as np

#: The goal node GraphGPO's rollout loop writes as the next observation of a successful final step ('success').
GOAL = ("<goal>",)
#: G2PO's SUCCESS_REWARD: ALFWorld's reward for a success, the value of the success terminal node.
SUCCESS_REWARD = 10.0
#: Items whose group-relative return is within this share of the set's RMS return of zero are zero (HGPO).
ZERO_TOL = 1e-12


def std(values: list[float], ddof: int) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((x - mean) ** 2 for x in values) / (len(values) - ddof))


def step_discounted_returns(rewards, traj_index, gamma: float) -> np.ndarray:
    """compute_step_discounted_returns: the return-to-go of each trajectory's rows, in batch order."""
    rewards = np.asarray(rewards, dtype=np.float64)
    returns_by_traj = {}
    for uid in np.unique(traj_index):
        traj_rewards = rewards[np.where(traj_index == uid)[0]]
        traj_returns = np.zeros_like(traj_rewards)
        running_return = 0.0
        for t in reversed(range(len(traj_rewards))):
            running_return = traj_rewards[t] + gamma * running_return
            traj_returns[t] = running_return
        returns_by_traj[uid] = traj_returns
    all_returns = np.zeros_like(rewards)
    for i, uid in enumerate(traj_index):
        traj_indices = np.where(traj_index == uid)[0]
        all_returns[i] = returns_by_traj[uid][np.where(traj_indices == i)[0][0]]
    return all_returns


def apply_invalid_action_penalty(row_scores, step_rewards, invalid, invalid_action_penalty_coef: float):
    """The trainer's inputs: each row's episode score and return-to-go, less its own penalty if its action was invalid.

    The episode reward manager writes the episode's env return on every row (``token_level_scores``) and
    ``compute_step_discounted_returns`` discounts the env rewards (``step_rewards``); neither carries a penalty.
    ``apply_invalid_action_penalty`` then subtracts ``coef * (1 - is_action_valid)`` from each row's two numbers.
    """
    row_scores = np.array(row_scores, dtype=np.float64)
    step_rewards = np.array(step_rewards, dtype=np.float64)
    for i in range(len(row_scores)):
        action_invalids = 1.0 - (0.0 if invalid[i] else 1.0)
        row_scores[i] -= invalid_action_penalty_coef * action_invalids
        step_rewards[i] -= invalid_action_penalty_coef * action_invalids
    return row_scores, step_rewards


def ref_gigpo(
    step_rewards,
    row_scores,
    anchor_obs,
    index,
    epsilon: float = 1e-6,
    step_advantage_w: float = 1.0,
    mode: str = "mean_norm",
) -> np.ndarray:
    """compute_gigpo_outcome_advantage (exact matching): the episode term over the task's rows plus the step term."""
    remove_std = mode == "mean_norm"
    episode_advantages = episode_norm_reward(row_scores, index, epsilon, remove_std)
    step_advantages = step_norm_reward(step_rewards, build_step_group(anchor_obs, index), epsilon, remove_std)
    return episode_advantages + step_advantage_w * step_advantages


def episode_norm_reward(scores, index, epsilon: float, remove_std: bool) -> np.ndarray:
    """GiGPO's episode_norm_reward with compute_mean_std_cross_steps=True: statistics over the task's rows.

    A task with a single row keeps its raw score (mean 0, std 1), as published.
    """
    scores = np.array(scores, dtype=np.float64)
    id2score = defaultdict(list)
    for i in range(len(scores)):
        id2score[index[i]].append(scores[i])
    id2mean, id2std = {}, {}
    for idx, members in id2score.items():
        if len(members) == 1:
            id2mean[idx], id2std[idx] = 0.0, 1.0
        else:
            id2mean[idx], id2std[idx] = sum(members) / len(members), std(members, ddof=1)
    out = np.zeros_like(scores)
    for i in range(len(scores)):
        if remove_std:
            out[i] = scores[i] - id2mean[index[i]]
        else:
            out[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
    return out


def build_step_group(anchor_obs, index) -> list:
    """GiGPO's build_step_group (exact matching): one cluster per (task, observation)."""
    step_group_uids = [None] * len(anchor_obs)
    for idx in np.unique(index):
        indices = np.where(index == idx)[0]
        clusters = defaultdict(list)
        for i in indices:
            clusters[anchor_obs[i]].append(i)
        for obs, members in clusters.items():
            for i in members:
                step_group_uids[i] = (idx, obs)
    return step_group_uids


def step_norm_reward(step_rewards, step_group_uids, epsilon: float, remove_std: bool) -> np.ndarray:
    """GiGPO's step_norm_reward: a one-row cluster centres on itself (0)."""
    id2score = defaultdict(list)
    for i, uid in enumerate(step_group_uids):
        id2score[uid].append(step_rewards[i])
    id2mean, id2std = {}, {}
    for uid, members in id2score.items():
        id2mean[uid] = sum(members) / len(members)
        id2std[uid] = 1.0 if len(members) == 1 else std(members, ddof=1)
    out = np.zeros(len(step_rewards))
    for i, uid in enumerate(step_group_uids):
        centred = step_rewards[i] - id2mean[uid]
        out[i] = centred if remove_std else centred / (id2std[uid] + epsilon)
    return out


# ---------------------------------------------------------------------------------------------------------
# HGPO
# ---------------------------------------------------------------------------------------------------------


def ref_hgpo(
    step_rewards,
    row_scores,
    anchor_obs,
    index,
    traj_index,
    history_length: int,
    epsilon: float = 1e-6,
    mode: str = "mean_std_norm",
    length_weight_alpha: float = 1.0,
    base_group: bool = False,
) -> np.ndarray:
    """hgpo_advantage_estimate. ``step_rewards``: discounted returns-to-go; ``row_scores``: each row's episode score.

    The published aggregator keeps the items that compare ``!= 0``; here an item is zero when its centred
    return is zero up to rounding (``ZERO_TOL`` of its set's RMS return), so that a set of equal returns is
    dropped whatever the rounding of its mean.
    """
    n = len(anchor_obs)
    all_step_adv = np.zeros(n)
    base = None
    if base_group:  # trajectory_advantages (cross-step statistics), with remove_std for mean_norm
        base = episode_norm_reward(row_scores, index, epsilon, remove_std=(mode == "mean_norm"))
        base_centred = episode_norm_reward(row_scores, index, epsilon, remove_std=True)
        base_rms = _task_rms(row_scores, index)

    def aggregate_items(items) -> float:
        valid = [(k, a) for k, a, nonzero in items if nonzero]
        if not valid:
            return 0.0
        w_raw = [(k + 1) ** length_weight_alpha for k, _ in valid]
        total = sum(w_raw)
        return sum(w / (total + epsilon) * a for w, (_, a) in zip(w_raw, valid, strict=True))

    for gid in np.unique(index):
        group_indices = np.flatnonzero(index == gid)
        uniq_traj, inv = np.unique(traj_index[group_indices], return_inverse=True)
        traj_positions = [[] for _ in range(len(uniq_traj))]
        for pos, t in enumerate(inv):
            traj_positions[t].append(pos)
        traj_h = [[anchor_obs[group_indices[p]] for p in positions] for positions in traj_positions]
        traj_gidx = [[group_indices[p] for p in positions] for positions in traj_positions]

        clusters = defaultdict(list)
        max_k = history_length + 1
        for ti in range(len(traj_h)):
            for si in range(len(traj_h[ti])):
                for k in range(1, min(max_k, si + 1) + 1):
                    clusters[(k, tuple(traj_h[ti][si - k + 1 : si + 1]))].append((ti, si))

        per_step_items = defaultdict(list)
        for (k, _key), members in clusters.items():
            if len(members) <= 1:
                continue
            r = [step_rewards[traj_gidx[ti][si]] for ti, si in members]
            mean = sum(r) / len(r)
            sigma = std(r, ddof=0)
            rms = math.sqrt(sum(x * x for x in r) / len(r))
            for j, (ti, si) in enumerate(members):
                centred = r[j] - mean
                a = centred / (sigma + epsilon) if mode == "mean_std_norm" else centred
                per_step_items[(ti, si)].append((k, a, abs(centred) > ZERO_TOL * rms))

        for ti in range(len(traj_h)):
            for si in range(len(traj_h[ti])):
                global_idx = traj_gidx[ti][si]
                items = per_step_items.get((ti, si), [])
                if base is not None:
                    nonzero = abs(base_centred[global_idx]) > ZERO_TOL * base_rms[index[global_idx]]
                    items = [(0, base[global_idx], nonzero), *items]
                all_step_adv[global_idx] = aggregate_items(items)
    return all_step_adv


def _task_rms(scores, index) -> dict:
    members = defaultdict(list)
    for i, x in enumerate(scores):
        members[index[i]].append(x)
    return {idx: math.sqrt(sum(x * x for x in xs) / len(xs)) for idx, xs in members.items()}


# ---------------------------------------------------------------------------------------------------------
# GraphGPO
# ---------------------------------------------------------------------------------------------------------


class ComplexGraph:
    """The state-transition graph of one task: graph[u][v] lists the transitions u -> v."""

    def __init__(self) -> None:
        self.graph: dict = defaultdict(lambda: defaultdict(list))
        self.nodes: set = set()
        self.final_state = GOAL
        self.shortest_path_to_final: dict | None = None

    def add_edge(self, u, v, **attrs) -> None:
        self.graph[u][v].append(attrs)
        self.nodes.update([u, v])

    @classmethod
    def from_data(cls, anchor_obs, next_obs, index) -> dict:
        graphs = {}
        for uid in set(index.tolist()):
            g = cls()
            for i in np.where(index == uid)[0]:
                g.add_edge(anchor_obs[i], next_obs[i], weight=1.0)
            graphs[uid] = g
        return graphs

    def all_to_target_shortest_paths(self, target) -> dict:
        """Reverse Dijkstra from the goal; nodes without a path get the largest finite distance + 1."""
        reverse_graph = defaultdict(list)
        for u in self.graph:
            for v in self.graph[u]:
                for attr in self.graph[u][v]:
                    reverse_graph[v].append((u, attr.get("weight", 1)))
        distances = {node: float("inf") for node in self.nodes}
        distances[target] = 0
        queue = [(0, 0, target)]
        tie = 1
        while queue:
            cost, _, node = heapq.heappop(queue)
            if cost > distances[node]:
                continue
            for neighbor, w in reverse_graph[node]:
                if cost + w < distances[neighbor]:
                    distances[neighbor] = cost + w
                    heapq.heappush(queue, (cost + w, tie, neighbor))
                    tie += 1
        far_distance = 0
        for value in distances.values():
            if value != float("inf") and value > far_distance:
                far_distance = value
        for key, value in distances.items():
            if value == float("inf"):
                distances[key] = far_distance + 1
        return distances

    def calculate_path(self) -> None:
        self.shortest_path_to_final = self.all_to_target_shortest_paths(self.final_state)


def graph_path_returns(anchor_obs, next_obs, index, traj_index, graphs, gamma: float, normalize_distance: bool):
    """compute_graph_path_returns: 10 * gamma ** d(next) (or ** (d(next) - d(anchor) + 1)) for every row."""
    all_returns = np.zeros(len(anchor_obs))
    for uid in np.unique(traj_index):
        traj_indices = np.where(traj_index == uid)[0]
        distances = graphs[index[traj_indices[0]]].shortest_path_to_final
        for i in traj_indices:
            new_h, old_h = next_obs[i], anchor_obs[i]
            if normalize_distance:
                all_returns[i] = 10 * gamma ** (distances[new_h] - distances[old_h] + 1.0)
            else:
                all_returns[i] = 10 * gamma ** (distances[new_h] + 1.0 - 1)
    return all_returns


def ref_graphgpo(
    anchor_obs,
    next_obs,
    index,
    traj_index,
    row_scores,
    invalid,
    gamma: float = 0.1,
    normalize_distance: bool = False,
    invalid_action_penalty_coef: float = 0.1,
    step_advantage_w: float = 1.0,
    episode_advantage_w: float = 1.0,
    mode: str = "mean_std_norm",
    epsilon: float = 1e-6,
) -> np.ndarray:
    """The trainer's GraphGPO path: graph, distances, step returns, invalid-action penalty, advantages.

    ``next_obs`` holds ``GOAL`` on the final row of a successful trajectory; ``invalid`` flags invalid actions.
    """
    graphs = ComplexGraph.from_data(anchor_obs, next_obs, index)
    for g in graphs.values():
        g.calculate_path()
    step_rewards = graph_path_returns(anchor_obs, next_obs, index, traj_index, graphs, gamma, normalize_distance)
    step_rewards = step_rewards - invalid_action_penalty_coef * np.asarray(invalid, dtype=np.float64)
    remove_std = mode == "mean_norm"
    step_advantages = step_norm_reward(step_rewards, build_step_group(anchor_obs, index), epsilon, remove_std)
    if episode_advantage_w == 0.0:
        return step_advantage_w * step_advantages
    episode_advantages = episode_norm_reward(row_scores, index, epsilon, remove_std)
    return step_advantage_w * step_advantages + episode_advantage_w * episode_advantages


# ---------------------------------------------------------------------------------------------------------
# G2PO
# ---------------------------------------------------------------------------------------------------------


def group_aggregation_values(episode_rewards, anchor_obs, index, traj_index, gamma: float = 0.95):
    """compute_group_aggregation_values: node value, node id and successor id (-1 success, -2 failure) per row."""
    bs = len(anchor_obs)
    scores = np.zeros(bs)
    group_idx = np.full(bs, -1)
    next_group_idx = np.ones(bs, dtype=int)
    for idx in np.unique(index):
        indices = np.where(index == idx)[0]
        unique_traj_index = np.unique(traj_index[indices])
        groups = defaultdict(list)
        obs2idx: dict = {}
        for t_idx in unique_traj_index:
            for traj_idx in np.where(traj_index == t_idx)[0]:
                obs = anchor_obs[traj_idx]
                if obs not in obs2idx:
                    obs2idx[obs] = len(obs2idx)
                group_idx[traj_idx] = obs2idx[obs]
                groups[obs2idx[obs]].append(traj_idx)
        group_score = np.zeros(len(groups))
        for t_idx in unique_traj_index:
            traj_indices = np.where(traj_index == t_idx)[0]
            episode_reward = episode_rewards[traj_indices[0]]
            for step_count, traj_idx in enumerate(traj_indices):
                if step_count + 1 < len(traj_indices):
                    next_group_idx[traj_idx] = group_idx[traj_indices[step_count + 1]]
                else:
                    next_group_idx[traj_idx] = -1 if episode_rewards[traj_idx] == SUCCESS_REWARD else -2
                group_score[group_idx[traj_idx]] += gamma ** (len(traj_indices) - step_count) * episode_reward
        for groupnum in range(len(obs2idx)):
            for traj_idx in groups[groupnum]:
                scores[traj_idx] = group_score[groupnum] / len(groups[groupnum])
    return scores, group_idx, next_group_idx


def step_level_advantage(
    step_rewards, invalid, index, group_idx, next_group_idx, epsilon: float, mode: str, invalid_action_penalty: float
) -> np.ndarray:
    """compute_step_level_advantage: the node term within each node, plus the score-gain term over the task."""
    action_invalids = np.asarray(invalid, dtype=np.float64)
    scores = np.zeros(len(index))
    for idx in np.unique(index):
        indices = np.where(index == idx)[0]
        groups = defaultdict(list)
        groupnum2score = {}
        for traj_idx in indices:
            groups[group_idx[traj_idx]].append(traj_idx)
            groupnum2score.setdefault(group_idx[traj_idx], step_rewards[traj_idx])
            assert groupnum2score[group_idx[traj_idx]] == step_rewards[traj_idx]
        groupnum2score[-2] = 0.0
        groupnum2score[-1] = SUCCESS_REWARD
        for members in groups.values():
            next_scores = [groupnum2score[next_group_idx[i]] for i in members]
            next_scores = np.array(next_scores) - action_invalids[members] * invalid_action_penalty
            if len(next_scores) > 1:
                mean, sigma = float(np.mean(next_scores)), std(list(next_scores), ddof=1)
                for traj_idx, score in zip(members, next_scores, strict=True):
                    scores[traj_idx] = (score - mean) / (sigma + epsilon) if mode == "mean_std_norm" else score - mean
        gains = [groupnum2score[next_group_idx[i]] - groupnum2score[group_idx[i]] for i in indices]
        mean = sum(gains) / len(gains)
        sigma = std(gains, ddof=1) if len(gains) > 1 else float("nan")  # torch.std of one value is nan
        for traj_idx, gain in zip(indices, gains, strict=True):
            scores[traj_idx] += (gain - mean) / (sigma + epsilon) if mode == "mean_std_norm" else gain - mean
    return scores


def ref_g2po(
    episode_rewards,
    row_scores,
    anchor_obs,
    index,
    traj_index,
    invalid,
    gamma: float = 0.95,
    step_advantage_w: float = 1.0,
    mode: str = "mean_std_norm",
    invalid_action_penalty: float = 0.1,
    epsilon: float = 1e-6,
) -> np.ndarray:
    """compute_g2po_outcome_advantage after compute_group_aggregation_values (the trainer's G2PO path)."""
    step_rewards, group_idx, next_group_idx = group_aggregation_values(
        episode_rewards, anchor_obs, index, traj_index, gamma
    )
    episode_advantages = episode_norm_reward(row_scores, index, epsilon, remove_std=(mode == "mean_norm"))
    step_advantages = step_level_advantage(
        step_rewards, invalid, index, group_idx, next_group_idx, epsilon, mode, invalid_action_penalty
    )
    return episode_advantages + step_advantage_w * step_advantages
