"""Tile-row partitioner: coverage, contiguity, the max/mean bound, baselines and config errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from distsplat_ns.balance.partition import (
    Band,
    band_pixel_rows,
    equal_rows_partition,
    imbalance,
    num_tile_rows,
    partition_rows,
    rank_costs,
    tile_rows_to_pixel_rows,
    whole_image_partition,
)

PROPERTY_SETTINGS = settings(derandomize=True, max_examples=300, deadline=None)


# ---- local helpers ---------------------------------------------------------------------------


def _laid_out_ranges(partition, heights):
    """Each rank's bands as ranges [start, end) of the laid-out rows, in rank then band order."""
    offsets = np.concatenate([[0], np.cumsum(heights)])
    return [
        [(int(offsets[b.position]) + b.first_row, int(offsets[b.position]) + b.end_row) for b in bands]
        for bands in partition
    ]


def _coverage(partition, heights):
    counts = [np.zeros(h, dtype=int) for h in heights]
    for bands in partition:
        for band in bands:
            counts[band.position][band.first_row : band.end_row] += 1
    return counts


def _window_cost(costs, min_band_rows):
    """Q of the bound: the largest cost of 2 * min_band_rows - 1 consecutive rows of one image."""
    best = 0.0
    for image in costs:
        width = min(len(image), 2 * min_band_rows - 1)
        for start in range(len(image) - width + 1):
            best = max(best, float(np.sum(image[start : start + width])))
    return best


@st.composite
def _batches(draw, min_band_rows=None, snap_tolerance=None):
    """A batch of 1-6 images of 1-20 tile rows with mixed cost patterns, and partition knobs.

    ``min_band_rows`` / ``snap_tolerance``: fixed values, or None to draw them.
    """
    num_images = draw(st.integers(1, 6))
    costs = []
    for _ in range(num_images):
        height = draw(st.integers(1, 20))
        kind = draw(st.sampled_from(["random", "zero", "uniform", "sparse"]))
        if kind == "zero":
            costs.append(np.zeros(height))
        elif kind == "uniform":
            costs.append(np.full(height, draw(st.floats(0.1, 10.0))))
        else:
            values = draw(st.lists(st.floats(0.0, 100.0), min_size=height, max_size=height))
            array = np.array(values)
            if kind == "sparse":
                array[array < 70.0] = 0.0
            costs.append(array)
    world_size = draw(st.integers(1, 9))
    if min_band_rows is None:
        min_band_rows = draw(st.integers(1, 4))
    if snap_tolerance is None:
        snap_tolerance = draw(st.sampled_from([0.0, 0.05, 0.5]))
    return costs, world_size, min_band_rows, snap_tolerance


def _run(batch):
    costs, world_size, min_band_rows, snap_tolerance = batch
    partition = partition_rows(costs, world_size, min_band_rows=min_band_rows, snap_tolerance=snap_tolerance)
    return partition, [len(c) for c in costs]


# ---- properties ------------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(_batches())
def test_every_row_is_assigned_exactly_once(batch):
    partition, heights = _run(batch)
    assert all(np.all(c == 1) for c in _coverage(partition, heights))


@PROPERTY_SETTINGS
@given(_batches())
def test_ranks_take_consecutive_ranges_of_the_laid_out_rows(batch):
    partition, heights = _run(batch)
    flat = [r for ranges in _laid_out_ranges(partition, heights) for r in ranges]
    assert flat[0][0] == 0 and flat[-1][1] == sum(heights)
    assert all(prev[1] == nxt[0] for prev, nxt in itertools.pairwise(flat))


@PROPERTY_SETTINGS
@given(_batches())
def test_bands_of_a_rank_are_in_batch_order_one_per_image(batch):
    partition, _ = _run(batch)
    for bands in partition:
        positions = [b.position for b in bands]
        assert positions == sorted(set(positions))


@PROPERTY_SETTINGS
@given(_batches())
def test_no_band_is_thinner_than_min_band_rows_unless_whole_image(batch):
    partition, heights = _run(batch)
    min_band_rows = batch[2]
    for bands in partition:
        for b in bands:
            whole = b.first_row == 0 and b.end_row == heights[b.position]
            assert whole or b.num_rows >= min_band_rows


@PROPERTY_SETTINGS
@given(_batches())
def test_only_trailing_ranks_are_empty(batch):
    partition, _ = _run(batch)
    non_empty = [len(bands) > 0 for bands in partition]
    num_used = sum(non_empty)
    assert non_empty == [True] * num_used + [False] * (len(partition) - num_used)


@PROPERTY_SETTINGS
@given(_batches(min_band_rows=1))
def test_ranks_are_empty_only_when_rows_are_fewer_than_ranks(batch):
    partition, heights = _run(batch)
    assert sum(len(bands) > 0 for bands in partition) == min(batch[1], sum(heights))


@PROPERTY_SETTINGS
@given(_batches())
def test_max_rank_cost_is_within_the_stated_bound(batch):
    costs, _world_size, min_band_rows, snap_tolerance = batch
    partition, _ = _run(batch)
    total = float(sum(c.sum() for c in costs))
    num_used = sum(len(bands) > 0 for bands in partition)
    bound = max(total / num_used + _window_cost(costs, min_band_rows), (1 + snap_tolerance) * total / num_used)
    assert max(rank_costs(partition, costs)) <= bound * (1 + 1e-12) + 1e-12


@PROPERTY_SETTINGS
@given(_batches(min_band_rows=1, snap_tolerance=0.0))
def test_without_snapping_max_cost_is_at_most_share_plus_largest_row(batch):
    costs, world_size, _, _ = batch
    partition, heights = _run(batch)
    if sum(heights) < world_size:
        return  # not every rank can get a row; covered by the general bound
    total = float(sum(c.sum() for c in costs))
    largest_row = max(float(c.max()) for c in costs)
    assert max(rank_costs(partition, costs)) <= (total / world_size + largest_row) * (1 + 1e-12)


@PROPERTY_SETTINGS
@given(_batches())
def test_partition_is_deterministic_across_input_types(batch):
    costs, world_size, min_band_rows, snap_tolerance = batch
    from_numpy = partition_rows(costs, world_size, min_band_rows=min_band_rows, snap_tolerance=snap_tolerance)
    tensors = [torch.from_numpy(c.copy()) for c in costs]
    from_torch = partition_rows(tensors, world_size, min_band_rows=min_band_rows, snap_tolerance=snap_tolerance)
    assert from_numpy == from_torch


# ---- cases -----------------------------------------------------------------------------------


def test_one_image_over_four_ranks_gives_four_bands_of_that_image():
    partition = partition_rows([np.ones(34)], 4)
    assert [b.position for bands in partition for b in bands] == [0, 0, 0, 0]
    assert [b.num_rows for bands in partition for b in bands] == [8, 9, 8, 9]


@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_uniform_batch_equal_to_world_size_gives_one_whole_image_per_rank(world_size):
    partition = partition_rows([np.ones(34)] * world_size, world_size)
    assert partition == whole_image_partition([34] * world_size, world_size)


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_uniform_batch_twice_world_size_gives_two_whole_images_per_rank(world_size):
    partition = partition_rows([np.ones(34)] * (2 * world_size), world_size)
    assert partition == whole_image_partition([34] * (2 * world_size), world_size)


@pytest.mark.parametrize("heights, world_size", [([10], 3), ([34, 34, 34], 2), ([5, 17, 3], 4), ([34] * 4, 4)])
def test_all_zero_costs_give_equal_rows(heights, world_size):
    partition = partition_rows([np.zeros(h) for h in heights], world_size)
    assert partition == equal_rows_partition(heights, world_size)


def test_one_huge_row_gets_a_rank_of_its_own():
    costs = np.ones(12)
    costs[5] = 1000.0
    partition = partition_rows([costs], 3)
    assert Band(0, 5, 6) in [b for bands in partition for b in bands]


def test_fewer_rows_than_ranks_leaves_trailing_ranks_empty():
    partition = partition_rows([np.ones(1), np.ones(2)], 5)
    assert partition == [[Band(0, 0, 1)], [Band(1, 0, 1)], [Band(1, 1, 2)], [], []]


@pytest.mark.parametrize(
    "min_band_rows, expected",
    [
        (1, [[Band(0, 0, 9), Band(1, 0, 1)], [Band(1, 1, 9)]]),  # the ideal cut: a 1-row band
        (3, [[Band(0, 0, 9)], [Band(1, 0, 9)]]),  # 1 row from the edge: moved onto it
    ],
)
def test_min_band_rows_moves_a_cut_one_row_from_an_image_edge(min_band_rows, expected):
    # Total 20, share 10: the ideal cut lies one row into image 1.
    costs = [np.ones(9), np.concatenate([[1.0], np.full(8, 1.25)])]
    assert partition_rows(costs, 2, min_band_rows=min_band_rows, snap_tolerance=0.0) == expected


def test_image_thinner_than_twice_min_band_rows_is_not_split():
    partition = partition_rows([np.ones(5)], 2, min_band_rows=3)
    assert partition == [[Band(0, 0, 5)], []]


def _one_cheap_row_past_an_edge():
    # Total 202, share 101: the ideal cut lies exactly one cheap row (cost 1) into image 1.
    return [np.full(10, 10.0), np.concatenate([[1.0], np.full(9, 101.0 / 9.0)])]


def test_cut_one_cheap_row_inside_an_image_snaps_to_the_edge():
    # Moving that row to rank 1 raises rank 1 to 102, within 5% of the share.
    partition = partition_rows(_one_cheap_row_past_an_edge(), 2, snap_tolerance=0.05)
    assert partition == [[Band(0, 0, 10)], [Band(1, 0, 10)]]


def test_zero_snap_tolerance_keeps_a_cut_that_would_overload_a_rank():
    partition = partition_rows(_one_cheap_row_past_an_edge(), 2, snap_tolerance=0.0)
    assert partition[0] == [Band(0, 0, 10), Band(1, 0, 1)]


def test_cost_weighted_cut_beats_baselines_on_a_skewed_batch():
    # The balancer's target: <= 1.10 where whole-image and equal-row splits exceed 1.3.
    rng = np.random.default_rng(0)
    costs = [rng.gamma(0.3, 1.0, 34) * np.linspace(0.1, 3.0, 34) for _ in range(3)]
    heights = [34, 34, 34]
    ours = imbalance(partition_rows(costs, 4), costs)
    assert ours <= 1.10
    assert (
        min(imbalance(whole_image_partition(heights, 4), costs), imbalance(equal_rows_partition(heights, 4), costs))
        > 1.3
    )


# ---- baselines -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "num_images, world_size, expected_counts",
    [(4, 4, [1, 1, 1, 1]), (8, 4, [2, 2, 2, 2]), (5, 2, [3, 2]), (2, 4, [1, 1, 0, 0]), (7, 3, [3, 2, 2])],
)
def test_whole_image_partition_gives_contiguous_near_equal_image_counts(num_images, world_size, expected_counts):
    partition = whole_image_partition([7] * num_images, world_size)
    assert [len(bands) for bands in partition] == expected_counts
    assert [b.position for bands in partition for b in bands] == list(range(num_images))


def test_whole_image_partition_bands_are_whole_images():
    partition = whole_image_partition([3, 5, 8], 2)
    assert partition == [[Band(0, 0, 3), Band(1, 0, 5)], [Band(2, 0, 8)]]


@pytest.mark.parametrize(
    "heights, world_size, expected_rows",
    [([34], 4, [8, 9, 8, 9]), ([34, 34, 34], 2, [51, 51]), ([10, 10], 3, [7, 6, 7]), ([2], 4, [0, 1, 0, 1])],
)
def test_equal_rows_partition_gives_near_equal_row_counts(heights, world_size, expected_rows):
    partition = equal_rows_partition(heights, world_size)
    assert [sum(b.num_rows for b in bands) for bands in partition] == expected_rows


def test_equal_rows_partition_splits_across_image_edges():
    assert equal_rows_partition([3, 3], 2) == [[Band(0, 0, 3)], [Band(1, 0, 3)]]


# ---- imbalance -------------------------------------------------------------------------------


def test_imbalance_is_max_over_mean_rank_cost():
    costs = [np.array([1.0, 2.0]), np.array([3.0])]
    partition = [[Band(0, 0, 2)], [Band(1, 0, 1)], []]
    assert imbalance(partition, costs) == pytest.approx(3.0 / 2.0)


def test_imbalance_of_zero_total_cost_is_one():
    assert imbalance([[Band(0, 0, 2)], []], [np.zeros(2)]) == 1.0


def test_rank_costs_rejects_a_band_outside_the_batch():
    with pytest.raises(ValueError, match="outside the batch"):
        rank_costs([[Band(1, 0, 1)]], [np.ones(2)])


# ---- tile rows <-> pixel rows ----------------------------------------------------------------


@pytest.mark.parametrize("height_px, tile_size, expected", [(544, 16, 34), (545, 16, 35), (1, 16, 1), (100, 10, 10)])
def test_num_tile_rows_rounds_up(height_px, tile_size, expected):
    assert num_tile_rows(height_px, tile_size) == expected


@pytest.mark.parametrize(
    "first_row, end_row, height_px, expected",
    [(0, 1, 40, (0, 16)), (1, 3, 40, (16, 40)), (2, 3, 40, (32, 40)), (0, 3, 48, (0, 48))],
)
def test_tile_rows_to_pixel_rows_clips_the_partial_last_row(first_row, end_row, height_px, expected):
    assert tile_rows_to_pixel_rows(first_row, end_row, height_px) == expected


def test_band_pixel_rows_uses_the_band_rows():
    assert band_pixel_rows(Band(0, 1, 3), 40) == (16, 40)


def test_tile_rows_to_pixel_rows_rejects_rows_past_the_image():
    with pytest.raises(ValueError, match="end_row"):
        tile_rows_to_pixel_rows(0, 4, 40)


# ---- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"row_costs": [np.ones(3)], "world_size": 0}, "world_size"),
        ({"row_costs": [np.ones(3)], "world_size": 2, "min_band_rows": 0}, "min_band_rows"),
        ({"row_costs": [np.ones(3)], "world_size": 2, "snap_tolerance": -0.1}, "snap_tolerance"),
        ({"row_costs": [np.ones(3)], "world_size": 2, "snap_tolerance": float("nan")}, "snap_tolerance"),
        ({"row_costs": [], "world_size": 2}, "row_costs"),
        ({"row_costs": [np.ones(0)], "world_size": 2}, r"row_costs\[0\]"),
        ({"row_costs": [np.ones(3), -np.ones(3)], "world_size": 2}, r"row_costs\[1\].*non-negative"),
        ({"row_costs": [np.array([1.0, np.inf])], "world_size": 2}, r"row_costs\[0\].*finite"),
        ({"row_costs": [np.ones((2, 3))], "world_size": 2}, r"row_costs\[0\].*1-D"),
    ],
)
def test_partition_rows_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        partition_rows(**kwargs)


def test_partition_rows_rejects_a_single_array_for_the_batch():
    with pytest.raises(TypeError, match="row_costs"):
        partition_rows(np.ones(3), 2)


@pytest.mark.parametrize("args, match", [((0, 0, 0), "first_row"), ((0, 2, 1), "first_row"), ((-1, 0, 1), "position")])
def test_band_rejects_empty_or_negative_ranges(args, match):
    with pytest.raises(ValueError, match=match):
        Band(*args)


@pytest.mark.parametrize("function", [whole_image_partition, equal_rows_partition])
def test_baselines_reject_a_zero_row_count(function):
    with pytest.raises(ValueError, match=r"row_counts\[1\]"):
        function([3, 0], 2)
