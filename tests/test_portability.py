"""A trained agent outside the library's own loops: predict() in a plain Gymnasium loop plays as evaluate() does,
and a saved agent loads from its folder alone, wherever it is, with the KL reference it was trained against."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import gymnasium as gym
import pytest

import gagpo_gym  # noqa: F401  (registers the envs)
from agents import GAGPOAgent

MAZE = "gagpo_gym/Maze-v0"
MAZE_KWARGS = {"max_episode_steps": 12}
SMALL: dict[str, Any] = {
    "num_groups": 2, "group_size": 2, "minibatch_size": 8, "torch_threads": 1, "verbose": 0,
    "tiny_hidden_size": 32, "history_length": 2, "env_kwargs": MAZE_KWARGS,
}  # fmt: skip


@pytest.fixture(scope="module")
def maze_agent() -> GAGPOAgent:
    return GAGPOAgent(MAZE, seed=4, **SMALL)


def play(agent: GAGPOAgent, seeds: list[int], *, memory: bool) -> list[dict[str, Any]]:
    """The deployment loop of the README: a plain ``gymnasium.make`` env, ``agent.predict`` each step."""
    env = gym.make(MAZE, **MAZE_KWARGS)
    episodes = []
    for seed in seeds:
        obs, info = env.reset(seed=seed)
        state, start, done, ret, actions = None, True, False, 0.0, []
        while not done:
            if memory:
                action, state = agent.predict(obs, info, state=state, episode_start=start, deterministic=True)
            else:
                action, _ = agent.predict(obs, info, deterministic=True)
            obs, reward, terminated, truncated, info = env.step(action)
            done, start = terminated or truncated, terminated or truncated
            ret = ret + float(reward)
            actions.append(action)
        episodes.append(
            {"seed": seed, "won": bool(info["won"]), "length": len(actions), "return": ret, "actions": actions}
        )
    env.close()
    return episodes


def summary(episodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {k: round(e[k], 9) if k == "return" else e[k] for k in ("seed", "won", "length", "return")} for e in episodes
    ]


@contextlib.contextmanager
def recorded_prompts(agent: GAGPOAgent):
    """Every prompt the policy is shown while the block runs (the policy itself acts unchanged)."""
    prompts: list[tuple[int, ...]] = []
    act = agent.policy.act

    def recording(batch, *args, **kwargs):
        prompts.extend(tuple(p) for p in batch)
        return act(batch, *args, **kwargs)

    agent.policy.act = recording
    try:
        yield prompts
    finally:
        agent.policy.act = act


def test_predict_with_state_in_a_plain_gymnasium_loop_reproduces_evaluate(maze_agent: GAGPOAgent) -> None:
    seeds = list(range(10))
    with recorded_prompts(maze_agent) as seen_by_evaluate:
        evaluated = summary(maze_agent.evaluate(n_tasks=len(seeds), episodes=True)["episodes"])
    with recorded_prompts(maze_agent) as seen_by_loop:
        remembering = play(maze_agent, seeds, memory=True)
    assert summary(remembering) == evaluated
    assert sorted(seen_by_loop) == sorted(seen_by_evaluate)  # the very prompts, history included
    # Without the memory the loop shows the agent other prompts than it trained on; the warning says so.
    with recorded_prompts(maze_agent) as seen_forgetting, pytest.warns(UserWarning, match="without history"):
        play(maze_agent, seeds, memory=False)
    assert sorted(seen_forgetting) != sorted(seen_by_evaluate)


def test_batched_predict_keeps_one_history_per_env(maze_agent: GAGPOAgent) -> None:
    envs = [gym.make(MAZE, **MAZE_KWARGS) for _ in range(3)]
    first = [env.reset(seed=s) for s, env in enumerate(envs)]
    obs, infos = [o for o, _ in first], [i for _, i in first]
    actions, state = maze_agent.predict(obs, infos, state=None, episode_start=[True] * 3, deterministic=True)
    assert len(state) == 3 and all(h == [[o, a]] for h, o, a in zip(state, obs, actions))
    steps = [env.step(a) for env, a in zip(envs, actions)]
    obs2, infos2 = [s[0] for s in steps], [s[4] for s in steps]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the memory is in use: no warning
        batched, state2 = maze_agent.predict(obs2, infos2, state=state, episode_start=[False, True, False])
    assert state2[1] == [[obs2[1], batched[1]]]  # a new episode forgets env 1's history
    assert state2[0] == [*state[0], [obs2[0], batched[0]]][-2:]
    one = [maze_agent.predict(o, i, state=h, episode_start=False, deterministic=True)[0]
           for o, i, h in zip(obs2, infos2, state)]  # fmt: skip
    assert maze_agent.predict(obs2, infos2, state=state, deterministic=True)[0] == one
    with pytest.raises(ValueError, match="3 observations and 2 states"):
        maze_agent.predict(obs2, infos2, state=state[:2])
