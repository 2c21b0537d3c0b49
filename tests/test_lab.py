"""The lab's shared pieces: the study runner's shape (lab/study.py) with its registration protocol, checked in a
temporary git repository, the report's statistics (lab/reporting.py) and the one logger recorder (lab/recorder.py)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from lab.recorder import Recorder
from lab.reporting import game_success_interval, permutation_test, plot_seed_bands, seed_comparison, type_intervals
from lab.study import (
    COMMANDS,
    GamesPlayed,
    load_legacy_settings,
    load_settings,
    read_curve,
    record_start,
    registered_digests,
    registration_problems,
    run_rows,
    same_settings,
    start_run,
    study_parser,
    train_games,
    write_record,
)


def test_a_settings_file_is_known_by_its_sha256_and_refused_unless_pre_registered(tmp_path: Path, capsys) -> None:
    settings_file = tmp_path / "settings.yaml"
    settings_file.write_text("seed: 0\narms: [gagpo, grpo]\n")
    digest = hashlib.sha256(settings_file.read_bytes()).hexdigest()
    record = tmp_path / "preregistration.md"
    record.write_text(f"# A study\n\nsettings sha256: {digest}\n")
    assert load_settings(settings_file, record) == {"seed": 0, "arms": ["gagpo", "grpo"], "sha256": digest}
    settings_file.write_text("seed: 1\narms: [gagpo, grpo]\n")  # changed after it was registered
    with pytest.raises(SystemExit) as ended:
        load_settings(settings_file, record)
    assert ended.value.code == 2 and "is not the pre-registered settings file" in capsys.readouterr().err
    assert load_settings(settings_file)["seed"] == 1  # a study without a pre-registration reads any file


def test_a_pre_registration_names_one_current_digest_and_refuses_the_superseded_ones(tmp_path: Path, capsys):
    old, new = "a" * 64, "b" * 64
    text = (
        f"# Study\n\nsettings sha256: {new}\n\n## Amendment 1\nArms added.\n\n## Superseded settings\n"
        f"- settings sha256: {old} (before amendment 1)\n\n## Analysis plan\nsha256 {'c' * 64} is a file.\n"
    )
    assert registered_digests(text) == ([new], [old])  # the section ends at the next heading of its level
    settings_file = tmp_path / "settings.yaml"
    settings_file.write_text("seed: 0\n")
    digest = hashlib.sha256(settings_file.read_bytes()).hexdigest()
    record = tmp_path / "preregistration.md"
    record.write_text(f"settings sha256: {'b' * 64}\n\n## Superseded\nsettings sha256: {digest}\n")
    with pytest.raises(SystemExit):
        load_settings(settings_file, record)
    assert f"(sha256 {digest}) is superseded in" in capsys.readouterr().err
    record.write_text(f"settings sha256: {digest}\nsettings sha256: {'b' * 64}\n")  # two current: which one?
    with pytest.raises(SystemExit):
        load_settings(settings_file, record)
    assert "must name exactly one current settings digest" in capsys.readouterr().err
    legacy = tmp_path / "legacy.md"  # the format before the protocol: any listed digest passes, read-only use
    legacy.write_text(f"The settings: sha256 `{digest}`.\n\n## Amendment 1\nSettings now sha256 `{'b' * 64}`.\n")
    assert load_legacy_settings(settings_file, legacy)["sha256"] == digest
    with pytest.raises(SystemExit):
        load_settings(settings_file, legacy)
    assert "it names 0" in capsys.readouterr().err


# ----- the protocol, in a temporary git repository ---------------------------------------------------------------
def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), "-c", "user.name=lab", "-c", "user.email=lab@example.invalid",
                           *args], capture_output=True, text=True, check=True)  # fmt: skip
    return done.stdout.strip()


@pytest.fixture
def study(tmp_path: Path) -> SimpleNamespace:
    """A repository with code, a settings file and a pre-registration naming it, nothing committed yet."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "code.py").write_text("x = 1\n")
    (repo / ".gitignore").write_text(".cache/\n")
    settings_file = repo / "settings.yaml"
    settings_file.write_text("seed: 0\n")
    digest = hashlib.sha256(settings_file.read_bytes()).hexdigest()
    prereg = repo / "preregistration.md"
    prereg.write_text(f"# Pre-registration\n\nsettings sha256: {digest}\n\nHeadline rule: written here.\n")
    return SimpleNamespace(repo=repo, settings=load_settings(settings_file, prereg), prereg=prereg, digest=digest)


def refused(study: SimpleNamespace, capsys, **kwargs) -> str:
    with pytest.raises(SystemExit) as ended:
        start_run(study.settings, study.prereg, root=study.repo, **kwargs)
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1  # one clear line
    return err


def test_a_run_is_refused_until_the_pre_registration_is_committed_unchanged(study: SimpleNamespace, capsys):
    git(study.repo, "add", "code.py", ".gitignore", "settings.yaml")
    git(study.repo, "commit", "-q", "-m", "code")
    assert "preregistration.md is not committed" in refused(study, capsys)  # untracked: not registered
    git(study.repo, "add", "preregistration.md")
    assert "preregistration.md is not committed" in refused(study, capsys)  # staged is not committed
    git(study.repo, "commit", "-q", "-m", "pre-register")
    study.prereg.write_text(study.prereg.read_text() + "An edit after the commit.\n")
    assert "preregistration.md is modified since committed" in refused(study, capsys)


def test_a_run_is_refused_on_a_superseded_digest(study: SimpleNamespace, capsys):
    old = study.digest
    (study.repo / "settings.yaml").write_text("seed: 1\n")
    new = hashlib.sha256(b"seed: 1\n").hexdigest()
    study.prereg.write_text(f"settings sha256: {new}\n\n## Superseded\n- settings sha256: {old}\n")
    git(study.repo, "add", ".")
    git(study.repo, "commit", "-q", "-m", "amend the settings")
    assert f"(sha256 {old}) is superseded" in refused(study, capsys)  # the run still holds the old settings


def test_a_run_is_refused_on_a_dirty_tree_and_recorded_on_a_clean_one(study: SimpleNamespace, capsys, tmp_path):
    git(study.repo, "add", ".")
    git(study.repo, "commit", "-q", "-m", "code and pre-registration")
    prereg_commit = git(study.repo, "log", "-1", "--format=%H")
    (study.repo / "code.py").write_text("x = 2\n")
    assert "uncommitted changes to tracked files" in refused(study, capsys)
    dev = start_run(study.settings, study.prereg, allow_dirty=True, root=study.repo)  # a development run
    assert dev["allow_dirty"] and not dev["clean"]
    assert registration_problems([dev]) == ["a development run (--allow-dirty)",
                                            "started on a tree with uncommitted changes"]  # fmt: skip

    git(study.repo, "commit", "-q", "-am", "x = 2")
    head = git(study.repo, "rev-parse", "HEAD")
    (study.repo / ".cache").mkdir()
    (study.repo / ".cache" / "blob").write_text("ignored")  # untracked, ignored files are no code: fine
    (study.repo / "notes.txt").write_text("untracked")
    registration = start_run(study.settings, study.prereg, stage="train", root=study.repo)
    run = tmp_path / "runs" / "gagpo-seed0"
    record_start(run, registration, fresh=True)
    record = write_record(run / "run.json", study.settings, registration, arm="gagpo", seed=0)
    assert json.loads((run / "run.json").read_text()) == record
    assert record["commit"] == head and record["clean"] is True and record["allow_dirty"] is False
    assert record["preregistration"] == "preregistration.md" and record["preregistration_commit"] == prereg_commit
    committed = git(study.repo, "log", "-1", "--format=%cI", prereg_commit)
    assert record["preregistration_committed"] == committed
    assert datetime.fromisoformat(committed) <= datetime.fromisoformat(record["started"])
    assert record["settings_sha256"] == study.digest and record["starts"] == [registration]
    assert registration_problems(record["starts"]) == []
    assert run_rows({"gagpo-seed0": run})[0]["registered"] == "yes"

    # a second process (the evaluation) on other code: still recorded, and the run is no longer one run
    record_start(run, {**registration, "stage": "evaluate", "commit": "f" * 40})
    assert run_rows({"gagpo-seed0": run})[0]["processes"] == 2
    assert "its processes ran different commits" in run_rows({"gagpo-seed0": run})[0]["registered"]
    early = {**registration, "started": "2000-01-01T00:00:00+00:00"}
    assert registration_problems([early]) == ["started before the pre-registration was committed"]
    assert registration_problems([{"commit": head, "clean": True, "started": registration["started"]}]) == [
        "no pre-registration recorded (made before the protocol, or by a study without one)"
    ]


def test_the_train_games_a_run_played_come_from_its_own_record(tmp_path: Path):
    """Episodes' task ids are kept by iteration as they end; a replayed iteration replaces its entry."""
    callback = GamesPlayed(tmp_path / "games.json")
    callback.model = SimpleNamespace(iteration=0, num_timesteps=0)

    def step(ids: list[str | None], dones: list[bool]) -> None:
        infos = {"task_id": np.array(ids, dtype=object), "_task_id": np.array([i is not None for i in ids])}
        callback.locals = {"infos": infos, "dones": np.array(dones)}
        callback.on_step()

    for iteration, games in ((0, ("a", "b")), (1, ("b", "c")), (1, ("b", "c"))):  # iteration 1 played twice
        callback.model.iteration = iteration
        callback.on_rollout_start()
        step([games[0], games[0], games[1]], [True, False, False])
        step([None, games[0], games[1]], [False, True, True])
        callback.on_rollout_end()
    games = GamesPlayed(tmp_path / "games.json").games  # what a resumed run reloads
    assert games == {"0": ["a", "a", "b"], "1": ["b", "b", "c"]}
    assert train_games(games) == {"a": 2, "b": 3, "c": 1}
    row = run_rows({"run": tmp_path})[0]
    assert row["distinct train games"] == 3 and row["train episodes"] == 6
    assert row["registered"] == "no: no registration recorded"


# ----- the report's statistics ------------------------------------------------------------------------------------
def test_the_exact_permutation_test_by_hand():
    # pooled {0, 1, 2, 3, 4, 5}: 20 ways to pick 3; only {3, 4, 5} (+3) and {0, 1, 2} (-3) are as far from 0
    assert permutation_test([3, 4, 5], [0, 1, 2]) == (pytest.approx(3.0), pytest.approx(2 / 20))
    # pooled {1, 2, 3, 4}, 6 splits; differences -2, -1, 0, 0, 1, 2: two reach |2|
    assert permutation_test([1, 2], [3, 4]) == (pytest.approx(-2.0), pytest.approx(2 / 6))
    # [1, 2, 3] vs [2, 3, 4]: a side summing to S gives d = (2S - 15) / 3, so |d| >= 1 when S <= 6 or S >= 9;
    # S <= 6: {1, 2, 2} (1 way) and {1, 2, 3} (2 x 2 ways), and as many complements with S >= 9: 10 of 20
    assert permutation_test([1, 2, 3], [2, 3, 4]) == (pytest.approx(-1.0), pytest.approx(10 / 20))
    assert permutation_test([1, 1], [1, 1])[1] == 1.0  # no difference: every split is as extreme
    with pytest.raises(ValueError):
        permutation_test([], [1.0])
    got = seed_comparison([59.3, 61.4, 64.3], [54.3, 56.4, 59.3], level=0.9)
    assert got["difference"] == pytest.approx(5.0) and got["df"] == pytest.approx(4.0)
    assert got["p"] == pytest.approx(4 / 20)  # d = 5; the splits as far: {a}, {b} and the two swapping 59.3s
    assert got["low"] < 5 < got["high"]


def test_per_type_intervals_count_each_game_once():
    seed0 = [{"task_id": "g1", "task_type": "pick", "won": True}, {"task_id": "g2", "task_type": "pick", "won": False},
             {"task_id": "g3", "task_type": "clean", "won": True}]  # fmt: skip
    seed1 = [{**e, "won": e["task_id"] != "g3"} for e in seed0]
    got = type_intervals([seed0, seed1], ("Pick", "Clean", "Heat", "All"))
    assert set(got) == {"Pick", "Clean", "All"}  # a type with no game has no interval
    # g1 won twice (1), g2 once of two (0.5): Pick 0.75 over 2 games, not 3 wins of 4 trials
    assert got["Pick"][0] == pytest.approx(0.75) and got["Pick"][3] == 2
    assert got["Pick"][1:3] == pytest.approx(game_success_interval([[1, 1], [0, 1]])[1:])
    assert got["Clean"][:3] == pytest.approx(game_success_interval([[1, 0]]))
    assert got["All"][0] == pytest.approx(2 / 3) and got["All"][3] == 3


def test_curves_are_drawn_as_each_arms_mean_and_seed_band(tmp_path: Path):
    def curve(shift: float) -> list[dict[str, float]]:
        return [{"step": 100 * k, "rollout/success_rate": min(1.0, 0.1 * k + shift)} for k in range(1, 8)]

    path = tmp_path / "curves.png"
    plot_seed_bands({"gagpo": [curve(0), curve(0.1)], "grpo": [curve(0.05)]}, path, reference="gagpo", bar=0.6)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_record_names_the_settings_and_the_commit_and_refuses_other_settings(tmp_path: Path, capsys) -> None:
    settings = {"seed": 0, "sha256": "a" * 64}
    record = write_record(tmp_path / "run.json", settings, steps=12)
    assert json.loads((tmp_path / "run.json").read_text()) == record
    assert record["steps"] == 12 and record["settings_sha256"] == "a" * 64 and record["commit"]
    assert isinstance(record["clean"], bool)
    assert same_settings(tmp_path / "run.json", settings) and not same_settings(tmp_path / "none.json", settings)
    with pytest.raises(SystemExit):
        same_settings(tmp_path / "run.json", {**settings, "sha256": "b" * 64})
    assert "was made with settings sha256 " + "a" * 64 in capsys.readouterr().err


def test_every_study_has_the_same_subcommands() -> None:
    parser, commands = study_parser("a study", {"train": "one run"})
    assert list(commands) == list(COMMANDS) == ["status", "train", "evaluate", "all", "report"]
    assert parser.parse_args(["report"]).command == "report"
    assert "one run" in parser.format_help()


def test_the_recorder_keeps_each_dump_as_a_row_and_appends_its_curve(tmp_path: Path) -> None:
    curve = tmp_path / "curve.jsonl"
    recorder = Recorder(curve, keep=lambda key: not key.startswith("time/"), step_key="steps")
    recorder.write({"rollout/success_rate": np.float32(0.5), "time/update_s": 3.0, "note": "text", "n": 2}, {}, 64)
    recorder.write({"rollout/success_rate": 0.75}, {}, 128)
    assert recorder.rows == [{"steps": 64, "rollout/success_rate": 0.5, "n": 2.0},
                             {"steps": 128, "rollout/success_rate": 0.75}]  # fmt: skip
    assert read_curve(curve) == recorder.rows and read_curve(tmp_path / "none.jsonl") == []


def test_games_played_reads_the_games_of_a_real_rollout(tmp_path: Path):
    """On the agent's own loop: each group's game once per episode (2 groups x 2 episodes), keyed by iteration."""
    from agents import GAGPOAgent

    maze = {"width": 3, "height": 3, "rooms": 0, "loops": 1, "min_path": 2, "max_path": 3, "max_episode_steps": 10}
    agent = GAGPOAgent("gagpo_gym/Maze-v0", env_kwargs=maze, verbose=0, num_groups=2, group_size=2,
                       tiny_hidden_size=32, history_length=0, torch_threads=1, seed=0)  # fmt: skip
    agent.learn(1, callback=GamesPlayed(tmp_path / "games.json"))
    games = json.loads((tmp_path / "games.json").read_text())
    assert list(games) == ["0"] and sorted(train_games(games).values()) == [2, 2]
