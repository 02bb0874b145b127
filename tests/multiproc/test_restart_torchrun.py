"""A torchrun restart (--max-restarts 1) resumes the run's latest checkpoint: one rank SIGKILLed after
a save, the restarted workers continue from that step to --max-num-iterations, never writing a step
at or below one already on disk, and the run summary lists both attempts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.ns_train_patched import patched_ns_train
from tests.helpers.nsrun import read_stats, run_dir, run_torchrun

pytestmark = [pytest.mark.slow, pytest.mark.long]

KILL_STEP = 8
SAVE_EVERY = 5
NUM_IMAGES = 14  # batch size 1: steps 0..13, saves at 5, 10 and the last step


def test_restart_after_a_killed_rank_resumes_from_the_last_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISTSPLAT_TEST_FAULT", "sigkill")  # rank 1 kills itself at KILL_STEP, first attempt only
    program = patched_ns_train(f"fault={KILL_STEP},1")
    # No --timestamp pinning needed by torchrun: the restart finds its folder by torchrun's run id;
    # the test pins it anyway to know where to look.
    proc = run_torchrun(
        tmp_path,
        "restart",
        NUM_IMAGES,
        2,
        program=program,
        check=False,
        timeout=900,
        torchrun_args=["--max-restarts", "1", "--standalone"],
        extra=[
            "--steps-per-save",
            str(SAVE_EVERY),
            "--save-only-latest-checkpoint",
            "False",
            "--steps-per-eval-all-images",
            "1000",
        ],
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert "fault injection: SIGKILL of this rank at step 8" in output, output[-6000:]
    assert "resuming from the run's latest checkpoint" in output and "step-000000005.ckpt" in output, output[-6000:]
    models = run_dir(tmp_path, "restart") / "nerfstudio_models"
    found = sorted(models.glob("step-*.ckpt"))
    assert [p.name for p in found] == ["step-000000005.ckpt", "step-000000010.ckpt", "step-000000013.ckpt"], found
    # Written in step order: the restart never rewrote step 5 (before the fix it wrote a new step-5 from scratch).
    by_time = sorted(found, key=lambda p: p.stat().st_mtime_ns)
    assert by_time == found, [(p.name, p.stat().st_mtime_ns) for p in found]
    attempts = read_stats(tmp_path, "restart")["attempts"]
    assert [(a["attempt"], a["restart_count"], a["start_step"], a["last_saved_step"]) for a in attempts] == [
        (0, 0, 0, 5),
        (1, 1, 6, 13),
    ], json.dumps(attempts, indent=1)
    assert attempts[0]["cause"].startswith("failed: ") and attempts[1]["cause"] == "completed", attempts
    assert attempts[1]["end_step"] == NUM_IMAGES - 1
