"""``utils/cameras.cameras_at``: a batch's cameras by position, without an index where the
positions are the whole batch in order (the common case at one rank or one camera group); and
``BatchCameras``: a batch's cameras indexed only when asked for, once per set of positions."""

from __future__ import annotations

import pytest
import torch

from distsplat_ns.model.camera_adjust import train_camera_ids, with_train_camera_ids
from distsplat_ns.utils.cameras import BatchCameras, cameras_at
from tests.helpers.model_factory import make_cameras


def test_the_whole_batch_in_order_is_the_batch_itself() -> None:
    cameras = with_train_camera_ids(make_cameras(3), [7, 2, 5])
    assert cameras_at(cameras, [0, 1, 2]) is cameras
    assert cameras_at(cameras, range(3)) is cameras


def test_a_subset_or_another_order_is_an_index_with_the_camera_ids() -> None:
    cameras = with_train_camera_ids(make_cameras(3), [7, 2, 5])
    for indices in ([2], [1, 2], [2, 1, 0], [0, 0]):
        got = cameras_at(cameras, indices)
        assert got is not cameras
        want = cameras[torch.tensor(indices)]
        assert torch.equal(got.camera_to_worlds, want.camera_to_worlds)
        assert torch.equal(got.fx, want.fx) and torch.equal(got.width, want.width)
        assert train_camera_ids(got).tolist() == [[7, 2, 5][i] for i in indices]


def test_batch_cameras_index_on_demand_once_per_positions() -> None:
    dataset = make_cameras(8)
    taken: list[list[int]] = []

    def take(ids: list[int]):
        taken.append(ids)
        return with_train_camera_ids(dataset[torch.tensor(ids, dtype=torch.long)], ids)

    batch = BatchCameras([7, 2, 5], take, [(32, 24)] * 3)
    assert len(batch) == 3 and taken == []  # nothing indexed until asked for
    mine = batch.at([2, 0])
    assert taken == [[5, 7]] and train_camera_ids(mine).tolist() == [5, 7]
    assert torch.equal(mine.camera_to_worlds, dataset.camera_to_worlds[[5, 7]])
    assert batch.at([2, 0]) is mine and len(taken) == 1  # the same positions again: no second index
    assert train_camera_ids(batch.at([0, 1, 2])).tolist() == [7, 2, 5] and len(taken) == 2
    with pytest.raises(IndexError, match="outside a batch of 3"):
        batch.at([3])
    assert batch.sizes_px([1, 0], 2) == [(16, 12), (16, 12)] and len(taken) == 2  # sizes index nothing


def test_batch_cameras_of_taken_cameras_picks_with_cameras_at() -> None:
    cameras = with_train_camera_ids(make_cameras(3), [7, 2, 5])
    batch = BatchCameras.of(cameras)
    assert len(batch) == 3 and batch.at([0, 1, 2]) is cameras
    assert train_camera_ids(batch.at([1])).tolist() == [2]
    assert batch.sizes_px([2], 1) == [(int(cameras.width[2]), int(cameras.height[2]))]
