"""A saved agent on disk: a folder (or a ``.zip`` of it) with a SHA-256 manifest, written all-or-nothing.

A save goes to a fresh folder beside the target and takes the target's name only once every file and the manifest
are written, so an interrupted save leaves the previous checkpoint whole, and no file of an earlier save survives
into the new one. Loading checks every file against the manifest first and names the first one that is missing,
altered or unreadable; a ``.zip`` is unpacked (refusing names outside the archive) into a temporary folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

AGENT_FILE = "agent.json"
MANIFEST_FILE = "manifest.json"


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
