"""A saved agent on disk: a folder (or a ``.zip`` of it) with a SHA-256 manifest, written all-or-nothing.

The folder: ``model/`` (weights in safetensors, fp32 master weights, and the tokenizer), ``value_head.safetensors``
(PPO), ``reference.safetensors`` (a tiny or prior agent's KL reference), ``prompt_template.txt`` (a template
read from a file), ``optimizer.pt`` (tensors and plain
containers only: loaded with ``weights_only=True``), ``rng.safetensors``, ``agent.json`` (config, env, counters,
the source record) and ``manifest.json``. :func:`write_agent` and :func:`restore_state` are what
:meth:`agents.gagpo.GAGPOAgent.save` and ``load`` call.

A save goes to a fresh folder beside the target and takes the target's name only once every file and the manifest
are written, so an interrupted save leaves the previous checkpoint whole, and no file of an earlier save survives
into the new one. Loading checks every file against the manifest first and names the first one that is missing,
altered or unreadable; a ``.zip`` is unpacked (refusing names outside the archive) into a temporary folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file, save_model
from transformers.utils import logging as hf_logging

from wrappers.prompt import TEMPLATES

AGENT_FILE = "agent.json"
MANIFEST_FILE = "manifest.json"
#: The KL reference's weights inside a saved tiny or prior agent (a pretrained one records its source instead).
REFERENCE_FILE = "reference.safetensors"
#: A prompt template read from a file, kept with the agent (its config names the file it came from).
TEMPLATE_FILE = "prompt_template.txt"


@contextlib.contextmanager
def quiet_hub() -> Iterator[None]:
    """No Hugging Face progress bars while a model is saved or loaded (the scripts print their own progress)."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path) -> None:
    """Every file's SHA-256 (the manifest itself aside), written last."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST_FILE)
    manifest = {str(p.relative_to(folder)): sha256_file(p) for p in files}
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))


def verify(path: Path) -> None:
    """Raise one clear error naming the first missing, altered or unreadable file of a saved agent."""
    if not (path / AGENT_FILE).is_file():
        raise FileNotFoundError(f"no saved agent at {path} (missing {AGENT_FILE})")
    if not (path / MANIFEST_FILE).is_file():
        raise FileNotFoundError(f"saved agent at {path} has no {MANIFEST_FILE}: cannot check its files")
    try:
        manifest = json.loads((path / MANIFEST_FILE).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"saved agent at {path}: {MANIFEST_FILE} is damaged or truncated ({err})") from None
    if not isinstance(manifest, dict) or AGENT_FILE not in manifest:
        raise ValueError(f"saved agent at {path}: {MANIFEST_FILE} does not list {AGENT_FILE}: cannot check it")
    for name, digest in manifest.items():
        file = path / name
        if not file.is_file():
            raise FileNotFoundError(f"saved agent at {path} is missing {name}")
        if sha256_file(file) != digest:
            raise ValueError(f"saved agent at {path}: {name} was altered (checksum mismatch)")


def save_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """``write(folder)`` into a fresh folder, add the manifest, then give it ``path``'s name (a ``.zip``: the folder
    zipped). Until that last step the previous checkpoint at ``path`` is untouched."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.saving-*"):  # left by a save that was killed
        shutil.rmtree(stale, ignore_errors=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.saving-") as tmp:
        folder = Path(tmp) / "agent"
        folder.mkdir()
        write(folder)
        write_manifest(folder)
        if path.suffix == ".zip":
            archive_path = Path(tmp) / "agent.zip"
            with zipfile.ZipFile(archive_path, "w", zipfile.ZIP_STORED) as archive:
                for file in sorted(folder.rglob("*")):
                    if file.is_file():
                        archive.write(file, file.relative_to(folder))
            os.replace(archive_path, path)
        elif not path.exists():
            os.replace(folder, path)
        else:  # a folder cannot be replaced in one rename: move the old one aside, then drop it
            old = Path(tmp) / "previous"
            os.replace(path, old)
            os.replace(folder, path)


@contextlib.contextmanager
def opened(path: Path) -> Iterator[Path]:
    """The saved agent's folder: ``path`` itself, or a ``.zip`` unpacked for the duration of the block."""
    if path.is_dir():
        yield path
        return
    if not path.exists():
        raise FileNotFoundError(f"no saved agent at {path}")
    if not zipfile.is_zipfile(path):
        raise ValueError(f"saved agent {path} is neither a folder nor a readable zip archive (truncated or damaged?)")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            with zipfile.ZipFile(path) as archive:
                for name in archive.namelist():
                    if Path(name).is_absolute() or ".." in Path(name).parts:
                        raise ValueError(f"saved agent {path}: unsafe file name {name!r} in the archive")
                archive.extractall(tmp)
        except (zipfile.BadZipFile, EOFError, OSError) as err:
            raise ValueError(f"saved agent {path}: the zip archive is damaged or truncated ({err})") from None
        yield Path(tmp)


def optimizer_format(sharded: bool) -> str:
    """How the optimizer state names its parameters: FSDP's state dict by names, a plain one by indices."""
    return "names" if sharded else "indices"


def write_agent(folder: Path, agent: Any, core_state: dict | None, optimizer_state: dict) -> None:
    """Every file of a saved :class:`~agents.gagpo.GAGPOAgent` but the manifest, from its last iteration boundary.

    ``core_state``: the full weights gathered under FSDP (``model.*`` and ``value_head.*``), None when not sharded.
    """
    policy = agent.policy
    if core_state is None:  # not sharded: the module's own tensors
        core_state = {f"model.{k}": v for k, v in policy.model.state_dict().items()}
        if policy.value_head is not None:
            core_state |= {f"value_head.{k}": v for k, v in policy.value_head.state_dict().items()}
    part = {name: {k[len(name) + 1 :]: v for k, v in core_state.items() if k.startswith(name + ".")}
            for name in ("model", "value_head")}  # fmt: skip
    model = policy.model
    tied = {n for n, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}
    part["model"] = {k: v for k, v in part["model"].items() if k not in tied}  # FSDP gathers tied copies too
    with quiet_hub():
        model.save_pretrained(folder / "model", state_dict=part["model"])
        policy.tokenizer.save_pretrained(folder / "model")
    if policy.value_head is not None:
        save_file({k: v.contiguous() for k, v in part["value_head"].items()}, folder / "value_head.safetensors")
    if agent.reference is not None and agent.source.kind != "pretrained":
        save_model(agent.reference, str(folder / REFERENCE_FILE))
    template = agent.prompts.template
    if template is not None and template.name not in TEMPLATES:
        (folder / TEMPLATE_FILE).write_text(template.text(), encoding="utf-8")
    torch.save(optimizer_state, folder / "optimizer.pt")
    boundary = agent.boundary
    save_file({"torch": boundary["torch_rng"]}, folder / "rng.safetensors")
    meta = {
        "config": agent.config.to_dict(),
        "model_source": agent.model_source,
        "model": dataclasses.asdict(agent.source),
        "env_id": agent.env_id,
        "env_kwargs": agent.env_kwargs,
        "env_wrappers": [list(w) for w in agent.env_wrappers],
        "num_timesteps": boundary["num_timesteps"],
        "iteration": boundary["iteration"],
        "numpy_rng": boundary["numpy_rng"],
        "optimizer_format": optimizer_format(agent.dist.sharded),
    }
    (folder / AGENT_FILE).write_text(json.dumps(meta, indent=2))


def read_agent(folder: Path) -> dict[str, Any]:
    """A saved agent's ``agent.json``, after every file was checked against the manifest."""
    verify(folder)
    return json.loads((folder / AGENT_FILE).read_text())


def restore_state(agent: Any, folder: Path, meta: dict[str, Any]) -> None:
    """What an agent built from a saved folder still lacks: value head, optimizer state, counters, RNG states."""
    if agent.policy.value_head is not None:
        agent.policy.value_head.load_state_dict(load_file(folder / "value_head.safetensors"))
    saved_format = meta.get("optimizer_format", "indices")
    if saved_format != optimizer_format(agent.dist.sharded):
        raise ValueError(
            f"saved agent at {folder} has an optimizer state saved {'with' if saved_format == 'names' else 'without'}"
            " FSDP: resume it with the same fsdp setting (or start a fresh optimizer with a new agent)"
        )
    optimizer_state = torch.load(folder / "optimizer.pt", weights_only=True)
    agent.dist.load_optimizer_state(agent.policy.core, agent.optimizer, optimizer_state)
    agent.num_timesteps, agent.iteration = meta["num_timesteps"], meta["iteration"]
    agent.rng.bit_generator.state = meta["numpy_rng"]
    torch.set_rng_state(load_file(folder / "rng.safetensors")["torch"])
    agent.mark_boundary()
