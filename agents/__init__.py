"""The agent side: GAGPOAgent, the LLM policy, the group rollout buffer, the estimators and the loss."""

from agents.config import GAGPOConfig
from agents.gagpo import GAGPOAgent

__all__ = ["GAGPOAgent", "GAGPOConfig"]
