"""Decoded batches reach a CUDA device byte for byte through pinned host memory and non-blocking
copies on a copy stream, ordered before their first use on the compute stream (issue 27; the CPU
variant is tests/data/test_upload.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig

from distsplat_ns.data.datamanager import ParallelFullImageDatamanagerConfig
from distsplat_ns.data.upload import DeviceUploader
from tests.helpers.data_fixtures import write_nerfstudio_scene

# CUDA only: pinned memory and a copy stream ordered against the compute stream (the CPU variant: tests/data/test_upload.py).
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_streamed_batches_reach_the_gpu_byte_for_byte_from_pinned_memory(tmp_path: Path) -> None:
    scene = write_nerfstudio_scene(tmp_path / "scene", num_frames=8, size_hw=(120, 160), with_masks=True)
    dataparser = NerfstudioDataParserConfig(data=scene, load_3D_points=False)
    manager = ParallelFullImageDatamanagerConfig(dataparser=dataparser, num_workers=2, eval_num_workers=0).setup(
        device="cuda:0"
    )
    try:
        manager.configure_training(batch_size=4, rank=0, world_size=1, start_step=0)
        loader = manager._train_loader
        for step in range(4):
            batch = manager.next_train_batch(step)
            assert all(image.is_pinned() for image in batch.images)  # copied out of the slots into pinned memory
            busy = torch.randn(4096, 4096, device="cuda:0")
            for _ in range(8):  # compute queued ahead of the copies: they must not wait for it, nor be read early
                busy = busy @ busy * 1e-3
            images, masks = manager.to_device(batch.images, batch.masks)
            sums = [image.to(torch.int64).sum() for image in images]  # first use, on the compute stream
            for index, image, mask, total in zip(batch.camera_indices, images, masks, sums, strict=True):
                decoded, decoded_mask = loader.load(index)
                assert image.device.type == "cuda"
                assert torch.equal(image.cpu(), decoded)
                assert torch.equal(mask.cpu(), decoded_mask)
                assert int(total) == int(decoded.to(torch.int64).sum())
    finally:
        manager.close()


def test_unpinned_tensors_are_pinned_then_uploaded_without_host_sync() -> None:
    uploader = DeviceUploader("cuda")
    host = [torch.randint(0, 256, (1080, 1920, 3), dtype=torch.uint8) for _ in range(4)]
    busy = torch.randn(4096, 4096, device="cuda")
    for _ in range(8):
        busy = busy @ busy * 1e-3
    moved = uploader.upload([*host, None])
    assert moved[-1] is None
    firsts = [m.view(-1)[:1_000_000].to(torch.int64).sum() for m in moved[:-1]]
    for h, m, first in zip(host, moved, firsts, strict=False):
        assert torch.equal(m.cpu(), h)
        assert int(first) == int(h.view(-1)[:1_000_000].to(torch.int64).sum())
