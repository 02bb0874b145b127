"""A run whose initial Gaussians alone pass ``--pipeline.memory-budget`` stops at set-up with one
line: the bytes needed, the budget and the smallest number of sharded ranks that holds them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.nsrun import run_ns_train

pytestmark = pytest.mark.slow


def test_initial_points_past_the_budget_are_refused_at_set_up(tmp_path: Path) -> None:
    # 0.0001 GiB holds a few dozen Gaussians; lund_door's point cloud has thousands.
    proc = run_ns_train(tmp_path, "budget", 5, extra=["--pipeline.memory-budget", "0.0001"], check=False, timeout=600)
    assert proc.returncode != 0
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "--pipeline.memory-budget: the" in line]
    assert len(lines) == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    line = lines[0]
    assert "initial Gaussians need" in line and "MiB per rank" in line and "budget of 104.86 KiB" in line
    assert "sharded mode holds them on" in line
    # Nothing trained: no checkpoint was written.
    assert not list(tmp_path.rglob("*.ckpt"))
