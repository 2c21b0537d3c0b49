"""The rollout marks the rows whose reward carries the invalid-action penalty, so the rivals' estimators charge it
to the row as their authors' trainers do (``Row.invalid``; the estimators' side is tested in tests/test_rivals.py)."""

from __future__ import annotations

from stable_baselines3.common.callbacks import BaseCallback

from agents.gagpo import GAGPOAgent


class _KeepRows(BaseCallback):
    """Copies the buffer's rows at the end of the rollout, before the update clears them."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        self.rows = list(self.model.buffer.rows)


def test_rows_whose_reward_carries_the_penalty_are_marked_invalid():
    """An untrained generate-mode policy writes many answers without a command (unparsed: penalised) and some
    commands the env rejects; exactly those rows are invalid, and their reward is the env's less the penalty."""
    penalty = 0.25
    agent = GAGPOAgent(
        "gagpo_gym/FrozenLake-v0", env_kwargs={"map_size": 4, "max_episode_steps": 6}, action_mode="generate",
        num_groups=2, group_size=2, invalid_action_penalty=penalty, max_new_tokens=8, tiny_hidden_size=32,
        torch_threads=1, verbose=0, seed=0,
    )  # fmt: skip
    keep = _KeepRows()
    agent.learn(1, callback=keep, max_iterations=1)
    rows = keep.rows
    assert rows and any(r.invalid for r in rows)
    for r in rows:
        env_reward = 1.0 if r.won else 0.0
        assert abs(r.reward - (env_reward - penalty * r.invalid)) < 1e-9, (r.reward, r.invalid, r.won)
