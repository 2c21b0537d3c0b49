"""Gymnasium wrappers for LLM agents on text envs: grouped vector env, history, parsing, keys, penalties, stats."""

from wrappers.grouped_vector_env import GroupedVectorEnv
from wrappers.memory import Memory, PlaceMemory
from wrappers.prompt import (
    ACTION_MODES,
    CHOOSE,
    GENERATE,
    TEMPLATES,
    ActionModeName,
    PromptBuilder,
    PromptOverflowWarning,
    PromptTemplate,
    check_action_mode,
    prompt_template,
    tagged_response,
)
from wrappers.text_wrappers import (
    EpisodeStatistics,
    History,
    InvalidActionPenalty,
    ParseAction,
    RevisitPenalty,
    StateKey,
    extract_action,
    follows_think_format,
    parse_backoff_spec,
    parse_key_spec,
    wrap_text_env,
)

__all__ = [
    "ACTION_MODES",
    "CHOOSE",
    "GENERATE",
    "ActionModeName",
    "EpisodeStatistics",
    "GroupedVectorEnv",
    "History",
    "InvalidActionPenalty",
    "Memory",
    "ParseAction",
    "PlaceMemory",
    "PromptBuilder",
    "PromptOverflowWarning",
    "PromptTemplate",
    "RevisitPenalty",
    "TEMPLATES",
    "StateKey",
    "check_action_mode",
    "extract_action",
    "follows_think_format",
    "parse_backoff_spec",
    "parse_key_spec",
    "prompt_template",
    "tagged_response",
    "wrap_text_env",
]
