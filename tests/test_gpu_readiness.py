"""What the first GPU run depends on, checked on CPU: the LoRA weights a vLLM engine gets, in bf16."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from agent_helpers import save_tiny_checkpoint

from agents.models import add_lora, load_causal_lm
from agents.vllm_backend import checkpoint_weights

pytest.importorskip("peft")

ENV = "gagpo_gym/FrozenLake-v0"


@pytest.fixture(scope="module")
def base_folder(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("base") / "model", ENV, torch_threads=1, verbose=0)


def test_lora_sync_folds_the_adapter_in_fp32_and_never_writes_the_bf16_base(base_folder: Path) -> None:
    model = add_lora(load_causal_lm(base_folder, torch.bfloat16, torch.device("cpu")), r=4, alpha=8)
    with torch.no_grad():  # a trained adapter: deltas of ~1e-4 on weights of ~0.02, below bf16's step there
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 2e-4)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    assert all(p.dtype == torch.bfloat16 for p in frozen.values())
    for _ in range(50):
        with checkpoint_weights(model) as weights:
            synced = dict(weights)
    after = dict(model.named_parameters())
    assert all(torch.equal(frozen[n], after[n]) for n in frozen)  # the base (and so the KL reference) never moves
    # Each adapted weight arrives as W + B A * scaling, exactly, in fp32; every name is the plain checkpoint's.
    plain = load_causal_lm(base_folder, torch.float32, torch.device("cpu")).state_dict()
    assert synced.keys() == plain.keys()
    folded = 0
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            key = name.removeprefix("base_model.model.") + ".weight"
            expected = module.get_base_layer().weight.float() + module.get_delta_weight("default").float()
            assert synced[key].dtype == torch.float32 and torch.equal(synced[key], expected)
            # What a bf16 engine keeps is the delta rounded once, to nearest: not lost against the stored base.
            kept = synced[key].to(torch.bfloat16).float() - module.get_base_layer().weight.float()
            assert (kept != 0).float().mean() > 0.1
            folded += 1
    assert folded > 0
