"""Prompt building: task + recent history + current observation + admissible actions, as token ids.

Rendered through the tokenizer's chat template when it has one (plain text otherwise). History is dropped
oldest-first to fit ``max_prompt_tokens``; when that is not enough the current observation itself is cut in the
middle, its head and tail kept around a visible ``[... N characters cut ...]`` marker, so that one huge observation
(a web page, a log) cannot blow the budget. A prompt never exceeds the budget: one that would even with no
history and the observation cut to the marker (the task, the admissible actions and the instructions alone are
too long) keeps its last ``max_prompt_tokens`` tokens, the end the answer follows. Each prompt that needed
truncation or overflowed is counted so the agent can log it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

SYSTEM_PROMPT = "You are an agent in a text environment. Read the task and the observation, then act."
GENERATE_INSTRUCTION = (
    "Think briefly inside <think> </think>, then give exactly one admissible action inside <action> </action>."
)
CHOOSE_INSTRUCTION = "Reply with one admissible action."
CUT_MARKER = "[... {n} characters cut ...]"


def cut_middle(text: str, keep: int) -> str:
    """``text`` with all but ``keep`` characters (its head and tail) replaced by the cut marker."""
    if keep >= len(text):
        return text
    head, tail = text[: (keep + 1) // 2], text[len(text) - keep // 2 :]
    return f"{head}\n{CUT_MARKER.format(n=len(text) - keep)}\n{tail}"


class PromptBuilder:
    """Turns (task, history, observation, admissible actions) into prompt token ids for one model.

    Args:
        tokenizer: a Hugging Face tokenizer (``apply_chat_template`` is used when ``chat_template`` is set).
        action_mode: ``"generate"`` adds the think/answer-format instruction; ``"choose"`` asks for an action.
        max_prompt_tokens: history is truncated (oldest first), then the observation cut, to fit this.
        show_admissible: list the admissible actions in the prompt.
    """

    def __init__(
        self,
        tokenizer: Any,
        action_mode: str = "generate",
        max_prompt_tokens: int = 1024,
        show_admissible: bool = True,
        system_prompt: str = SYSTEM_PROMPT,
    ) -> None:
        if action_mode not in ("generate", "choose"):
            raise ValueError(f"action_mode must be 'generate' or 'choose', got {action_mode!r}")
        if max_prompt_tokens < 16:
            raise ValueError(f"max_prompt_tokens must be >= 16, got {max_prompt_tokens}")
        self.tokenizer = tokenizer
        self.action_mode = action_mode
        self.max_prompt_tokens = max_prompt_tokens
        self.show_admissible = show_admissible
        self.system_prompt = system_prompt
        self.truncated_count = 0  # prompts shortened to fit: history dropped and/or the observation cut
        self.observation_cuts = 0  # prompts whose current observation was cut (fitting or not)
        self.overflow_count = 0  # prompts longer than the budget even without history and with the observation cut

    def user_message(
        self,
        task: str,
        history: Sequence[Sequence[str]],
        observation: str,
        admissible: Sequence[str],
        memory: str = "",
    ) -> str:
        parts = [f"Task: {task}"] if task else []
        if memory:
            parts.append(f"Memory: {memory}")
        if history:
            steps = "\n".join(f"Observation: {obs}\nAction: {act}" for obs, act in history)
            parts.append(f"Recent steps:\n{steps}")
        parts.append(f"Current observation: {observation}")
        if self.show_admissible and admissible:
            parts.append("Admissible actions: " + " | ".join(admissible))
        parts.append(GENERATE_INSTRUCTION if self.action_mode == "generate" else CHOOSE_INSTRUCTION)
        return "\n\n".join(parts)

    def render(self, user: str) -> str:
        """The prompt text, ending where the model's answer starts."""
        if getattr(self.tokenizer, "chat_template", None):
            messages = [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": user}]
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return f"{self.system_prompt}\n\n{user}\n\nAnswer:"  # no trailing space: BPE answers start with " word"

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def for_step(
        self, observation: str, info: dict[str, Any], history: Sequence | None = None, memory: str | None = None
    ) -> list[int]:
        """The prompt of one env step from its observation and info (task, admissible actions, and the history
        and memory the text wrappers keep, unless ``history`` or ``memory`` is given)."""
        history = info.get("history", []) if history is None else history
        memory = info.get("memory", "") if memory is None else memory
        return self.build(info.get("task", ""), history, observation, info.get("admissible_actions", []), memory)

    def build(
        self,
        task: str,
        history: Sequence[Sequence[str]],
        observation: str,
        admissible: Sequence[str],
        memory: str = "",
    ) -> list[int]:
        """Prompt token ids: as much recent history as fits in ``max_prompt_tokens``, else a cut observation."""
        history = list(history)

        def prompt(steps: list, obs: str) -> list[int]:
            return self.encode(self.render(self.user_message(task, steps, obs, admissible, memory)))

        for keep in range(len(history), -1, -1):
            ids = prompt(history[len(history) - keep :], observation)
            if len(ids) <= self.max_prompt_tokens:
                if keep < len(history):
                    self.truncated_count += 1
                return ids
        best = prompt([], cut_middle(observation, 0))
        if len(best) > self.max_prompt_tokens:
            # Even the bare prompt is too long (the task, admissible actions and instructions alone): keep its end,
            # where the answer starts, so that no engine is handed more than the budget it was sized for.
            self.overflow_count += 1
            if len(ids) > len(best):  # the observation is longer than its cut marker
                self.observation_cuts += 1
                ids = best
            return ids[len(ids) - self.max_prompt_tokens :]
        self.observation_cuts += 1
        # The longest head + tail that fits: binary search on the characters kept (tokens grow with them).
        low, high = 0, len(observation) - 1
        while low < high:
            mid = (low + high + 1) // 2
            ids = prompt([], cut_middle(observation, mid))
            if len(ids) <= self.max_prompt_tokens:
                low, best = mid, ids
            else:
                high = mid - 1
        self.truncated_count += 1
        return best
