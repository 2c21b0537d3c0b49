"""agents/checkpoint.py on its own: the manifest covers every file, verify() names what is missing or altered, a save
is all-or-nothing, and a ``.zip`` checkpoint cannot write outside the folder it is unpacked into (zip slip).

No agent is built here (milliseconds per test); tests/test_reliability.py and tests/test_portability.py check the
same guarantees on real saved agents.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from agents import checkpoint
from agents.checkpoint import AGENT_FILE, MANIFEST_FILE

#: What a saved agent folder holds: a weights file, the optimizer's pickle-free torch file, JSON, nested files.
FILES = {
    AGENT_FILE: '{"num_timesteps": 8}',
    "optimizer.pt": "optimizer bytes",
    "rng.safetensors": "rng bytes",
    "model/model.safetensors": "weights",
    "model/tokenizer.json": '{"vocab": {}}',
    "model/config.json": '{"hidden_size": 32}',
}


def write_files(folder: Path, files: dict[str, str] = FILES) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def saved(tmp_path: Path, name: str = "agent") -> Path:
    path = tmp_path / name
    checkpoint.save_atomically(path, write_files)
    return path


def test_the_manifest_lists_every_file_but_itself(tmp_path: Path) -> None:
    path = saved(tmp_path / "new" / "folders")  # parents are made
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    assert sorted(manifest) == sorted(FILES)  # agent.json and the non-safetensors files too
    assert all(manifest[name] == checkpoint.sha256_file(path / name) for name in FILES)
    checkpoint.verify(path)


@pytest.mark.parametrize("name", sorted(FILES))
def test_an_altered_file_of_any_kind_is_named(tmp_path: Path, name: str) -> None:
    path = saved(tmp_path)
    (path / name).write_text(FILES[name] + " ")
    with pytest.raises(ValueError, match=rf"{name} was altered \(checksum mismatch\)"):
        checkpoint.verify(path)


def test_missing_files_and_incomplete_manifests_are_named(tmp_path: Path) -> None:
    path = saved(tmp_path)
    (path / "model" / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"is missing model/tokenizer\.json"):
        checkpoint.verify(path)
    path = saved(tmp_path, "no-agent")
    (path / AGENT_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=r"no saved agent at .* \(missing agent\.json\)"):
        checkpoint.verify(path)
    path = saved(tmp_path, "unlisted")
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    del manifest[AGENT_FILE]  # an agent.json nothing vouches for: it could say anything
    (path / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"manifest\.json does not list agent\.json"):
        checkpoint.verify(path)
    (path / MANIFEST_FILE).write_text("[]")
    with pytest.raises(ValueError, match=r"does not list agent\.json"):
        checkpoint.verify(path)
    (path / MANIFEST_FILE).write_text('{"agent.json": ')
    with pytest.raises(ValueError, match=r"manifest\.json is damaged or truncated"):
        checkpoint.verify(path)
    (path / MANIFEST_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=r"has no manifest\.json"):
        checkpoint.verify(path)


def test_a_save_replaces_the_folder_whole_and_leaves_nothing_beside_it(tmp_path: Path) -> None:
    path = saved(tmp_path)
    (tmp_path / f".{path.name}.saving-killed").mkdir()  # left by a save that was killed

    def write(folder: Path) -> None:
        # Written beside the target (same file system: the final rename is atomic), under a name a later save
        # recognises as a leftover.
        assert folder.parent.parent == tmp_path and folder.parent.name.startswith(f".{path.name}.saving-")
        write_files(folder, {AGENT_FILE: "{}", "other.txt": "x"})

    checkpoint.save_atomically(path, write)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent"]
    assert sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()) == [
        AGENT_FILE, MANIFEST_FILE, "other.txt"
    ]  # fmt: skip
    checkpoint.verify(path)


def test_a_failing_save_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    path = saved(tmp_path)

    def fails(folder: Path) -> None:
        write_files(folder, {AGENT_FILE: '{"num_timesteps": 99}'})
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_atomically(path, fails)
    assert (path / AGENT_FILE).read_text() == FILES[AGENT_FILE] and [p.name for p in tmp_path.iterdir()] == ["agent"]
    checkpoint.verify(path)


def test_a_zip_checkpoint_round_trips(tmp_path: Path) -> None:
    path = saved(tmp_path, "agent.zip")
    assert zipfile.is_zipfile(path) and [p.name for p in tmp_path.iterdir()] == ["agent.zip"]
    with zipfile.ZipFile(path) as archive:
        assert sorted(archive.namelist()) == sorted([*FILES, MANIFEST_FILE])
    with checkpoint.opened(path) as folder:
        checkpoint.verify(folder)
        assert (folder / "model" / "config.json").read_text() == FILES["model/config.json"]
    assert not folder.exists()  # unpacked for the block only
    with checkpoint.opened(saved(tmp_path, "folder")) as same:
        assert same == tmp_path / "folder"


@pytest.mark.parametrize("evil", ["../escaped.txt", "model/../../escaped.txt", "/tmp/gagpo-escaped.txt"])
def test_a_zip_with_a_path_outside_the_archive_is_refused(tmp_path: Path, evil: str) -> None:
    """Zip slip: a crafted checkpoint naming ``../x`` or ``/x`` must not write there when it is loaded."""
    path = tmp_path / "crafted" / "agent.zip"
    path.parent.mkdir()
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in FILES.items():
            archive.writestr(name, text)
        archive.writestr(evil, "planted")
    with pytest.raises(ValueError, match=r"unsafe file name .* in the archive"), checkpoint.opened(path):
        pass
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "crafted" / "escaped.txt").exists()
    assert not Path("/tmp/gagpo-escaped.txt").exists()


def test_what_is_not_a_checkpoint_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no saved agent at"), checkpoint.opened(tmp_path / "nothing"):
        pass
    (tmp_path / "notes.zip").write_text("not a zip")
    with (
        pytest.raises(ValueError, match="neither a folder nor a readable zip"),
        checkpoint.opened(tmp_path / "notes.zip"),
    ):
        pass
