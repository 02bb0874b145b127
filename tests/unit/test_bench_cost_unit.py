"""The pure parts of benchmarks/bench_cost_unit.py: the least-squares fits and the summary."""

from __future__ import annotations

import pytest

from benchmarks import bench_cost_unit as cost_unit


def test_an_exact_line_is_fitted_with_no_residual() -> None:
    fit = cost_unit.fit_linear([[1.0, 2.0, 3.0, 4.0]], [5.0, 7.0, 9.0, 11.0])
    assert fit["coefficients"] == pytest.approx([2.0]) and fit["intercept"] == pytest.approx(3.0)
    assert fit["r2"] == pytest.approx(1.0) and fit["residual_sd"] == pytest.approx(0.0, abs=1e-12)


def test_the_residual_is_what_the_count_leaves_unexplained() -> None:
    # y = x + (1, -1, -1, 1): the deviations are orthogonal to x and to a constant, so the best
    # line is y = x and they are its residual, s.d. 1; R^2 = 1 - 4 / sum((y - 1.5)^2) = 1 - 4 / 9.
    fit = cost_unit.fit_linear([[0.0, 1.0, 2.0, 3.0]], [1.0, 0.0, 1.0, 4.0])
    assert fit["coefficients"] == pytest.approx([1.0]) and fit["intercept"] == pytest.approx(0.0, abs=1e-12)
    assert fit["residual_sd"] == pytest.approx(1.0)
    assert fit["r2"] == pytest.approx(5.0 / 9.0)


def test_two_counts_fit_a_plane() -> None:
    xs, zs = [0.0, 1.0, 0.0, 1.0, 2.0], [0.0, 0.0, 1.0, 1.0, 3.0]
    fit = cost_unit.fit_linear([xs, zs], [2 * x + 5 * z + 1 for x, z in zip(xs, zs, strict=True)])
    assert fit["coefficients"] == pytest.approx([2.0, 5.0]) and fit["intercept"] == pytest.approx(1.0)


def test_too_few_cameras_are_refused() -> None:
    with pytest.raises(ValueError, match="fit_linear"):
        cost_unit.fit_linear([[1.0, 2.0]], [1.0, 2.0])


def test_the_summary_takes_each_cameras_median_and_the_repeats_deviation() -> None:
    # Times are 10 * pairs ms (+-1 ms noise on one repeat each); intersections say nothing.
    cameras = [
        {"times_s": [p / 100, p / 100 + 0.001, p / 100], "intersections": 7, "composited_pairs": p}
        for p in (1, 2, 3, 4, 5)
    ]
    summary = cost_unit.summarise(cameras)
    assert summary["noise_ms"] == pytest.approx(0.0, abs=1e-9)  # the median deviation: 2 of 3 repeats are exact
    assert summary["fits"]["composited_pairs"]["r2"] == pytest.approx(1.0)
    assert summary["fits"]["composited_pairs"]["residual_sd_ms"] == pytest.approx(0.0, abs=1e-9)
    assert summary["fits"]["intersections"]["r2"] == pytest.approx(0.0, abs=1e-9)


def test_a_bands_fixed_cost_is_the_two_band_time_over_the_whole_in_the_pairs_unit() -> None:
    # 10 ms per pair; two bands take 2 ms more than the whole image: 0.2 pairs' worth, over the
    # mean image's 3 pairs.
    cameras = [
        {
            "times_s": [p / 100] * 2,
            "two_band_times_s": [p / 100 + 0.002] * 2,
            "intersections": p % 2,
            "composited_pairs": p,
        }
        for p in (1, 2, 3, 4, 5)
    ]
    summary = cost_unit.summarise(cameras)
    assert summary["band_overhead_ms"] == pytest.approx(2.0)
    assert summary["band_cost_fraction"] == pytest.approx(0.2 / 3.0)


def test_no_band_figure_without_two_band_timings() -> None:
    cameras = [{"times_s": [p / 100] * 2, "intersections": p % 2, "composited_pairs": p} for p in (1, 2, 3, 4)]
    assert "band_cost_fraction" not in cost_unit.summarise(cameras)


def test_on_gsplat_a_bands_fixed_cost_is_in_the_intersections_unit() -> None:
    # gsplat's cameras carry intersections only (its tile_work): 10 ms per intersection, two bands
    # take 4 ms more, 0.4 intersections' worth, over the mean image's 4 intersections. No pairs
    # fit and no fit on both counts.
    cameras = [
        {"times_s": [i / 100] * 2, "two_band_times_s": [i / 100 + 0.004] * 2, "intersections": i}
        for i in (2, 3, 4, 5, 6)
    ]
    summary = cost_unit.summarise(cameras)
    assert summary["work_count"] == "intersections" and set(summary["fits"]) == {"intersections"}
    assert summary["band_overhead_ms"] == pytest.approx(4.0)
    assert summary["band_cost_fraction"] == pytest.approx(0.4 / 4.0)


def test_on_the_reference_backend_the_work_count_is_the_composited_pairs() -> None:
    cameras = [{"times_s": [p / 100] * 2, "intersections": p % 2, "composited_pairs": p} for p in (1, 2, 3, 4)]
    summary = cost_unit.summarise(cameras)
    assert summary["work_count"] == "composited_pairs" and set(summary["fits"]) == {
        "intersections",
        "composited_pairs",
        "both",
    }
