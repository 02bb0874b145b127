"""The step's one handle on the data (``data/step_batch.py:StepBatch``): the batch's camera ids at
once, the stream read only when the plan's positions are asked for, the images it did not
prefetch decoded on demand with their masks and counted, everything in the order asked."""

from __future__ import annotations

import pytest
import torch

from distsplat_ns.data.reader import TrainBatch
from distsplat_ns.data.step_batch import StepBatch

CAMERA_IDS = [7, 3, 9]


def _image(index: int) -> torch.Tensor:
    return torch.full((2, 3, 3), index, dtype=torch.uint8)


def _mask(index: int) -> torch.Tensor:
    return torch.full((2, 3, 1), index % 2 == 1, dtype=torch.bool)


class _Data:
    """The datamanager's parts, recording what the handle asked of them."""

    def __init__(self, streamed_positions: list[int]) -> None:
        self.streamed_positions = streamed_positions
        self.received = 0
        self.decoded: list[list[int]] = []
        self.uploaded = 0

    def receive(self) -> TrainBatch:
        self.received += 1
        ids = [CAMERA_IDS[p] for p in self.streamed_positions]
        return TrainBatch(
            step=4,
            camera_indices=ids,
            positions=self.streamed_positions,
            images=[_image(i) for i in ids],
            masks=[_mask(i) for i in ids],
            wait_s=0.25,
        )

    def decode(self, indices: list[int]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        self.decoded.append(list(indices))
        return [(_image(i), _mask(i)) for i in indices]

    def upload(
        self, images: list[torch.Tensor], masks: list[torch.Tensor | None]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        self.uploaded += 1
        return [i.clone() for i in images], [None if m is None else m.clone() for m in masks]

    def batch(self) -> StepBatch:
        return StepBatch(4, list(CAMERA_IDS), self.receive, self.decode, self.upload)


def test_camera_ids_come_before_the_stream_is_read() -> None:
    data = _Data(streamed_positions=[0, 1])
    batch = data.batch()
    assert batch.camera_ids == CAMERA_IDS
    assert data.received == 0


def test_streamed_images_are_taken_and_the_rest_decoded_with_masks() -> None:
    data = _Data(streamed_positions=[0, 1])
    images = data.batch().on_device([1, 2])
    assert images.positions == [1, 2]
    assert data.decoded == [[CAMERA_IDS[2]]]
    assert images.num_fetched_on_demand == 1
    for p, image, mask in zip(images.positions, images.images, images.masks, strict=True):
        assert torch.equal(image, _image(CAMERA_IDS[p]))
        assert mask is not None and torch.equal(mask, _mask(CAMERA_IDS[p]))
    assert data.received == data.uploaded == 1


def test_a_fully_streamed_step_decodes_nothing_and_waits_the_streams_time() -> None:
    data = _Data(streamed_positions=[0, 1, 2])
    images = data.batch().on_device([0, 2])
    assert data.decoded == []
    assert images.num_fetched_on_demand == 0
    assert images.wait_s == 0.25


def test_images_are_taken_once_per_step() -> None:
    batch = _Data(streamed_positions=[0]).batch()
    batch.on_device([0])
    with pytest.raises(RuntimeError, match="step 4"):
        batch.on_device([0])


def test_a_position_outside_the_batch_is_refused() -> None:
    with pytest.raises(ValueError, match="positions"):
        _Data(streamed_positions=[0]).batch().on_device([3])
