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

import copy
import dataclasses
import hashlib
import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from huggingface_hub import constants as hub_constants
from huggingface_hub import snapshot_download, try_to_load_from_cache
from safetensors.torch import load_model
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from agents.checkpoint import REFERENCE_FILE, sha256_file
from agents.policy import LLMPolicy
from agents.precision import Precision, resolve_device, resolve_dtype
from agents.tiny import TinyModelSpec, build_tiny_model, train_tokenizer
from agents.vllm_backend import VLLMGenerationBackend
from wrappers import GENERATE

#: Tokenizer classes that run a saved tokenizer.json exactly as written (the tiny model's tokenizer is one).
GENERIC_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(source: str | Path):
    """A left-padding tokenizer with a pad token (the eos token when the checkpoint has none).

    A folder whose tokenizer is a generic one (the tiny model's, saved by this library) loads as that class:
    ``AutoTokenizer`` would pick the model type's class (Qwen2's for the tiny Qwen2) and swap in its own
    pre-tokenizer, which splits " 1" into " " and "1" and so changes every action with a number in it.
    """
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


#: Where a proxy may resolve the hub's name for us: then a local lookup failing says nothing.
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def check_hub_reachable(source: str) -> None:
    """Before reading a pretrained source: a mistyped folder is named (:func:`check_model_source`), and a hub id
    missing from the local cache, which must be downloaded, is refused at once when the hub's name does not even
    resolve (no network), instead of huggingface_hub retrying for about a minute before the same failure."""
    check_model_source(source)
    if Path(source).expanduser().exists() or os.environ.get("HF_HUB_OFFLINE"):
        return  # a folder; or offline mode, where huggingface_hub fails at once by itself
    cached = isinstance(try_to_load_from_cache(source, "config.json"), str)
    if cached or any(os.environ.get(v) for v in PROXY_VARIABLES):
        return
    host = urlparse(hub_constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        raise OSError(
            f"model {source!r} is not in the local Hugging Face cache and {host} cannot be reached (its name does "
            f"not resolve): download it where there is a network (hf download {source}) or pass a local folder"
        ) from None


def load_causal_lm(
    source: str | Path, dtype: torch.dtype, device: torch.device, *, local_files_only: bool = False
) -> nn.Module:
    return AutoModelForCausalLM.from_pretrained(source, dtype=dtype, local_files_only=local_files_only).to(device)


#: Files whose bytes decide a model: its weights and its config (tokenizers travel with every saved agent).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def local_folder(source: str) -> Path:
    """The folder a model source reads from: itself, or a hub id's copy in the local cache (never the network)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path.resolve()
    check_model_source(source)
    try:
        return Path(snapshot_download(source, local_files_only=True))
    except Exception as err:  # huggingface_hub raises several kinds for "not cached"
        raise FileNotFoundError(f"model {source!r} is neither a folder here nor in the local hub cache") from err


def fingerprint(source: str) -> str:
    """SHA-256 over a model source's weight files and config.json: the same bytes whatever dtype loads them."""

    folder = local_folder(source)
    files = sorted(f for f in folder.iterdir() if f.suffix in WEIGHT_SUFFIXES or f.name == "config.json")
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.name}\0{sha256_file(file)}\n".encode())
    return digest.hexdigest()


#: The kinds of source that are the library's tiny model: built fresh (``model="tiny"``) or warm-started (a prior
#: folder). What "tiny" means everywhere: it trains all its weights, and the config's tiny defaults apply to it.
TINY_KINDS = ("tiny", "prior")


@dataclass(frozen=True)
class ModelSource:
    """Where an agent's initial policy came from, as its checkpoint records it (``agent.json``'s ``"model"``).

    ``kind``: ``"tiny"`` (built fresh from a config), ``"prior"`` (a warm-start folder: the tiny model with a
    language prior) or ``"pretrained"``; the first two are :attr:`tiny`. A saved
    agent holds its full weights (or its LoRA adapter) and its tokenizer; what it may still need from the source is
    the KL reference (a tiny or prior agent stores that too: a few MB) and a LoRA base. For those a pretrained
    source is recorded by absolute path and fingerprint, and loading refuses any other bytes under that name.
    """

    name: str
    kind: str
    path: str | None = None  # absolute folder of a local source
    sha256: str | None = None  # fingerprint(), where a reference or LoRA base must be read back from the source

    @property
    def tiny(self) -> bool:
        return self.kind in TINY_KINDS

    @classmethod
    def of(cls, name: str, kind: str, *, needed: bool) -> ModelSource:
        """The record of a source given at construction; ``needed``: a checkpoint will have to read it back."""
        if kind in TINY_KINDS or not needed:  # a tiny agent stores its reference itself
            return cls(name, kind)
        folder = Path(name).expanduser()
        return cls(name, kind, str(folder.resolve()) if folder.is_dir() else None, fingerprint(name))

    @classmethod
    def from_record(cls, record: dict | str, checkpoint: Path) -> ModelSource:
        """From ``agent.json``; checkpoints written before the record kept only the name (``model_source``)."""
        if isinstance(record, dict):
            return cls(**record)
        if record == "tiny":
            return cls(record, "tiny")
        # A folder written by this library's tiny model keeps its generic tokenizer class: a warm-start prior.
        config = checkpoint / "model" / "tokenizer_config.json"
        generic = config.is_file() and json.loads(config.read_text()).get("tokenizer_class") in GENERIC_TOKENIZERS
        return cls(record, "prior" if generic else "pretrained")

    def locate(self, purpose: str, override: str | None = None) -> str:
        """Where to read the source back for ``purpose`` (``override``, else where it was), checked against the
        fingerprint; never from the network."""
        where = override or self.path or self.name
        if self.sha256 is None:  # an old checkpoint: nothing recorded to check against
            check_model_source(where)
            return where
        try:
            found = fingerprint(where)
        except FileNotFoundError as err:
            raise FileNotFoundError(
                f"this agent needs its source model {self.name!r} (sha256 {self.sha256[:12]}...) as its {purpose}, "
                f"and {where!r} is not there: pass load(..., model=PATH) to a copy of it"
            ) from err
        if found != self.sha256:
            raise ValueError(
                f"{where!r} is not the model this agent was trained from: its weights' sha256 is {found[:12]}..., "
                f"the agent's source {self.name!r} had {self.sha256[:12]}...; pass load(..., model=PATH) to that model"
            )
        return where


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


def frozen(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """The KL reference: frozen, stored in the compute dtype (autocast would cast it there anyway)."""
    model = model.to(dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@dataclass
class Models:
    """What the agent trains and what it regularises towards."""

    policy: LLMPolicy
    reference: nn.Module | None  # frozen initial policy for the KL term; None without KL or with LoRA


def build_models(
    config: Any,
    source: str,
    *,
    corpus: Callable[[], list[str]] | None = None,
    restore: Restore | None = None,
    device: torch.device | None = None,
    shard: bool = False,
) -> Models:
    """The policy (and KL reference) for a resolved :class:`~agents.config.GAGPOConfig`.

    ``source`` is ``"tiny"`` (needs ``corpus``, the env text its tokenizer is trained on) or a checkpoint path or
    hub id. ``restore`` is a saved agent's folder and source record: its weights and tokenizer replace the
    source's, while the KL reference stays the initial policy (stored in the folder, or read back from the verified
    source); a LoRA adapter goes on the verified base. ``device`` overrides the config's (each rank its own).
    ``shard``: the policy is about to be sharded (FSDP2), so it is built on the CPU and each unit reaches ``device``
    as it is sharded: no rank holds the whole fp32 model on its accelerator (28 GB for a 7B model).
    """

    c = config
    device = device or resolve_device(c.device)
    precision = Precision(device, resolve_dtype(c.dtype, device))
    home = torch.device("cpu") if shard else device  # where the policy's weights are first placed
    if restore is not None:
        saved = restore.folder / "model"
        tokenizer = load_tokenizer(saved)
        if c.lora_r > 0:
            base_source = restore.source.locate("LoRA base", restore.model)
            base = load_causal_lm(base_source, precision.compute_dtype, home, local_files_only=True)
            model = load_lora(base, saved)
        else:
            model = load_causal_lm(saved, torch.float32, home)
    elif source == "tiny":  # built fresh
        if corpus is None:
            raise ValueError("model='tiny' trains its tokenizer on env text: pass an env id or a made env")
        tokenizer = train_tokenizer(corpus(), c.tiny_vocab_size)
        model = build_tiny_model(tokenizer, tiny_spec(c), seed=c.seed).to(home)
    else:
        check_hub_reachable(source)
        tokenizer = load_tokenizer(source)
        if c.lora_r > 0:
            model = add_lora(load_causal_lm(source, precision.compute_dtype, home), c.lora_r, c.lora_alpha)
        else:
            model = load_causal_lm(source, torch.float32, home)
    if c.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    backend = None
    if c.backend == "vllm" and c.action_mode == GENERATE:
        backend = VLLMGenerationBackend(
            model, tokenizer, precision, max_model_len=c.max_prompt_tokens + c.max_new_tokens,
            gpu_memory_utilization=c.vllm_gpu_memory_utilization, seed=c.seed,
        )  # fmt: skip
    policy = LLMPolicy(
        model, tokenizer, action_mode=c.action_mode, temperature=c.temperature, max_new_tokens=c.max_new_tokens,
        value_head=c.estimator_spec.needs_critic, choose_score=c.choose_score, precision=precision,
        token_budget=c.token_budget, backend=backend,
    )  # fmt: skip
    reference = None
    if c.kl_coef > 0 and c.lora_r == 0:
        stored = restore.folder / REFERENCE_FILE if restore is not None else None
        if (stored is None and source == "tiny") or (stored is not None and stored.is_file()):
            initial = copy.deepcopy(model)  # a restored agent's stored reference replaces these weights below
        elif stored is None:  # read again in the compute dtype: no transient fp32 copy of a large model
            initial = load_causal_lm(source, precision.compute_dtype, device)
        elif restore.source.kind == "tiny":  # saved before references were stored: rebuild it from the seed
            initial = build_tiny_model(tokenizer, tiny_spec(c), seed=c.seed).to(device)
        else:
            where = restore.source.locate("KL reference", restore.model)
            initial = load_causal_lm(where, precision.compute_dtype, device, local_files_only=True)
        reference = frozen(initial, precision.compute_dtype).to(device)  # whole on every rank, in bf16 on CUDA
        if stored is not None and stored.is_file():
            load_model(reference, stored, device=str(device))
    return Models(policy, reference)


@dataclass(frozen=True)
class Restore:
    """A saved agent to rebuild: its folder, the record of its source, and where to find that source instead."""

    folder: Path
    source: ModelSource
    model: str | None = None  # load(..., model=PATH): the source's copy, verified against its fingerprint

    def moved(self) -> ModelSource:
        """The source record a re-save keeps: pointing at ``model`` where the source was found there."""
        if self.model is None or not Path(self.model).expanduser().is_dir():
            return self.source
        return dataclasses.replace(self.source, path=str(Path(self.model).expanduser().resolve()))


def tiny_spec(config: Any) -> TinyModelSpec:
    return TinyModelSpec(
        vocab_size=config.tiny_vocab_size,
        hidden_size=config.tiny_hidden_size,
        intermediate_size=3 * config.tiny_hidden_size,
        num_hidden_layers=config.tiny_layers,
        num_attention_heads=config.tiny_heads,
        num_key_value_heads=max(1, config.tiny_heads // 2),
    )
