"""Rank 0's own work (here a full evaluation made slow by a test hook) never counts against the
other ranks' --collective-timeout-s (distributed/lifecycle.py:rank0_work)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.nsrun import REPO, read_stats, run_torchrun

pytestmark = pytest.mark.slow

TIMEOUT_S = 10
EVAL_DELAY_S = 25  # > 2 x the collective timeout


def test_an_evaluation_longer_than_the_collective_timeout_trains_on(tmp_path: Path) -> None:
    program = [str(REPO / "tests" / "helpers" / "ns_train_slow_eval.py"), str(EVAL_DELAY_S)]
    proc = run_torchrun(tmp_path, "slow", 6, 2, program=program, check=False, timeout=900,
                        extra=["--collective-timeout-s", str(TIMEOUT_S), "--steps-per-eval-all-images", "3",
                               "--steps-per-eval-image", "100000"])
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert output.count("test hook: the full evaluation sleeps") >= 2, output[-4000:]  # step 0, step 3 (and the end)
    stats = read_stats(tmp_path, "slow")
    assert [step for step, _ in stats["eval_psnr_history"]][:2] == [0, 3], stats["eval_psnr_history"]
    assert stats["steps"] == 6 and stats["attempts"][-1]["cause"] == "completed"
