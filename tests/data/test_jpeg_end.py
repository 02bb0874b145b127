"""Start-up refuses a JPEG cut before its end-of-image marker, naming it; padded and appended files pass (issue 20)."""

from __future__ import annotations

import io
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from nerfstudio.data.dataparsers.colmap_dataparser import ColmapDataParserConfig
from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig
from PIL import Image

from distsplat_ns.data import preflight
from distsplat_ns.data.datamanager import ParallelFullImageDatamanagerConfig
from tests.helpers.data_fixtures import LogRecords, write_nerfstudio_scene

REPO = Path(__file__).resolve().parents[2]
SHIPPED_LUND_DOOR = REPO / "scenes" / "lund_door"
SHARED_DATA = REPO.parent / "shared" / "data"
BAD_NAME = "DSC_0004.JPG"


def _sos_data_start(data: bytes) -> int:
    """Offset of the first scan's entropy-coded data (just past its start-of-scan header)."""
    sos = data.index(b"\xff\xda")
    return sos + 2 + int.from_bytes(data[sos + 2 : sos + 4], "big")


# Cut points: right after the header (the first scan's header kept, no pixel data), half-way, and
# only the end-of-image marker missing.
CUTS = {
    "after-header": lambda data: data[: _sos_data_start(data) + 16],
    "half": lambda data: data[: len(data) // 2],
    "marker-only": lambda data: data[:-2],
}


def _colmap_scene(tmp_path: Path) -> Path:
    scene = tmp_path / "lund_door"
    shutil.copytree(SHIPPED_LUND_DOOR, scene)
    return scene


def _colmap_config(scene: Path, **overrides) -> ParallelFullImageDatamanagerConfig:
    dataparser = ColmapDataParserConfig(
        data=scene, colmap_path=Path("sparse/0"), load_3D_points=True, downscale_factor=1
    )
    return ParallelFullImageDatamanagerConfig(dataparser=dataparser, num_workers=0, **overrides)


def _small_jpeg(progressive: bool = False) -> bytes:
    pixels = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90, progressive=progressive)
    return out.getvalue()


def _with_thumbnail_segment(data: bytes) -> bytes:
    """``data`` with an APP1 segment holding a whole small JPEG (as an EXIF thumbnail does), so
    that an ``FF D9`` comes before the main image's scan."""
    payload = b"Exif\x00\x00" + _small_jpeg()
    return data[:2] + b"\xff\xe1" + (len(payload) + 2).to_bytes(2, "big") + payload + data[2:]


@pytest.mark.parametrize("cut", sorted(CUTS))
def test_truncated_jpeg_fails_at_startup_naming_the_file(tmp_path: Path, cut: str) -> None:
    scene = _colmap_scene(tmp_path)
    bad = scene / "images" / BAD_NAME
    size_wh = preflight.header_size_wh(bad)
    bad.write_bytes(CUTS[cut](bad.read_bytes()))
    assert preflight.header_size_wh(bad) == size_wh, "the header must stay readable: only the body is cut"
    with pytest.raises(ValueError) as excinfo:
        _colmap_config(scene).setup(device="cpu")
    message = str(excinfo.value)
    assert "\n" not in message
    assert f"train image {bad} (dataset index" in message
    assert "truncated" in message and "end-of-image marker (FF D9)" in message


def test_shipped_scene_passes_the_startup_checks() -> None:
    manager = _colmap_config(SHIPPED_LUND_DOOR).setup(device="cpu")
    assert len(manager.train_dataset) > 0
    assert all(preflight.jpeg_is_complete(p) for p in manager.train_dataset.image_filenames)


def test_every_jpeg_of_the_shared_scenes_is_complete() -> None:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} is absent (the shared scenes are not on this machine)")
    paths = sorted(p for p in SHARED_DATA.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
    assert paths
    assert [p for p in paths if not preflight.jpeg_is_complete(p)] == []
    # The slow path agrees with the two-byte one on real files (EXIF segments included).
    for path in paths[:: max(len(paths) // 20, 1)]:
        data = path.read_bytes()
        assert preflight.jpeg_end_offset(data) == len(data), path


# What follows the end-of-image marker in valid files: padding, or a block the decoders ignore.
TRAILERS = {
    "zeros": bytes(4096),
    "ff-fill": b"\xff" * 3,
    "newline": b"\n",
    "second-jpeg": _small_jpeg(),
    "video-block": b"\x00\x00\x00\x18ftypmp42" + bytes(1000) + b"mdat",
}


@pytest.mark.parametrize("progressive", [False, True], ids=["baseline", "progressive"])
@pytest.mark.parametrize("trailer", sorted(TRAILERS))
def test_jpeg_with_bytes_after_its_end_marker_passes(tmp_path: Path, trailer: str, progressive: bool) -> None:
    path = tmp_path / "padded.jpg"
    path.write_bytes(_small_jpeg(progressive) + TRAILERS[trailer])
    assert preflight.jpeg_is_complete(path)
    # The decoder training uses agrees: strict mode turns any libjpeg warning into an error.
    assert simplejpeg.decode_jpeg(path.read_bytes(), colorspace="RGB", strict=True).shape == (48, 64, 3)


@pytest.mark.parametrize("progressive", [False, True], ids=["baseline", "progressive"])
def test_cut_jpeg_is_refused_also_when_zero_filled(tmp_path: Path, progressive: bool) -> None:
    data = _small_jpeg(progressive)
    cut = data[: int(len(data) * 0.8)]
    for name, content in (("cut.jpg", cut), ("zero_filled.jpg", cut + bytes(len(data) - len(cut)))):
        (tmp_path / name).write_bytes(content)
        assert not preflight.jpeg_is_complete(tmp_path / name), name
        with pytest.raises(ValueError, match="Premature end of JPEG file"):
            simplejpeg.decode_jpeg(content, colorspace="RGB", strict=True)


def test_end_marker_inside_an_earlier_segment_does_not_hide_a_cut(tmp_path: Path) -> None:
    data = _with_thumbnail_segment(_small_jpeg())
    whole, cut = tmp_path / "whole.jpg", tmp_path / "cut.jpg"
    whole.write_bytes(data + bytes(8))  # not ending with FF D9: the segment walk decides
    cut.write_bytes(data[: int(len(data) * 0.9)])
    assert preflight.jpeg_is_complete(whole)
    assert not preflight.jpeg_is_complete(cut)


def test_files_that_are_not_jpeg_are_not_checked(tmp_path: Path) -> None:
    path = tmp_path / "named_jpg_but_png.jpg"
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(path, format="PNG")
    path.write_bytes(path.read_bytes()[:-20])
    assert preflight.jpeg_is_complete(path)


def test_truncated_jpeg_mask_fails_at_startup_naming_the_mask(tmp_path: Path) -> None:
    scene = write_nerfstudio_scene(tmp_path / "scene", num_frames=6, with_masks=True)
    mask = min((scene / "masks").glob("*.png"))
    size = Image.open(mask).size
    out = io.BytesIO()
    Image.fromarray(np.full((size[1], size[0]), 255, np.uint8)).save(out, format="JPEG")
    mask.write_bytes(out.getvalue()[:-2])  # a JPEG mask, whatever its name, cut before its marker
    config = ParallelFullImageDatamanagerConfig(
        dataparser=NerfstudioDataParserConfig(data=scene, downscale_factor=1), num_workers=0
    )
    with pytest.raises(ValueError, match=f"mask {mask} \\(dataset index \\d+\\) is truncated"):
        config.setup(device="cpu")


def test_skip_corrupt_images_logs_a_truncated_jpeg_at_startup_and_drops_it_when_drawn(tmp_path: Path) -> None:
    scene = _colmap_scene(tmp_path)
    bad = scene / "images" / BAD_NAME
    bad.write_bytes(CUTS["half"](bad.read_bytes()))
    handler = LogRecords()
    logger = logging.getLogger("distsplat_ns")
    logger.addHandler(handler)
    try:
        manager = _colmap_config(scene, skip_corrupt_images=True).setup(device="cpu")
    finally:
        logger.removeHandler(handler)
    logged = [m for m in handler.messages if "truncated" in m]
    assert len(logged) == 1 and str(bad) in logged[0] and "skip_corrupt_images" in logged[0]
    index = [Path(p).name for p in manager.train_dataset.image_filenames].index(BAD_NAME)
    num_images = len(manager.train_dataset)
    manager.configure_training(num_images, rank=0, world_size=1)
    try:
        batch = manager.next_train_batch(0)
    finally:
        manager.close()
    assert index in batch.skipped_indices and index not in batch.camera_indices
