"""Prompt building: task + recent history + current observation + admissible actions, as token ids.

Rendered through the tokenizer's chat template when it has one (plain text otherwise). History is dropped
oldest-first to fit ``max_prompt_tokens``; when that is not enough the current observation itself is cut in the
middle, its head and tail kept around a visible ``[... N characters cut ...]`` marker, so that one huge observation
(a web page, a log) cannot blow the budget. A prompt never exceeds the budget: one that would even with no
history and the observation cut to the marker (the task, the admissible actions and the instructions alone are
too long) keeps its last ``max_prompt_tokens`` tokens, the end the answer follows; its head, the task and the
observation, is lost, so the first such prompt of a builder raises a :class:`PromptOverflowWarning` that names the
fix (a larger ``max_prompt_tokens``, or fewer actions listed). Each prompt that needed truncation or overflowed is
counted so the agent can log it.
"""

from __future__ import annotations

import string
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

#: How a policy acts: it writes its action as text (``GENERATE``: think, then the action inside ``<action>``), or
#: scores the admissible actions and plays one of them (``CHOOSE``). ``GAGPOConfig.action_mode`` adds ``"auto"``.
ActionModeName = Literal["generate", "choose"]
GENERATE: Final = "generate"
CHOOSE: Final = "choose"
ACTION_MODES: tuple[ActionModeName, ...] = (GENERATE, CHOOSE)


def check_action_mode(action_mode: str) -> None:
    """One readable error for a mode that is not in :data:`ACTION_MODES` (for the classes built with one)."""
    if action_mode not in ACTION_MODES:
        raise ValueError(f"action_mode must be one of {ACTION_MODES}, got {action_mode!r}")


SYSTEM_PROMPT = "You are an agent in a text environment. Read the task and the observation, then act."
GENERATE_INSTRUCTION = (
    "Think briefly inside <think> </think>, then give exactly one admissible action inside <action> </action>."
)
CHOOSE_INSTRUCTION = "Reply with one admissible action."


def tagged_response(command: str, thought: str = " ") -> str:
    """A generate-mode answer that plays ``command``: what GENERATE_INSTRUCTION asks for, and what a warm start in
    generate mode trains (an empty thought: the tiny model has no reasoning to imitate)."""
    return f"<think>{thought}</think> <action> {command} </action>"


CUT_MARKER = "[... {n} characters cut ...]"


class PromptOverflowWarning(UserWarning):
    """A prompt longer than ``max_prompt_tokens`` even with no history and the observation cut: only its end is kept,
    and the policy acts without seeing its task or observation."""


#: What a :class:`PromptTemplate` may name, and what each holds.
PLACEHOLDERS = {
    "task": "the task text",
    "step_count": "the steps already taken in the episode",
    "current_step": "step_count + 1",
    "history_length": "how many recent steps are shown",
    "history": "one [Observation k: '...', Action k: '...'] line per recent step, k counted from the episode's start",
    "observation": "the current observation",
    "admissible_actions": "the admissible actions, each in single quotes, comma-separated",
    "memory": "the episode's memory (memory=True), else empty",
}
#: The line that separates a template file's first-step part from the part used after it.
SEPARATOR = "---"


@dataclass(frozen=True)
class PromptTemplate:
    """A user message with named ``{placeholders}`` (:data:`PLACEHOLDERS`; literal braces doubled, as in
    ``str.format``), for prompts in the shape a published setting was measured with.

    ``first`` is the message of an episode's first step (nothing to show as history), ``later`` every step after
    it. ``system``: the system message; None sends the user message alone (the chat template's default system
    message applies, as in verl-agent). ``drop_actions``: admissible actions never listed (ALFWorld's ``help``).
    """

    name: str
    first: str
    later: str
    system: str | None = None
    drop_actions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for part in (self.first, self.later):
            try:
                names = {field for _, field, _, _ in string.Formatter().parse(part) if field is not None}
            except ValueError as err:  # a lone brace
                raise ValueError(f"prompt template {self.name!r}: {err} (write literal braces as {{{{ }}}})") from None
            unknown = sorted(names - PLACEHOLDERS.keys())
            if unknown:
                raise ValueError(
                    f"prompt template {self.name!r} names unknown placeholders {unknown}; known: {sorted(PLACEHOLDERS)}"
                )

    @classmethod
    def from_file(cls, path: str | Path) -> PromptTemplate:
        """A template file: one message for every step, or a first-step message, a line ``---``, and the
        message of the later steps."""
        text = Path(path).read_text(encoding="utf-8")
        lines = text.splitlines()
        if SEPARATOR in lines:
            cut = lines.index(SEPARATOR)
            first, later = "\n".join(lines[:cut]).strip("\n"), "\n".join(lines[cut + 1 :]).strip("\n")
        else:
            first = later = text.strip("\n")
        return cls(str(path), first, later)

    def text(self) -> str:
        """The template as a file holds it (:meth:`from_file` reads it back)."""
        return self.later if self.first == self.later else f"{self.first}\n{SEPARATOR}\n{self.later}"

    def render(self, fields: Mapping[str, Any]) -> str:
        return (self.later if fields["step_count"] else self.first).format(**fields)

    def fields(
        self, task: str, history: Sequence[Sequence[str]], observation: str, admissible: Sequence[str], memory: str,
        step_count: int,
    ) -> dict[str, Any]:  # fmt: skip
        """Every placeholder's text for one step; the history's steps numbered from the episode's start."""
        start = step_count - len(history)
        lines = [f"[Observation {start + k + 1}: '{obs}', Action {start + k + 1}: '{act}']"
                 for k, (obs, act) in enumerate(history)]  # fmt: skip
        actions = [a for a in admissible if a not in self.drop_actions]
        return {
            "task": task,
            "step_count": step_count,
            "current_step": step_count + 1,
            "history_length": len(history),
            "history": "\n".join(lines),
            "observation": observation,
            "admissible_actions": ", ".join(f"'{a}'" for a in actions),
            "memory": memory,
        }


_THINK_THEN_ACT = (
    "Now it is your turn to act.\n"
    "First reason step by step about the current situation; enclose this reasoning in <think> </think> tags.\n"
    "Then choose one admissible action for the current step and give it inside <action> </action> tags."
)
#: verl-agent's ALFWorld prompt structure (its GiGPO runs were measured with it), in this project's words.
ALFWORLD_TEMPLATE = PromptTemplate(
    "alfworld",
    first=(
        "You are an expert agent in the ALFRED embodied household environment.\n"
        "Your current observation is: {observation}\n"
        "Your admissible actions in the current situation are: [{admissible_actions}].\n\n" + _THINK_THEN_ACT
    ),
    later=(
        "You are an expert agent in the ALFRED embodied household environment. Your task is to: {task}\n"
        "Before this step you have taken {step_count} step(s). Your {history_length} most recent observations and "
        "the actions you took after them:\n{history}\n"
        "You are now at step {current_step} and your current observation is: {observation}\n"
        "Your admissible actions in the current situation are: [{admissible_actions}].\n\n" + _THINK_THEN_ACT
    ),
    drop_actions=("help",),
)
#: verl-agent's WebShop prompt structure, in this project's words (MiniShop plays it).
WEBSHOP_TEMPLATE = PromptTemplate(
    "webshop",
    first=(
        "You are an expert autonomous agent in the WebShop online shopping environment.\n"
        "Your task is to: {task}.\n"
        "Your current observation is: {observation}.\n"
        "Your admissible actions in the current situation are:\n[\n{admissible_actions}\n].\n\n" + _THINK_THEN_ACT
    ),
    later=(
        "You are an expert autonomous agent in the WebShop online shopping environment.\n"
        "Your task is to: {task}.\n"
        "Before this step you have taken {step_count} step(s). Your {history_length} most recent observations and "
        "the actions you took after them:\n{history}\n"
        "You are now at step {current_step} and your current observation is: {observation}.\n"
        "Your admissible actions in the current situation are:\n[\n{admissible_actions}\n].\n\n" + _THINK_THEN_ACT
    ),
)
TEMPLATES = {t.name: t for t in (ALFWORLD_TEMPLATE, WEBSHOP_TEMPLATE)}


def prompt_template(spec: str) -> PromptTemplate | None:
    """``"generic"`` (None: the builder's own message), a built-in template's name, or a template file's path."""
    if spec == "generic":
        return None
    if spec in TEMPLATES:
        return TEMPLATES[spec]
    if not Path(spec).is_file():
        raise ValueError(f"prompt_template must be 'generic', one of {sorted(TEMPLATES)} or a file; got {spec!r}")
    return PromptTemplate.from_file(spec)


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
        action_mode: :data:`GENERATE` adds the think/answer-format instruction; :data:`CHOOSE` asks for an action.
        max_prompt_tokens: history is truncated (oldest first), then the observation cut, to fit this.
        show_admissible: list the admissible actions in the prompt.
        template: a :class:`PromptTemplate` for the user message (its own system message and action list), or
            None for this builder's generic one.
    """

    def __init__(
        self,
        tokenizer: Any,
        action_mode: ActionModeName = GENERATE,
        max_prompt_tokens: int = 1024,
        show_admissible: bool = True,
        system_prompt: str = SYSTEM_PROMPT,
        template: PromptTemplate | None = None,
    ) -> None:
        check_action_mode(action_mode)
        if max_prompt_tokens < 16:
            raise ValueError(f"max_prompt_tokens must be >= 16, got {max_prompt_tokens}")
        self.tokenizer = tokenizer
        self.action_mode = action_mode
        self.max_prompt_tokens = max_prompt_tokens
        self.show_admissible = show_admissible
        self.template = template
        self.system_prompt = system_prompt if template is None else template.system
        self.truncated_count = 0  # prompts shortened to fit: history dropped and/or the observation cut
        self.observation_cuts = 0  # prompts whose current observation was cut (fitting or not)
        self.overflow_count = 0  # prompts longer than the budget even without history and with the observation cut
        self.overflow_warned = False  # the first overflow warns (PromptOverflowWarning); the count goes on

    def user_message(
        self,
        task: str,
        history: Sequence[Sequence[str]],
        observation: str,
        admissible: Sequence[str],
        memory: str = "",
        step_count: int | None = None,
    ) -> str:
        """The user message; ``step_count`` (steps already taken) defaults to the history's length."""
        if self.template is not None:
            steps = len(history) if step_count is None else step_count
            return self.template.render(self.template.fields(task, history, observation, admissible, memory, steps))
        parts = [f"Task: {task}"] if task else []
        if memory:
            parts.append(f"Memory: {memory}")
        if history:
            steps = "\n".join(f"Observation: {obs}\nAction: {act}" for obs, act in history)
            parts.append(f"Recent steps:\n{steps}")
        parts.append(f"Current observation: {observation}")
        if self.show_admissible and admissible:
            parts.append("Admissible actions: " + " | ".join(admissible))
        parts.append(GENERATE_INSTRUCTION if self.action_mode == GENERATE else CHOOSE_INSTRUCTION)
        return "\n\n".join(parts)

    def render(self, user: str) -> str:
        """The prompt text, ending where the model's answer starts."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt is not None else []
        if getattr(self.tokenizer, "chat_template", None):
            messages = [*system, {"role": "user", "content": user}]
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        head = f"{self.system_prompt}\n\n" if system else ""
        return f"{head}{user}\n\nAnswer:"  # no trailing space: BPE answers start with " word"

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def for_step(
        self,
        observation: str,
        info: dict[str, Any],
        history: Sequence | None = None,
        memory: str | None = None,
        step_count: int | None = None,
    ) -> list[int]:
        """The prompt of one env step from its observation and info (task, admissible actions, and the history,
        memory and step count the text wrappers keep, unless ``history``, ``memory`` or ``step_count`` is given)."""
        history = info.get("history", []) if history is None else history
        memory = info.get("memory", "") if memory is None else memory
        step_count = info.get("episode_step", len(history)) if step_count is None else step_count
        admissible = info.get("admissible_actions", [])
        return self.build(info.get("task", ""), history, observation, admissible, memory, step_count)

    def build(
        self,
        task: str,
        history: Sequence[Sequence[str]],
        observation: str,
        admissible: Sequence[str],
        memory: str = "",
        step_count: int | None = None,
    ) -> list[int]:
        """Prompt token ids: as much recent history as fits in ``max_prompt_tokens``, else a cut observation."""
        history = list(history)
        step_count = len(history) if step_count is None else step_count

        def prompt(steps: list, obs: str) -> list[int]:
            return self.encode(self.render(self.user_message(task, steps, obs, admissible, memory, step_count)))

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
            self.warn_overflow(len(best), len(admissible))
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

    def warn_overflow(self, needed: int, n_actions: int) -> None:
        """Say once per builder that prompts lose their head (the task, the observation), and how to avoid it."""
        if self.overflow_warned:
            return
        self.overflow_warned = True
        fewer = "show_admissible=False" if self.template is None else "a prompt template that leaves them out"
        warnings.warn(
            PromptOverflowWarning(
                f"a prompt needs {needed} tokens with no history and its observation cut, over max_prompt_tokens="
                f"{self.max_prompt_tokens}: only its last {self.max_prompt_tokens} tokens are kept, so the policy acts "
                f"without seeing the task or the observation ({n_actions} admissible actions listed). Raise "
                f"max_prompt_tokens to at least {needed}, or list fewer actions: {fewer} (choose mode scores every "
                "admissible action without the list), or an env that offers fewer"
            ),
            stacklevel=3,
        )
