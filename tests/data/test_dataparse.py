"""A dataparser downscale factor without a pre-made images_N folder: no prompt, cameras as nerfstudio's,
images decoded at 1/N; folders that exist are still used (CPU)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from nerfstudio.data.dataparsers.colmap_dataparser import ColmapDataParserConfig
from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig
from PIL import Image
from rich.prompt import Confirm

from distsplat_ns.data.datamanager import ParallelFullImageDatamanager, ParallelFullImageDatamanagerConfig
from distsplat_ns.data.decode import decode_bytes
from distsplat_ns.data.resize import box_downscale
from tests.helpers.data_fixtures import write_nerfstudio_scene

SHIPPED_LUND_DOOR = Path(__file__).resolve().parents[2] / "scenes" / "lund_door"


@pytest.fixture(autouse=True)
def no_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    """nerfstudio's colmap dataparser asks on stdin (rich Confirm) when images_N is missing: forbidden."""

    def _prompted(*args, **kwargs):
        raise AssertionError(f"the dataparser prompted: {args[1:2]}")

    monkeypatch.setattr(Confirm, "ask", classmethod(_prompted))


@pytest.fixture()
def lund_door_copy(tmp_path: Path) -> Path:
    target = tmp_path / "lund_door"
    shutil.copytree(SHIPPED_LUND_DOOR, target)
    return target


def _colmap(data: Path, factor: int | None) -> ColmapDataParserConfig:
    return ColmapDataParserConfig(data=data, colmap_path=Path("sparse/0"), load_3D_points=True, downscale_factor=factor)


def _manager(dataparser) -> ParallelFullImageDatamanager:
    return ParallelFullImageDatamanagerConfig(dataparser=dataparser, num_workers=0, eval_num_workers=0).setup(
        device="cpu"
    )


def _make_downscaled_folder(scene: Path, factor: int) -> None:
    """images_N as a user would have it (box-averaged copies, floor sizes)."""
    out = scene / f"images_{factor}"
    out.mkdir()
    for path in sorted((scene / "images").iterdir()):
        full = decode_bytes(path.read_bytes(), "simplejpeg")
        small = box_downscale(full, factor, (full.shape[0] // factor, full.shape[1] // factor))
        Image.fromarray(small).save(out / path.name, quality=95)


def _camera_fields(manager: ParallelFullImageDatamanager) -> dict[str, torch.Tensor]:
    cameras = manager.train_dataset.cameras
    return {name: getattr(cameras, name) for name in ("fx", "fy", "cx", "cy", "width", "height", "camera_to_worlds")}


def test_colmap_downscale_without_folder_trains_at_the_camera_size(lund_door_copy: Path) -> None:
    manager = _manager(_colmap(lund_door_copy, 4))
    try:
        assert all("/images/" in str(p) for p in manager.train_dataparser_outputs.image_filenames)
        assert not (lund_door_copy / "images_4").exists()  # nothing written
        parsed = manager.train_dataparser_outputs.cameras
        # lund_door is 162x242 (WxH): nerfstudio's floor rounding gives 40x60 (before undistortion)
        assert set(parsed.width.reshape(-1).tolist()) == {40} and set(parsed.height.reshape(-1).tolist()) == {60}
        cameras = manager.train_dataset.cameras  # undistorted: the delivered pixels' size
        manager.configure_training(batch_size=3, rank=0, world_size=1)
        batch = manager.next_train_batch(0)
        for index, image in zip(batch.camera_indices, batch.images, strict=False):
            assert tuple(image.shape) == (int(cameras.height[index]), int(cameras.width[index]), 3)
        camera, data = manager.next_eval_image(0)
        assert tuple(data["image"].shape) == (int(camera.height), int(camera.width), 3)
    finally:
        manager.close()


def test_colmap_downscale_cameras_equal_those_of_an_existing_folder(lund_door_copy: Path, tmp_path: Path) -> None:
    without = _manager(_colmap(lund_door_copy, 4))
    with_folder_scene = tmp_path / "with_folder"
    shutil.copytree(lund_door_copy, with_folder_scene)
    _make_downscaled_folder(with_folder_scene, 4)
    with_folder = _manager(_colmap(with_folder_scene, 4))
    try:
        # the existing folder is used ...
        assert all("/images_4/" in str(p) for p in with_folder.train_dataparser_outputs.image_filenames)
        # ... and the cameras parsed at factor 1 then rescaled are nerfstudio's own, exactly
        for name, value in _camera_fields(without).items():
            assert torch.equal(value, _camera_fields(with_folder)[name]), name
        a = without.get_images([0])[0].numpy().astype(np.float64)
        b = with_folder.get_images([0])[0].numpy().astype(np.float64)
        assert a.shape == b.shape
        # Same pixels up to the DCT-scaled decode (>= 45 dB, tests/data/test_decode_scale.py) and the
        # folder's JPEG re-encoding at 40x60 px (quality 95), which costs more at that size: measured
        # 38.2 dB; bound 35 dB (a one-pixel shift of the grid gives ~20 dB on these images).
        assert 10 * np.log10(255.0**2 / ((a - b) ** 2).mean()) >= 35.0
    finally:
        without.close()
        with_folder.close()


def test_colmap_auto_factor_without_folder_does_not_prompt(tmp_path: Path) -> None:
    # Images over 1600 px and no --downscale-factor: nerfstudio picks 2 and asks to create images_2.
    scene = tmp_path / "big"
    shutil.copytree(SHIPPED_LUND_DOOR, scene)
    # Only the parse is checked (the COLMAP cameras still say 162x242): the files are 1620x2420.
    for path in (scene / "images").iterdir():
        image = Image.open(path).convert("RGB")
        image.resize((image.width * 10, image.height * 10)).save(path, quality=80)
    from distsplat_ns.data.dataparse import DownscaledParse

    parse = DownscaledParse(_colmap(scene, None))
    assert parse.source_downscale == 2 and parse.missing_folder == "images_2"


def test_nerfstudio_data_downscale_without_folder(tmp_path: Path) -> None:
    scene = write_nerfstudio_scene(tmp_path / "ns", num_frames=4, size_hw=(61, 83))
    manager = _manager(NerfstudioDataParserConfig(data=scene, downscale_factor=2, eval_mode="all"))
    try:
        parsed = manager.train_dataparser_outputs.cameras
        assert set(parsed.width.reshape(-1).tolist()) == {41} and set(parsed.height.reshape(-1).tolist()) == {30}
        cameras = manager.train_dataset.cameras  # undistorted (the scene has p1 != 0)
        (image,) = manager.get_images([0])
        assert tuple(image.shape) == (int(cameras.height[0]), int(cameras.width[0]), 3)
    finally:
        manager.close()


def test_downscale_one_is_untouched(lund_door_copy: Path) -> None:
    manager = _manager(_colmap(lund_door_copy, 1))
    try:
        assert manager._parse.source_downscale == 1
        assert set(manager.train_dataparser_outputs.cameras.width.reshape(-1).tolist()) == {162}
    finally:
        manager.close()
