"""Sim-to-real: the fidelity measurements (MiniHouse against the real ALFWorld games) and the study
(lab/studies/sim2real.py: train, evaluate, report).

The ALFWorld parts play real games on ALFWorld's own engine from ``../shared/alfworld`` and skip only where
ALFWorld or its data is absent.
"""

from __future__ import annotations

import json
import math
import pathlib

import pytest
import torch
import yaml
from agent_helpers import script
from safetensors.torch import load_file

ROOT = pathlib.Path(__file__).resolve().parents[1]
fidelity = script("lab.research.minihouse_fidelity")

ALFWORLD_DATA = ROOT / ".." / "shared" / "alfworld" / "json_2.1.1"


def _need_alfworld() -> None:
    pytest.importorskip("alfworld")
    if not ALFWORLD_DATA.is_dir():
        pytest.skip(f"ALFWorld data not found at {ALFWORLD_DATA}")


def test_phrasing_template_hides_names_and_list_lengths():
    long = "You arrive at countertop 1. On the countertop 1, you see a apple 1, a bread 2, and a cup 3."
    short = "You arrive at drawer 12. On the drawer 12, you see a pen 1."
    assert fidelity.template(long) == fidelity.template(short) == "you arrive at <e>. on the <e>, you see <e>."
    assert fidelity.template("You close the fridge 1.") == "you close the <e>."
    assert fidelity.template("Nothing happens.") == "nothing happens."


def test_minihouse_statistics_follow_the_generator():
    rows, phrasing = fidelity.minihouse_houses(30, {})
    stats = fidelity.summary(rows, phrasing, None)
    assert stats["games"] == 30 and 7 <= stats["receptacles"] <= 50
    assert stats["shared_location_share"] == 0.0 and stats["off_receptacle"] == 0.0  # by construction
    assert 0.0 < stats["targets_behind_door"] < 0.3  # the full preset's door_weight
    assert "you close the <e>." in phrasing and stats["phrasing_templates"] > 10  # random episodes: other verbs


def test_alfworld_statistics_and_phrasing_coverage():
    _need_alfworld()
    rows, phrasing = fidelity.alfworld_games("valid_seen", 6)
    assert len(rows) == 6 and {r["type"] for r in rows} == {"pick", "look", "clean", "heat", "cool", "pick2"}
    assert all(r["receptacles"] >= 5 and r["targets"] >= 1 and r["search_width"] >= 1 for r in rows)
    house_rows, house_phrasing = fidelity.minihouse_houses(100, {})
    stats = fidelity.summary(rows, phrasing, house_phrasing)
    # MiniHouse speaks ALFWorld's language: most real walkthrough observations have a MiniHouse twin phrasing.
    assert stats["phrasing_covered"] > 0.6, stats["phrasing_missing"]
    assert not stats["unknown_goal_object"] and not stats["unknown_goal_receptacle"]


def small_settings(folder: pathlib.Path, **changes: object) -> pathlib.Path:
    """The committed settings file, made small (``changes``: sections' values replaced), written into ``folder``."""
    sim2real = script("lab.studies.sim2real")
    settings = yaml.safe_load(sim2real.SETTINGS.read_text())
    for section, values in changes.items():
        settings[section] = {**settings[section], **values} if isinstance(values, dict) else values
    path = folder / "settings.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


def test_pipeline_trains_selects_and_resumes(tmp_path):
    """The whole study, small: a warm start, one GAGPO iteration (2 episodes of one task), model selection on
    valid_seen, both splits played on the real engine, then a resume that trains and plays nothing again; the
    records name the settings' sha256 and the commit, and a resume with other settings is refused."""
    _need_alfworld()
    sim2real = script("lab.studies.sim2real")

    from agents.gagpo import GAGPOAgent

    out = tmp_path / "s2r"
    small = dict(
        prior=None, warm_start={"episodes": 3, "epochs": 1},
        gagpo={"steps": 1, "num_groups": 1, "group_size": 2, "ent_coef": 0.05},
        evaluation={"valid_seen": 1, "valid_unseen": 1, "minihouse_heldout": 2},
    )  # fmt: skip
    settings = small_settings(tmp_path, **small)
    argv = ["--settings", str(settings), "--out", str(out)]
    assert sim2real.main(["all", *argv]) == 0
    payload = json.loads((out / "sim2real.json").read_text())
    record = json.loads((out / "work" / "train.json").read_text())
    assert payload["settings_sha256"] == record["settings_sha256"] and record["commit"] and payload["commit"]
    for split in ("valid_seen", "valid_unseen"):
        rows = {row["policy"]: row for row in payload["tables"][split]}
        assert set(rows) == set(sim2real.ROWS) and all(row["Games"] == 1 for row in rows.values())
        assert rows["handcoded expert"]["All"] == 100.0 and rows["handcoded expert"]["Won steps"] <= 50
    assert payload["training"]["warm_start"]["episodes"] == 3
    heldout = {row["policy"]: row for row in payload["tables"][sim2real.MINIHOUSE_HELDOUT]}
    assert set(heldout) == {"prior", "gagpo"} and all(row["Houses"] == 2 for row in heldout.values())
    panel = json.loads((out / "eval" / sim2real.MINIHOUSE_HELDOUT / "gagpo" / "eval.json").read_text())
    assert [e["seed"] for e in panel["results"][0]["episodes"]] == [100_000, 100_001]  # never a training seed
    # GAGPO trained: one iteration, both episodes played to the end, then the update's optimiser steps (two episodes
    # of a 3-episode prior rarely win a full house, so the advantages may well be 0: the entropy bonus moves it).
    work = out / "work"
    prior_meta, gagpo_meta = (json.loads((work / name / "agent.json").read_text()) for name in ("prior_agent", "gagpo"))
    steps = payload["training"]["gagpo"]["minihouse_env_steps"]
    assert prior_meta["num_timesteps"] == 0 and gagpo_meta["num_timesteps"] == steps >= 2
    assert gagpo_meta["iteration"] == 1
    optimizer = {name: torch.load(work / name / "optimizer.pt", weights_only=True) for name in ("prior_agent", "gagpo")}
    assert not optimizer["prior_agent"]["state"]  # saved before any step
    config = gagpo_meta["config"]
    updates = config["n_epochs"] * math.ceil(steps / config["minibatch_size"])  # one optimiser step per minibatch
    assert {float(s["step"]) for s in optimizer["gagpo"]["state"].values()} == {updates}
    weights = {
        name: load_file(next((work / name / "model").glob("*.safetensors"))) for name in ("prior_agent", "gagpo")
    }
    assert weights["prior_agent"].keys() == weights["gagpo"].keys()
    assert any(not torch.equal(weights["prior_agent"][k], weights["gagpo"][k]) for k in weights["gagpo"])
    assert config["ent_coef"] == 0.05
    # Model selection: the better of the prior and the GAGPO agent on valid_seen (a tie goes to GAGPO) is <out>/agent.
    seen = {row["policy"]: row for row in payload["tables"]["valid_seen"]}
    expected = "gagpo" if seen["gagpo"]["All"] >= seen["prior"]["All"] else "prior"
    assert payload["selected"] == expected
    assert json.loads((out / "agent" / "agent.json").read_text()) == (gagpo_meta if expected == "gagpo" else prior_meta)
    assert json.loads((out / "prior_agent" / "agent.json").read_text()) == prior_meta
    agent = GAGPOAgent.load(str(out / "agent"), verbose=0, torch_threads=1)
    assert agent.env_id == sim2real.MINIHOUSE and agent.config.history_length == 4
    stamps = {p: p.stat().st_mtime_ns for p in (out / "eval").rglob("eval.json")}
    assert len(stamps) == 10
    trained = (work / "gagpo" / "agent.json").stat().st_mtime_ns
    assert sim2real.main(["all", *argv, "--resume"]) == 0  # nothing is trained or played again
    assert {p: p.stat().st_mtime_ns for p in (out / "eval").rglob("eval.json")} == stamps
    assert (work / "gagpo" / "agent.json").stat().st_mtime_ns == trained
    (tmp_path / "other").mkdir()
    other = small_settings(tmp_path / "other", **small, seed=1)
    with pytest.raises(SystemExit) as ended:
        sim2real.main(["train", "--settings", str(other), "--out", str(out), "--resume"])
    assert ended.value.code == 2 and (work / "gagpo" / "agent.json").stat().st_mtime_ns == trained


def test_a_given_prior_is_fine_tuned_as_it_is_and_a_folder_without_one_is_refused(tmp_path, capsys):
    """The settings' ``prior`` (the committed run's) is a warm-start folder reused as it is: its own record comes back
    and nothing is trained; a folder that is not a warm start ends in one readable error before any work."""
    sim2real = script("lab.studies.sim2real")

    settings = sim2real.read_settings(sim2real.SETTINGS)
    source = ROOT / settings["prior"]
    stamp = (source / "prior.json").stat().st_mtime_ns
    record = sim2real.warm_start_stage(settings, source, resume=False, torch_threads=1)
    assert record == json.loads((source / "prior.json").read_text()) and record["episodes"] == 800
    assert (source / "prior.json").stat().st_mtime_ns == stamp
    with pytest.raises(SystemExit) as ended:
        sim2real.main(["train", "--settings", str(small_settings(tmp_path, prior=str(tmp_path))),
                       "--out", str(tmp_path / "out")])  # fmt: skip
    assert ended.value.code == 2
    assert "not a warm-start folder" in capsys.readouterr().err
    assert not (tmp_path / "out" / "work" / "gagpo").exists()


def test_a_settings_file_with_a_bad_value_is_one_error(tmp_path, capsys):
    sim2real = script("lab.studies.sim2real")
    with pytest.raises(SystemExit) as ended:
        sim2real.main(["status", "--settings", str(small_settings(tmp_path, gagpo={"steps": -1}))])
    assert ended.value.code == 2 and "gagpo.steps must be an int >= 0, got -1" in capsys.readouterr().err
