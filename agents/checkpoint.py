"""A saved agent on disk: a folder (or a ``.zip`` of it) with a SHA-256 manifest, written all-or-nothing.

The folder: ``model/`` (weights in safetensors, fp32 master weights, and the tokenizer), ``value_head.safetensors``
(PPO), ``reference.safetensors`` (a tiny or prior agent's KL reference), ``prompt_template.txt`` (a template
read from a file), ``optimizer.pt`` (tensors and plain containers only: loaded with ``weights_only=True``),
``rng.safetensors``, ``behaviour.safetensors`` (an ``overlap`` run's older weights, which its next rollouts act
with), ``agent.json`` (config, env, counters, the source record) and ``manifest.json``. :func:`write_agent` and
:func:`restore_state` are what :meth:`agents.gagpo.GAGPOAgent.save` and ``load`` call.

``optimizer.pt`` is what resuming needs and playing does not: a copy kept to play (the committed agents of
``results/agents/``) leaves it out of the folder and of its manifest, and loads and plays as the full checkpoint
does; training it refuses with one error (:func:`restore_state`). A file the manifest does not list is never read.

A save goes to a fresh folder beside the target and takes the target's name only once every file and the manifest
are written, so an interrupted save leaves the previous checkpoint whole, and no file of an earlier save survives
into the new one. Loading checks every file against the manifest first and names the first one that is missing,
altered or unreadable; a ``.zip`` is unpacked (refusing names outside the archive) into a temporary folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import weakref
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
BEHAVIOUR_FILE = "behaviour.safetensors"  # overlap: the weights versions a resumed run still acts with
#: A prompt template read from a file, kept with the agent (its config names the file it came from).
TEMPLATE_FILE = "prompt_template.txt"
#: The optimizer state: needed to resume a run, not to play; a play-only copy's manifest does not list it.
OPTIMIZER_FILE = "optimizer.pt"
#: The format of the files a save writes, in ``agent.json``'s ``format``; a folder without one is format 1.
#: Adding a GAGPOConfig field bumps it and gives the field's value for the older formats in :data:`MIGRATIONS`.
FORMAT = 5
#: For each format, the hyperparameters its files lack and the values that play as those files were trained (the
#: behaviour before each field existed); a field missing with no migration is refused, never given today's default.
MIGRATIONS: dict[int, dict[str, Any]] = {
    1: {
        "lr_schedule": "constant",
        "revisit_penalty": 0.0,
        "greedy_members": 0,
        "expert_members": 0,
        "expert": "oracle",
        "hgpo_alpha": 1.0,
        "hgpo_base_group": False,
        "hgpo_history": -1,
        "hgpo_std_norm": True,
        "graphgpo_episode_coef": 1.0,
        "graphgpo_gamma": 0.1,
        "graphgpo_progress": False,
        "graphgpo_std_norm": True,
        "g2po_std_norm": True,
    },
    # Format 3 added the overlapped update (docs/overlap.md): an older agent trained sequentially.
    2: {"overlap": False, "max_staleness": 1},
    # Format 4 added the advantage rescaling (docs/algorithm.md): an older agent trained on the estimator's scale.
    3: {"advantage_scale": "estimator"},
    # Format 5 added the pipelined rollout (docs/overlap.md): an older agent stepped every sub-env at once.
    4: {"pipeline": False},
}
#: The keys every ``agent.json`` holds, whatever its format.
REQUIRED_KEYS = ("config", "model_source", "env_id", "env_kwargs", "num_timesteps", "iteration", "numpy_rng")


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


@contextlib.contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``folder`` for the block: saves into one folder, from any process, take turns.

    The lock goes with its holder: a save that was killed holds nothing, so the next one may clear what it left.
    """
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def save_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """``write(folder)`` into a fresh folder, add the manifest, then give it ``path``'s name (a ``.zip``: the folder
    zipped). Until that last step the previous checkpoint at ``path`` is untouched. Saves into the same folder
    take turns (:func:`folder_lock`), so a concurrent one never sees another's work in progress as left over."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with folder_lock(path.parent):
        for stale in path.parent.glob(f".{path.name}.saving-*"):  # left by a save that was killed
            shutil.rmtree(stale, ignore_errors=True)
        try:
            write_beside(path, write)
        except Exception as err:
            reason = write_failure(err)
            if reason is None:
                raise
            raise OSError(f"cannot save to {path}: {reason}; what was there is untouched") from err


def write_failure(err: BaseException) -> str | None:
    """What a failed write says in words (a full disk, a read-only folder...); None for an error that is not one.

    torch.save reports a full disk as ``[enforce fail at inline_container.cc:...] ... file write failed`` and
    safetensors as ``IoError(Os { code: 28, ... })``: both become the OS's own words.
    """
    if isinstance(err, OSError) and err.errno is not None:
        return os.strerror(err.errno).lower()
    text = str(err)
    code = re.search(r"code: (\d+)", text)
    if code and ("IoError" in text or "Os {" in text):
        return os.strerror(int(code.group(1))).lower()
    if "PytorchStreamWriter" in text or "file write failed" in text:
        return "a file write failed (is the disk full?)"
    return None


def write_beside(path: Path, write: Callable[[Path], None]) -> None:
    """The body of :func:`save_atomically`, under its lock."""
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
    if play_only_reason(agent) is None:  # a play-only agent has no run's state to save: its copies stay play-only
        torch.save(optimizer_state, folder / OPTIMIZER_FILE)
    boundary = agent.boundary
    save_file({"torch": boundary["torch_rng"]}, folder / "rng.safetensors")
    # overlap: the older weights the next rollouts act with (docs/overlap.md), so a resumed run plays them again.
    behaviour = agent.behaviour_versions() if hasattr(agent, "behaviour_versions") else {}
    if behaviour:
        tensors = {f"{v}/{k}": t.contiguous() for v, state in behaviour.items() for k, t in state.items()}
        save_file(tensors, folder / BEHAVIOUR_FILE)
    meta = {
        "format": FORMAT,
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
    """A saved agent's ``agent.json``, after every file was checked against the manifest and its format against
    this version's (:func:`check_format`)."""
    verify(folder)
    meta = json.loads((folder / AGENT_FILE).read_text())
    check_format(meta, folder)
    return meta


def read_saved(path: str | os.PathLike) -> tuple[dict[str, Any], str]:
    """What the scripts read of a saved agent at ``path``, a folder or a ``.zip`` (SB3's CheckpointCallback names
    them so) before loading it: its ``agent.json`` (:func:`read_agent`: every file checked first) and its manifest's
    SHA-256, which names the agent byte for byte wherever it is copied. Errors as :func:`read_agent`'s."""
    with opened(Path(path)) as folder:
        meta = read_agent(folder)
        return meta, sha256_file(folder / MANIFEST_FILE)


def check_format(meta: Any, where: Path | str) -> int:
    """The format of ``agent.json``'s contents ``meta``: one this version reads, or one ValueError saying why not."""
    version = meta.get("format", 1) if isinstance(meta, dict) else None
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"saved agent at {where}: {AGENT_FILE} has no readable format ({version!r})")
    if version > FORMAT:
        raise ValueError(
            f"saved agent at {where} was saved by a newer gagpo-gym (format {version} > {FORMAT}): upgrade gagpo-gym "
            "to load it"
        )
    missing = [key for key in REQUIRED_KEYS if key not in meta]
    if missing:
        raise ValueError(f"saved agent at {where}: {AGENT_FILE} (format {version}) lacks {missing}: it is damaged")
    return version


def saved_config(meta: dict[str, Any], where: Path | str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The saved hyperparameters migrated to this version's (:data:`MIGRATIONS`), with ``overrides`` on top.

    A field the saved format lacks and no migration gives is refused (one ValueError naming it), unless
    ``overrides`` gives it: an older file never silently takes today's default.
    """
    from agents.config import GAGPOConfig

    version = check_format(meta, where)
    values = dict(meta["config"])
    for older in range(version, FORMAT):
        for key, value in MIGRATIONS.get(older, {}).items():
            values.setdefault(key, value)
    values |= overrides
    missing = sorted({f.name for f in dataclasses.fields(GAGPOConfig)} - set(values))
    if missing:
        raise ValueError(
            f"saved agent at {where} (format {version}) lacks the hyperparameters {missing} and this gagpo-gym has no "
            "migration for them: give each when loading (GAGPOAgent.load(path, name=value); train.py: its flag)"
        )
    return values


def lists_optimizer(folder: Path) -> bool:
    """Whether the saved agent's manifest lists its optimizer state (after :func:`verify`: then the file is there)."""
    return OPTIMIZER_FILE in json.loads((folder / MANIFEST_FILE).read_text())


def drop_optimizer_state(folder: Path) -> bool:
    """Make a saved agent folder a play-only copy: its optimizer state leaves the folder and the manifest (every
    other file checked first, the others' digests unchanged). False when it had none. What ``results/agents/``
    commits: the optimizer state is the largest file of a small agent and only resuming its run reads it."""
    verify(folder)
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    if manifest.pop(OPTIMIZER_FILE, None) is None:
        return False
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))
    (folder / OPTIMIZER_FILE).unlink()
    return True


#: The agents loaded from a copy without optimizer state after training had begun, each with the one line that
#: refuses to train it (weak keys: an agent's entry goes with it).
PLAY_ONLY: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def play_only_reason(agent: Any) -> str | None:
    """Why ``agent`` cannot train (it was loaded without the optimizer state of its run), or None when it can."""
    return PLAY_ONLY.get(agent)


def refuse_training(agent: Any, folder: Path, meta: dict[str, Any]) -> None:
    """Mark ``agent`` play-only: its first optimizer step raises one RuntimeError saying why and what to do.

    A fresh AdamW would silently restart the run's moment estimates and step counts: a resumed run that is not the
    run it continues. Playing, evaluating and saving (a copy that stays play-only) are unaffected."""
    reason = (
        f"saved agent at {folder} carries no optimizer state ({OPTIMIZER_FILE} is not in its {MANIFEST_FILE}: a copy "
        f"kept for playing, after {meta['num_timesteps']} env steps of training): it plays and evaluates, but cannot "
        "train on; resume from a checkpoint of its run that has the file, or start a new run from its weights "
        f"(GAGPOAgent(env, model='{folder / 'model'}'))"
    )
    PLAY_ONLY[agent] = reason
    optimizer = agent.optimizer
    inner = optimizer if isinstance(optimizer, torch.optim.Optimizer) else getattr(optimizer, "optimizer", optimizer)

    def refuse(*_: Any) -> None:
        raise RuntimeError(reason)

    inner.register_step_pre_hook(refuse)


def restore_state(agent: Any, folder: Path, meta: dict[str, Any]) -> None:
    """What an agent built from a saved folder still lacks: value head, optimizer state, counters, RNG states.

    Without an optimizer state in the manifest, an agent saved before any update starts with the fresh optimizer,
    which is its state; one saved after training plays, and refuses to train (:func:`refuse_training`)."""
    if agent.policy.value_head is not None:
        agent.policy.value_head.load_state_dict(load_file(folder / "value_head.safetensors"))
    if lists_optimizer(folder):
        saved_format = meta.get("optimizer_format", "indices")
        if saved_format != optimizer_format(agent.dist.sharded):
            raise ValueError(
                f"saved agent at {folder} has an optimizer state saved "
                f"{'with' if saved_format == 'names' else 'without'} FSDP: resume it with the same fsdp setting (or "
                "start a fresh optimizer with a new agent)"
            )
        optimizer_state = torch.load(folder / OPTIMIZER_FILE, weights_only=True)
        agent.dist.load_optimizer_state(agent.policy.core, agent.optimizer, optimizer_state)
    elif meta["iteration"] > 0:
        refuse_training(agent, folder, meta)
    agent.num_timesteps, agent.iteration = meta["num_timesteps"], meta["iteration"]
    agent.rng.bit_generator.state = meta["numpy_rng"]
    torch.set_rng_state(load_file(folder / "rng.safetensors")["torch"])
    agent.mark_boundary()
    if (folder / BEHAVIOUR_FILE).is_file() and getattr(agent, "pipeline", None) is not None:
        states: dict[int, dict[str, torch.Tensor]] = {}
        for name, tensor in load_file(folder / BEHAVIOUR_FILE).items():
            version, key = name.split("/", 1)
            states.setdefault(int(version), {})[key] = tensor
        agent.pipeline.versions.states.update(states)
