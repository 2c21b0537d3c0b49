"""Shared by the agent tests: a logger output that keeps every dump, and a tiny 'pretrained' checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stable_baselines3.common.logger import KVWriter, Logger

from agents import GAGPOAgent


class Capture(KVWriter):
    """Keeps every dump of SB3's logger."""

    def __init__(self) -> None:
        self.dumps: list[dict[str, Any]] = []

    def write(self, key_values: dict[str, Any], key_excluded: dict, step: int = 0) -> None:
        self.dumps.append(dict(key_values))

    def close(self) -> None:
        pass


def capture_logs(agent: GAGPOAgent) -> Capture:
    capture = Capture()
    agent.set_logger(Logger(folder=None, output_formats=[capture]))
    return capture


def save_tiny_checkpoint(folder: Path, env_id: str, **config: Any) -> Path:
    """The tiny model written with save_pretrained: a local checkpoint that loads through the pretrained path."""
    agent = GAGPOAgent(env_id, tiny_hidden_size=32, **config)
    agent.policy.model.save_pretrained(folder)
    agent.policy.tokenizer.save_pretrained(folder)
    return folder
