"""The capacity benchmark's pure parts (``benchmarks/bench_capacity.py``): the marginal bytes per
Gaussian, the ratio to W = 1 and the verdict against the target T / W (1.5 for RSS, 1.2 for device
bytes), and the device slope split by creating place."""

from __future__ import annotations

import pytest

from benchmarks.bench_capacity import (
    analyse,
    capacity_table,
    kept_sites,
    largest_rank,
    marginal_bytes_per_gaussian,
    phase_slopes,
    site_slopes,
    target_ratio,
)

MIB = 2**20


def test_target_ratio_is_one_and_a_half_over_w() -> None:
    assert [target_ratio(w) for w in (1, 2, 4, 8)] == [1.5, 0.75, 0.375, 0.1875]
    with pytest.raises(ValueError, match="world size"):
        target_ratio(0)


def test_target_ratio_of_the_device_bytes_is_one_point_two_over_w() -> None:
    assert [target_ratio(w, 1.2) for w in (1, 2, 4, 8)] == [1.2, 0.6, 0.3, 0.15]


def test_table_verdict_follows_the_numerator() -> None:
    # W = 2 at 0.7 of W = 1: within 1.5 / 2, past 1.2 / 2.
    peaks = {(1, 0): [0], (1, 100): [1000], (2, 0): [0, 0], (2, 100): [700, 10]}
    assert capacity_table(peaks, 0, 100)[1]["reached"] is True
    two = capacity_table(peaks, 0, 100, 1.2)[1]
    assert two["reached"] is False and two["target_ratio"] == 0.6


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


def test_site_slopes_split_the_slope_by_place_and_sum_to_it() -> None:
    # The draw's place grows 76 B per Gaussian, the parameters' 30, the image's not at all; one place
    # appears only at N_b, one only at N_a (a temporary alive at one peak, not the other).
    a = {"initial.py:1": [76_000, 2], "rows.py:9": [30_000, 6], "eval.py:3": [500, 1], "gone.py:4": [1_000, 1]}
    b = {"initial.py:1": [152_000, 2], "rows.py:9": [60_000, 6], "eval.py:3": [500, 1], "new.py:5": [3_000, 1]}
    split = site_slopes(a, b, 1_000, 2_000)
    assert split == [
        ("initial.py:1", 76.0),
        ("rows.py:9", 30.0),
        ("new.py:5", 3.0),
        ("eval.py:3", 0.0),
        ("gone.py:4", -1.0),
    ]
    total = marginal_bytes_per_gaussian(sum(v[0] for v in a.values()), sum(v[0] for v in b.values()), 1_000, 2_000)
    assert sum(v for _, v in split) == total


def test_largest_rank_is_the_first_of_the_largest() -> None:
    assert largest_rank([5, 9, 9, 1]) == 1
    assert largest_rank([7]) == 0


def test_kept_sites_keep_the_largest_and_sum_the_rest() -> None:
    sites = {"a": [10, 1], "b": [30, 2], "c": [20, 1], "d": [5, 4]}
    assert kept_sites(sites, 2) == {"b": [30, 2], "c": [20, 1], "other": [15, 5]}
    assert kept_sites(sites, 4) == sites


def test_analyse_tables_device_bytes_with_the_rss_beside() -> None:
    def run(world: int, num: int, device: list[int], rss: list[int], sites: list[dict]) -> dict:
        return {
            "world_size": world,
            "num_random": num,
            "peak_device_bytes_per_rank": device,
            "peak_rss_bytes_per_rank": rss,
            "phase_device_peaks": [{"setup": d} for d in device],
            "device_peak_sites_per_rank": sites,
        }

    runs = [
        run(1, 100, [1_000], [9_000], [{"x": [1_000, 1]}]),
        run(1, 200, [2_000], [19_000], [{"x": [2_000, 1]}]),
        run(2, 100, [600, 500], [5_000, 5_000], [{"x": [600, 1]}, {"x": [500, 1]}]),
        # N_b: rank 1 is the largest; its split is taken at both sizes.
        run(2, 200, [1_000, 1_300], [9_000, 9_500], [{"x": [1_000, 1]}, {"x": [900, 1], "y": [300, 1]}]),
    ]
    out = analyse(runs, 100, 200, 1.2)
    assert [r["marginal_bytes_per_gaussian"] for r in out["table"]] == [10.0, 7.0]  # max over ranks: 600 -> 1,300
    assert [r["reached"] for r in out["table"]] == [True, False]  # 0.7 > 1.2 / 2
    assert [r["marginal_bytes_per_gaussian"] for r in out["rss_table"]] == [100.0, 45.0]
    assert out["device_phase_slopes"] == {1: {"setup": 10.0}, 2: {"setup": 7.0}}
    assert out["device_site_slopes"][2] == {"rank": 1, "slopes": [["x", 4.0], ["y", 3.0]]}
