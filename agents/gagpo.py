"""GAGPOAgent: ``agent = GAGPOAgent(env); agent.learn(steps)``.

The loop is Stable-Baselines3's on-policy loop: collect a rollout (every group plays its task to the end),
compute advantages in the buffer, recompute the behaviour log-probs with the update's own forward, run the
clipped-PPO update, log, call callbacks. SB3's logger and callbacks are reused unchanged. The parts live in modules
of their own: the env in :mod:`agents.env_spec`, the rollout in :mod:`agents.rollout`, the update in
:mod:`agents.update`, the models in :mod:`agents.models`, evaluation panels in :mod:`agents.evaluation`, the saved
folder's manifest in :mod:`agents.checkpoint`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import Logger

from agents import checkpoint
from agents.buffer import GroupRolloutBuffer, Row
from agents.callbacks import default_logger, init_callback
from agents.checkpoint import TEMPLATE_FILE, quiet_hub
from agents.config import GAGPOConfig
from agents.distributed import Distributed
from agents.env_spec import EnvSpec, check_step_limit, prompt_builder, text_wrapping
from agents.evaluation import run_panel
from agents.models import TINY_KINDS, Models, ModelSource, Restore, build_models
from agents.overlap import STATE_SET_ESTIMATORS, Pending, UpdatePipeline, mixed_version_sets
from agents.policy import LLMPolicy, PolicyCore
from agents.precision import resolve_device
from agents.prior import prior_defaults, read_prior
from agents.rollout import RolloutCollector, RolloutSummary, panel_action_seed
from agents.tiny import collect_env_text
from agents.update import PolicyUpdate
from wrappers import CHOOSE, GENERATE, GroupedVectorEnv, PlaceMemory, extract_action


class GAGPOAgent:
    """A multi-turn LLM agent trained with GAGPO (or GiGPO, GRPO, RLOO, PPO with a critic).

    Args:
        env: an env id (``"gagpo_gym/Maze-v0"``), an env made with ``gymnasium.make``, or a
            :class:`~wrappers.GroupedVectorEnv` whose sub-envs are wrapped with :func:`~wrappers.wrap_text_env`.
        model: ``"tiny"`` (a small Qwen2 built from a config, tokenizer trained on the env's text) or a local
            checkpoint path / hub id for ``AutoModelForCausalLM``. A folder written by
            :func:`~agents.warm_start.warm_start` is a tiny model with a language prior: it fine-tunes with
            :data:`~agents.prior.FINE_TUNE` and the prompt settings it was trained with as defaults.
        estimator: ``"gagpo"`` | ``"gigpo"`` | ``"grpo"`` | ``"rloo"`` | ``"ppo"`` | ``"hgpo"`` | ``"graphgpo"``
            | ``"g2po"``.
        env_kwargs: constructor arguments for the env (with an env id).
        env_wrappers: ``(entry point, kwargs)`` of wrappers to put on the env before the agent's own (a made env
            brings its own from ``env.spec``).
        verbose: 0 silent, 1 one line per iteration on stdout, 2 SB3's full table.
        log_dir: where SB3's logger writes CSV, JSON and TensorBoard (when installed) files.
        restore: a saved agent to rebuild (what :meth:`load` passes).
        **hyperparameters: any field of :class:`~agents.config.GAGPOConfig`.
    """

    def __init__(
        self,
        env: Any,
        model: str = "tiny",
        estimator: str = "gagpo",
        *,
        env_kwargs: dict[str, Any] | None = None,
        env_wrappers: Sequence[tuple[str, dict[str, Any]]] = (),
        verbose: int = 1,
        log_dir: str | None = None,
        seed: int | None = None,
        restore: Restore | None = None,
        **hyperparameters: Any,
    ) -> None:
        if seed is not None:
            hyperparameters["seed"] = seed
        self.model_source = model
        # A warm-started tiny model (agents.warm_start) fine-tunes with the prior's fine-tuning and prompt settings,
        # unless given others (a restored agent's saved config holds them).
        prior = read_prior(model) if model != "tiny" and restore is None else None
        for key, value in (prior_defaults(prior) if prior else {}).items():
            hyperparameters.setdefault(key, value)
        kind = restore.source.kind if restore else "tiny" if model == "tiny" else "prior" if prior else "pretrained"
        tiny = kind in TINY_KINDS
        config = GAGPOConfig.from_dict({"estimator": estimator, **hyperparameters})
        self.config = config.resolved(tiny, accelerator=resolve_device(config.device).type != "cpu")
        c = self.config
        if c.backend == "vllm" and c.action_mode == CHOOSE:
            warnings.warn(
                "backend='vllm' serves generate mode; choose mode scores candidates with the trainer's packed forward",
                stacklevel=2,
            )
        threads = c.torch_threads or max(1, (os.cpu_count() or 2) // 2)
        torch.set_num_threads(threads)
        torch.manual_seed(c.seed)
        self.rng = np.random.default_rng(c.seed)
        self.num_timesteps = 0
        self.iteration = 0
        #: The last rollout's summary over every rank (its episodes, rows, timings, counts), set by
        #: :meth:`collect_rollouts` before ``on_rollout_end``, where callbacks read it; None before the first.
        self.last_rollout: RolloutSummary | None = None
        self.dist = Distributed(fsdp=c.fsdp)
        if c.backend == "vllm" and self.dist.world_size > 1:
            raise ValueError("backend='vllm' runs one engine in one process: launch a single process (or use 'hf')")
        # The main thread's collectives (the rollout's sums and gathers, the update's plan) on a group of their own
        # under overlap: the update thread's DDP all-reduces use the default group at the same time.
        self.rollout_dist = self.dist.side_channel() if c.overlap and self.dist.enabled else self.dist
        self.verbose = verbose if self.dist.is_main else 0  # logs come from the main process

        # The vector env is built when first needed (learn(), get_env()): a loaded agent plays and evaluates
        # without its training env's data (a train split that is not on this machine).
        self.env_spec, self._env, self.num_groups = self._attach_env(env, env_kwargs, env_wrappers)
        self._env_given = self._env is not None  # a GroupedVectorEnv of the user's: never rebuilt
        self._rollout: RolloutCollector | None = None
        corpus = None
        if self.env_spec is not None:
            corpus = functools.partial(collect_env_text, self.env_spec.factory(), seed=c.seed)
        with quiet_hub() if restore is not None or prior is not None else contextlib.nullcontext():
            models: Models = build_models(
                c, model, corpus=corpus, restore=restore, device=self.dist.device, shard=self.dist.fsdp
            )
        # What a checkpoint may have to read back from the source: a LoRA base, or a pretrained model's KL reference.
        needed = c.lora_r > 0 or c.kl_coef > 0
        self.source = restore.moved() if restore else ModelSource.of(model, kind, needed=needed)
        self.policy, self.reference = models.policy, models.reference
        self.reference_core = PolicyCore(self.reference) if self.reference is not None else None
        self.precision = self.policy.precision
        self.prompts = prompt_builder(self.policy.tokenizer, c)
        #: The update beside the next rollout (``overlap``): its thread, the weights' versions, the acting copy
        #: (copied here, before the trainer's weights are wrapped or sharded).
        self.pipeline = UpdatePipeline(self.policy, c.max_staleness, threads) if c.overlap else None
        self.policy.forward_core = self.dist.prepare(self.policy.core)
        params = [p for p in self.policy.forward_core.parameters() if p.requires_grad]
        # Fused: one kernel over all parameters (on a CPU, SmolLM2's 135M: the first step 16 s -> 1 s, then 0.95 s
        # -> 0.07 s, one thread); the for-loop default allocates and updates tensor by tensor.
        optimizer = torch.optim.AdamW(params, lr=c.learning_rate, weight_decay=c.weight_decay, fused=True)
        self.optimizer = self.dist.prepare_optimizer(optimizer)
        self.update = PolicyUpdate(self.policy, self.optimizer, c, self.dist, self.reference_core)
        self.dist.first_forward(self.update.zero_loss)
        self.buffer = GroupRolloutBuffer(c)
        self._log_interval = 1
        # One writer per log folder: under a launch every rank runs this, the main process logs.
        self.set_logger(default_logger(self.verbose, log_dir if self.dist.is_main else None))
        self.mark_boundary()

    # ----- construction ---------------------------------------------------------------------------------
    def _attach_env(
        self, env: Any, env_kwargs: dict[str, Any] | None, env_wrappers: Sequence[tuple[str, dict[str, Any]]]
    ) -> tuple[EnvSpec | None, GroupedVectorEnv | None, int]:
        """The env spec (None: a GroupedVectorEnv from the user's own factory), this rank's vector env (None: built
        from the spec when first needed, :attr:`env`), and the number of groups over all ranks."""
        c = self.config
        if isinstance(env, GroupedVectorEnv):  # under a launch: this rank's own groups
            spec = EnvSpec(env.spec.id, dict(env_kwargs or {})) if env.spec is not None else None
            check_step_limit(spec.id if spec is not None else "from your factory", env.step_limit)
            return spec, env, env.num_groups * self.dist.world_size
        if c.num_groups % self.dist.world_size:
            raise ValueError(
                f"num_groups ({c.num_groups}) must be a multiple of the number of processes "
                f"({self.dist.world_size}): each rank plays whole groups"
            )
        spec = EnvSpec.of(env, env_kwargs, env_wrappers)
        spec.check_step_limit()
        return spec, None, c.num_groups

    @property
    def env(self) -> GroupedVectorEnv:
        """This rank's training env (``num_groups x group_size`` sub-envs), built from :attr:`env_spec` on first use."""
        if self._env is None:
            assert self.env_spec is not None  # a GroupedVectorEnv given to the constructor is kept as it is
            c = self.config
            self._env = self.env_spec.vector(
                c.num_groups // self.dist.world_size, c.group_size, text_wrapping(c), mode=c.vec_mode,
                task_pool=c.task_pool,
            )  # fmt: skip
        return self._env

    @property
    def rollout(self) -> RolloutCollector:
        """What plays a rollout on :attr:`env` into the buffer, made with the env."""
        if self._rollout is None:
            self._rollout = RolloutCollector(
                self.env, self.policy, self.prompts, self.buffer, self.config, self.rollout_dist,
                num_groups=self.num_groups, env_id=self.env_id,
            )  # fmt: skip
        return self._rollout

    def close(self) -> None:
        """Close the training env if it was built (its worker processes, an ALFWorld engine); a later
        :meth:`learn` builds a fresh one."""
        if self._env is not None:
            self._env.close()
            if not self._env_given:
                self._env, self._rollout = None, None

    @property
    def tiny(self) -> bool:
        """The library's tiny model, fresh or warm-started (:data:`agents.models.TINY_KINDS`)."""
        return self.source.tiny

    @property
    def env_id(self) -> str | None:
        return self.env_spec.id if self.env_spec else None

    @property
    def env_kwargs(self) -> dict[str, Any]:
        return self.env_spec.kwargs if self.env_spec else {}

    @property
    def env_wrappers(self) -> tuple[tuple[str, dict[str, Any]], ...]:
        return self.env_spec.wrappers if self.env_spec else ()

    # ----- SB3-style accessors --------------------------------------------------------------------------
    def set_logger(self, logger: Logger) -> None:
        self.logger = logger

    def get_env(self) -> GroupedVectorEnv:
        """The training env (built now if it was not yet: SB3's callbacks ask for it when training starts)."""
        return self.env

    def get_vec_normalize_env(self) -> None:
        """Text observations are never normalised (SB3's CheckpointCallback asks)."""
        return None

    # ----- acting ---------------------------------------------------------------------------------------
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
        ``history_length`` observation/command pairs, and with ``memory`` on the episode's memory, folded from
        all of them); ``episode_start`` True forgets it. A list of observations
        (and infos) plays a batch: ``state`` and ``episode_start`` then hold one entry per env. Without ``state``
        the history comes from ``info["history"]`` where the agent's own wrappers set it. The action is the
        command for the env: in generate mode the text inside ``<action>...</action>``, ``""`` when the model
        gave none (the env's invalid path).
        """
        single = isinstance(observation, str)
        if not single and not (isinstance(observation, Sequence) and all(isinstance(o, str) for o in observation)):
            raise TypeError(
                f"predict takes an observation str (or a list of them), got {type(observation).__name__}: pass the "
                "text the env returned"
            )
        if not (
            isinstance(info, dict) if single else isinstance(info, Sequence) and all(isinstance(i, dict) for i in info)
        ):
            raise TypeError(
                f"predict takes the env's info dict beside the observation (a list of them with a list of "
                f"observations), got {type(info).__name__}: pass the info reset() and step() returned ({{}} for an "
                "env without one, in generate mode)"
            )
        obs_list = [observation] if single else list(observation)
        info_list = [info] if single else list(info)
        if len(obs_list) != len(info_list):
            raise ValueError("predict needs one info per observation")
        if not obs_list:  # an empty batch: nothing to play
            return [], []
        c = self.config
        if c.action_mode == CHOOSE and not all(i.get("admissible_actions") for i in info_list):
            raise ValueError(
                "this agent chooses among info['admissible_actions'] (action_mode='choose'), and an info given to "
                "predict lists none: pass the info reset() and step() returned (an empty info serves in generate "
                "mode only)"
            )
        k = c.history_length
        episodes = predict_histories(len(obs_list), info_list, state, episode_start, single, bool(k or c.memory))
        histories = [e[-k:] if k else [] for e in episodes]
        # The memory folds the whole episode: from the wrappers' info where they keep it, else from the state.
        memories = [
            (i["memory"] if "memory" in i else PlaceMemory.of([p[0] for p in e] + [o]).render()) if c.memory else ""
            for e, o, i in zip(episodes, obs_list, info_list)
        ]
        # A memory folds the whole episode and a prompt template counts its steps: the state then holds all of it.
        whole = c.memory or self.prompts.template is not None
        counts = [len(e) for e in episodes] if state is not None and whole else [None] * len(episodes)
        texts = self._act(obs_list, info_list, histories, deterministic, memories=memories, step_counts=counts)
        commands = [extract_action(t, tagged=c.action_mode == GENERATE) or "" for t in texts]
        steps = [e + [[o, a]] for e, o, a in zip(episodes, obs_list, commands)]
        state_out = steps if whole else [s[-k:] if k else [] for s in steps]
        return (commands[0], state_out[0]) if single else (commands, state_out)

    def _act(
        self, obs: list[str], infos: list[dict], histories: list[list], deterministic: bool,
        seeds: list[int] | None = None, memories: list[str] | None = None, step_counts: list[int] | None = None,
    ) -> list[str]:  # fmt: skip
        """The model's texts (generate mode: the whole response) for a batch of observations, each sampled with
        its seed (default: seeds drawn from the agent's RNG); memories and step counts default to the infos'."""
        self.settle()  # an update running beside a rollout (overlap) would be changing the weights it plays with
        memories = memories or [None] * len(obs)
        step_counts = step_counts or [None] * len(obs)
        prompts = [
            self.prompts.for_step(o, i, h, m, n) for o, i, h, m, n in zip(obs, infos, histories, memories, step_counts)
        ]
        admissible = [list(i.get("admissible_actions", [])) for i in infos]
        self.policy.eval()
        with self.dist.full_params():
            rng = self.rng if seeds is None else None
            return self.policy.act(prompts, admissible, seeds=seeds, rng=rng, deterministic=deterministic).texts

    # ----- rollouts and updates ------------------------------------------------------------------------
    def collect_rollouts(
        self, callback: BaseCallback, iteration: int | None = None, logger: Logger | None = None,
        policy: LLMPolicy | None = None,
    ) -> bool:  # fmt: skip
        """Every group plays its task to the end; rows go to the buffer. False if a callback stopped training.

        ``iteration`` (default: the iterations done), ``logger`` and ``policy``: what the overlap changes, the
        rollout's index, where its metrics wait for its iteration's end, and the frozen weights it acts with."""
        start_timesteps = self.num_timesteps
        collector = self.rollout
        own = collector.policy
        collector.policy = policy or own
        try:
            stats = collector.collect(self.iteration if iteration is None else iteration, callback, self._count_steps)
        finally:
            collector.policy = own
        if stats is None:
            return False
        # Callbacks saw this rank's steps; from here on the count is every rank's (dropped groups' steps included).
        self.num_timesteps = start_timesteps + int(self.rollout_dist.sum([stats.steps])[0])
        self.last_rollout = collector.log(logger or self.logger, stats)
        callback.on_rollout_end()
        return True

    def _count_steps(self, n: int) -> None:
        self.num_timesteps += n

    def update_plan(self) -> list[list[list[Row]]]:
        """The update's minibatches, epoch by epoch (drawn from the agent's RNG): every rank's part of one
        process's minibatches."""
        gather = self.rollout_dist.gather if self.rollout_dist.enabled else None
        return self.buffer.minibatches(self.rng, self.config.n_epochs, self.config.minibatch_size, gather)

    def recompute_log_probs(self, plan: list[list[list[Row]]]) -> None:
        """Behaviour (and reference) log-probs of the rollout from the update's own forward, in the first epoch's
        minibatches of ``plan`` (:meth:`agents.update.PolicyUpdate.recompute`)."""
        for key, value in self.update.recompute(plan[0]).items():
            self.logger.record(key, value)

    def train(self, plan: list[list[list[Row]]] | None = None) -> None:
        """n_epochs of clipped-PPO minibatch updates over the rollout (a fresh plan when none is given).

        Each epoch splits the rollout into ``ceil(rows / minibatch_size)`` minibatches of nearly equal size; each
        minibatch is one optimiser step (:meth:`agents.update.PolicyUpdate.minibatch_step`).
        """
        t0 = time.perf_counter()
        # The weights leave the last boundary with the first optimiser step; mark_boundary() records the next one.
        self.boundary = None
        logs = self.update.run(plan if plan is not None else self.update_plan())
        self.logger.record("time/update_s", time.perf_counter() - t0)
        for key, value in logs.items():
            self.logger.record(key, value)

    # ----- the loop -------------------------------------------------------------------------------------
    def learn(
        self,
        total_timesteps: int,
        callback: BaseCallback | list[BaseCallback] | None = None,
        progress_bar: bool = False,
        log_interval: int = 1,
        reset_num_timesteps: bool = True,
        max_iterations: int | None = None,
    ) -> GAGPOAgent:
        """Train until ``total_timesteps`` env steps (actions) have been taken, or ``max_iterations`` iterations
        (rollout + update) have run in this call, whichever comes first; returns self.

        An iteration is never cut: the one in progress when the count is reached is finished (every group
        plays its task to the end and is trained on), so a run takes up to one iteration's steps more.

        ``reset_num_timesteps`` (Stable-Baselines3's convention): True (the default) starts the step and iteration
        counts at 0, a new run, also for an agent just loaded; False continues them, and ``total_timesteps`` is
        then the number of steps to add. Continuing a saved run is ``GAGPOAgent.load(path).learn(n,
        reset_num_timesteps=False)``: the counts, the learning-rate schedule and the checkpoint names go on from
        where it stopped. (:class:`~agents.callbacks.IterationCheckpoint` refuses to start a new count in a folder
        that holds checkpoints already, so the names of two runs never mix.)
        """
        steps = whole_steps(total_timesteps)
        if max_iterations is not None and max_iterations < 1:
            raise ValueError(f"max_iterations must be >= 1 or None, got {max_iterations}")
        if (play_only := checkpoint.play_only_reason(self)) is not None:  # before a rollout is spent, not after
            raise RuntimeError(play_only)
        if reset_num_timesteps:
            self.num_timesteps = 0
            self.iteration = 0
        total_timesteps = steps + (0 if reset_num_timesteps else self.num_timesteps)
        last_iteration = None if max_iterations is None else self.iteration + max_iterations
        callback = init_callback(self, callback, progress_bar)
        callback.on_training_start(locals(), globals())
        if self.pipeline is not None:
            self._log_interval = log_interval
            self.learn_overlapped(callback, total_timesteps, last_iteration, reset_num_timesteps)
            callback.on_training_end()
            return self
        while self.num_timesteps < total_timesteps and (last_iteration is None or self.iteration < last_iteration):
            t0, start_timesteps = time.perf_counter(), self.num_timesteps
            try:
                if not self.collect_rollouts(callback):
                    break
            except BaseException:  # Ctrl-C or an error mid-rollout: its steps are dropped, never trained on
                self.num_timesteps = start_timesteps
                raise
            self.logger.record("time/weight_sync_s", self.policy.release_engine())
            t1 = time.perf_counter()
            self.logger.record("time/rollout_s", t1 - t0)
            plan = self.update_plan()
            self.recompute_log_probs(plan)
            self.logger.record("time/recompute_s", time.perf_counter() - t1)
            # The schedule's progress where the iteration began: the first update steps at the full rate.
            self.logger.record("train/learning_rate", self.update.set_progress(start_timesteps / total_timesteps))
            self.train(plan)
            self.iteration += 1
            self.mark_boundary()
            self.logger.record("time/iterations", self.iteration)
            self.logger.record("time/total_timesteps", self.num_timesteps)
            if log_interval and self.iteration % log_interval == 0:
                self.logger.dump(step=self.num_timesteps)
        callback.on_training_end()
        return self

    # ----- the loop with the update beside the next rollout (overlap) -----------------------------------
    def learn_overlapped(
        self, callback: BaseCallback, total_timesteps: int, last_iteration: int | None, reset: bool
    ) -> None:
        """:meth:`learn`'s loop with ``overlap``: rollout j plays with version ``j - max_staleness`` while the
        updates before it run in the pipeline's thread (:mod:`agents.overlap`). An iteration's metrics (its rollout's
        and its update's) are logged together when its update ends; an error, a failed update or Ctrl-C first lets
        the updates in flight end, so the last boundary holds every finished update."""
        pipe = self.pipeline
        assert pipe is not None
        if reset:  # a new run: versions of another count would be read as this one's
            pipe.versions.clear()
            pipe.acting_version = None
        if pipe.versions.get(self.iteration) is None:
            pipe.versions.publish(self.iteration, self.dist.full_state(self.policy.core))
        own_threads = torch.get_num_threads()
        torch.set_num_threads(pipe.rollout_threads)
        rollout = self.iteration  # the next rollout's index (no update is in flight between learn() calls)
        try:
            while self.num_timesteps < total_timesteps and (last_iteration is None or rollout < last_iteration):
                version = pipe.behaviour_version(rollout)
                t0 = time.perf_counter()
                self.finish_updates(lambda v=version: pipe.versions.get(v) is not None)
                waited = time.perf_counter() - t0
                pipe.versions.keep_from(version)
                acting = pipe.acting(version)
                t1, start_timesteps = time.perf_counter(), self.num_timesteps
                metrics = Logger(folder=None, output_formats=[])  # logged when this rollout's iteration ends
                try:
                    if not self.collect_rollouts(callback, iteration=rollout, logger=metrics, policy=acting):
                        break
                except BaseException:  # its steps are dropped, never trained on; the updates in flight end first
                    self.num_timesteps = start_timesteps
                    self.settle()
                    raise
                metrics.record("time/weight_sync_s", pipe.sync_s)
                metrics.record("time/rollout_s", time.perf_counter() - t1)
                metrics.record("time/rollout_wait_s", waited)
                metrics.record("overlap/staleness", rollout - version)  # every group of a rollout: one version
                for row in self.buffer.rows:
                    row.version = version
                if self.config.estimator in STATE_SET_ESTIMATORS:
                    metrics.record("overlap/mixed_version_sets", mixed_version_sets(self.buffer.rows))
                plan = self.update_plan()
                boundary = {
                    "num_timesteps": self.num_timesteps, "iteration": rollout + 1,
                    "numpy_rng": self.rng.bit_generator.state,
                }  # fmt: skip
                job = functools.partial(
                    self.update_job, plan, start_timesteps / total_timesteps, version != rollout, rollout + 1
                )
                pipe.submit(job, Pending(rollout, dict(metrics.name_to_value), boundary))
                rollout += 1
            self.settle()
        finally:
            torch.set_num_threads(own_threads)
            pipe.hand_back(self.policy)
            if not pipe.pending:
                pipe.close()

    def update_job(self, plan: list[list[list[Row]]], progress: float, stale: bool, version: int) -> dict[str, float]:
        """One iteration's update, run in the pipeline's thread: recompute (decoupled PPO's proximal log-probs and
        the truncated weights of stale rows), the learning rate, the minibatch steps; then publish ``version``."""
        t0 = time.perf_counter()
        logs = self.update.recompute(plan[0], stale=stale)
        logs["time/recompute_s"] = time.perf_counter() - t0
        logs["train/learning_rate"] = self.update.set_progress(progress)
        t1 = time.perf_counter()
        logs |= self.update.run(plan)
        logs["time/update_s"] = time.perf_counter() - t1
        assert self.pipeline is not None
        self.pipeline.versions.publish(version, self.dist.full_state(self.policy.core))
        return logs

    def finish_updates(self, done: Any = None) -> None:
        """End the iterations whose updates are over, in order; then wait for more until ``done()`` (None: all)."""
        pipe = self.pipeline
        if pipe is None:
            return
        while pipe.pending and (pipe.pending[0].future.done() or (done is None or not done())):
            self.finish_oldest()

    def settle(self) -> None:
        """Wait for every update in flight (``overlap``) and end its iteration: the weights are then at the last
        boundary, what :meth:`save`, :meth:`predict` and :meth:`evaluate` need. A no-op without overlap."""
        self.finish_updates(None)

    def pending_boundary(self) -> dict[str, Any] | None:
        """The boundary the last update in flight ends at (None when none is): what a save would hold."""
        pipe = self.pipeline
        return pipe.pending[-1].boundary if pipe is not None and pipe.pending else None

    def behaviour_versions(self) -> dict[int, dict[str, torch.Tensor]]:
        """The older weights later rollouts still act with (``overlap``): a save holds them, to resume exactly."""
        if self.pipeline is None or self.boundary is None:
            return {}
        b = int(self.boundary["iteration"])
        return self.pipeline.versions.between(b - self.config.max_staleness, b)

    def finish_oldest(self) -> None:
        """Wait for the oldest update in flight, then log its iteration (rollout and update metrics together) and
        make its end the boundary a save holds. A failed update raises one RuntimeError saying so."""
        pipe = self.pipeline
        assert pipe is not None
        p = pipe.pending[0]
        try:
            logs = p.future.result()
        except BaseException as err:
            if not p.future.done():  # Ctrl-C while waiting: the update runs on, still pending
                raise
            for q in pipe.pending:
                q.future.cancel()
            pipe.pending.clear()
            self.boundary = None  # the weights are part-way through that update
            raise RuntimeError(
                f"the update of iteration {p.rollout + 1} failed in the update thread ({type(err).__name__}: {err}); "
                f"iterations up to {self.iteration} are intact (save the last checkpoint's, not these weights)"
            ) from err
        pipe.pending.popleft()
        self.iteration = p.rollout + 1
        self.boundary = {**p.boundary, "torch_rng": torch.get_rng_state()}
        for key, value in {**p.logs, **logs}.items():
            self.logger.record(key, value)
        steps = int(p.boundary["num_timesteps"])
        self.logger.record("time/iterations", self.iteration)
        self.logger.record("time/total_timesteps", steps)
        if self._log_interval and self.iteration % self._log_interval == 0:
            self.logger.dump(step=steps)

    # ----- evaluation -----------------------------------------------------------------------------------
    def evaluate(
        self, env: Any = None, n_tasks: int = 50, *, deterministic: bool = True, batch_size: int = 16,
        seed_offset: int = 0, env_kwargs: dict[str, Any] | None = None, episodes: bool = False, workers: int = 0,
        temperature: float | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Play a fixed panel of tasks (seeds ``seed_offset .. seed_offset + n_tasks - 1``), each once.

        The env is exactly the one named: ``env`` (an env id or a made env) with ``env_kwargs``; without ``env``,
        the agent's own env (its id and wrappers) with ``env_kwargs`` over its own kwargs, so
        ``evaluate(env_kwargs={"split": "valid_seen"})`` plays ALFWorld's valid_seen games, never the training ones.
        Sampled actions (``deterministic=False``) draw from streams of their own, one per (agent seed, task,
        step): evaluating never changes the draws of the training that follows, and a task plays the same in any
        panel. They sample at ``temperature`` (None: the training temperature; verl-agent validates at 0.4).
        Returns success rate, score, mean return, mean length, invalid rate and per-task-type success;
        ``episodes=True`` adds one row per episode; ``workers >= 2`` steps the envs in that many processes
        (:func:`~agents.evaluation.run_panel`; the same results).
        """
        spec = self.panel_spec(env, env_kwargs)
        spec.check_step_limit()
        steps: dict[int, int] = {}  # actions taken so far in each task of the panel

        def act(obs: list[str], infos: list[dict], venv: GroupedVectorEnv, idx: Sequence[int]) -> list[str]:
            tasks = [int(venv.task_seeds[venv.group_index[i]]) for i in idx]
            seeds = [panel_action_seed(self.config.seed, t, steps.get(t, 0)) for t in tasks]
            for t in tasks:
                steps[t] = steps.get(t, 0) + 1
            return self._act(obs, infos, [x.get("history", []) for x in infos], deterministic, seeds)

        if temperature is not None and not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        with self.policy.sampling_at(None if deterministic else temperature):
            return run_panel(
                act,
                spec.factory(text_wrapping(self.config)), n_tasks, batch_size=batch_size, seed_offset=seed_offset,
                episodes=episodes, workers=workers,
            )  # fmt: skip

    def panel_spec(self, env: Any = None, env_kwargs: dict[str, Any] | None = None) -> EnvSpec:
        """The env :meth:`evaluate` plays: ``env`` with ``env_kwargs``, else the agent's own with ``env_kwargs`` over
        its kwargs (an argument is never ignored: an agent without an env id of its own refuses)."""
        if env is not None:
            return EnvSpec.of(env, env_kwargs)
        if self.env_spec is None:
            raise ValueError(
                "this agent trains on a GroupedVectorEnv from your own factory, with no env id to rebuild: pass an "
                "env id (or a made env) to evaluate()"
            )
        if not env_kwargs:
            return self.env_spec
        own = self.env_spec
        return EnvSpec(own.id, {**own.kwargs, **env_kwargs}, own.wrappers)

    # ----- persistence ----------------------------------------------------------------------------------
    def mark_boundary(self) -> None:
        """Remember the counters and RNG states between two iterations (``self.boundary``): what a save holds.

        Weights and optimiser only change in the update, so a save() called mid-rollout (SB3's
        CheckpointCallback saves in on_step) still writes a consistent state, the last iteration boundary, and
        the resumed run continues exactly as the uninterrupted one. :meth:`train` clears it (None) until the
        iteration ends: weights part-way through an update match no boundary, and :meth:`save` refuses them.
        """
        self.boundary: dict[str, Any] | None = {
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
        names them) gets that folder as a zip file. A save holds the last iteration boundary (weights, optimiser,
        counters, RNG); after learn() was stopped inside an update (Ctrl-C, an error) it raises RuntimeError.
        """
        path = Path(path)
        self.settle()  # overlap: the updates in flight end first, so the weights are at a boundary
        if self.boundary is None:
            raise RuntimeError(
                f"cannot save to {path}: learn() stopped inside iteration {self.iteration + 1}'s update, so the "
                "weights are part-way between two iteration boundaries; resume from the last checkpoint, or call "
                "learn() again (a save holds the next boundary)"
            )
        # Under FSDP every rank takes part in gathering the full weights and optimiser state; one rank writes.
        core_state = self.dist.model_state(self.policy.core)
        optimizer_state = self.dist.optimizer_state(self.policy.core, self.optimizer)
        if self.dist.is_main:
            checkpoint.save_atomically(
                path, lambda folder: checkpoint.write_agent(folder, self, core_state, optimizer_state)
            )
        self.dist.barrier()

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
        env_kwargs: dict[str, Any] | None = None,
        model: str | None = None,
        verbose: int = 1,
        log_dir: str | None = None,
        **overrides: Any,
    ) -> GAGPOAgent:
        """Restore an agent saved with :meth:`save` (no unpickling: safetensors and ``weights_only=True``).

        Every file is checked against the manifest first. No env is made here: the training env is built when
        :meth:`learn` (or :meth:`get_env`) first needs it, so an agent loads and evaluates on a machine without
        its training data. ``env`` (an id, a made env or a GroupedVectorEnv) with ``env_kwargs`` replaces the saved
        env; ``env_kwargs`` alone go over the saved env's kwargs (its id and wrappers kept). ``overrides`` replace
        saved hyperparameters; the estimator may not switch between ``"ppo"`` and the others (the critic and its
        optimizer state are saved with a PPO agent only). The KL reference is the initial policy again, not the
        saved weights. ``model`` points at a copy of a pretrained source that moved (for its LoRA base or KL
        reference): it must have the recorded fingerprint. Nothing is downloaded.

        The saved step and iteration counts come back, but :meth:`learn` restarts them by default
        (``reset_num_timesteps=True``, as in Stable-Baselines3): ``learn(n, reset_num_timesteps=False)`` continues
        the run (its count, learning-rate schedule and checkpoint names).
        """
        with checkpoint.opened(Path(path)) as folder:
            meta = checkpoint.read_agent(folder)
            kept = {"prompt_template": str(folder / TEMPLATE_FILE)} if (folder / TEMPLATE_FILE).is_file() else {}
            values = checkpoint.saved_config(meta, path, {**kept, **overrides})
            estimator = values.pop("estimator")
            saved_estimator = meta["config"].get("estimator")
            if (estimator == "ppo") != (saved_estimator == "ppo"):
                raise ValueError(
                    f"saved agent at {path} was trained with estimator {saved_estimator!r}; it cannot be loaded as "
                    f"{estimator!r}: a PPO agent's critic (value_head.safetensors) and its optimizer state come "
                    "with it, and exist only for PPO"
                )
            source = ModelSource.from_record(meta.get("model", meta["model_source"]), folder)
            if env is None:
                env, env_wrappers = meta["env_id"], meta.get("env_wrappers", [])
                env_kwargs = {**meta["env_kwargs"], **(env_kwargs or {})}
            else:
                env_wrappers = []
            agent = cls(
                env,
                model=meta["model_source"],
                estimator=estimator,
                env_kwargs=env_kwargs,
                env_wrappers=env_wrappers,
                verbose=verbose,
                log_dir=log_dir,
                restore=Restore(folder, source, model),
                **values,
            )
            checkpoint.restore_state(agent, folder, meta)
        return agent


def whole_steps(total_timesteps: Any) -> int:
    """``learn()``'s step budget as an int (``1e4`` reads as 10000), or one ValueError: a negative or fractional
    budget would silently train for less than asked, or not at all."""
    try:
        steps = int(total_timesteps)
        whole = not isinstance(total_timesteps, bool) and steps == total_timesteps and steps >= 0
    except (TypeError, ValueError, OverflowError):
        whole = False
    if not whole:
        raise ValueError(f"total_timesteps must be a whole number of env steps >= 0, got {total_timesteps!r}")
    return steps


def predict_histories(
    n: int, infos: list[dict], state: Any, episode_start: Any, single: bool, remembers: bool
) -> list[list]:
    """Each env's steps for :meth:`GAGPOAgent.predict`: its state unless its episode starts, else the wrappers'
    history. ``remembers``: the prompt shows history or memory (so a missing state is warned about)."""
    if state is None:
        if episode_start is None and remembers and "history" not in infos[0] and "memory" not in infos[0]:
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
