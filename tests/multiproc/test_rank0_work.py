"""Rank 0's own work (here a full evaluation, or a sharded run's params-only consolidation, made
slow by a test hook) never counts against the other ranks' --collective-timeout-s
(distributed/rank0_work.py:rank0_work)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.ns_train_patched import patched_ns_train
from tests.helpers.nsrun import read_stats, run_dir, run_torchrun

pytestmark = [pytest.mark.slow, pytest.mark.long]

TIMEOUT_S = 10
EVAL_DELAY_S = 25  # > 2 x the collective timeout
CONSOLIDATE_DELAY_S = 25  # > 2 x the collective timeout


def test_an_evaluation_longer_than_the_collective_timeout_trains_on(tmp_path: Path) -> None:
    program = patched_ns_train(f"slow-eval={EVAL_DELAY_S}")
    proc = run_torchrun(
        tmp_path,
        "slow",
        6,
        2,
        program=program,
        check=False,
        timeout=900,
        extra=[
            "--collective-timeout-s",
            str(TIMEOUT_S),
            "--steps-per-eval-all-images",
            "3",
            "--steps-per-eval-image",
            "100000",
        ],
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert output.count("test hook: the full evaluation sleeps") >= 2, output[-4000:]  # step 0, step 3 (and the end)
    stats = read_stats(tmp_path, "slow")
    assert [step for step, _ in stats["eval_psnr_history"]][:2] == [0, 3], stats["eval_psnr_history"]
    assert stats["steps"] == 6 and stats["attempts"][-1]["cause"] == "completed"


def test_a_consolidation_longer_than_the_collective_timeout_completes(tmp_path: Path) -> None:
    """A sharded run's last checkpoint is consolidated by rank 0 alone (a scene no single device
    holds takes long to read and write); rank 1 waits in a rank-0 window, not in a collective."""
    program = patched_ns_train(f"slow-consolidate={CONSOLIDATE_DELAY_S}")
    proc = run_torchrun(
        tmp_path,
        "slowc",
        4,
        2,
        program=program,
        check=False,
        timeout=900,
        extra=[
            "--pipeline.parallel",
            "sharded",
            "--collective-timeout-s",
            str(TIMEOUT_S),
            "--steps-per-eval-all-images",
            "100000",
            "--steps-per-eval-image",
            "100000",
        ],
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert output.count("test hook: the consolidation sleeps") == 1, output[-4000:]  # rank 0 only, once
    # The last step's gradients are freed before rank 0 reads the whole model's parameters.
    assert "test hook: 0 parameters of 1 models hold gradients at the consolidation" in output, output[-4000:]
    stats = read_stats(tmp_path, "slowc")
    assert stats["steps"] == 4 and stats["attempts"][-1]["cause"] == "completed"
    models = run_dir(tmp_path, "slowc") / "nerfstudio_models"
    assert (models / "step-000000003.ckpt").is_file() and (models / "step-000000003.dcp").is_dir(), sorted(
        models.iterdir()
    )
