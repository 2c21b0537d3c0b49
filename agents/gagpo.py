"""GAGPOAgent: ``agent = GAGPOAgent(env); agent.learn(steps)``.

The loop is Stable-Baselines3's on-policy loop: collect a rollout (every group plays its task to the end),
compute advantages in the buffer, recompute the behaviour log-probs with the update's own forward, run the
clipped-PPO update, log, call callbacks. SB3's logger and callbacks are reused unchanged. Model construction
(tiny or pretrained, precision, LoRA, the KL reference) lives in :mod:`agents.models`; evaluation panels in
:mod:`agents.evaluation`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, ProgressBarCallback
from stable_baselines3.common.logger import HumanOutputFormat, Logger, make_output_format

from agents import checkpoint
from agents.buffer import GroupRolloutBuffer, Row
from agents.callbacks import OneLineOutput, StepProgressBar, step_accurate
from agents.checkpoint import AGENT_FILE
from agents.config import GAGPOConfig
from agents.distributed import Distributed
from agents.evaluation import check_reward, info_at, make_env, run_panel
from agents.loss import clipped_policy_loss, k3_kl
from agents.models import REFERENCE_FILE, Models, ModelSource, Restore, build_models
from agents.policy import PolicyCore, budget_batches
from agents.tiny import collect_env_text
from agents.warm_start import prior_defaults, read_prior
from wrappers import GroupedVectorEnv, PromptBuilder, extract_action

#: A mean sampler/trainer log-prob gap (nats per token) far beyond rounding in the compute dtype: the engine holds
#: other weights than the trainer. Warned about once (rollout/logp_gap_mean). fp32: measured 1e-7 with vLLM on a CPU,
#: 0.025 with one MLP weight of a random tiny model left unsynced; bf16: an estimate, not yet measured on a GPU.
LOGP_GAP_WARN = {torch.float32: 1e-3, torch.bfloat16: 0.1}


def _env_source(env: Any) -> tuple[str, dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    """(env id, constructor kwargs, extra wrappers) that rebuild ``env`` in every sub-env of the vector env.

    A made env keeps what ``gymnasium.make`` was told (``max_episode_steps`` included) and the wrappers put on
    it afterwards, as far as Gymnasium can re-create them from ``env.spec``.
    """
    if isinstance(env, str):
        return env, {}, []
    if isinstance(env, gym.vector.VectorEnv):
        raise ValueError(
            "GAGPOAgent builds its own grouped vector env (num_groups x group_size sub-envs): pass the env id "
            "or one env made with gymnasium.make, not a gymnasium vector env"
        )
    spec = getattr(env, "spec", None)
    if spec is None:
        raise ValueError(
            "this env has no spec to rebuild its sub-envs from: it is not registered, or one of its wrappers "
            "does not record its constructor arguments; pass an env id, an env made with gymnasium.make "
            "(wrappers recording their arguments), or a GroupedVectorEnv built from your own factory"
        )
    kwargs = dict(spec.kwargs)
    registered = gym.spec(spec.id)
    if spec.max_episode_steps != registered.max_episode_steps:
        kwargs["max_episode_steps"] = spec.max_episode_steps
    wrappers = [(w.entry_point, dict(w.kwargs or {})) for w in spec.additional_wrappers]
    return spec.id, kwargs, wrappers


@contextlib.contextmanager
def _quiet_hub():
    """No Hugging Face progress bars while saving or loading a checkpoint."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


class GAGPOAgent:
    """A multi-turn LLM agent trained with GAGPO (or GiGPO, GRPO, RLOO, PPO with a critic).

    Args:
        env: an env id (``"gagpo_gym/Maze-v0"``), an env made with ``gymnasium.make``, or a
            :class:`~wrappers.GroupedVectorEnv` whose sub-envs are wrapped with :func:`~wrappers.wrap_text_env`.
        model: ``"tiny"`` (a small Qwen2 built from a config, tokenizer trained on the env's text) or a local
            checkpoint path / hub id for ``AutoModelForCausalLM``. A folder written by
            :func:`~agents.warm_start.warm_start` is a tiny model with a language prior: it fine-tunes with
            :data:`~agents.warm_start.FINE_TUNE` and the prompt settings it was trained with as defaults.
        estimator: ``"gagpo"`` | ``"gigpo"`` | ``"grpo"`` | ``"rloo"`` | ``"ppo"``.
        env_kwargs: constructor arguments for the env (with an env id).
        verbose: 0 silent, 1 one line per iteration on stdout, 2 SB3's full table.
        log_dir: where SB3's logger writes CSV, JSON and TensorBoard (when installed) files.
        **hyperparameters: any field of :class:`~agents.config.GAGPOConfig`.
    """

    def __init__(
        self,
        env: Any,
        model: str = "tiny",
        estimator: str = "gagpo",
        *,
        env_kwargs: dict[str, Any] | None = None,
        verbose: int = 1,
        log_dir: str | None = None,
        seed: int | None = None,
        _restore: Restore | None = None,
        _env_wrappers: list | None = None,
        **hyperparameters: Any,
    ) -> None:
        if seed is not None:
            hyperparameters["seed"] = seed
        self.model_source = model
        # A warm-started tiny model (agents.warm_start) fine-tunes with the prior's fine-tuning and prompt settings,
        # unless given others (a restored agent's saved config holds them).
        prior = read_prior(model) if model != "tiny" and _restore is None else None
        for key, value in (prior_defaults(prior) if prior else {}).items():
            hyperparameters.setdefault(key, value)
        kind = _restore.source.kind if _restore else "tiny" if model == "tiny" else "prior" if prior else "pretrained"
        self.tiny = kind != "pretrained"
        self.config = GAGPOConfig.from_dict({"estimator": estimator, **hyperparameters}).resolved(self.tiny)
        c = self.config
        if c.backend == "vllm" and c.action_mode == "choose":
            warnings.warn(
                "backend='vllm' serves generate mode; choose mode scores candidates with the trainer's packed forward",
                stacklevel=2,
            )
        if self.tiny and c.lora_r > 0:
            raise ValueError("lora_r > 0 needs a pretrained model: the tiny model starts random and trains all weights")
        torch.set_num_threads(c.torch_threads or max(1, (os.cpu_count() or 2) // 2))
        torch.manual_seed(c.seed)
        self.rng = np.random.default_rng(c.seed)
        self.num_timesteps = 0
        self.iteration = 0
        self.dist = Distributed(fsdp=c.fsdp)
        if c.backend == "vllm" and self.dist.world_size > 1:
            raise ValueError("backend='vllm' runs one engine in one process: launch a single process (or use 'hf')")
        self.verbose = verbose if self.dist.is_main else 0  # logs come from the main process

        self.env_id, self.env_kwargs, self.env_wrappers = None, dict(env_kwargs or {}), []
        if isinstance(env, GroupedVectorEnv):  # under a launch: this rank's own groups
            self.env = env
            self.env_id = env.spec.id if env.spec is not None else None
            self.num_groups = env.num_groups * self.dist.world_size
        else:
            if c.num_groups % self.dist.world_size:
                raise ValueError(
                    f"num_groups ({c.num_groups}) must be a multiple of the number of processes "
                    f"({self.dist.world_size}): each rank plays whole groups"
                )
            self.num_groups = c.num_groups
            self.env_id, spec_kwargs, self.env_wrappers = _env_source(env)
            self.env_wrappers = self.env_wrappers or [tuple(w) for w in _env_wrappers or []]
            self.env_kwargs = {**spec_kwargs, **self.env_kwargs}
            self.env = self._make_vec_env(c.num_groups // self.dist.world_size, c.group_size, c.vec_mode)
        self.group_offset = self.dist.rank * self.env.num_groups  # global index of this rank's first group

        corpus = None
        if self.env_id is not None:
            corpus = functools.partial(
                collect_env_text,
                functools.partial(make_env, self.env_id, self.env_kwargs, None, self.env_wrappers),
                seed=c.seed,
            )
        with _quiet_hub() if _restore is not None or prior is not None else contextlib.nullcontext():
            models: Models = build_models(c, model, corpus=corpus, restore=_restore, device=self.dist.device)
        # What a checkpoint may have to read back from the source: a LoRA base, or a pretrained model's KL reference.
        needed = c.lora_r > 0 or c.kl_coef > 0
        self.source = _restore.moved() if _restore else ModelSource.of(model, kind, needed=needed)
        self.policy, self.reference = models.policy, models.reference
        self.reference_core = PolicyCore(self.reference) if self.reference is not None else None
        self.precision = self.policy.precision
        self.prompts = PromptBuilder(
            self.policy.tokenizer, c.action_mode, c.max_prompt_tokens, show_admissible=c.show_admissible
        )
        self.policy.forward_core = self.dist.prepare(self.policy.core)
        self.dist.first_forward(self._zero_loss)
        self.params = [p for p in self.policy.forward_core.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(self.params, lr=c.learning_rate, weight_decay=c.weight_decay)
        self.optimizer = self.dist.prepare_optimizer(optimizer)
        self.buffer = GroupRolloutBuffer(c)
        self._gap_warned = False  # the sampler/trainer log-prob gap is warned about once
        self._plan: list[list[list[Row]]] | None = None  # the next update's minibatches (drawn at the recompute)
        self.set_logger(self._default_logger(log_dir))
        self._mark_boundary()

    # ----- construction ---------------------------------------------------------------------------------
    def _wrap_kwargs(self) -> dict[str, Any]:
        c = self.config
        return {
            "key": c.state_key,
            "penalty": c.invalid_action_penalty,
            "history_length": c.history_length,
            "tagged": c.action_mode == "generate",
            "backoff": c.key_backoff,
        }

    def _make_vec_env(self, num_groups: int, group_size: int, mode: str) -> GroupedVectorEnv:
        if self.env_id is None:
            raise ValueError("this agent's env has no registered id; pass an env to evaluate()")
        factory = functools.partial(make_env, self.env_id, self.env_kwargs, self._wrap_kwargs(), self.env_wrappers)
        return GroupedVectorEnv(factory, num_groups, group_size, mode=mode, task_pool=self.config.task_pool or None)

    def _default_logger(self, log_dir: str | None) -> Logger:
        """SB3's logger: one line per iteration at ``verbose=1``, SB3's table at 2; CSV/JSON/TB in ``log_dir``."""
        outputs: list = []
        if self.verbose == 1:
            outputs.append(OneLineOutput())
        elif self.verbose >= 2:
            outputs.append(HumanOutputFormat(sys.stdout))
        if log_dir is not None:
            os.makedirs(log_dir, exist_ok=True)
            formats = ["csv", "json"]
            try:
                import torch.utils.tensorboard  # noqa: F401

                formats.append("tensorboard")
            except ImportError:
                pass
            outputs += [make_output_format(f, log_dir) for f in formats]
        return Logger(folder=log_dir, output_formats=outputs)

    # ----- SB3-style accessors --------------------------------------------------------------------------
    def set_logger(self, logger: Logger) -> None:
        self.logger = logger

    def get_env(self) -> GroupedVectorEnv:
        return self.env

    def get_vec_normalize_env(self) -> None:
        """Text observations are never normalised (SB3's CheckpointCallback asks)."""
        return None

    # ----- acting ---------------------------------------------------------------------------------------
    def _prompt(self, obs: str, info: dict[str, Any], history: list | None = None) -> list[int]:
        history = info.get("history", []) if history is None else history
        return self.prompts.build(info.get("task", ""), history, obs, info.get("admissible_actions", []))

    def predict(
        self,
        observation: str | list[str],
        info: dict | list[dict],
        state: list | None = None,
        episode_start: bool | Sequence[bool] | None = None,
        deterministic: bool = False,
    ) -> tuple[str, list] | tuple[list[str], list[list]]:
        """The command to play for an observation (with its info), and the memory to pass back next step.

        As SB3's recurrent policies: ``action, state = agent.predict(obs, info, state=state,
        episode_start=start)`` in a plain Gymnasium loop plays with the history the agent trained with (its last
        ``history_length`` observation/command pairs); ``episode_start`` True forgets it. A list of observations
        (and infos) plays a batch: ``state`` and ``episode_start`` then hold one entry per env. Without ``state``
        the history comes from ``info["history"]`` where the agent's own wrappers set it. The action is the
        command for the env: in generate mode the text inside ``<action>...</action>``, ``""`` when the model
        gave none (the env's invalid path).
        """
        single = isinstance(observation, str)
        obs_list = [observation] if single else list(observation)
        info_list = [info] if single else list(info)
        if len(obs_list) != len(info_list):
            raise ValueError("predict needs one info per observation")
        histories = self._histories(len(obs_list), info_list, state, episode_start, single)
        texts = self._act(obs_list, info_list, histories, deterministic)
        commands = [extract_action(t, tagged=self.config.action_mode == "generate") or "" for t in texts]
        k = self.config.history_length
        memory = [(h + [[o, a]])[-k:] if k else [] for h, o, a in zip(histories, obs_list, commands)]
        return (commands[0], memory[0]) if single else (commands, memory)

    def _histories(self, n: int, infos: list[dict], state, episode_start, single: bool) -> list[list]:
        """Each env's history for :meth:`predict`: its state unless its episode starts, else the wrappers'."""
        if state is None:
            if episode_start is None and self.config.history_length and "history" not in infos[0]:
                warnings.warn(
                    "predict() without state= plays every step without history; pass the state it returns "
                    "back (and episode_start) to play with the history the agent trained with",
                    stacklevel=3,
                )
            return [list(i.get("history", [])) for i in infos]
        states = [state] if single else list(state)
        starts = np.broadcast_to(np.asarray(False if episode_start is None else episode_start, dtype=bool), (n,))
        if len(states) != n:
            raise ValueError(f"predict got {n} observations and {len(states)} states")
        return [[] if start else list(h) for h, start in zip(states, starts)]

    def _act(self, obs: list[str], infos: list[dict], histories: list[list], deterministic: bool) -> list[str]:
        """The model's texts (generate mode: the whole response) for a batch of observations."""
        prompts = [self._prompt(o, i, h) for o, i, h in zip(obs, infos, histories)]
        admissible = [list(i.get("admissible_actions", [])) for i in infos]
        self.policy.eval()
        with self.dist.full_params():
            return self.policy.act(prompts, admissible, rng=self.rng, deterministic=deterministic).texts

    # ----- rollouts -------------------------------------------------------------------------------------
    def collect_rollouts(self, callback: BaseCallback) -> bool:
        """Every group plays its task to the end; rows go to the buffer. False if a callback stopped training."""
        self.buffer.reset()
        self.policy.eval()
        start_timesteps = self.num_timesteps
        callback.on_rollout_start()
        with self.dist.full_params():
            return self._play_rollout(callback, start_timesteps)

    def _play_rollout(self, callback: BaseCallback, start_timesteps: int) -> bool:
        env, c = self.env, self.config
        # Task seeds of iteration k come from (seed, k): reproducible, resumable, and unrelated across seeds. All
        # groups' seeds are drawn at once and each rank plays its slice: together, one process's tasks.
        sampler = np.random.default_rng(int(np.random.SeedSequence([c.seed, self.iteration]).generate_state(1)[0]))
        task_seeds = env.draw_task_seeds(sampler, self.num_groups)
        local_seeds = task_seeds[self.group_offset : self.group_offset + env.num_groups]
        obs, infos = env.reset(options={"task_seeds": local_seeds})
        if "history" not in infos:
            raise ValueError("the GroupedVectorEnv's sub-envs must be wrapped with wrappers.wrap_text_env")
        current = [info_at(infos, i) for i in range(env.num_envs)]
        for g in range(env.num_groups):
            members = np.flatnonzero(env.group_index == g)
            self.buffer.start_group(self._group_id(g), env.episode_index[members].tolist())
        stats = {"gen_s": 0.0, "env_s": 0.0, "tokens": 0, "invalid": 0, "unparsed": 0}
        episodes: list[dict[str, Any]] = []
        returns = np.zeros(env.num_envs)
        lengths = np.zeros(env.num_envs, dtype=int)
        while env.active.any():
            idx = np.flatnonzero(env.active)
            if c.action_mode == "choose":
                for i in idx:
                    if not current[i].get("admissible_actions"):
                        raise ValueError(
                            f"{self.env_id}: task {current[i].get('task_id')!r} offers no admissible actions at step "
                            f"{lengths[i]}; choose mode picks among them (use action_mode='generate')"
                        )
            t0 = time.perf_counter()
            prompts = [self._prompt(obs[i], current[i]) for i in idx]
            seeds = [self._action_seed(env, i, int(lengths[i])) for i in idx]
            out = self.policy.act(prompts, [current[i]["admissible_actions"] for i in idx], seeds=seeds)
            stats["gen_s"] += time.perf_counter() - t0
            stats["tokens"] += out.scored_tokens
            actions: list[Any] = [None] * env.num_envs
            for k, i in enumerate(idx):
                actions[i] = out.texts[k]
            t0 = time.perf_counter()
            obs, rewards, terminated, truncated, infos = env.step(actions)
            stats["env_s"] += time.perf_counter() - t0
            next_infos = {int(i): info_at(infos, i) for i in idx}
            for i in idx:
                check_reward(rewards[i], self.env_id, repr(next_infos[i].get("task_id")), lengths[i] + 1, actions[i])
            next_values = self._bootstrap_values(idx, obs, next_infos, truncated)
            for k, i in enumerate(idx):
                info = next_infos[i]
                done = bool(terminated[i] or truncated[i])
                stats["invalid"] += not info.get("action_valid", True)
                stats["unparsed"] += not info.get("action_parsed", True)
                self.buffer.add(
                    Row(
                        group=self._group_id(int(env.group_index[i])),
                        episode=int(env.episode_index[i]),
                        prompt_ids=out.prompt_ids[k],
                        old_logp=out.logp[k],
                        reward=float(rewards[i]),
                        state_key=current[i]["state_key"],
                        next_state_key=info["state_key"],
                        terminated=bool(terminated[i]),
                        done=done,
                        won=bool(info.get("won", False)),
                        response_ids=out.response_ids[k] if out.response_ids else [],
                        candidate_ids=out.candidate_ids[k] if out.candidate_ids else [],
                        chosen=out.chosen[k] if out.chosen else -1,
                        value=out.values[k] if out.values else 0.0,
                        next_value=next_values.get(int(i), 0.0),
                        backoff_keys=Row.keys_from(current[i], c.key_backoff),
                    )
                )
                returns[i] += rewards[i]
                lengths[i] += 1
                if done:
                    episodes.append({"return": returns[i], "length": lengths[i], "won": bool(info.get("won", False))})
                current[i] = info
            self.num_timesteps += len(idx)
            # What SB3's on-policy loop offers callbacks: only the members stepped this time can be done.
            stepped = np.zeros(env.num_envs, dtype=bool)
            stepped[idx] = True
            new_obs, dones = obs, (np.asarray(terminated) | np.asarray(truncated)) & stepped  # noqa: F841
            n_active = len(idx)  # noqa: F841  (read by the progress bar through locals)
            callback.update_locals(locals())
            if not callback.on_step():
                return False
        # Callbacks saw this rank's steps; from here on the count is every rank's.
        self.num_timesteps = start_timesteps + int(self.dist.sum([len(self.buffer.rows)])[0])
        self.buffer.finalize(self.dist.sum if self.dist.enabled else None)
        self._log_rollout(episodes, stats)
        callback.on_rollout_end()
        return True

    def _group_id(self, local_group: int) -> int:
        """A group's id in the buffer: unique across iterations and ranks."""
        return self.iteration * self.num_groups + self.group_offset + local_group

    def _action_seed(self, env: GroupedVectorEnv, i: int, step: int) -> int:
        """The random stream of one action: a function of (seed, iteration, group, member, step) alone, so the
        rollout does not depend on batching or on how groups are spread over processes."""
        group = self._group_id(int(env.group_index[i]))
        member = int(i) % env.group_size
        return int(np.random.SeedSequence([self.config.seed, group, member, step]).generate_state(2, np.uint64)[0] >> 1)

    def _bootstrap_values(self, idx, obs, infos, truncated) -> dict[int, float]:
        """V(s_T) of truncated final states, for the PPO baseline's GAE."""
        cut = [int(i) for i in idx if truncated[i]]
        if self.policy.value_head is None or not cut:
            return {}
        values = self.policy.values([self._prompt(obs[i], infos[i]) for i in cut])
        return dict(zip(cut, values))

    # ----- update ---------------------------------------------------------------------------------------
    def _micro_batches(self, rows: list[Row]) -> list[list[Row]]:
        """Split rows so that each forward holds at most ``token_budget`` tokens."""
        sizes = [len(r.prompt_ids) + len(r.response_ids) + sum(len(c) for c in r.candidate_ids) for r in rows]
        return [[rows[i] for i in batch] for batch in budget_batches(sizes, self.config.token_budget)]

    def _evaluate_rows(self, rows: list[Row], core=None, *, entropy: bool = True):
        return self.policy.evaluate(
            [r.prompt_ids for r in rows],
            responses=[r.response_ids for r in rows],
            candidates=[r.candidate_ids for r in rows],
            chosen=[r.chosen for r in rows],
            core=core,
            entropy=entropy,
        )

    @torch.no_grad()
    def recompute_log_probs(self) -> None:
        with self.dist.full_params():
            self._recompute_log_probs()

    def _recompute_log_probs(self) -> None:
        """Behaviour (and reference) log-probs of the rollout from the update's own forward, once per rollout.

        The sampler's log-probs come from another computation (cached, batched differently, maybe another
        engine); the PPO ratio must start at exactly 1, so the trainer's forward is the source of truth, as in
        verl and TRL. The rows are recomputed in the first epoch's minibatches and micro-batches, so the first
        optimiser step sees bit-identical log-probs (same shapes, same kernels: the ratio is exactly 1, in bf16
        too). The largest gap to the sampler's values is logged.
        """
        self.policy.train()  # the mode the update runs in (dropout, gradient checkpointing)
        self._plan = self._update_plan()
        gaps, entropy = [], []
        micros = [m for minibatch in self._plan[0] for m in self._micro_batches(minibatch)]
        for micro in micros:
            ev = self._evaluate_rows(micro)
            ref = self._reference_eval(micro) if self.config.kl_coef > 0 else None
            logp = ev.logp.float().cpu().numpy()
            for k, r in enumerate(micro):
                n = len(r.old_logp)
                fresh = logp[k, :n].astype(np.float64)
                gaps.append(np.abs(fresh - r.old_logp))
                r.rollout_logp, r.old_logp = r.old_logp, fresh
                if self.config.rollout_is == "on":
                    r.is_weight = min(math.exp(float(np.mean(fresh - r.rollout_logp))), self.config.rollout_is_cap)
                if ref is not None:
                    r.ref_logp = ref[k, :n].float().cpu().numpy().astype(np.float64)
            entropy += ev.entropy.float().cpu().tolist()
        per_token = np.concatenate(gaps) if gaps else np.zeros(0)
        gap, mean_gap = float(per_token.max(initial=0.0)), float(per_token.mean()) if per_token.size else 0.0
        self.logger.record("rollout/logp_gap_max", gap)
        self.logger.record("rollout/logp_gap_mean", mean_gap)
        if self.config.rollout_is == "on":
            weights = np.array([r.is_weight for r in self.buffer.rows])
            self.logger.record("rollout/is_weight_mean", float(weights.mean()) if weights.size else 1.0)
            self.logger.record("rollout/is_truncated_share", float(np.mean(weights >= self.config.rollout_is_cap)))
        if mean_gap > LOGP_GAP_WARN.get(self.precision.compute_dtype, 0.1) and not self._gap_warned:
            self._gap_warned = True
            warnings.warn(
                f"the sampler's log-probs differ from the trainer's by {mean_gap:.3f} nats per token on average "
                f"(up to {gap:.2f}; rollout/logp_gap_mean, _max): the engine holds other weights than the trainer "
                f"(a weight its loader did not take?) or computes in a much coarser dtype",
                stacklevel=2,
            )
        self.logger.record("rollout/entropy", float(np.mean(entropy)) if entropy else 0.0)

    def _reference_eval(self, rows: list[Row]) -> torch.Tensor:
        if self.reference_core is not None:
            return self._evaluate_rows(rows, self.reference_core, entropy=False).logp
        with self.policy.model.disable_adapter():  # LoRA: the base model is the initial policy
            return self._evaluate_rows(rows, entropy=False).logp

    def train(self) -> None:
        """n_epochs of clipped-PPO minibatch updates over the rollout.

        Each epoch splits the rollout into ``ceil(rows / minibatch_size)`` minibatches of nearly equal size; each
        minibatch is one optimiser step, its micro-batches (``token_budget``) accumulate gradients. In a launch,
        every rank takes the same number of steps and forwards (a rank with fewer rows runs zero-weight ones),
        and each rank's loss is weighted by its share of the global minibatch, so the reduced gradient is
        exactly the one-process gradient.
        """
        c, dist = self.config, self.dist
        self.policy.train()
        t0 = time.perf_counter()
        keys = ("policy_loss", "kl", "entropy", "clip_fraction", "approx_kl", "grad_norm", "value_loss")
        logs: dict[str, list[float]] = {k: [] for k in keys}
        skipped = 0
        first_ratio_dev = None
        plan, self._plan = self._plan or self._update_plan(), None
        for minibatches in plan:
            for minibatch in minibatches:
                micros = self._micro_batches(minibatch)
                sizes = dist.gather((len(minibatch), len(micros)))
                global_rows, n_micro = sum(s[0] for s in sizes), max(s[1] for s in sizes)
                self.optimizer.zero_grad(set_to_none=True)
                bad, ratio_dev = 0, 0.0
                for k in range(n_micro):
                    micro = micros[k] if k < len(micros) else []
                    with dist.no_sync(self.policy.forward_core, skip=k < n_micro - 1):
                        loss, dev = self._micro_loss(micro, logs) if micro else (None, 0.0)
                        if loss is not None and not torch.isfinite(loss):
                            bad, loss = 1, None
                        if loss is None:
                            dist.backward(self._zero_loss())  # keeps this rank's collectives in step
                            continue
                        dist.backward(loss * (len(micro) / global_rows * dist.world_size))
                        ratio_dev = max(ratio_dev, dev)
                if first_ratio_dev is None:  # before any step: on-policy, so the ratio must be 1
                    first_ratio_dev = max(dist.gather(ratio_dev))
                grad_norm = dist.clip_grad_norm_(self.params, c.max_grad_norm)
                if dist.sum([bad])[0] > 0 or not torch.isfinite(grad_norm):
                    skipped += 1
                    self.optimizer.zero_grad(set_to_none=True)
                    continue
                logs["grad_norm"].append(float(grad_norm))
                self.optimizer.step()
        # The last step's gradients would otherwise live until the next update, beside a waking rollout engine.
        self.optimizer.zero_grad(set_to_none=True)
        self.logger.record("time/update_s", time.perf_counter() - t0)
        self.logger.record("train/skipped_updates", skipped)
        self.logger.record("train/first_ratio_dev", first_ratio_dev or 0.0)
        for key, values in logs.items():
            if values:
                self.logger.record(f"train/{key}", float(np.mean(values)))

    def _update_plan(self) -> list[list[list[Row]]]:
        """The update's minibatches, epoch by epoch: every rank's part of one process's minibatches."""
        gather = self.dist.gather if self.dist.enabled else None
        return self.buffer.minibatches(self.rng, self.config.n_epochs, self.config.minibatch_size, gather)

    def _micro_loss(self, micro: list[Row], logs: dict[str, list[float]]) -> tuple[torch.Tensor, float]:
        """The loss of one micro-batch, a mean over its actions (logs its parts), and its largest |ratio - 1|."""
        c = self.config
        ev = self._evaluate_rows(micro, entropy=c.ent_coef > 0)
        device = ev.logp.device
        old = self._padded([r.old_logp for r in micro], ev.logp)
        advantage = torch.as_tensor([r.advantage for r in micro], dtype=ev.logp.dtype, device=device)
        weights = torch.as_tensor([r.is_weight for r in micro], dtype=ev.logp.dtype, device=device)
        pg_loss, info = clipped_policy_loss(
            ev.logp, old, ev.mask, advantage, clip_low=c.clip_range_low, clip_high=c.clip_range_high, ratio=c.ratio,
            weights=weights,
        )  # fmt: skip
        loss = pg_loss
        if c.ent_coef > 0:
            loss = loss - c.ent_coef * ev.entropy.mean()
            logs["entropy"].append(float(ev.entropy.mean().detach()))
        if c.kl_coef > 0:
            kl = k3_kl(ev.logp, self._padded([r.ref_logp for r in micro], ev.logp), ev.mask).mean()
            loss = loss + c.kl_coef * kl
            logs["kl"].append(float(kl.detach()))
        if ev.values is not None:
            target = torch.as_tensor([r.value_target for r in micro], device=ev.values.device)
            value_loss = torch.nn.functional.mse_loss(ev.values, target)
            loss = loss + c.vf_coef * value_loss
            logs["value_loss"].append(float(value_loss.detach()))
        logs["policy_loss"].append(float(pg_loss.detach()))
        logs["clip_fraction"].append(float(info["clip_fraction"]))
        logs["approx_kl"].append(float(info["approx_kl"]))
        return loss, float(info["ratio_dev_max"])

    def _zero_loss(self) -> torch.Tensor:
        """A zero loss through the whole wrapped model (one token, one prediction): a rank with no rows left
        still runs the forward and backward its peers run, so DDP/FSDP collectives stay matched."""
        device = self.policy.device
        one = torch.ones((1, 1), dtype=torch.long, device=device)
        zero = torch.zeros(1, dtype=torch.long, device=device)
        with self.precision.autocast():
            logp, _, end, values = self.policy.forward_core(
                one * self.policy.tokenizer.pad_token_id, one, None, zero, zero, zero, zero,
                temperature=1.0, entropy=False,
            )  # fmt: skip
        loss = logp.sum() + end.float().sum()
        return (loss + values.sum() if values is not None else loss) * 0.0

    @staticmethod
    def _padded(values: list[np.ndarray], like: torch.Tensor) -> torch.Tensor:
        """Per-row arrays of log-probs, zero-padded to ``like``'s [B, T]."""
        out = torch.zeros(like.shape, dtype=torch.float32)
        for k, v in enumerate(values):
            out[k, : len(v)] = torch.as_tensor(v, dtype=torch.float32)
        return out.to(like.device)

    def _log_rollout(self, episodes: list[dict[str, Any]], stats: dict[str, float]) -> None:
        """Rollout statistics over every rank's episodes and rows (advantage statistics: this rank's rows)."""
        rows = self.buffer.rows
        a = self.buffer.advantages()
        if self.dist.enabled:
            episodes = [e for part in self.dist.gather(episodes) for e in part]
            keys = ("invalid", "unparsed", "tokens")
            stats = {**stats, **dict(zip(keys, self.dist.sum([stats[k] for k in keys]).tolist()))}
        n = int(self.dist.sum([len(rows)])[0])
        record = self.logger.record
        record("rollout/success_rate", float(np.mean([e["won"] for e in episodes])))
        record("rollout/ep_return_mean", float(np.mean([e["return"] for e in episodes])))
        record("rollout/ep_len_mean", float(np.mean([e["length"] for e in episodes])))
        record("rollout/invalid_rate", stats["invalid"] / max(n, 1))
        record("rollout/unparsed_rate", stats["unparsed"] / max(n, 1))
        record("rollout/prompt_truncations", self.prompts.truncated_count)
        record("rollout/prompt_overflows", self.prompts.overflow_count)
        record("advantage/mean", float(a.mean()))
        record("advantage/std", float(a.std()))
        q75, q25 = np.percentile(a, [75, 25])
        record("advantage/iqr", float(q75 - q25))
        record("advantage/share_abs_gt_1", float(np.mean(np.abs(a) > 1)))
        sets = self.buffer.key_stats()
        record("advantage/singleton_share", sets["singleton_row_share"])
        record("advantage/set_size_mean", sets["set_size_mean"])
        record("advantage/set_size_max", sets["set_size_max"])
        for level, share in enumerate(sets["level_shares"]):
            record(f"advantage/level_share_{level}", share)
        record("time/generate_s", stats["gen_s"])
        record("time/env_s", stats["env_s"])
        rollout_s = stats["gen_s"] + stats["env_s"]
        record("time/env_steps_per_s", n / max(rollout_s, 1e-9))
        record("time/tokens_per_s", stats["tokens"] / max(stats["gen_s"], 1e-9))
        self.last_rollout = {"episodes": episodes, "rows": n, **stats}

    # ----- the loop -------------------------------------------------------------------------------------
    def _init_callback(self, callback, progress_bar: bool) -> BaseCallback:
        if isinstance(callback, list):
            callback = CallbackList(callback)
        elif callback is None:
            callback = CallbackList([])
        if progress_bar:
            callback = CallbackList([callback, StepProgressBar()])
        stack = [callback]
        while stack:  # SB3's own progress bars count env steps taken, not sub-envs per vector step
            cb = stack.pop()
            stack += getattr(cb, "callbacks", [])
            if isinstance(cb, ProgressBarCallback) and not isinstance(cb, StepProgressBar):
                step_accurate(cb)
        callback.init_callback(self)
        return callback

    def learn(
        self,
        total_timesteps: int,
        callback: BaseCallback | list[BaseCallback] | None = None,
        progress_bar: bool = False,
        log_interval: int = 1,
        reset_num_timesteps: bool = True,
    ) -> GAGPOAgent:
        """Train until ``total_timesteps`` env steps (actions) have been taken; returns self.

        An iteration is never cut: the one in progress when the count is reached is finished (every group
        plays its task to the end and is trained on), so a run takes up to one iteration's steps more.
        """
        if reset_num_timesteps:
            self.num_timesteps = 0
            self.iteration = 0
        total_timesteps = int(total_timesteps) + (0 if reset_num_timesteps else self.num_timesteps)
        callback = self._init_callback(callback, progress_bar)
        callback.on_training_start(locals(), globals())
        while self.num_timesteps < total_timesteps:
            t0 = time.perf_counter()
            if not self.collect_rollouts(callback):
                break
            self.logger.record("time/weight_sync_s", self.policy.backend.last_sync_s)
            self.policy.backend.release()  # a separate engine's weights are stale from here (on CUDA it sleeps)
            self.recompute_log_probs()
            self.logger.record("time/rollout_s", time.perf_counter() - t0)
            self.train()
            self.iteration += 1
            self._mark_boundary()
            self.logger.record("time/iterations", self.iteration)
            self.logger.record("time/total_timesteps", self.num_timesteps)
            if log_interval and self.iteration % log_interval == 0:
                self.logger.dump(step=self.num_timesteps)
        callback.on_training_end()
        return self

    # ----- evaluation -----------------------------------------------------------------------------------
    def evaluate(
        self, env: str | None = None, n_tasks: int = 50, *, deterministic: bool = True, batch_size: int = 16,
        seed_offset: int = 0, env_kwargs: dict[str, Any] | None = None, episodes: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        """Play a fixed panel of tasks (seeds ``seed_offset .. seed_offset + n_tasks - 1``), each once.

        Returns success rate, score, mean return, mean length, invalid rate and per-task-type success;
        ``episodes=True`` adds one row per episode.
        """
        env_id = env or self.env_id
        kwargs = self.env_kwargs if env is None else dict(env_kwargs or {})
        if env_id is None:
            raise ValueError("pass an env id to evaluate()")
        wrappers = self.env_wrappers if env is None else []
        factory = functools.partial(make_env, env_id, kwargs, self._wrap_kwargs(), wrappers)
        return run_panel(
            lambda o, i, venv, idx: self._act(o, i, [x.get("history", []) for x in i], deterministic),
            factory, n_tasks, batch_size=batch_size, seed_offset=seed_offset, episodes=episodes,
        )  # fmt: skip

    # ----- persistence ----------------------------------------------------------------------------------
    def _mark_boundary(self) -> None:
        """Remember the counters and RNG states between two iterations: what a checkpoint holds.

        Weights and optimiser only change in the update, so a save() called mid-rollout (SB3's
        CheckpointCallback saves in on_step) still writes a consistent state, the last iteration boundary, and
        the resumed run continues exactly as the uninterrupted one.
        """
        self._boundary = {
            "num_timesteps": self.num_timesteps,
            "iteration": self.iteration,
            "numpy_rng": self.rng.bit_generator.state,
            "torch_rng": torch.get_rng_state(),
        }

    def save(self, path: str | os.PathLike) -> None:
        """A folder: model + tokenizer (safetensors, fp32 master weights), value head, optimizer and RNG state,
        config and counters as JSON, and a manifest of every file's SHA-256 that :meth:`load` checks.

        The folder loads from itself alone, wherever it is moved: a tiny or prior agent with ``kl_coef > 0`` also
        stores its KL reference; a pretrained one records its source's path and fingerprint, checked when the
        reference (or a LoRA base) is read back. A save is all-or-nothing: it is written beside ``path`` and takes
        its name when complete, replacing what was there. A path ending in ``.zip`` (as SB3's CheckpointCallback
        names them) gets that folder as a zip file.
        """
        path = Path(path)
        # Under FSDP every rank takes part in gathering the full weights and optimiser state; one rank writes.
        core_state = self.dist.model_state(self.policy.core)
        optimizer_state = self.dist.optimizer_state(self.policy.core, self.optimizer)
        if self.dist.is_main:
            checkpoint.save_atomically(path, lambda folder: self._save_folder(folder, core_state, optimizer_state))
        self.dist.barrier()

    def _save_folder(self, path: Path, core_state: dict | None, optimizer_state: dict) -> None:
        from safetensors.torch import save_file, save_model

        if core_state is None:  # not sharded: the module's own tensors
            core_state = {f"model.{k}": v for k, v in self.policy.model.state_dict().items()}
            if self.policy.value_head is not None:
                core_state |= {f"value_head.{k}": v for k, v in self.policy.value_head.state_dict().items()}
        part = {name: {k[len(name) + 1 :]: v for k, v in core_state.items() if k.startswith(name + ".")}
                for name in ("model", "value_head")}  # fmt: skip
        model = self.policy.model
        tied = {n for n, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}
        part["model"] = {k: v for k, v in part["model"].items() if k not in tied}  # FSDP gathers tied copies too
        with _quiet_hub():
            self.policy.model.save_pretrained(path / "model", state_dict=part["model"])
            self.policy.tokenizer.save_pretrained(path / "model")
        if self.policy.value_head is not None:
            save_file({k: v.contiguous() for k, v in part["value_head"].items()}, path / "value_head.safetensors")
        if self.reference is not None and self.source.kind != "pretrained":
            save_model(self.reference, str(path / REFERENCE_FILE))
        torch.save(optimizer_state, path / "optimizer.pt")
        boundary = self._boundary
        save_file({"torch": boundary["torch_rng"]}, path / "rng.safetensors")
        meta = {
            "config": self.config.to_dict(),
            "model_source": self.model_source,
            "model": dataclasses.asdict(self.source),
            "env_id": self.env_id,
            "env_kwargs": self.env_kwargs,
            "env_wrappers": self.env_wrappers,
            "num_timesteps": boundary["num_timesteps"],
            "iteration": boundary["iteration"],
            "numpy_rng": boundary["numpy_rng"],
            "optimizer_format": "names" if self.dist.sharded else "indices",
        }
        (path / AGENT_FILE).write_text(json.dumps(meta, indent=2))

    @staticmethod
    def verify_checkpoint(path: str | os.PathLike) -> None:
        """Raise one clear error naming the first missing, altered or unreadable file of a saved agent."""
        with checkpoint.opened(Path(path)) as folder:
            checkpoint.verify(folder)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        env: Any = None,
        *,
        model: str | None = None,
        verbose: int = 1,
        log_dir: str | None = None,
        **overrides: Any,
    ) -> GAGPOAgent:
        """Restore an agent saved with :meth:`save` (no unpickling: safetensors and ``weights_only=True``).

        Every file is checked against the manifest first. ``env`` replaces the saved env id; ``overrides``
        replace saved hyperparameters. The KL reference is the initial policy again, not the saved weights.
        ``model`` points at a copy of a pretrained source that moved (for its LoRA base or KL reference): it must
        have the recorded fingerprint. Nothing is downloaded.
        """
        with checkpoint.opened(Path(path)) as folder:
            return cls._load_folder(folder, env, model=model, verbose=verbose, log_dir=log_dir, **overrides)

    @classmethod
    def _load_folder(
        cls, path: Path, env: Any, *, model: str | None, verbose: int, log_dir: str | None, **overrides: Any
    ) -> GAGPOAgent:
        from safetensors.torch import load_file

        checkpoint.verify(path)
        meta = json.loads((path / AGENT_FILE).read_text())
        values = {**meta["config"], **overrides}
        hyper = {k: v for k, v in values.items() if k != "estimator"}
        source = ModelSource.from_record(meta.get("model", meta["model_source"]), path)
        agent = cls(
            env if env is not None else meta["env_id"],
            model=meta["model_source"],
            estimator=values["estimator"],
            env_kwargs=meta["env_kwargs"] if env is None else None,
            _env_wrappers=meta.get("env_wrappers") if env is None else None,
            verbose=verbose,
            log_dir=log_dir,
            _restore=Restore(path, source, model),
            **hyper,
        )
        if agent.policy.value_head is not None:
            agent.policy.value_head.load_state_dict(load_file(path / "value_head.safetensors"))
        saved_format = meta.get("optimizer_format", "indices")
        if saved_format != ("names" if agent.dist.sharded else "indices"):
            raise ValueError(
                f"saved agent at {path} has an optimizer state saved {'with' if saved_format == 'names' else 'without'}"
                " FSDP: resume it with the same fsdp setting (or start a fresh optimizer with a new agent)"
            )
        optimizer_state = torch.load(path / "optimizer.pt", weights_only=True)
        agent.dist.load_optimizer_state(agent.policy.core, agent.optimizer, optimizer_state)
        agent.num_timesteps, agent.iteration = meta["num_timesteps"], meta["iteration"]
        agent.rng.bit_generator.state = meta["numpy_rng"]
        torch.set_rng_state(load_file(path / "rng.safetensors")["torch"])
        agent._mark_boundary()
        return agent
