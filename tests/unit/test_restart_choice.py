"""Which checkpoint a launch resumes from (distributed/restart.py:choose_checkpoint) and the attempt log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distsplat_ns.distributed.restart import (
    UNRECORDED_END,
    AttemptLog,
    checkpoint_steps,
    choose_checkpoint,
    previous_timestamp,
)
from distsplat_ns.utils.errors import UserError


def _ckpts(folder: Path, *steps: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for step in steps:
        (folder / f"step-{step:09d}.ckpt").write_bytes(b"x")
    return folder


def test_restart_resumes_the_latest_checkpoint_whatever_the_flags(tmp_path: Path) -> None:
    own = _ckpts(tmp_path / "run" / "nerfstudio_models", 20, 40)
    other = _ckpts(tmp_path / "other", 10)
    choice = choose_checkpoint(own, other, None, None, "refuse", restarts=1)
    assert choice.path == own / "step-000000040.ckpt"


def test_complete_checkpoints_only(tmp_path: Path) -> None:
    own = _ckpts(tmp_path / "m", 20)
    (own / ".step-000000040.ckpt.tmp-123").write_bytes(b"partial")
    (own / "step-000000060.ckpt").write_bytes(b"")
    assert checkpoint_steps(own) == [20]


def test_fresh_launch_into_a_run_with_checkpoints_resumes(tmp_path: Path) -> None:
    own = _ckpts(tmp_path / "run" / "nerfstudio_models", 20, 60)
    assert choose_checkpoint(own, None, None, None, "resume", restarts=0).path == own / "step-000000060.ckpt"


def test_fresh_launch_refuses_naming_the_folder_and_the_flag(tmp_path: Path) -> None:
    own = _ckpts(tmp_path / "run" / "nerfstudio_models", 20)
    with pytest.raises(
        UserError, match=r"run folder .*/run already holds checkpoints up to step 20: --existing-checkpoints resume"
    ):
        choose_checkpoint(own, None, None, None, "refuse", restarts=0)


def test_load_dir_naming_the_runs_own_folder_before_it_exists_trains_from_scratch(tmp_path: Path) -> None:
    own = tmp_path / "run" / "nerfstudio_models"
    assert choose_checkpoint(own, own, None, None, "resume", restarts=0).path is None


def test_load_dir_elsewhere_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="--load-dir .*/nope is not a directory"):
        choose_checkpoint(tmp_path / "run" / "m", tmp_path / "nope", None, None, "resume", restarts=0)


def test_an_older_explicit_checkpoint_would_overwrite_later_steps_and_is_refused(tmp_path: Path) -> None:
    own = _ckpts(tmp_path / "run" / "nerfstudio_models", 20, 60)
    with pytest.raises(UserError, match="older than step 60"):
        choose_checkpoint(own, own, 20, None, "resume", restarts=0)


def test_the_first_restart_of_a_run_resumed_from_elsewhere_loads_that_checkpoint(tmp_path: Path) -> None:
    other = _ckpts(tmp_path / "other", 10)
    choice = choose_checkpoint(tmp_path / "run" / "m", other, None, None, "resume", restarts=1)
    assert choice.path == other / "step-000000010.ckpt"


def test_attempt_log_marks_a_killed_attempt_and_finds_the_folder_by_run_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "method" / "2026-12-01_120000"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-7")
    first = AttemptLog(run, enabled=True)
    first.begin(0, 2)
    first.saved(20)  # then SIGKILLed: no end recorded
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert previous_timestamp(tmp_path / "method", "job-7") == run.name
    assert previous_timestamp(tmp_path / "method", "another-job") is None
    second = AttemptLog(run, enabled=True)
    second.begin(21, 2)
    second.end(50, "completed")
    attempts = json.loads((run / "distsplat_attempts.json").read_text())
    assert [(a["start_step"], a["end_step"], a["cause"], a["restart_count"]) for a in attempts] == [
        (0, 20, UNRECORDED_END, 0),
        (21, 50, "completed", 1),
    ]
