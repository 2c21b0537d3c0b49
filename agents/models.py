"""Model construction for the agent: the tiny model, pretrained checkpoints, precision, LoRA, the KL reference.

Precision follows what verl and TRL settled on for RL fine-tuning:

* trainable parameters and the optimiser state are fp32 (master weights): Adam's update at lr 1e-6 is far
  below bf16's resolution (8 bits of mantissa), so bf16 weights would mostly not move at all;
* compute runs in the ``compute_dtype`` (bf16 on CUDA by default) under ``torch.autocast``, rollouts and
  updates alike, so the behaviour log-probs recomputed before an update come from the very forward it uses;
* with LoRA the frozen base is stored in the compute dtype and only the adapters are fp32;
* the KL reference is the *initial* policy: a frozen copy (in the compute dtype), the adapter-disabled model
  with LoRA, and after ``load()`` the same initial weights again, never the trained ones.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_device(device: str) -> torch.device:
    """``"auto"`` picks CUDA when present; anything torch cannot parse or use gives one readable error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from err
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but torch sees no CUDA device")
    if resolved.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    return resolved


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """The compute dtype: ``"auto"`` is bf16 on CUDA and fp32 elsewhere."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


@dataclass(frozen=True)
class Precision:
    """Where the model runs and in which dtype it computes (parameters that train are always fp32)."""

    device: torch.device
    compute_dtype: torch.dtype

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 compute over fp32 weights; a no-op in fp32."""
        if self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)


#: Tokenizer classes that run a saved tokenizer.json exactly as written (the tiny model's tokenizer is one).
GENERIC_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(source: str | Path):
    """A left-padding tokenizer with a pad token (the eos token when the checkpoint has none).

    A folder whose tokenizer is a generic one (the tiny model's, saved by this library) loads as that class:
    ``AutoTokenizer`` would pick the model type's class (Qwen2's for the tiny Qwen2) and swap in its own
    pre-tokenizer, which splits " 1" into " " and "1" and so changes every action with a number in it.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config = Path(source) / "tokenizer_config.json"
    generic = config.is_file() and json.loads(config.read_text()).get("tokenizer_class") in GENERIC_TOKENIZERS
    tokenizer = (PreTrainedTokenizerFast if generic else AutoTokenizer).from_pretrained(source)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def check_model_source(source: str) -> None:
    """A path-like source that does not exist is a typo, not a hub id: say so before transformers does.

    Hub ids are ``name`` or ``org/name`` (dots allowed: ``Qwen/Qwen2.5-1.5B``); a source is taken as a local path
    when it starts like one, has more than one ``/``, or its first part is a folder here (``runs/typo``).
    """
    path = Path(source).expanduser()
    looks_local = source.startswith((".", "/", "~")) or source.count("/") > 1 or Path(path.parts[0]).is_dir()
    if looks_local and not path.exists():
        raise FileNotFoundError(f"model folder {source!r} does not exist")


def load_causal_lm(source: str | Path, dtype: torch.dtype, device: torch.device) -> nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(source, dtype=dtype).to(device)


def add_lora(model: nn.Module, r: int, alpha: int) -> nn.Module:
    """A LoRA adapter on every linear layer, trained in fp32 on the frozen base."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, target_modules="all-linear"))
    return upcast_trainable(model)


def load_lora(base: nn.Module, folder: str | Path) -> nn.Module:
    from peft import PeftModel

    return upcast_trainable(PeftModel.from_pretrained(base, folder, is_trainable=True))


def upcast_trainable(model: nn.Module) -> nn.Module:
    """Master weights: every parameter that trains is fp32, whatever dtype the rest of the model has."""
    for p in model.parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.float()
    return model


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """Non-reentrant checkpointing: works with frozen inputs (LoRA) and with the packed choose-mode forward."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()  # harmless without reentrancy; needed by older peft paths


def frozen_copy(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """The KL reference: a frozen copy, stored in the compute dtype (autocast would cast it there anyway)."""
    ref = copy.deepcopy(model).to(dtype).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


@dataclass
class Models:
    """What the agent trains and what it regularises towards."""

    policy: Any  # agents.policy.LLMPolicy
    reference: nn.Module | None  # frozen initial policy for the KL term; None without KL or with LoRA


def build_models(
    config: Any,
    source: str,
    *,
    corpus: Callable[[], list[str]] | None = None,
    checkpoint: Path | None = None,
    device: torch.device | None = None,
) -> Models:
    """The policy (and KL reference) for a resolved :class:`~agents.config.GAGPOConfig`.

    ``source`` is ``"tiny"`` (needs ``corpus``, the env text its tokenizer is trained on) or a checkpoint path or
    hub id. ``checkpoint`` is a saved agent's folder: its weights replace the source's, while the KL reference
    stays the source's initial policy. ``device`` overrides the config's (each rank of a launch its own).
    """
    from agents.policy import LLMPolicy
    from agents.tiny import build_tiny_model, train_tokenizer

    c = config
    device = device or resolve_device(c.device)
    precision = Precision(device, resolve_dtype(c.dtype, device))
    saved = checkpoint / "model" if checkpoint is not None else None
    tiny = source == "tiny"
    if tiny:
        if saved is not None:
            tokenizer = load_tokenizer(saved)
            model = load_causal_lm(saved, torch.float32, device)
        else:
            if corpus is None:
                raise ValueError("model='tiny' trains its tokenizer on env text: pass an env id or a made env")
            tokenizer = train_tokenizer(corpus(), c.tiny_vocab_size)
            model = build_tiny_model(tokenizer, tiny_spec(c), seed=c.seed).to(device)
    else:
        check_model_source(source)
        tokenizer = load_tokenizer(saved or source)
        if c.lora_r > 0:
            base = load_causal_lm(source, precision.compute_dtype, device)
            model = load_lora(base, saved) if saved is not None else add_lora(base, c.lora_r, c.lora_alpha)
        else:
            model = load_causal_lm(saved or source, torch.float32, device)
    if c.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    backend = None
    if c.backend == "vllm" and c.action_mode == "generate":
        from agents.vllm_backend import VLLMGenerationBackend

        backend = VLLMGenerationBackend(
            model, tokenizer, precision, max_model_len=c.max_prompt_tokens + c.max_new_tokens,
            gpu_memory_utilization=c.vllm_gpu_memory_utilization, seed=c.seed,
        )  # fmt: skip
    policy = LLMPolicy(
        model, tokenizer, action_mode=c.action_mode, temperature=c.temperature, max_new_tokens=c.max_new_tokens,
        value_head=c.estimator == "ppo", choose_score=c.choose_score, precision=precision,
        token_budget=c.token_budget, backend=backend,
    )  # fmt: skip
    reference = None
    if c.kl_coef > 0 and c.lora_r == 0:
        if saved is None:
            initial = model
        elif tiny:  # the initial tiny model is a function of (tokenizer, shape, seed): rebuild it
            initial = build_tiny_model(tokenizer, tiny_spec(c), seed=c.seed).to(device)
        else:
            initial = load_causal_lm(source, precision.compute_dtype, device)
        reference = frozen_copy(initial, precision.compute_dtype)
    return Models(policy, reference)


def tiny_spec(config: Any):
    from agents.tiny import TinyModelSpec

    return TinyModelSpec(
        vocab_size=config.tiny_vocab_size,
        hidden_size=config.tiny_hidden_size,
        intermediate_size=3 * config.tiny_hidden_size,
        num_hidden_layers=config.tiny_layers,
        num_attention_heads=config.tiny_heads,
        num_key_value_heads=max(1, config.tiny_heads // 2),
    )
