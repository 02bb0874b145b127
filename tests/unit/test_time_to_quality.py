"""The pure parts of benchmarks/bench_time_to_quality.py: cumulative step times, time to a target
PSNR by linear interpolation, and the ratios to the 1-rank run."""

from __future__ import annotations

import pytest

from benchmarks import bench_time_to_quality as ttq


def test_time_to_reach_interpolates_between_the_points_around_the_first_crossing() -> None:
    # 20 dB is a quarter of the way from 19 (t = 10) to 23 (t = 30): t = 15.
    assert ttq.time_to_reach([0.0, 10.0, 30.0, 40.0], [15.0, 19.0, 23.0, 18.0], 20.0) == pytest.approx(15.0)


def test_time_to_reach_is_the_first_crossing_when_the_curve_dips_again() -> None:
    assert ttq.time_to_reach([1.0, 2.0, 3.0, 4.0], [10.0, 12.0, 11.0, 13.0], 12.0) == pytest.approx(2.0)


def test_time_to_reach_is_the_first_time_when_the_first_point_is_already_there() -> None:
    assert ttq.time_to_reach([5.0, 6.0], [21.0, 22.0], 20.0) == 5.0


def test_time_to_reach_is_none_when_never_reached() -> None:
    assert ttq.time_to_reach([1.0, 2.0], [10.0, 11.0], 11.5) is None


@pytest.mark.parametrize(
    "times, values", [([1.0, 2.0], [10.0]), ([2.0, 1.0], [10.0, 11.0]), ([1.0, 1.0], [10.0, 11.0])]
)
def test_time_to_reach_rejects_mismatched_or_non_increasing_times(times: list, values: list) -> None:
    with pytest.raises(ValueError):
        ttq.time_to_reach(times, values, 10.5)


def test_cumulative_step_times_sum_every_step_through_each_point() -> None:
    durations = {0: 1.0, 1: 0.5, 2: 0.25, 3: 2.0}
    assert ttq.cumulative_step_times(durations, [3, 1]) == pytest.approx([3.75, 1.5])


def test_cumulative_step_times_reject_a_missing_step() -> None:
    with pytest.raises(ValueError, match="lacks 1 steps"):
        ttq.cumulative_step_times({0: 1.0, 2: 1.0}, [2])


def test_ratios_divide_the_time_to_the_reference_final_psnr_by_the_reference_time() -> None:
    curves = {
        "w1_b1": {"wall_s": [10.0, 20.0, 40.0], "psnr": [15.0, 18.0, 20.0]},
        "w2_fast": {"wall_s": [5.0, 10.0, 20.0], "psnr": [16.0, 19.0, 21.0]},  # 20 dB at t = 15
        "w2_short": {"wall_s": [5.0, 10.0], "psnr": [16.0, 19.5]},
    }
    ratios = ttq.ratios_to_reference(curves, "w1_b1")
    assert set(ratios) == {"w2_fast", "w2_short"}
    assert ratios["w2_fast"]["ratio"] == pytest.approx(15.0 / 40.0) and ratios["w2_fast"]["reached"]
    assert ratios["w2_short"]["ratio"] is None and not ratios["w2_short"]["reached"]
    assert ratios["w2_short"]["final_psnr_gap_db"] == pytest.approx(-0.5)


def test_time_per_image_ratio_is_each_runs_last_wall_per_image_over_the_references() -> None:
    curves = {
        "w1_b1": {"wall_s": [10.0, 40.0], "images": [100, 400]},  # 0.1 s per image
        "w2_b2": {"wall_s": [5.0, 24.0], "images": [100, 400]},  # 0.06 s per image at the last point
        "w2_short": {"wall_s": [5.0], "images": [100]},  # 0.05 s per image
    }
    ratios = ttq.time_per_image_ratios(curves, "w1_b1")
    assert ratios == {"w2_b2": pytest.approx(0.6), "w2_short": pytest.approx(0.5)}


def test_run_specs_cover_one_rank_and_both_modes_at_b1_and_bw() -> None:
    names = [spec.name for spec in ttq.run_specs(2)]
    assert names == ["w1_b1", "w2_replicated_b1", "w2_replicated_b2", "w2_sharded_b1", "w2_sharded_b2"]
