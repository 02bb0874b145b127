"""ParallelFullImageDatamanager on real and synthetic scenes, against nerfstudio 1.1.5's own loader."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from nerfstudio.data.datamanagers.full_images_datamanager import FullImageDatamanagerConfig, _undistort_image
from nerfstudio.data.dataparsers.blender_dataparser import BlenderDataParserConfig
from nerfstudio.data.dataparsers.colmap_dataparser import ColmapDataParserConfig
from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig
from nerfstudio.data.datasets.base_dataset import InputDataset

from distsplat_ns.data.datamanager import ParallelFullImageDatamanager, ParallelFullImageDatamanagerConfig
from distsplat_ns.data.order import batch_camera_ids, contiguous_split
from tests.helpers.data_fixtures import shared_scene, write_nerfstudio_scene

SHIPPED_LUND_DOOR = Path(__file__).resolve().parents[2] / "scenes" / "lund_door"


def _colmap(data: Path) -> ColmapDataParserConfig:
    return ColmapDataParserConfig(data=data, colmap_path=Path("sparse/0"), load_3D_points=True, downscale_factor=1)


def _manager(dataparser, **overrides) -> ParallelFullImageDatamanager:
    overrides.setdefault("num_workers", 2)
    overrides.setdefault("eval_num_workers", 2)
    return ParallelFullImageDatamanagerConfig(dataparser=dataparser, **overrides).setup(device="cpu")


@pytest.fixture(scope="module")
def lund_door() -> ParallelFullImageDatamanager:
    manager = _manager(_colmap(SHIPPED_LUND_DOOR))
    yield manager
    manager.close()


# ---------------------------------------------------------------------------------- training stream
@pytest.mark.parametrize("rank", [0, 1])
def test_lund_door_rank_gets_its_contiguous_share(lund_door: ParallelFullImageDatamanager, rank: int) -> None:
    lund_door.configure_training(batch_size=5, rank=rank, world_size=2, start_step=0)
    for step in range(3):
        batch = lund_door.next_train_batch(step)
        start, end = contiguous_split(5, 2, rank)
        assert batch.positions == list(range(start, end))
        assert batch.camera_indices == lund_door.batch_camera_ids(step)[start:end]
        cameras = lund_door.train_dataset.cameras
        for index, image in zip(batch.camera_indices, batch.images, strict=False):
            assert image.dtype == torch.uint8
            assert tuple(image.shape) == (int(cameras.height[index]), int(cameras.width[index]), 3)


def test_next_train_batch_requires_configure_training() -> None:
    manager = _manager(_colmap(SHIPPED_LUND_DOOR), num_workers=0)
    with pytest.raises(RuntimeError, match="configure_training"):
        manager.next_train_batch(0)


def test_requesting_another_step_restarts_the_stream_there(lund_door: ParallelFullImageDatamanager) -> None:
    lund_door.configure_training(3, 0, 1)
    lund_door.next_train_batch(0)
    jumped = lund_door.next_train_batch(5)
    lund_door.configure_training(3, 0, 1, start_step=5)
    fresh = lund_door.next_train_batch(5)
    assert jumped.camera_indices == fresh.camera_indices == batch_camera_ids(42, 10, 3, 5)
    assert all(torch.equal(a, b) for a, b in zip(jumped.images, fresh.images, strict=False))


def test_get_images_matches_the_stream(lund_door: ParallelFullImageDatamanager) -> None:
    lund_door.configure_training(4, 0, 1, start_step=2)
    batch = lund_door.next_train_batch(2)
    assert all(
        torch.equal(a, b) for a, b in zip(lund_door.get_images(batch.camera_indices), batch.images, strict=False)
    )


def test_stats_report_store_and_counters(lund_door: ParallelFullImageDatamanager) -> None:
    lund_door.configure_training(2, 0, 1)
    lund_door.next_train_batch(0)
    stats = lund_door.stats()
    expected_bytes = sum(p.stat().st_size for p in lund_door.train_dataset.image_filenames)
    assert stats["store_bytes"] == expected_bytes and stats["disk_mode"] is False
    assert stats["num_images_delivered"] >= 2 and stats["wait_s"] >= 0.0


def test_ram_budget_below_file_size_switches_to_disk_mode() -> None:
    manager = _manager(_colmap(SHIPPED_LUND_DOOR), ram_budget_bytes=1)
    manager.configure_training(2, 0, 1)
    assert len(manager.next_train_batch(0).images) == 2
    assert manager.stats()["disk_mode"] is True
    manager.close()


# ---------------------------------------------------------------------------------- nerfstudio API
def test_next_train_returns_one_uint8_image_and_its_camera(lund_door: ParallelFullImageDatamanager) -> None:
    # uint8: the model converts on its device (no host float conversion).
    for step in range(2):
        camera, data = lund_door.next_train(step)
        assert camera.shape == (1,) and camera.metadata["cam_idx"] == data["image_idx"]
        assert data["image"].dtype == torch.uint8
        assert tuple(data["image"].shape[:2]) == (int(camera.height), int(camera.width))


def test_next_eval_image_returns_a_uint8_eval_image(lund_door: ParallelFullImageDatamanager) -> None:
    camera, data = lund_door.next_eval_image(0)
    assert data["image"].dtype == torch.uint8
    assert tuple(data["image"].shape[:2]) == (int(camera.height), int(camera.width))


def test_fixed_indices_eval_dataloader_with_workers(lund_door: ParallelFullImageDatamanager) -> None:
    loader = lund_door.fixed_indices_eval_dataloader
    items = list(loader)
    assert len(loader) == len(items) == len(lund_door.eval_dataset)
    assert [data["image_idx"] for _, data in items] == list(range(len(items)))
    for camera, data in items:
        assert data["image"].dtype == torch.uint8
        assert tuple(data["image"].shape[:2]) == (int(camera.height), int(camera.width))


def test_missing_image_reported_at_startup(tmp_path: Path) -> None:
    scene = tmp_path / "lund_door"
    shutil.copytree(SHIPPED_LUND_DOOR, scene)
    (scene / "images" / "DSC_0004.JPG").unlink()
    with pytest.raises(FileNotFoundError, match="DSC_0004.JPG"):
        _manager(_colmap(scene))


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_workers", -1),
        ("prefetch_batches", 0),
        ("ram_budget_bytes", -5),
        ("decoder", "libjpeg"),
        ("camera_res_scale_factor", 0.0),
    ],
)
def test_config_rejects_bad_values_naming_the_flag(field: str, value: object) -> None:
    with pytest.raises(ValueError, match="--pipeline.datamanager." + field.replace("_", "-")):
        ParallelFullImageDatamanagerConfig(**{field: value})


# ---------------------------------------------------------------------------------- pixels vs nerfstudio
def _nerfstudio_full_image_manager(dataparser, scale: float):
    # cache_images="gpu" with device cpu keeps the cache in plain CPU tensors ("cpu" pins memory,
    # which needs CUDA).
    config = FullImageDatamanagerConfig(
        dataparser=dataparser, cache_images="gpu", cache_images_type="uint8", camera_res_scale_factor=scale
    )
    return config.setup(device="cpu")


@pytest.mark.parametrize(
    "k1, masks, scale, model",
    [
        (0.0, False, 1.0, "OPENCV"),
        (0.08, True, 1.0, "OPENCV"),
        (0.08, True, 0.5, "OPENCV"),
        (0.08, False, 1.0, "OPENCV_FISHEYE"),
        (0.0, False, 1.0, "FISHEYE624"),
    ],
    ids=["undistorted", "distorted-masks", "distorted-masks-half-res", "fisheye", "fisheye624"],
)
def test_synthetic_scene_matches_nerfstudio_pixel_for_pixel(
    tmp_path: Path, k1: float, masks: bool, scale: float, model: str
) -> None:
    # FISHEYE624: masks generated from the crop circle (55 x 55 images from 80 x 60), none without distortion or mask files.
    radius = 27.5 if model == "FISHEYE624" else None
    scene = write_nerfstudio_scene(
        tmp_path / "scene",
        num_frames=5,
        size_hw=(60, 80),
        k1=k1,
        with_masks=masks,
        camera_model=model,
        fisheye_crop_radius=radius,
    )
    dataparser = NerfstudioDataParserConfig(data=scene, downscale_factor=1, eval_mode="all")
    ours = _manager(dataparser, camera_res_scale_factor=scale, num_workers=1)
    reference = _nerfstudio_full_image_manager(
        NerfstudioDataParserConfig(data=scene, downscale_factor=1, eval_mode="all"), scale
    )
    cached = reference.cached_train
    ours.configure_training(len(cached), 0, 1)
    batch = ours.next_train_batch(0)
    assert sorted(batch.camera_indices) == list(range(len(cached)))
    for index, image, mask in zip(batch.camera_indices, batch.images, batch.masks, strict=True):
        _assert_same_image_and_mask(image, mask, cached[index])
    cached_eval = reference.cached_eval
    eval_items = list(ours.fixed_indices_eval_dataloader)
    assert len(eval_items) == len(cached_eval)
    for _, data in eval_items:
        _assert_same_image_and_mask(data["image"], data.get("mask"), cached_eval[data["image_idx"]])
    for split in ("train_dataset", "eval_dataset"):
        for name in ("fx", "fy", "cx", "cy", "width", "height", "camera_type"):
            theirs = getattr(getattr(reference, split).cameras, name)
            assert torch.equal(getattr(getattr(ours, split).cameras, name), theirs), (split, name)
    ours.close()


def _assert_same_image_and_mask(image: torch.Tensor, mask: torch.Tensor | None, expected: dict) -> None:
    assert torch.equal(image, expected["image"])
    assert (mask is None) == ("mask" not in expected)
    if mask is not None:
        assert mask.dtype == torch.bool and torch.equal(mask, expected["mask"])


@pytest.mark.parametrize("index", [0, 33, 60])
def test_fox_undistortion_matches_nerfstudio_pixel_for_pixel(index: int) -> None:
    fox = shared_scene("fox")
    ours = _manager(NerfstudioDataParserConfig(data=fox, downscale_factor=1), num_workers=0)
    dataset = InputDataset(ours.train_dataparser_outputs)
    data = dataset.get_data(index, image_type="uint8")
    camera = dataset.cameras[index].reshape(())
    K, expected, _ = _undistort_image(
        camera, camera.distortion_params.numpy(), data, data["image"].numpy(), camera.get_intrinsics_matrices().numpy()
    )
    (image,) = ours.get_images([index])
    assert np.array_equal(image.numpy(), expected)
    cameras = ours.train_dataset.cameras
    assert (
        (int(cameras.width[index]), int(cameras.height[index]))
        == (expected.shape[1], expected.shape[0])
        == (1079, 1919)
    )
    assert [float(cameras.fx[index]), float(cameras.fy[index]), float(cameras.cx[index]), float(cameras.cy[index])] == [
        float(np.float32(v)) for v in (K[0, 0], K[1, 1], K[0, 2], K[1, 2])
    ]


def test_lego_blender_rgba_composited_like_nerfstudio() -> None:
    lego = shared_scene("lego")
    manager = _manager(BlenderDataParserConfig(data=lego))
    manager.configure_training(3, 0, 1)
    batch = manager.next_train_batch(0)
    reference = InputDataset(manager.train_dataparser_outputs)
    for index, image in zip(batch.camera_indices, batch.images, strict=False):
        assert torch.equal(image, reference.get_data(index, image_type="uint8")["image"])
    manager.close()


@pytest.mark.parametrize("scene", ["lund_door", "bird"])
def test_real_colmap_scenes_load(scene: str) -> None:
    data = shared_scene(scene)
    manager = _manager(_colmap(data), camera_res_scale_factor=0.25 if scene == "lund_door" else 1.0)
    manager.configure_training(4, 1, 2)
    batch = manager.next_train_batch(0)
    assert batch.positions == [2, 3]
    cameras = manager.train_dataset.cameras
    for index, image in zip(batch.camera_indices, batch.images, strict=False):
        assert tuple(image.shape) == (int(cameras.height[index]), int(cameras.width[index]), 3)
    manager.close()
