"""GroupRolloutBuffer: one row per environment step, advantages computed group by group.

Rows arrive in the order the vector env produces them (episodes interleaved). When the last episode of a
group ends, the group's rows are laid out episode by episode (the estimators' contract) and its advantages
are computed with the configured estimator; batch-level normalisation waits for :meth:`finalize`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from agents import advantages as adv
from agents.config import GAGPOConfig


@dataclass
class Row:
    """One action: what the policy saw and did, and what the env answered."""

    group: int
    episode: int
    prompt_ids: list[int]
    rollout_logp: np.ndarray  # the sampler's per-token log-probs (choose mode: one entry)
    reward: float
    state_key: int | str
    next_state_key: int | str
    terminated: bool
    done: bool  # last row of its episode (terminated or truncated)
    won: bool
    response_ids: list[int] = field(default_factory=list)
    candidate_ids: list[list[int]] = field(default_factory=list)
    chosen: int = -1
    value: float = 0.0  # value-head estimate of V(s_t) (ppo estimator)
    next_value: float = 0.0  # V(s_T) for a truncated final row (ppo estimator)
    advantage: float = float("nan")
    old_logp: np.ndarray | None = None  # behaviour log-probs from the update's own forward (PolicyUpdate.recompute)
    ref_logp: np.ndarray | None = None  # reference policy's log-probs (kl_coef > 0)
    is_weight: float = 1.0  # truncated importance weight trainer / sampler (config.rollout_is)
    value_target: float = 0.0
    backoff_keys: tuple = ()  # keys of the state acted from, one per name in config.key_backoff (key back-off)
    # The reward carries config.invalid_action_penalty: the env rejected the action or no command was parsed
    # (not info["action_valid"] or not info["action_parsed"]), verl-agent's is_action_valid = False.
    invalid: bool = False
    version: int = 0  # the policy version (updates done) whose weights sampled it; lags the trainer's under overlap

    @staticmethod
    def keys_from(info: dict, names: Sequence[str]) -> tuple:
        """The back-off keys ``names`` of a state, from its ``info["keys"]`` (set by ``wrappers.StateKey``)."""
        keys = info.get("keys", {})
        missing = [name for name in names if name not in keys]
        if missing:
            raise ValueError(
                f"info['keys'] lacks the back-off keys {missing}: wrap the env with "
                f"wrappers.wrap_text_env(..., backoff={tuple(names)!r})"
            )
        return tuple(keys[name] for name in names)


def key_type(name: str, key: object) -> type:
    """``int`` or ``str``: the type of a state key, or one ValueError saying what it must be instead."""
    if isinstance(key, str):
        return str
    if isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
        if not -(2**63) <= int(key) < 2**63:
            raise ValueError(f"{name} {key} does not fit in int64: hash it (gagpo_gym.state_key(text)) or use a str")
        return int
    raise ValueError(
        f"{name} must be an int64 or a str, got {type(key).__name__} {str(key)[:60]!r}: give a hashable summary of "
        "the state, e.g. gagpo_gym.state_key(text)"
    )


class GroupRolloutBuffer:
    """Collects rows, tracks which episodes of each group are still running, and computes advantages."""

    def __init__(self, config: GAGPOConfig) -> None:
        self.config = config
        self.rows: list[Row] = []
        self._rows_of_group: dict[int, list[int]] = {}
        self._open: dict[int, set[int]] = {}
        self.finished_groups: list[int] = []
        self._key_types: tuple[type, ...] | None = None  # (state key, each back-off key): int or str, fixed by row 1

    def reset(self) -> None:
        self.rows.clear()
        self._rows_of_group.clear()
        self._open.clear()
        self.finished_groups.clear()
        self._key_types = None

    def start_group(self, group: int, episodes: list[int]) -> None:
        """Declare a group and its episodes before their first row arrives."""
        if group in self._open or group in self._rows_of_group:
            raise ValueError(f"group {group} was already started in this buffer")
        self._open[group] = set(episodes)
        self._rows_of_group[group] = []

    def add(self, row: Row) -> None:
        """Append a row; computes the group's advantages when this row ends its group's last episode."""
        if row.episode not in self._open.get(row.group, ()):
            raise ValueError(f"episode {row.episode} of group {row.group} is not running")
        if len(row.backoff_keys) != len(self.config.key_backoff):
            raise ValueError(
                f"the row has {len(row.backoff_keys)} back-off keys, config.key_backoff names "
                f"{len(self.config.key_backoff)}: {self.config.key_backoff} (see Row.keys_from)"
            )
        self._check_keys(row)
        self._rows_of_group[row.group].append(len(self.rows))
        self.rows.append(row)
        if row.done:
            self._open[row.group].discard(row.episode)
            if not self._open[row.group]:
                del self._open[row.group]
                self._finish_group(row.group)

    def _check_keys(self, row: Row) -> None:
        """Every key an int64 or a str, each kind of key the same type in every row of the rollout.

        The estimators compare keys with numpy arrays: a mix of ints and strs becomes an array of strs, where the
        state ``7`` and the state ``"7"`` are two states; an int past int64 or an unhashable key fails deep inside.
        """
        names = ("state_key", *(f"info['keys'][{name!r}]" for name in self.config.key_backoff))
        values = (row.state_key, *row.backoff_keys)
        types = tuple(key_type(name, value) for name, value in zip(names, values))
        if key_type("next state_key", row.next_state_key) is not types[0]:
            self._refuse_mix("state_key", types[0], key_type("", row.next_state_key), row)
        if self._key_types is None:
            self._key_types = types
        for name, kind, first in zip(names, types, self._key_types):
            if kind is not first:
                self._refuse_mix(name, first, kind, row)

    @staticmethod
    def _refuse_mix(name: str, first: type, now: type, row: Row) -> None:
        raise ValueError(
            f"{name} is {first.__name__} on some steps and {now.__name__} on others (group {row.group}, episode "
            f"{row.episode}): one state would count as two; make the env give one type, e.g. always str(key) or "
            "gagpo_gym.state_key(text)"
        )

    @property
    def complete(self) -> bool:
        return not self._open

    def informative(self, group: int) -> bool:
        """A finished group teaches something: some advantage of its rows is not zero."""
        return any(self.rows[i].advantage != 0.0 for i in self._rows_of_group[group])

    def keep_groups(self, groups: set[int]) -> None:
        """Drop every finished group not in ``groups`` (dynamic sampling), rows and bookkeeping alike."""
        if not self.complete:
            raise RuntimeError("keep_groups() called while episodes are still running")
        kept = [r for r in self.rows if r.group in groups]
        self.reset()
        for row in kept:
            self._rows_of_group.setdefault(row.group, []).append(len(self.rows))
            self.rows.append(row)
            if row.group not in self.finished_groups:
                self.finished_groups.append(row.group)

    def _group_rows(self, group: int) -> list[Row]:
        """The group's rows laid out episode by episode (the estimators' contract), time order kept inside each."""
        idx = np.asarray(self._rows_of_group[group])
        episodes = np.asarray([self.rows[i].episode for i in idx])
        return [self.rows[i] for i in idx[np.argsort(episodes, kind="stable")]]

    def _zeroed(self, rows: list[Row]) -> bool:
        """zero_failed_groups applies to these rows of one group: no episode succeeded."""
        return self.config.zero_failed_groups and not any(r.won for r in rows if r.done)

    def _levels(self, rows: list[Row]) -> list[np.ndarray]:
        """One key array per back-off level (config.key_backoff), over ``rows``."""
        return [np.array([r.backoff_keys[level] for r in rows]) for level in range(len(self.config.key_backoff))]

    def _finish_group(self, group: int) -> None:
        rows = self._group_rows(group)
        a, target = self._estimate(rows)
        if self._zeroed(rows):
            a = np.zeros_like(a)
        for r, ai, ti in zip(rows, a, target):
            r.advantage, r.value_target = float(ai), float(ti)
        self.finished_groups.append(group)

    def _estimate(self, rows: list[Row]) -> tuple[np.ndarray, np.ndarray]:
        """Advantages (and value targets, with a critic) of one group's rows, laid out episode by episode.

        The configured estimator's registry entry (``agents.advantages.REGISTRY``) names the arrays and settings
        it takes; an estimator normalised over the batch waits for :meth:`finalize`.
        """
        c = self.config
        spec = c.estimator_spec
        arrays = self._arrays(rows)
        settings = spec.settings(c)
        if settings.get("normalize") == "batch":
            # finalize() normalises over the batch, then adds the episode term as the estimator adds it after its own.
            settings["normalize"] = "none"
            if "episode_coef" in settings:
                settings["episode_coef"] = 0.0
        a = spec.function(**{name: arrays[name] for name in spec.inputs}, **settings)
        return a, (a + arrays["values"] if spec.needs_critic else np.zeros(len(rows)))

    def _arrays(self, rows: list[Row]) -> dict[str, np.ndarray | list[np.ndarray]]:
        """Every per-row array an estimator can take (``agents.advantages.INPUTS``), over one group's rows."""
        invalid = np.array([r.invalid for r in rows], dtype=np.float64)
        return {
            "rewards": np.array([r.reward for r in rows], dtype=np.float64),
            "episode_index": np.array([r.episode for r in rows], dtype=np.int64),
            "group_index": np.array([r.group for r in rows], dtype=np.int64),
            "state_keys": np.array([r.state_key for r in rows]),
            "next_state_keys": np.array([r.next_state_key for r in rows]),
            "terminated": np.array([r.terminated for r in rows], dtype=bool),
            "success": np.array([r.done and r.won for r in rows], dtype=bool),
            # The rivals and GiGPO charge an invalid action's penalty as their published trainers do (docs/rivals.md).
            "penalties": self.config.invalid_action_penalty * invalid,
            "backoff_keys": self._levels(rows),
            "values": np.array([r.value for r in rows]),
            "last_values": np.array([r.next_value for r in rows]),
        }

    def credit_under(self, config: GAGPOConfig) -> np.ndarray:
        """The advantages ``config``'s estimator gives these rows, group by group as it computes them (before any
        batch normalisation or rescaling), in row order: how another estimator would credit this same rollout."""
        other = GroupRolloutBuffer(config)
        position = {id(r): i for i, r in enumerate(self.rows)}
        out = np.zeros(len(self.rows))
        for group in self.finished_groups:
            rows = self._group_rows(group)
            out[[position[id(r)] for r in rows]] = other._estimate(rows)[0]
        return out

    def finalize(self, reduce: Callable[[list[float]], np.ndarray] | None = None) -> None:
        """Apply what needs the whole batch: normalisation for the estimators whose entry is ``batch_normalized``
        (GAGPO with normalize="batch", the PPO baseline), then ``advantage_scale="unit"``'s rescaling.

        ``reduce`` sums a few numbers over the ranks of a distributed run, so that the batch is every rank's rows.
        Groups zeroed by ``zero_failed_groups`` stay exactly 0: they are left out of the batch's mean and std (as
        under per-group normalisation, where they take no part either), so no constant shift reaches them.
        """
        if not self.complete:
            raise RuntimeError("finalize() called while episodes are still running")
        c = self.config
        zeroed = (
            {g for g in self.finished_groups if self._zeroed(self._group_rows(g))} if c.zero_failed_groups else set()
        )
        kept = np.array([r.group not in zeroed for r in self.rows], dtype=bool)
        if c.estimator_spec.batch_normalized(c):
            self._batch_normalize(kept, zeroed, reduce)
        if c.advantage_scale == "unit":
            self._rescale(kept, reduce)

    def _rescale(self, kept: np.ndarray, reduce: Callable[[list[float]], np.ndarray] | None) -> None:
        """Divide every advantage by the root mean square over the batch's kept rows (``advantage_scale="unit"``).

        Estimators differ in scale (G2PO sums three standardised terms, GiGPO two, GRPO one), and at one learning
        rate a wider advantage is a larger step: with one scale, a difference between estimators is their credit's,
        not their step size's. Signs and ratios inside the batch are kept; a batch of zeros stays zero.
        """
        a = self.advantages()
        n, squares = (reduce or np.asarray)([float(kept.sum()), float(np.square(a[kept]).sum())])
        rms = float(np.sqrt(squares / n)) if n > 0 else 0.0
        if rms > 0.0:
            for r, ai in zip(self.rows, a / rms):
                r.advantage = float(ai)

    def _batch_normalize(
        self, kept: np.ndarray, zeroed: set[int], reduce: Callable[[list[float]], np.ndarray] | None
    ) -> None:
        """Standardise over the batch's kept rows (the whole batch across ranks with ``reduce``); see finalize."""
        c = self.config
        spec = c.estimator_spec
        a = self.advantages()
        out = np.zeros_like(a)
        if reduce is None:
            out[kept] = adv.normalize_advantages(a[kept], mode="batch", eps=c.adv_eps)
        else:
            b = a[kept]
            n, total, squares = reduce([b.size, b.sum(), np.square(b).sum()])
            mean = total / max(n, 1)
            std = np.sqrt(max(squares - n * mean**2, 0.0) / (n - 1)) if n > 1 else 0.0
            out[kept] = (b - mean) / (std + c.adv_eps) if n > 1 else 0.0
        for r, ai in zip(self.rows, out):
            r.advantage = float(ai)
        settings = spec.settings(c)
        coef = settings.get("episode_coef", 0.0) if settings.get("normalize") == "batch" else 0.0  # see _estimate
        if coef:
            # As gagpo_advantages adds it: episode_coef * GRPO advantage, after normalisation.
            for group in self.finished_groups:
                if group in zeroed:
                    continue
                rows = self._group_rows(group)
                rewards = np.array([r.reward for r in rows], dtype=np.float64)
                episodes = np.array([r.episode for r in rows], dtype=np.int64)
                grpo = adv.grpo_advantages(rewards, episodes, np.zeros(len(rows), dtype=np.int64), eps=c.adv_eps)
                for r, ai in zip(rows, grpo):
                    r.advantage += coef * float(ai)

    def key_stats(self) -> dict:
        """adv.step_group_stats over all rows, with the configured back-off levels (level_shares), for logging."""
        groups = np.array([r.group for r in self.rows], dtype=np.int64)
        keys = np.array([r.state_key for r in self.rows])
        return adv.step_group_stats(
            groups, keys, backoff_keys=self._levels(self.rows), backoff_min_count=self.config.backoff_min_count
        )

    def minibatches(
        self,
        rng: np.random.Generator,
        n_epochs: int,
        minibatch_size: int,
        gather: Callable[[object], list] | None = None,
    ) -> list[list[list[Row]]]:
        """The update's plan, epoch by epoch (SB3's ``RolloutBuffer.get``): this process's rows of each minibatch.

        Each epoch permutes the rollout's rows in one canonical order (group by group, episode by episode, time
        order) and cuts the permutation into ``ceil(rows / minibatch_size)`` nearly equal minibatches. ``gather``
        returns every rank's value of its argument: with it the order covers every rank's rows and each rank keeps
        its own part of each minibatch, so N ranks step on exactly the minibatches of one process (``rng`` must
        be in the same state on every rank).
        """
        groups = sorted(self._rows_of_group)
        layout = (gather or (lambda obj: [obj]))([(g, len(self._rows_of_group[g])) for g in groups])
        sizes = dict(sorted(item for part in layout for item in part))
        offset = dict(zip(sizes, np.cumsum([0, *sizes.values()])))
        local = {int(offset[g]) + k: row for g in groups for k, row in enumerate(self._group_rows(g))}
        total = sum(sizes.values())
        steps = max(1, math.ceil(total / minibatch_size))
        plan = []
        for _ in range(n_epochs):
            order = rng.permutation(total)
            plan.append([[local[i] for i in chunk if i in local] for chunk in np.array_split(order, steps)])
        return plan

    def advantages(self) -> np.ndarray:
        return np.array([r.advantage for r in self.rows], dtype=np.float64)

    def __len__(self) -> int:
        return len(self.rows)
