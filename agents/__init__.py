"""The agent side: GAGPOAgent, the LLM policy, the group rollout buffer, the estimators and the loss.

The two names load on first use (PEP 562): ``from agents.config import GAGPOConfig`` or ``agents.env_spec`` then
costs no torch or transformers import, so that a script's ``--help``, its input checks and an expert-only
evaluation start in a fraction of the seconds a model import takes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agents.config import GAGPOConfig
    from agents.gagpo import GAGPOAgent

__all__ = ["GAGPOAgent", "GAGPOConfig"]
_HOMES = {"GAGPOAgent": "agents.gagpo", "GAGPOConfig": "agents.config"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'agents' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
