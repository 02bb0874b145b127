"""Decoded batches reach the device byte for byte (issue 27): the datamanager's ``to_device`` on the
training stream's images and masks, on CPU (plain tensors, nothing pinned: pinning needs CUDA).
The CUDA variant (pinned memory, non-blocking copies on a copy stream) is tests/gpu/test_upload_cuda.py."""

from __future__ import annotations

import pytest
import torch
from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig

from distsplat_ns.data.datamanager import ParallelFullImageDatamanagerConfig
from distsplat_ns.data.upload import DeviceUploader, pins_memory
from distsplat_ns.utils.cameras import ResolutionSchedule
from tests.helpers.data_fixtures import write_nerfstudio_scene


@pytest.fixture(scope="module")
def masked_manager(tmp_path_factory: pytest.TempPathFactory):
    scene = write_nerfstudio_scene(
        tmp_path_factory.mktemp("upload") / "scene", num_frames=8, size_hw=(40, 56), with_masks=True
    )
    dataparser = NerfstudioDataParserConfig(data=scene, load_3D_points=False)
    manager = ParallelFullImageDatamanagerConfig(dataparser=dataparser, num_workers=2, eval_num_workers=0).setup(
        device="cpu"
    )
    yield manager
    manager.close()


@pytest.mark.parametrize("downscale", [1, 2])
def test_streamed_images_and_masks_reach_the_device_byte_for_byte(masked_manager, downscale: int) -> None:
    masked_manager.configure_training(
        batch_size=4, rank=0, world_size=1, start_step=0, downscale_at=ResolutionSchedule(downscale // 2, 10**6, 4)
    )
    loader = masked_manager._train_loader
    for step in range(3):
        batch = masked_manager.next_train_batch(step)
        images, masks = masked_manager.to_device(batch.images, batch.masks)
        assert len(images) == len(masks) == 4
        for index, image, mask in zip(batch.camera_indices, images, masks, strict=True):
            decoded, decoded_mask = loader.load(index, downscale=downscale)
            assert image.device == torch.device("cpu") and image.dtype == torch.uint8
            assert torch.equal(image, decoded)
            assert mask is not None and torch.equal(mask, decoded_mask)


def test_on_demand_images_reach_the_device_byte_for_byte(masked_manager) -> None:
    masked_manager.configure_training(batch_size=2, rank=0, world_size=1, start_step=0)
    fetched = masked_manager.get_images_and_masks([5, 1], step=0)
    images, masks = masked_manager.to_device([f[0] for f in fetched], [f[1] for f in fetched])
    loader = masked_manager._train_loader
    for index, image, mask in zip([5, 1], images, masks, strict=True):
        decoded, decoded_mask = loader.load(index)
        assert torch.equal(image, decoded) and torch.equal(mask, decoded_mask)


def test_nothing_is_pinned_without_a_cuda_device() -> None:
    uploader = DeviceUploader("cpu")
    assert not uploader.pin_memory and not pins_memory("cpu")
    image = torch.arange(24, dtype=torch.uint8).reshape(2, 4, 3)
    (moved, none) = uploader.upload([image, None])
    assert moved is image and none is None  # the same code path, plain tensors
