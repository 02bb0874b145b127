"""The capacity benchmark's pure parts (``benchmarks/bench_capacity.py``): the marginal bytes per
Gaussian, the ratio to W = 1 and the verdict against the issue's target 1.5 / W."""

from __future__ import annotations

import pytest

from benchmarks.bench_capacity import capacity_table, marginal_bytes_per_gaussian, phase_slopes, target_ratio

MIB = 2**20


def test_target_ratio_is_one_and_a_half_over_w() -> None:
    assert [target_ratio(w) for w in (1, 2, 4, 8)] == [1.5, 0.75, 0.375, 0.1875]
    with pytest.raises(ValueError, match="world size"):
        target_ratio(0)


def test_marginal_bytes_is_the_slope_between_the_two_sizes() -> None:
    assert marginal_bytes_per_gaussian(1_000, 3_000, 10, 20) == 200.0
    assert marginal_bytes_per_gaussian(3_000, 1_000, 10, 20) == -200.0  # a falling peak is reported as such
    with pytest.raises(ValueError, match="N_a = 20, N_b = 20"):
        marginal_bytes_per_gaussian(0, 0, 20, 20)


def test_table_takes_the_largest_rank_and_divides_by_w1() -> None:
    # W = 1: 1000 B per Gaussian over 1M. W = 2: the largest rank (rank 1 at N_b) grows 700 B.
    # W = 4: rank 0 is largest at N_b, rank 2 at N_a: the largest of each run, not one rank's slope.
    peaks = {
        (1, 1_000_000): [1_500 * MIB],
        (1, 2_000_000): [1_500 * MIB + 1_000_000_000],
        (2, 1_000_000): [1_400 * MIB, 1_450 * MIB],
        (2, 2_000_000): [1_400 * MIB + 600_000_000, 1_450 * MIB + 700_000_000],
        (4, 1_000_000): [1_400 * MIB, 1_300 * MIB, 1_500 * MIB, 1_300 * MIB],
        (4, 2_000_000): [1_500 * MIB + 400_000_000, 1_300 * MIB, 1_300 * MIB, 1_300 * MIB],
    }
    rows = capacity_table(peaks, 1_000_000, 2_000_000)
    assert [r["world_size"] for r in rows] == [1, 2, 4]
    assert [r["marginal_bytes_per_gaussian"] for r in rows] == [1_000.0, 700.0, 400.0]
    assert [r["ratio_to_w1"] for r in rows] == [1.0, 0.7, 0.4]
    assert [r["reached"] for r in rows] == [True, True, False]  # 0.4 > 0.375
    assert rows[2]["largest_peak_a_bytes"] == 1_500 * MIB


def test_table_verdict_at_the_target_itself_is_reached() -> None:
    peaks = {(1, 0): [0], (1, 100): [800], (8, 0): [0] * 8, (8, 100): [150] + [0] * 7}
    (_, eight) = capacity_table(peaks, 0, 100)
    assert eight["ratio_to_w1"] == 0.1875 and eight["reached"] is True


def test_table_without_w1_or_a_second_size() -> None:
    rows = capacity_table({(2, 10): [0, 0], (2, 20): [10, 50], (4, 10): [0] * 4}, 10, 20)
    assert len(rows) == 1 and rows[0]["world_size"] == 2
    assert rows[0]["ratio_to_w1"] is None and rows[0]["reached"] is None


def test_table_refuses_a_run_whose_rank_count_is_not_its_w() -> None:
    with pytest.raises(ValueError, match="W = 2, N = 10: 1 rank peaks"):
        capacity_table({(2, 10): [5]}, 10, 20)


def test_phase_slopes_take_each_phase_over_the_ranks_that_had_it() -> None:
    # Only rank 0 consolidates: the consolidation's slope is rank 0's; the save's is the larger rank's.
    def run(num: int, rank0: dict[str, int], rank1: dict[str, int]) -> dict:
        return {"world_size": 2, "num_random": num, "phase_peaks": [rank0, rank1]}

    runs = [
        run(100, {"save": 1_000, "consolidate": 1_000}, {"save": 1_200}),
        run(200, {"save": 2_000, "consolidate": 9_000}, {"save": 4_200}),
    ]
    assert phase_slopes(runs, 100, 200) == {2: {"save": 30.0, "consolidate": 80.0}}
