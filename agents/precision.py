"""Where the model runs and in which dtype it computes: a leaf every model-facing module imports.

Trainable parameters and the optimiser state are always fp32 (master weights); compute runs in the compute dtype
(bf16 on CUDA by default) under ``torch.autocast``.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
#: Said once (Python's default filter: one message, one place) when bf16 compute is asked for on a CPU.
SLOW_CPU_BF16 = (
    "dtype='bfloat16' on a CPU: most CPUs have no bf16 arithmetic and emulate it, about 18x slower than float32 "
    "(one forward+backward took 141 s against 7.9 s on a CPU without bf16 instructions); use dtype='float32' (or "
    "'auto': fp32 on a CPU) unless this CPU computes bf16 natively (AMX, AVX512-BF16)"
)


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
    """The compute dtype: ``"auto"`` is bf16 on CUDA and fp32 elsewhere. bf16 asked for on a CPU is granted, with a
    warning: emulated, it costs many times fp32's time, and nothing else would tell."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(DTYPES)}, got {dtype!r}")
    if DTYPES[dtype] == torch.bfloat16 and device.type == "cpu":
        warnings.warn(SLOW_CPU_BF16, UserWarning, stacklevel=2)
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
