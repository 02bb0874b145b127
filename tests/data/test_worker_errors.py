"""Errors name their cause: decode errors from DataLoader workers, missing files, preflight checks (CPU)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from nerfstudio.data.dataparsers.colmap_dataparser import ColmapDataParserConfig
from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig
from PIL import Image

from distsplat_ns.data.datamanager import ParallelFullImageDatamanagerConfig
from distsplat_ns.data.reader import TrainBatchReader
from distsplat_ns.data.store import EncodedImageStore
from distsplat_ns.data.stream import ImageBatchStream
from tests.helpers.data_fixtures import LogRecords, make_loader, write_nerfstudio_scene

SHIPPED_LUND_DOOR = Path(__file__).resolve().parents[2] / "scenes" / "lund_door"
BAD = 5


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _zero_bytes(path: Path) -> None:
    path.write_bytes(b"")


def _wrong_size(path: Path) -> None:
    Image.fromarray(np.full((20, 30, 3), 128, np.uint8)).save(path, format="JPEG")


def _delete(path: Path) -> None:
    path.unlink()


def _corrupt(path: Path) -> None:
    # Garbage in the middle of the entropy-coded data; header and end marker intact.
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 200] = np.random.default_rng(0).integers(0, 256, 200, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))


# (damage, what the decoder's reason says)
PROBLEMS = {
    "truncated": (_truncate, "Premature end of JPEG file"),
    "zero-byte": (_zero_bytes, "cannot identify image file"),
    "wrong-size": (_wrong_size, "30x20"),
    "deleted": (_delete, "No such file or directory"),
    "corrupt": (_corrupt, "Corrupt JPEG data"),
}


@pytest.fixture()
def good_copy(tmp_path: Path, jpeg_paths: list[Path]) -> list[Path]:
    paths = []
    for path in jpeg_paths:
        target = tmp_path / path.name
        target.write_bytes(path.read_bytes())
        paths.append(target)
    return paths


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("problem", sorted(PROBLEMS))
def test_decode_error_reaches_the_consumer_with_file_index_and_reason(
    good_copy: list[Path], problem: str, num_workers: int
) -> None:
    # The files go bad after start-up (the preflight checks passed): disk mode reads them then.
    loader = make_loader(good_copy, ram_budget_bytes=1)
    damage, reason = PROBLEMS[problem]
    damage(good_copy[BAD])
    reader = TrainBatchReader(ImageBatchStream(loader, len(good_copy), seed=3), num_workers, 2)
    with pytest.raises(ValueError) as excinfo:
        reader.next_batch(0)
    first_line = str(excinfo.value).splitlines()[0]
    assert str(good_copy[BAD]) in first_line
    assert f"dataset index {BAD}" in first_line
    assert reason in first_line
    assert "DataLoader worker" not in str(excinfo.value)


def test_decode_error_in_an_eval_worker_names_the_file(tmp_path: Path) -> None:
    scene = write_nerfstudio_scene(tmp_path / "scene", num_frames=10)
    manager = ParallelFullImageDatamanagerConfig(
        dataparser=NerfstudioDataParserConfig(data=scene, downscale_factor=1), eval_num_workers=2
    ).setup(device="cpu")
    bad = manager.eval_dataset.image_filenames[0]
    _truncate(Path(bad))
    with pytest.raises(ValueError) as excinfo:
        list(manager.fixed_indices_eval_dataloader)
    first_line = str(excinfo.value).splitlines()[0]
    assert str(bad) in first_line and "dataset index 0" in first_line


def test_missing_files_error_lists_them_on_one_line(tmp_path: Path, jpeg_paths: list[Path]) -> None:
    paths = list(jpeg_paths) + [tmp_path / "gone_1.jpg", tmp_path / "gone_2.jpg"]
    with pytest.raises(FileNotFoundError) as excinfo:
        EncodedImageStore(paths, 1 << 30)
    message = str(excinfo.value)
    assert "\n" not in message
    assert "2 of 14 image files are missing" in message and "gone_1.jpg" in message and "gone_2.jpg" in message


# ---------------------------------------------------------------------------------- preflight
def _colmap_scene(tmp_path: Path) -> Path:
    scene = tmp_path / "lund_door"
    shutil.copytree(SHIPPED_LUND_DOOR, scene)
    return scene


def _colmap_manager(scene: Path, **overrides):
    dataparser = ColmapDataParserConfig(
        data=scene, colmap_path=Path("sparse/0"), load_3D_points=True, downscale_factor=1
    )
    return ParallelFullImageDatamanagerConfig(dataparser=dataparser, num_workers=0, **overrides).setup(device="cpu")


@pytest.mark.parametrize("via_datamanager_flag", [False, True])
def test_missing_data_path_is_a_one_line_error_naming_it(tmp_path: Path, via_datamanager_flag: bool) -> None:
    missing = tmp_path / "no_such_scene"
    if via_datamanager_flag:
        config = ParallelFullImageDatamanagerConfig(data=missing, dataparser=NerfstudioDataParserConfig())
    else:
        config = ParallelFullImageDatamanagerConfig(dataparser=NerfstudioDataParserConfig(data=missing))
    with pytest.raises(ValueError) as excinfo:
        config.setup(device="cpu")
    message = str(excinfo.value)
    assert "\n" not in message and str(missing) in message and "does not exist" in message
    assert "--data" in message


def test_missing_image_listed_at_startup_on_one_line(tmp_path: Path) -> None:
    scene = _colmap_scene(tmp_path)
    (scene / "images" / "DSC_0004.JPG").unlink()
    with pytest.raises(FileNotFoundError) as excinfo:
        _colmap_manager(scene)
    assert "\n" not in str(excinfo.value) and "DSC_0004.JPG" in str(excinfo.value)


@pytest.mark.parametrize(
    "problem, expected", [("zero-byte", "no readable image header"), ("wrong-size", "camera says")]
)
def test_bad_image_header_fails_at_startup_naming_the_file(tmp_path: Path, problem: str, expected: str) -> None:
    scene = _colmap_scene(tmp_path)
    bad = scene / "images" / "DSC_0004.JPG"
    PROBLEMS[problem][0](bad)
    with pytest.raises(ValueError) as excinfo:
        _colmap_manager(scene)
    message = str(excinfo.value)
    assert "\n" not in message and str(bad) in message and expected in message


def test_bad_mask_size_fails_at_startup_naming_the_mask(tmp_path: Path) -> None:
    scene = write_nerfstudio_scene(tmp_path / "scene", num_frames=6, with_masks=True)
    mask = min((scene / "masks").glob("*.png"))
    Image.fromarray(np.zeros((10, 10), np.uint8)).save(mask)
    with pytest.raises(ValueError, match=f"mask {mask} .* 10x10"):
        ParallelFullImageDatamanagerConfig(
            dataparser=NerfstudioDataParserConfig(data=scene, downscale_factor=1), num_workers=0
        ).setup(device="cpu")


# ---------------------------------------------------------------------------------- batch size
def test_batch_larger_than_training_set_is_allowed_and_logged_once() -> None:
    manager = _colmap_manager(SHIPPED_LUND_DOOR)
    handler = LogRecords()
    logger = logging.getLogger("distsplat_ns")
    logger.addHandler(handler)
    try:
        num_images = len(manager.train_dataset)
        for start_step in (0, 3):
            manager.configure_training(num_images + 2, rank=0, world_size=1, start_step=start_step)
            assert len(manager.next_train_batch(start_step).images) == num_images + 2
    finally:
        logger.removeHandler(handler)
        manager.close()
    logged = [m for m in handler.messages if "larger than the" in m]
    assert len(logged) == 1 and f"batch size {num_images + 2}" in logged[0]
