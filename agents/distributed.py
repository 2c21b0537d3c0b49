"""Data-parallel training on accelerate: one process by default, several ranks under a launcher.

Under ``torchrun`` or ``accelerate launch`` (``WORLD_SIZE > 1``) each rank owns ``num_groups / world_size`` rollout
groups: a group never spans ranks, so GAGPO's per-group statistics stay local and exact. The policy's root module
(:class:`~agents.policy.PolicyCore`) is prepared by accelerate (DDP, or FSDP when the launcher's config asks for
it) and gradients are reduced by that engine. What must be global is reduced here: row and episode counts,
batch-normalisation moments, logged statistics. Without a launcher nothing here touches torch.distributed.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import numpy as np
import torch
from torch import nn


def launched() -> bool:
    """True inside a multi-process launch (torchrun / accelerate launch set WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


class Distributed:
    """The process group as the agent sees it: rank, world size, reductions, and the engine's wrappers."""

    def __init__(self) -> None:
        self.accelerator = None
        self.rank, self.world_size = 0, 1
        if launched():
            from accelerate import Accelerator

            self.accelerator = Accelerator(cpu=not torch.cuda.is_available())
            self.rank, self.world_size = self.accelerator.process_index, self.accelerator.num_processes

    @property
    def enabled(self) -> bool:
        return self.accelerator is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def device(self) -> torch.device | None:
        """The rank's device (each rank its own GPU), or None to let the config decide."""
        return self.accelerator.device if self.enabled else None

    @property
    def fsdp(self) -> bool:
        return self.enabled and self.accelerator.distributed_type.name == "FSDP"

    def prepare(self, core: nn.Module) -> nn.Module:
        return self.accelerator.prepare(core) if self.enabled else core

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        return self.accelerator.prepare(optimizer) if self.enabled else optimizer

    def backward(self, loss: torch.Tensor) -> None:
        if self.enabled:
            self.accelerator.backward(loss)
        else:
            loss.backward()

    def no_sync(self, module: nn.Module, skip: bool) -> contextlib.AbstractContextManager:
        """Accumulate gradients locally (no all-reduce) when ``skip``: all but a step's last backward."""
        if self.enabled and skip:
            return self.accelerator.no_sync(module)
        return contextlib.nullcontext()

    def clip_grad_norm_(self, params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
        if self.enabled:
            return self.accelerator.clip_grad_norm_(params, max_norm)
        return torch.nn.utils.clip_grad_norm_(params, max_norm)

    def sum(self, values: Any) -> np.ndarray:
        """Element-wise sum over ranks of a small vector of numbers (float64)."""
        array = np.asarray(values, dtype=np.float64)
        if not self.enabled:
            return array
        tensor = torch.as_tensor(array, device=self.accelerator.device)
        return self.accelerator.reduce(tensor, reduction="sum").cpu().numpy()

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order."""
        if not self.enabled:
            return [obj]
        from accelerate.utils import gather_object

        return gather_object([obj])

    def unwrap(self, module: nn.Module) -> nn.Module:
        return self.accelerator.unwrap_model(module) if self.enabled else module

    def full_state_dict(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """The whole state dict on the main rank (gathered from FSDP shards); every rank must call it."""
        return self.accelerator.get_state_dict(module)

    def barrier(self) -> None:
        if self.enabled:
            self.accelerator.wait_for_everyone()
