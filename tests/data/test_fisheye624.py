"""FISHEYE624 (Project Aria) undistortion against nerfstudio 1.1.5's ``_undistort_image``, bit for bit,
its generated mask on every delivery path, and its start-up refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from nerfstudio.cameras.cameras import Cameras, CameraType
from nerfstudio.data.datamanagers.full_images_datamanager import _undistort_image
from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig

from distsplat_ns.data.datamanager import ParallelFullImageDatamanager, ParallelFullImageDatamanagerConfig
from distsplat_ns.data.undistort import MapCache, Undistortion, undistort, undistort_intrinsics
from distsplat_ns.utils.errors import UserError
from tests.helpers.data_fixtures import FISHEYE624_PARAMS, write_nerfstudio_scene

#: ``(W, H, fx, fy, cx, cy, fisheye_crop_radius)``: a wide image whose principal point is off centre
#: (not symmetric under swapping x and y, so a transposed map would show), and a near-square one of
#: odd sides (the mask circle's centre is ``(H // 2, W // 2)``) with a fractional radius.
CAMERAS = {
    "wide-asymmetric": (96, 80, 41.3, 41.5, 48.7, 39.6, 35.0),
    "odd-sides-fractional-radius": (81, 79, 34.4, 34.4, 40.2, 39.9, 37.3),
}


def _nerfstudio_camera(width: int, height: int, fx: float, fy: float, cx: float, cy: float, radius: float) -> Cameras:
    return Cameras(
        fx=fx,
        fy=fy,
        cx=cx,
        cy=cy,
        width=width,
        height=height,
        distortion_params=torch.tensor(FISHEYE624_PARAMS, dtype=torch.float32),
        camera_type=CameraType.FISHEYE624,
        camera_to_worlds=torch.eye(4)[None, :3, :4],
        metadata={"fisheye_crop_radius": radius},
    )


def _ours(cameras: Cameras, radius: float | None) -> Undistortion | None:
    columns = [getattr(cameras, name)[:, 0].numpy() for name in ("fx", "fy", "cx", "cy", "width", "height")]
    (result,) = undistort_intrinsics(
        ["FISHEYE624"], *columns, cameras.distortion_params.numpy(), fisheye_crop_radius=[radius]
    )
    return result


def _image(height: int, width: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    gradient = np.stack([xx * 255.0 / width, yy * 255.0 / height, np.full((height, width), 90.0)], -1)
    return np.clip(gradient + rng.normal(0.0, 30.0, (height, width, 3)), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("name", list(CAMERAS))
def test_fisheye624_undistortion_matches_nerfstudio_bit_for_bit(name: str) -> None:
    width, height, fx, fy, cx, cy, radius = CAMERAS[name]
    cameras = _nerfstudio_camera(width, height, fx, fy, cx, cy, radius)
    camera = cameras[0].reshape(())  # as nerfstudio's _load_images takes it
    image = _image(height, width, seed=3)
    K, expected_image, expected_mask = _undistort_image(
        camera, camera.distortion_params.numpy(), {}, image.copy(), camera.get_intrinsics_matrices().numpy()
    )
    result = _ours(cameras, radius)
    assert result is not None
    side = int(2 * radius)
    assert (result.width, result.height) == (side, side) == (expected_image.shape[1], expected_image.shape[0])
    assert [result.fx, result.fy, result.cx, result.cy] == [
        float(K[0, 0]),
        float(K[1, 1]),
        float(K[0, 2]),
        float(K[1, 2]),
    ]
    ours_image, ours_mask = undistort(image, None, result.spec, MapCache())
    assert np.array_equal(ours_image, expected_image)
    assert ours_mask is not None and ours_mask.dtype == np.bool_
    assert np.array_equal(ours_mask, expected_mask.numpy())
    assert 0.2 < ours_mask.mean() < 1.0  # the crop circle's edge is inside the delivered square


def test_fisheye624_maps_and_mask_are_built_once_per_camera() -> None:
    width, height, fx, fy, cx, cy, radius = CAMERAS["wide-asymmetric"]
    cameras = _nerfstudio_camera(width, height, fx, fy, cx, cy, radius)
    camera = cameras[0].reshape(())
    result = _ours(cameras, radius)
    assert result is not None
    cache = MapCache()
    _, first_mask = undistort(_image(height, width, seed=1), None, result.spec, cache)
    second = _image(height, width, seed=2)
    second_image, second_mask = undistort(second, None, result.spec, cache)
    assert cache.num_built == 1  # the second image hit the cache
    _, expected_image, expected_mask = _undistort_image(
        camera, camera.distortion_params.numpy(), {}, second.copy(), camera.get_intrinsics_matrices().numpy()
    )
    assert np.array_equal(second_image, expected_image) and np.array_equal(second_mask, expected_mask.numpy())
    # Each image gets its own mask array: changing one leaves the cache and the others alone.
    first_mask[:] = False
    assert np.array_equal(second_mask, expected_mask.numpy())
    assert np.array_equal(undistort(second, None, result.spec, cache)[1], expected_mask.numpy())


def test_fisheye624_without_distortion_is_left_alone_without_a_radius() -> None:
    # As nerfstudio: all-zero distortion parameters mean no undistortion, whatever the model.
    cameras = _nerfstudio_camera(96, 80, 41.3, 41.5, 48.7, 39.6, 35.0)
    cameras.distortion_params = torch.zeros_like(cameras.distortion_params)
    assert _ours(cameras, None) is None


@pytest.mark.parametrize("radius", [None, 0.2, "35", True], ids=["absent", "too-small", "string", "bool"])
def test_fisheye624_without_a_usable_crop_radius_is_refused(radius: object) -> None:
    cameras = _nerfstudio_camera(96, 80, 41.3, 41.5, 48.7, 39.6, 35.0)
    with pytest.raises(UserError, match="fisheye_crop_radius in transforms.json") as info:
        _ours(cameras, radius)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_other_distorted_models_still_refused_naming_the_supported_ones() -> None:
    with pytest.raises(NotImplementedError, match="perspective, fisheye and FISHEYE624 are"):
        undistort_intrinsics(
            ["EQUIRECTANGULAR"],
            *([np.ones(1, np.float32)] * 4),
            np.array([8]),
            np.array([6]),
            np.full((1, 6), 0.1, np.float32),
        )


def test_mask_given_with_a_fisheye624_spec_is_an_error() -> None:
    cameras = _nerfstudio_camera(96, 80, 41.3, 41.5, 48.7, 39.6, 35.0)
    result = _ours(cameras, 35.0)
    assert result is not None
    with pytest.raises(ValueError, match="generates its own mask"):
        undistort(_image(80, 96, 0), np.ones((80, 96, 1), bool), result.spec, MapCache())


# ---------------------------------------------------------------------------------- the datamanager


def _scene_manager(scene: Path, num_workers: int = 0) -> ParallelFullImageDatamanager:
    dataparser = NerfstudioDataParserConfig(data=scene, downscale_factor=1, eval_mode="all")
    return ParallelFullImageDatamanagerConfig(dataparser=dataparser, num_workers=num_workers, eval_num_workers=0).setup(
        device="cpu"
    )


def test_fisheye624_scene_without_crop_radius_is_refused_at_startup(tmp_path: Path) -> None:
    scene = write_nerfstudio_scene(tmp_path / "scene", num_frames=2, camera_model="FISHEYE624")
    with pytest.raises(UserError, match="FISHEYE624 cameras need fisheye_crop_radius in transforms.json") as info:
        _scene_manager(scene)
    assert "\n" not in str(info.value)


def test_fisheye624_scene_with_mask_files_is_refused_at_startup(tmp_path: Path) -> None:
    scene = write_nerfstudio_scene(
        tmp_path / "scene", num_frames=2, camera_model="FISHEYE624", fisheye_crop_radius=27.5, with_masks=True
    )
    with pytest.raises(UserError, match="mask_path in transforms.json") as info:
        _scene_manager(scene)
    assert "\n" not in str(info.value)


def test_fisheye624_generated_mask_reaches_every_delivery_path(tmp_path: Path) -> None:
    # No mask files: the masks come from the undistortion alone, on the stream (a worker), the
    # in-process fallback, nerfstudio's next_train and the eval images, as the model's loss takes them.
    scene = write_nerfstudio_scene(
        tmp_path / "scene", num_frames=3, camera_model="FISHEYE624", fisheye_crop_radius=27.5
    )
    manager = _scene_manager(scene, num_workers=1)
    expected = {i: mask for i, (_, mask) in enumerate(manager.get_images_and_masks([0, 1, 2]))}
    assert all(m is not None and m.dtype == torch.bool and tuple(m.shape) == (55, 55, 1) for m in expected.values())
    assert not bool(expected[0].all()) and bool(expected[0].any())
    manager.configure_training(3, 0, 1)
    batch = manager.next_train_batch(0)
    for index, mask in zip(batch.camera_indices, batch.masks, strict=True):
        assert torch.equal(mask, expected[index])
    camera, data = manager.next_train(0)
    assert torch.equal(data["mask"], expected[data["image_idx"]])
    assert tuple(data["mask"].shape[:2]) == (int(camera.height), int(camera.width))
    _, data = manager.next_eval_image(0)
    assert torch.equal(data["mask"], expected[data["image_idx"]])
    manager.close()
