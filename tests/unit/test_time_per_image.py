"""The pure parts of benchmarks/bench_time_per_image.py: the alternated rounds and the ratios."""

from __future__ import annotations

import pytest

from benchmarks import bench_time_per_image as tpi


def test_rounds_alternate_which_side_runs_first() -> None:
    rounds = tpi.round_specs(2, 3)
    assert [[s.name for s in r] for r in rounds] == [
        ["w1_b1", "w2_replicated_b2", "w2_sharded_b2"],
        ["w2_sharded_b2", "w2_replicated_b2", "w1_b1"],
        ["w1_b1", "w2_replicated_b2", "w2_sharded_b2"],
    ]
    assert {(s.world_size, s.batch_size, s.parallel) for s in rounds[0]} == {
        (1, 1, "replicated"),
        (2, 2, "replicated"),
        (2, 2, "sharded"),
    }


@pytest.mark.parametrize("world_size, rounds", [(1, 3), (2, 0)])
def test_rounds_refuse_one_rank_or_no_round(world_size: int, rounds: int) -> None:
    with pytest.raises(ValueError):
        tpi.round_specs(world_size, rounds)


def test_ratios_divide_by_the_same_rounds_one_rank_time() -> None:
    # Round 1's machine is twice as slow for both: its ratio is still 0.5, the medians' ratio too.
    ratios = tpi.per_image_ratios(
        [{"w1_b1": 0.4, "w2_b2": 0.2}, {"w1_b1": 0.8, "w2_b2": 0.4}, {"w1_b1": 0.4, "w2_b2": 0.24}]
    )
    r = ratios["w2_b2"]
    assert r["per_round"] == pytest.approx([0.5, 0.5, 0.6])
    assert (r["median"], r["min"], r["max"]) == pytest.approx((0.5, 0.5, 0.6))
    assert r["of_medians"] == pytest.approx(0.24 / 0.4)


def test_ratios_refuse_a_round_without_its_one_rank_run() -> None:
    with pytest.raises(ValueError):
        tpi.per_image_ratios([{"w2_b2": 0.2}])
