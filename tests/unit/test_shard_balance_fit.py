"""The fit of benchmarks/bench_shard_balance.py: rank 0's render-time excess at equal work."""

from __future__ import annotations

import random

import pytest

from benchmarks.bench_shard_balance import rank_gap_fit


def _steps(excess: float, per_work: float, per_band: float, noise: float, num: int = 400) -> list[dict]:
    rng = random.Random(7)
    steps = []
    for _ in range(num):
        work = [rng.uniform(0.8, 1.2) * 1e5, rng.uniform(0.8, 1.2) * 1e5]
        bands = rng.choice([[1, 1], [1, 2], [2, 1]])
        work_gap = (work[0] - work[1]) / (sum(work) / 2)
        gap = per_work * work_gap + per_band * (bands[0] - bands[1]) + excess + rng.gauss(0.0, noise)
        # Two times whose relative gap (t0 - t1) / mean is `gap`.
        steps.append({"render_s": [0.4 * (1 + gap / 2), 0.4 * (1 - gap / 2)], "work": work, "bands": bands})
    return steps


def test_the_fit_recovers_a_known_excess_work_slope_and_band_cost() -> None:
    fit = rank_gap_fit(_steps(excess=0.042, per_work=0.9, per_band=0.013, noise=0.0), skip=10)
    assert fit["steps_fitted"] == 390
    # Noise-free: exact up to float64 rounding of the least squares.
    assert fit["rank0_excess"] == pytest.approx(0.042, abs=1e-9)
    assert fit["work_gap"] == pytest.approx(0.9, abs=1e-9)
    assert fit["band_gap"] == pytest.approx(0.013, abs=1e-9)


def test_the_standard_error_covers_the_excess_under_noise() -> None:
    fit = rank_gap_fit(_steps(excess=0.042, per_work=0.9, per_band=0.013, noise=0.1), skip=0)
    # 400 steps of 0.1 noise: the intercept's standard error is about 0.1 / sqrt(400) = 0.005.
    assert 0.002 < fit["rank0_excess_se"] < 0.01
    assert abs(fit["rank0_excess"] - 0.042) < 4 * fit["rank0_excess_se"]


def test_too_few_steps_or_ranks_are_refused() -> None:
    with pytest.raises(ValueError, match="rank_gap_fit"):
        rank_gap_fit(_steps(0.0, 1.0, 0.0, 0.0, num=5), skip=2)
    with pytest.raises(ValueError, match="rank_gap_fit"):
        rank_gap_fit([{"render_s": [1.0, 1.0, 1.0], "work": [1, 1, 1], "bands": [1, 1, 1]}] * 8, skip=0)
