"""The pure parts of benchmarks/bench_core_contention.py: the pinned command and the summary."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import bench_core_contention as cc
from benchmarks import common


def test_the_pair_runs_the_time_to_quality_1_rank_command_on_its_own_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "ns_train_executable", lambda: "ns-train")
    cmd = cc.pinned_command("pair_core1", 1, 300, Path("/o"), Path("/d"), 42)
    assert cmd[:4] == ["taskset", "-c", "1", "ns-train"]
    assert cmd[cmd.index("--max-num-iterations") + 1] == "300"
    assert cmd[cmd.index("--timestamp") + 1] == "pair_core1"
    assert cmd[cmd.index("--downscale-factor") + 1] == str(cc.ttq.SIZES["full"].downscale)


def test_summary_averages_the_pair_and_halves_the_median_ratio() -> None:
    summary = cc.summarise(
        [
            {"solo": 0.40, "pair_core0": 0.42, "pair_core1": 0.44},  # 1.075
            {"solo": 0.50, "pair_core0": 0.55, "pair_core1": 0.55},  # 1.10
            {"solo": 0.45, "pair_core0": 0.45, "pair_core1": 0.45},  # 1.0
        ]
    )
    assert summary["pair_over_solo"] == pytest.approx([1.075, 1.10, 1.0])
    assert summary["pair_over_solo_median"] == pytest.approx(1.075)
    assert summary["w2_floor_time_per_image"] == pytest.approx(0.5375)
