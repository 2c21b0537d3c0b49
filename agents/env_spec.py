"""The user's env as one value: (id, constructor kwargs, wrappers), made one way everywhere.

Training, evaluation, the tiny tokenizer's corpus and the warm start all rebuild the user's env from an
:class:`EnvSpec`; the agent's own text wrappers (:func:`~wrappers.wrap_text_env`) go on top with the settings
:func:`text_wrapping` reads from the config. Env ids may take Gymnasium's ``"module:EnvId"`` form
(``gymnasium.make("my_pkg.envs:MyEnv-v0")`` imports ``my_pkg.envs`` first, which registers the env):
:func:`make_env` imports the module in every process that builds the env, so an agent trained on such an id
keeps it and rebuilds its env anywhere the module can be imported.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

import gagpo_gym
from agents.config import GAGPOConfig
from wrappers import GENERATE, GroupedVectorEnv, PromptBuilder, prompt_template, wrap_text_env

#: The text wrappers' settings for reference policies (expert, random): true state keys, no penalty, no history.
REFERENCE_WRAPPING = {"key": "state", "penalty": 0.0, "history_length": 0, "tagged": False}


def text_wrapping(config: GAGPOConfig) -> dict[str, Any]:
    """The :func:`~wrappers.wrap_text_env` settings an agent plays with: its state key, penalty, history, tags."""
    return {
        "key": config.state_key,
        "penalty": config.invalid_action_penalty,
        "history_length": config.history_length,
        "tagged": config.action_mode == GENERATE,
        "backoff": config.key_backoff,
        "memory": config.memory,
        "strict_format": config.strict_format,
        "revisit_penalty": config.revisit_penalty,
    }


def prompt_builder(tokenizer: Any, config: GAGPOConfig) -> PromptBuilder:
    """The prompts an agent with ``config`` reads, for ``tokenizer`` (the dry run shows the same ones)."""
    return PromptBuilder(
        tokenizer, config.action_mode, config.max_prompt_tokens, show_admissible=config.show_admissible,
        template=prompt_template(config.prompt_template),
    )  # fmt: skip


def split_env_id(env_id: str) -> tuple[str | None, str]:
    """``"my_pkg.envs:MyEnv-v0"`` -> ``("my_pkg.envs", "MyEnv-v0")``; an id without a module -> ``(None, id)``."""
    if ":" not in env_id:
        return None, env_id
    module, name = env_id.split(":", 1)
    if not module or not name or ":" in name:
        raise ValueError(f"env id {env_id!r} is not of the form 'module:EnvId'")
    return module, name


def registered_env_id(env_id: str) -> str:
    """The registry id that ``env_id`` names, after importing its module part (as ``gymnasium.make`` does).

    ``"Maze-v0"`` -> ``"gagpo_gym/Maze-v0"`` (an id without a module and a namespace is always under
    ``gagpo_gym/``, as :func:`gagpo_gym.make` reads it); ``"my_envs:MyEnv-v0"`` imports ``my_envs`` and returns
    the id it registered (``MyEnv-v0`` as given, else under ``gagpo_gym/``, where
    :func:`gagpo_gym.register_text_env` puts an id without a namespace). Raises ``ValueError`` with one readable
    line for a module that cannot be imported or an id that is not registered.
    """
    module, name = split_env_id(env_id)
    if module is not None:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ValueError(
                f"cannot import {module!r}, the module part of env id {env_id!r} ({err}); is it on PYTHONPATH?"
            ) from err
    namespaced = name if "/" in name else f"{gagpo_gym.registration.NAMESPACE}/{name}"
    # Without a module an id is one of ours (``CliffWalking-v0`` is gagpo_gym's text env, never Gymnasium's).
    for candidate in (name, namespaced) if module is not None else (namespaced,):
        if candidate in gym.registry:
            return candidate
    if module is not None:
        hint = f" (importing {module!r} did not register it)"
    else:  # an env of the user's own, registered by a module nobody imported in this process
        hint = (f"; if a module of yours registers it, name the module first, Gymnasium's module:EnvId form (e.g. "
                f"my_envs:{name.split('/')[-1]}, the module on PYTHONPATH)")  # fmt: skip
    raise ValueError(
        f"unknown env id {env_id!r}{hint}; registered text envs: {', '.join(gagpo_gym.registered_text_envs())}"
    )


def canonical_env_id(env_id: str) -> str:
    """``env_id`` with its registry id spelled out and its module part kept: ``"m:X-v0"`` -> ``"m:gagpo_gym/X-v0"``."""
    module, _ = split_env_id(env_id)
    full = registered_env_id(env_id)
    return full if module is None else f"{module}:{full}"


def make_env(
    env_id: str,
    env_kwargs: dict[str, Any],
    wrap: dict[str, Any] | None,
    env_wrappers: Sequence[tuple[str, dict[str, Any]]] = (),
) -> gym.Env:
    """Picklable env factory (async workers rebuild envs from it).

    ``env_wrappers`` are ``(entry point, kwargs)`` of wrappers the user put on a made env (Gymnasium records
    them in ``env.spec.additional_wrappers``); they go on before the agent's own text wrappers.
    """
    if ":" in env_id:  # Gymnasium's "module:EnvId": import the module (it registers the env), make the bare id
        full = registered_env_id(env_id)
        # gagpo_gym.make takes namespaced ids; a module's own id without a namespace goes to Gymnasium directly.
        env = gagpo_gym.make(full, **env_kwargs) if "/" in full else gym.make(full, **env_kwargs)
    else:
        env = gagpo_gym.make(env_id, **env_kwargs)
    for entry_point, kwargs in env_wrappers:
        env = load_env_creator(entry_point)(env, **kwargs)
    return wrap_text_env(env, **wrap) if wrap is not None else env


def check_step_limit(env_id: str, limit: int | None) -> None:
    """Refuse an env whose episodes nothing bounds: a rollout waits for every episode to end, so one that never
    does would hang training while its rows pile up in memory."""
    if limit is None:
        raise ValueError(
            f"env {env_id} has no step limit, and a rollout waits for every episode to end: give "
            "max_episode_steps (env_kwargs={'max_episode_steps': N}, gymnasium.make(id, max_episode_steps=N), "
            "gymnasium.wrappers.TimeLimit(env, N) in your own factory, or register_text_env(..., max_episode_steps=N))"
        )


@dataclass(frozen=True)
class EnvSpec:
    """What rebuilds the user's env in every sub-env, process and panel: its id, kwargs and extra wrappers."""

    id: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    wrappers: tuple[tuple[str, dict[str, Any]], ...] = ()

    @classmethod
    def of(cls, env: Any, env_kwargs: dict[str, Any] | None = None, wrappers: Sequence = ()) -> EnvSpec:
        """The spec of an env id or of one env made with ``gymnasium.make``.

        A made env keeps what ``gymnasium.make`` was told (``max_episode_steps`` included) and the wrappers put on
        it afterwards, as far as Gymnasium can re-create them from ``env.spec``; ``env_kwargs`` add to (and
        override) its kwargs. ``wrappers`` (as a saved agent records them) serve where the env names none.
        """
        given = tuple((str(entry_point), dict(kwargs)) for entry_point, kwargs in wrappers)
        if isinstance(env, str):
            return cls(env, dict(env_kwargs or {}), given)
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
        if spec.max_episode_steps != gym.spec(spec.id).max_episode_steps:
            kwargs["max_episode_steps"] = spec.max_episode_steps
        made = tuple((w.entry_point, dict(w.kwargs or {})) for w in spec.additional_wrappers)
        return cls(spec.id, {**kwargs, **(env_kwargs or {})}, made or given)

    def step_limit(self) -> int | None:
        """The episodes' step limit (Gymnasium's ``TimeLimit``): from the kwargs, a ``TimeLimit`` among the wrappers,
        or the registration; None when nothing bounds them."""
        if self.kwargs.get("max_episode_steps") is not None:
            return int(self.kwargs["max_episode_steps"])
        for entry_point, kwargs in self.wrappers:
            if entry_point.endswith("TimeLimit") and kwargs.get("max_episode_steps") is not None:
                return int(kwargs["max_episode_steps"])
        return gym.spec(registered_env_id(self.id)).max_episode_steps

    def check_step_limit(self) -> None:
        """Refuse an env whose episodes nothing bounds (:func:`check_step_limit`)."""
        check_step_limit(self.id, self.step_limit())

    def factory(self, wrap: dict[str, Any] | None = None) -> Callable[[], gym.Env]:
        """A picklable factory (async workers rebuild envs from it); ``wrap``: the text wrappers' settings."""
        return functools.partial(make_env, self.id, self.kwargs, wrap, self.wrappers)

    def make(self, wrap: dict[str, Any] | None = None) -> gym.Env:
        return self.factory(wrap)()

    def vector(
        self, num_groups: int, group_size: int, wrap: dict[str, Any], *, mode: str = "sync", task_pool: int = 0
    ) -> GroupedVectorEnv:
        """``num_groups`` groups of ``group_size`` sub-envs, each group playing one task per rollout."""
        return GroupedVectorEnv(self.factory(wrap), num_groups, group_size, mode=mode, task_pool=task_pool or None)
