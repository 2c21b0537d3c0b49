"""Data-parallel training: one process by default, several ranks under a launcher.

Under ``torchrun`` or ``accelerate launch`` (``WORLD_SIZE`` and ``LOCAL_RANK`` set) each rank owns
``num_groups / world_size`` rollout groups: a group never spans ranks, so GAGPO's per-group statistics stay local
and exact. accelerate sets up the process group and wraps the policy's root module
(:class:`~agents.policy.PolicyCore`) in DDP; with ``fsdp=True`` the root and each decoder layer are sharded with
PyTorch's FSDP2 (``fully_shard``) instead, which also runs on CPU with gloo (accelerate treats CPU launches as plain
multi-CPU DDP). What must be global is reduced here: row and episode counts, batch-normalisation moments, logged
statistics. Without a launcher nothing here touches torch.distributed.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard

SETTLE_S = 0.25  # seconds a launched rank leaves gloo's workers at exit (close_process_group)


def launched() -> bool:
    """True under a launcher (torchrun / accelerate launch set WORLD_SIZE and LOCAL_RANK), one process included:
    ``torchrun --nproc_per_node 1`` runs the distributed code path, which is how FSDP is checked on one GPU."""
    return "WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ


def close_process_group() -> None:
    """Tear the process group down at a launched rank's exit, after giving gloo's worker threads the GIL.

    A gloo worker drops a finished collective's work after the caller already has its result; when that work holds
    tensors Python owns (FSDP's all-gathers do), the drop takes the GIL. A rank that exits right after its last
    collective (a save ends with a barrier) can start interpreter finalisation first: the worker then finds the
    GIL gone, its thread is ended mid-destructor and the rank aborts after all its work is done (``terminate
    called without an active exception``, SIGABRT; seen in gdb as ``take_gil`` -> ``PyThread_exit_thread`` under
    ``~AsyncAllgatherCoalescedWork`` in ``pt_gloo_runloop``). Tearing the group down does not end those threads
    while FSDP's meshes still hold it, so the rank first sleeps with the GIL released: a waiting worker takes it
    at once; the sleep only covers a worker not yet scheduled on a loaded machine."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        time.sleep(SETTLE_S)
        torch.distributed.destroy_process_group()


class Distributed:
    """The process group as the agent sees it: rank, world size, reductions, and the engine's wrappers."""

    def __init__(self, fsdp: bool = False) -> None:
        self.accelerator = None
        self.rank, self.world_size = 0, 1
        self.sharded: list[nn.Module] = []  # FSDP2 modules, root last
        if launched():
            try:  # the optional `distributed` extra
                from accelerate import Accelerator
            except ImportError as err:
                raise ImportError(
                    "a multi-process launch needs accelerate: pip install 'gagpo-gym[distributed]'"
                ) from err

            self.accelerator = Accelerator(cpu=not torch.cuda.is_available())
            self.rank, self.world_size = self.accelerator.process_index, self.accelerator.num_processes
            atexit.unregister(close_process_group)  # once, however many agents the process builds
            atexit.register(close_process_group)
        self.fsdp = fsdp and self.enabled
        self.group: Any = None  # a process group of its own (side_channel); None: the default group

    def side_channel(self) -> Distributed:
        """The same ranks on a gloo process group of their own, for a second thread's small collectives (the
        overlapped rollout's sums and gathers) while this thread's (the update's) run on the default group: two
        threads never share a group, so each group's collectives keep one order on every rank. Every rank must
        call it, at the same point (it creates the group)."""
        view = copy.copy(self)
        view.sharded = []  # that thread acts with a whole copy of the weights (agents.overlap), never the shards
        if self.enabled:
            view.group = torch.distributed.new_group(backend="gloo")
        return view

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

    def prepare(self, core: nn.Module) -> nn.Module:
        """DDP through accelerate, or FSDP2 in place (each decoder layer a unit, the root holding the rest)."""
        if not self.enabled:
            return core
        if not self.fsdp:
            return self.accelerator.prepare(core)
        for layer in core.model.get_decoder().layers:
            self.sharded.append(fully_shard(layer))
        self.sharded.append(fully_shard(core))
        return core

    def first_forward(self, forward: Callable[[], Any]) -> None:
        """FSDP2 makes the module of a run's first forward its root. Run that forward through the real root now:
        the first forward of a generate-mode run is the sampler's, through the inner model, whose decoder layers
        would each become a root and break the next forward through the real one. Then reshard everything (the
        root keeps its weights whole after a forward), so the optimizer is built on the sharded parameters."""
        if not self.sharded:
            return
        with torch.no_grad():
            forward()
        for module in self.sharded:
            module.reshard()

    @contextlib.contextmanager
    def full_params(self):
        """Whole weights on every rank for a phase without gradients (rollouts, recomputed log-probs, saving
        the weights): gathered once, so ranks can run different numbers of forwards with no collectives."""
        if not self.sharded:
            yield
            return
        for module in self.sharded:
            module.set_reshard_after_forward(False)
            module.unshard()
        try:
            yield
        finally:
            for module in self.sharded:
                module.reshard()
                module.set_reshard_after_forward(True)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        return self.accelerator.prepare(optimizer) if self.enabled else optimizer

    def backward(self, loss: torch.Tensor) -> None:
        if self.enabled:
            self.accelerator.backward(loss)
        else:
            loss.backward()

    def no_sync(self, module: nn.Module, skip: bool) -> contextlib.AbstractContextManager:
        """Accumulate gradients locally (no all-reduce) when ``skip``: all but a step's last backward."""
        if self.sharded:
            return _gradient_sync(self.sharded[-1], not skip)
        if self.enabled and skip:
            return self.accelerator.no_sync(module)
        return contextlib.nullcontext()

    def clip_grad_norm_(self, params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
        if self.enabled and not self.fsdp:
            return self.accelerator.clip_grad_norm_(params, max_norm)
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: a sharded norm

    def sum(self, values: Any) -> np.ndarray:
        """Element-wise sum over ranks of a small vector of numbers (float64)."""
        array = np.asarray(values, dtype=np.float64)
        if not self.enabled:
            return array
        if self.group is not None:
            tensor = torch.as_tensor(array)  # gloo: on the CPU, whatever device the model is on
            torch.distributed.all_reduce(tensor, group=self.group)
            return tensor.numpy()
        tensor = torch.as_tensor(array, device=self.accelerator.device)
        return self.accelerator.reduce(tensor, reduction="sum").cpu().numpy()

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order."""
        if not self.enabled:
            return [obj]
        if self.group is not None:
            out: list[Any] = [None] * self.world_size
            torch.distributed.all_gather_object(out, obj, group=self.group)
            return out
        from accelerate.utils import gather_object  # accelerate is there: self.enabled

        return gather_object([obj])

    def full_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Whole weights of this rank's own, on the model's device: a copy, or under FSDP2 gathered from every
        rank's shards (every rank must call, from the thread that owns the default group's collectives)."""
        if not self.sharded:
            return {k: v.detach().clone() for k, v in model.state_dict().items()}
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))

    def model_state(self, model: nn.Module) -> dict[str, torch.Tensor] | None:
        """The model's full state dict (gathered from FSDP shards, every rank must call); None when not sharded."""
        if not self.sharded:
            return None
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer's full state dict keyed by parameter names under FSDP (every rank must call)."""
        if not self.sharded:
            return optimizer.state_dict()
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(model, optimizer, options=options)

    def load_optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
        if not self.sharded:
            optimizer.load_state_dict(state)
            return
        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))

    def barrier(self) -> None:
        if self.enabled:
            self.accelerator.wait_for_everyone()


@contextlib.contextmanager
def _gradient_sync(root: nn.Module, sync: bool):
    root.set_requires_gradient_sync(sync)
    try:
        yield
    finally:
        root.set_requires_gradient_sync(True)
