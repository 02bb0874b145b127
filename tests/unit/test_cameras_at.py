"""``utils/cameras.cameras_at``: a batch's cameras by position, without an index where the
positions are the whole batch in order (the common case at one rank or one camera group)."""

from __future__ import annotations

import torch

from distsplat_ns.model.camera_adjust import train_camera_ids, with_train_camera_ids
from distsplat_ns.utils.cameras import cameras_at
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
