"""MiniHouse-v0: an offline, pure-Python household simulator with ALFWorld's grammar and its six task types."""

from gagpo_gym.envs.minihouse.env import SIZES, MiniHouseEnv
from gagpo_gym.envs.minihouse.vocab import ROOM_KINDS, TASK_TYPES

__all__ = ["ROOM_KINDS", "SIZES", "TASK_TYPES", "MiniHouseEnv"]
