"""gagpo-gym: Gymnasium text environments for multi-turn LLM agents.

Importing the package registers every built-in env under the ``gagpo_gym/`` namespace.
"""

from gagpo_gym.checker import check_text_env
from gagpo_gym.core import CHARSET, TextEnv, match_command, normalize_command, state_key, to_charset
from gagpo_gym.registration import make, register_builtin_envs, register_text_env, registered_text_envs

register_builtin_envs()

__all__ = [
    "CHARSET",
    "TextEnv",
    "check_text_env",
    "make",
    "match_command",
    "normalize_command",
    "register_text_env",
    "registered_text_envs",
    "state_key",
    "to_charset",
]
