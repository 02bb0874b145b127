"""Sampling order and the rank split (pure, no worker processes)."""

from __future__ import annotations

import collections

import pytest

from distsplat_ns.data import order
from distsplat_ns.data.order import ContiguousAssigner, batch_camera_ids, contiguous_split, epoch_permutation


@pytest.mark.parametrize("num_images, batch_size", [(10, 1), (10, 3), (10, 10), (7, 4), (5, 12)])
def test_every_image_once_per_epoch(num_images: int, batch_size: int) -> None:
    num_epochs = 3
    flat = [
        i
        for step in range(num_epochs * num_images // batch_size + 1)
        for i in batch_camera_ids(7, num_images, batch_size, step)
    ]
    for epoch in range(num_epochs):
        assert sorted(flat[epoch * num_images : (epoch + 1) * num_images]) == list(range(num_images))


def test_epochs_are_reshuffled() -> None:
    assert list(epoch_permutation(3, 50, 0)) != list(epoch_permutation(3, 50, 1))


def test_same_seed_same_batches() -> None:
    assert [batch_camera_ids(11, 23, 4, s) for s in range(30)] == [batch_camera_ids(11, 23, 4, s) for s in range(30)]


def test_different_seed_different_batches() -> None:
    assert [batch_camera_ids(1, 23, 4, s) for s in range(10)] != [batch_camera_ids(2, 23, 4, s) for s in range(10)]


@pytest.mark.parametrize("start", [0, 3, 17])
def test_resume_at_step_matches_straight_run(start: int) -> None:
    straight = [batch_camera_ids(5, 13, 3, s) for s in range(25)]
    order._epoch_permutation.cache_clear()  # a resumed process starts with an empty cache
    resumed = [batch_camera_ids(5, 13, 3, s) for s in range(start, 25)]
    assert resumed == straight[start:]


@pytest.mark.parametrize("batch_size, world_size", [(1, 1), (4, 2), (5, 2), (3, 4), (1, 4), (8, 3)])
def test_contiguous_split_partitions_the_batch(batch_size: int, world_size: int) -> None:
    ranges = [contiguous_split(batch_size, world_size, r) for r in range(world_size)]
    positions = [p for start, end in ranges for p in range(start, end)]
    assert positions == list(range(batch_size))
    sizes = [end - start for start, end in ranges]
    assert max(sizes) - min(sizes) <= 1


def test_assigner_matches_contiguous_split() -> None:
    batch = batch_camera_ids(0, 10, 5, 2)
    got = [ContiguousAssigner().positions_for_rank(2, batch, r, 2) for r in range(2)]
    assert got == [[0, 1, 2], [3, 4]]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"seed": 0, "num_images": 0, "batch_size": 1, "step": 0}, "num_images"),
        ({"seed": 0, "num_images": 3, "batch_size": 0, "step": 0}, "batch_size"),
        ({"seed": 0, "num_images": 3, "batch_size": 1, "step": -1}, "step"),
        ({"seed": -1, "num_images": 3, "batch_size": 1, "step": 0}, "seed"),
    ],
)
def test_batch_camera_ids_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        batch_camera_ids(**kwargs)


def test_contiguous_split_rejects_rank_outside_world() -> None:
    with pytest.raises(ValueError, match="rank"):
        contiguous_split(4, 2, 2)


def test_batch_larger_than_dataset_repeats_across_epochs() -> None:
    counts = collections.Counter(batch_camera_ids(0, 3, 7, 0))
    assert sum(counts.values()) == 7 and set(counts) == {0, 1, 2}
