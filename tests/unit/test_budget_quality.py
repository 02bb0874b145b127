"""benchmarks/bench_budget_quality.py's pure parts: the budget that caps one process at N1, and
the per-seed verdicts."""

from __future__ import annotations

import pytest

from benchmarks.bench_budget_quality import GIB, budget_gib, one_process_bytes_per_gaussian, verdicts
from distsplat_ns.gaussians.budget_caps import caps_from_budget


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("n1", [1, 6600, 12345, 1_000_000])
def test_the_budget_caps_one_process_at_exactly_n1(n1: int, batch_size: int) -> None:
    per = one_process_bytes_per_gaussian(batch_size)
    budget = int(float(budget_gib(n1, batch_size)) * GIB)
    assert caps_from_budget(budget, 0, per, world_size=1, sharded=False, headroom=1.1).total == n1


def test_verdicts_compare_each_seeds_pair() -> None:
    rows = [
        {"seed": 1, "world_size": 1, "final_gaussians": 100, "psnr": 20.0},
        {"seed": 1, "world_size": 4, "final_gaussians": 300, "psnr": 20.5},
        {"seed": 2, "world_size": 4, "final_gaussians": 299, "psnr": 19.0},
        {"seed": 2, "world_size": 1, "final_gaussians": 100, "psnr": 19.5},
    ]
    got = verdicts(rows, 100, 4)
    assert got["1"]["grew_to_3x_n1"] and got["1"]["higher_psnr"] and got["1"]["psnr_gain_db"] == pytest.approx(0.5)
    assert (
        not got["2"]["grew_to_3x_n1"] and not got["2"]["higher_psnr"] and got["2"]["ratio_to_n1"] == pytest.approx(2.99)
    )
