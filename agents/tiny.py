"""The default tiny model: a small Qwen2-architecture causal LM built from a config, no download.

Its byte-level BPE tokenizer is trained locally on text the env itself produces (observations, tasks,
admissible actions) plus the prompt template, so a few hundred tokens cover the env's language. This is what
runs on a laptop CPU and in the tests; real runs pass a local checkpoint path or a hub id instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from wrappers.prompt import CHOOSE_INSTRUCTION, GENERATE_INSTRUCTION, SYSTEM_PROMPT

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the tiny model; about 0.2M parameters plus embeddings at the defaults."""

    vocab_size: int = 1024
    hidden_size: int = 64
    intermediate_size: int = 192
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 4096


def collect_env_text(make_env: Callable[[], gym.Env], episodes: int = 48, seed: int = 0) -> list[str]:
    """Observations, tasks and admissible actions from seeded episodes (half expert-led, half random)."""
    env = make_env()
    rng = np.random.default_rng(seed)
    texts: list[str] = []
    has_expert = hasattr(env.unwrapped, "expert_action")
    try:
        for episode in range(episodes):
            obs, info = env.reset(seed=seed + episode)
            texts += [obs, str(info.get("task", ""))]
            use_expert = has_expert and episode % 2 == 0
            for _ in range(60):
                admissible = list(info.get("admissible_actions", []))
                texts.append(" | ".join(admissible))
                if not admissible:
                    break
                action = None
                if use_expert:
                    try:
                        action = env.unwrapped.expert_action()
                    except NotImplementedError:  # the env contract's default: no expert
                        has_expert = use_expert = False
                if action is None:
                    action = admissible[rng.integers(len(admissible))]
                obs, _, terminated, truncated, info = env.step(action)
                texts.append(obs)
                if terminated or truncated:
                    break
    finally:
        env.close()
    return texts


def train_tokenizer(corpus: Iterable[str], vocab_size: int = 1024):
    """A byte-level BPE tokenizer (any text encodes) with Qwen-style chat special tokens and template."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    template_text = [
        SYSTEM_PROMPT,
        GENERATE_INSTRUCTION,
        CHOOSE_INSTRUCTION,
        "<think> </think> <action> </action>",
    ]
    texts = sorted(set(corpus)) + template_text * 20  # sorted: same corpus -> same merges
    backend.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


def build_tiny_model(tokenizer, spec: TinyModelSpec = TinyModelSpec(), seed: int = 0):
    """A randomly initialised Qwen2ForCausalLM sized by ``spec`` for ``tokenizer``."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)
