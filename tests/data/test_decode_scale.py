"""Decode at the training scale: sizes follow the model's rule, pixels match full decode + resize (CPU)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from nerfstudio.models.splatfacto import resize_image
from PIL import Image

from distsplat_ns.data.decode import DECODERS, decode_bytes
from distsplat_ns.data.image_loader import ImageLoader, ImageSpec
from distsplat_ns.data.reader import TrainBatchReader
from distsplat_ns.data.resize import box_downscale
from distsplat_ns.data.store import EncodedImageStore
from distsplat_ns.data.stream import ImageBatchStream
from distsplat_ns.utils.cameras import downscaled_px
from tests.helpers.data_fixtures import make_loader, write_images

REPO = Path(__file__).resolve().parents[2]
# Real photos (natural content: the DCT-scaled decode is a low-pass meant for such images), 242x162
# portrait: both sides odd at 1/4 (60.5 x 40.5), so the partial-block rule is exercised.
LUND_DOOR = sorted((REPO / "scenes" / "lund_door" / "images").glob("*.JPG"))[:3]
ODD_SIZES_HW = [(37, 53), (101, 151), (64, 48), (9, 17)]


def _model_reference(full: np.ndarray, downscale: int) -> np.ndarray:
    """What the model does today with a full-size image: splatfacto's resize_image, in [0, 255]."""
    if downscale == 1:
        return full.astype(np.float64)
    return resize_image(torch.from_numpy(full).double(), downscale).double().numpy()


def _full_decode(path: Path) -> np.ndarray:
    return decode_bytes(path.read_bytes(), "simplejpeg")


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("downscale", [1, 2, 3, 4, 8, 16])
@pytest.mark.parametrize("size_hw", ODD_SIZES_HW)
def test_decoded_size_is_the_rendered_size(
    tmp_path: Path, decoder: str, downscale: int, size_hw: tuple[int, int]
) -> None:
    (path,) = write_images(tmp_path, [size_hw], seed=1)
    image, _ = make_loader([path], decoder=decoder).load_array(0, downscale=downscale)
    expected = (downscaled_px(size_hw[0], downscale), downscaled_px(size_hw[1], downscale))
    assert image.shape == (*expected, 3)
    # The model's own resize of the full image gives the same size: it then skips its resize.
    if min(size_hw) >= downscale:
        assert _model_reference(_full_decode(path), downscale).shape[:2] == expected


@pytest.mark.parametrize("downscale", [2, 3, 4, 8])
@pytest.mark.parametrize("path", LUND_DOOR, ids=lambda p: p.name)
def test_torchvision_at_scale_is_the_exact_box_average(path: Path, downscale: int) -> None:
    # torchvision cannot scale in the DCT domain: full decode + box average, which is the model's
    # resize_image rounded to uint8, so within 0.5 grey level (+ float64 summation noise).
    image, _ = make_loader([path], decoder="torchvision").load_array(0, downscale=downscale)
    reference = _model_reference(_full_decode(path), downscale)
    assert np.abs(image - reference).max() <= 0.5 + 1e-6


@pytest.mark.parametrize("decoder", ["simplejpeg", "pil"])
@pytest.mark.parametrize("downscale", [2, 4, 8])
@pytest.mark.parametrize("path", LUND_DOOR, ids=lambda p: p.name)
def test_dct_scaled_decode_is_close_to_full_decode_plus_resize(path: Path, decoder: str, downscale: int) -> None:
    image, _ = make_loader([path], decoder=decoder).load_array(0, downscale=downscale)
    reference = _model_reference(_full_decode(path), downscale)
    diff = image.astype(np.float64) - reference
    # libjpeg-turbo's scaled IDCT drops the high DCT coefficients instead of averaging pixels: a
    # different low-pass on the same pixel grid. Measured on lund_door, bird and fox (docs/data.md):
    # mean |diff| 0.07-0.57 grey levels, PSNR 49.6-63 dB, single pixels at sharp edges up to 13
    # levels. Bounds: mean 1 level, PSNR 45 dB (a grid shifted by one pixel gives ~25 dB).
    assert np.abs(diff).mean() <= 1.0
    assert 10 * np.log10(255.0**2 / (diff**2).mean()) >= 45.0


def test_box_downscale_is_the_rounded_block_mean() -> None:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (103, 77, 3), dtype=np.uint8)
    for factor in (2, 3, 4, 8):
        size_hw = (103 // factor, 77 // factor)
        block_means = (
            image[: size_hw[0] * factor, : size_hw[1] * factor]
            .reshape(size_hw[0], factor, size_hw[1], factor, 3)
            .mean(axis=(1, 3))
        )
        out = box_downscale(image, factor, size_hw)
        assert out.shape == (*size_hw, 3) and out.dtype == np.uint8
        assert np.abs(out - block_means).max() <= 0.5 + 1e-9  # "exact": rounding to uint8 only


def test_masks_stay_at_full_resolution(tmp_path: Path) -> None:
    (path,) = write_images(tmp_path / "img", [(48, 64)], seed=2)
    mask_path = tmp_path / "mask.png"
    Image.fromarray(np.full((48, 64), 255, np.uint8)).save(mask_path)
    image, mask = make_loader([path], masks=[mask_path]).load_array(0, downscale=4)
    assert image.shape == (12, 16, 3) and mask is not None and mask.shape == (48, 64, 1)


def _loader_with_spec(paths: list[Path], spec: ImageSpec, decoder: str = "simplejpeg") -> ImageLoader:
    store = EncodedImageStore(paths, 1 << 30, name="test images")
    return ImageLoader(store, [spec] * len(paths), decoder=decoder)


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("source_downscale", [2, 4])
def test_source_downscale_decodes_the_file_at_the_camera_size(decoder: str, source_downscale: int) -> None:
    path = LUND_DOOR[0]
    full = _full_decode(path)
    parsed = (full.shape[0] // source_downscale, full.shape[1] // source_downscale)
    spec = ImageSpec(height=parsed[0], width=parsed[1], source_downscale=source_downscale, parsed_size_hw=parsed)
    image, _ = _loader_with_spec([path], spec, decoder).load_array(0)
    assert image.shape == (*parsed, 3)
    diff = image.astype(np.float64) - _model_reference(full, source_downscale)
    assert 10 * np.log10(255.0**2 / (diff**2).mean()) >= 45.0  # as the DCT test above
    # and the training schedule composes with it: 1/(N*d) of the file, the camera's size // d
    small, _ = _loader_with_spec([path], spec, decoder).load_array(0, downscale=2)
    assert small.shape == (parsed[0] // 2, parsed[1] // 2, 3)


def test_source_downscale_rejects_a_file_of_the_wrong_size(tmp_path: Path) -> None:
    (path,) = write_images(tmp_path, [(48, 64)], seed=3)
    spec = ImageSpec(height=20, width=16, source_downscale=2, parsed_size_hw=(20, 16))
    with pytest.raises(
        ValueError, match=r"image .*\.jpg \(dataset index 0\) is 64x48 \(WxH\), but its camera says 16x20 at 1/2"
    ):
        _loader_with_spec([path], spec).load_array(0)


def test_undistorted_images_are_box_averaged_after_undistortion() -> None:
    from distsplat_ns.data.undistort import UndistortSpec

    path = LUND_DOOR[0]
    full = _full_decode(path)
    h, w = full.shape[:2]
    K = (200.0, 0.0, w / 2 - 0.5, 0.0, 200.0, h / 2 - 0.5, 0.0, 0.0, 1.0)
    undistort = UndistortSpec(
        "perspective", K, (0.05, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0), K, (w, h), (2, 3, w - 5, h - 7)
    )
    spec = ImageSpec(height=h, width=w, undistort=undistort)
    at_full, _ = _loader_with_spec([path], spec).load_array(0)
    at_scale, _ = _loader_with_spec([path], spec).load_array(0, downscale=4)
    size = (downscaled_px(h - 7, 4), downscaled_px(w - 5, 4))
    assert at_scale.shape == (*size, 3)
    assert np.array_equal(at_scale, box_downscale(at_full, 4, size))


def _schedule(step: int) -> int:
    return 4 if step < 2 else (2 if step < 4 else 1)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stream_decodes_each_step_at_its_scale(tmp_path: Path, num_workers: int) -> None:
    sizes = [(48, 64), (40, 56), (64, 48), (37, 53)]
    paths = write_images(tmp_path, sizes, seed=4)
    loader = make_loader(paths)
    stream = ImageBatchStream(loader, batch_size=3, seed=0, downscale_at=_schedule)
    reader = TrainBatchReader(stream, num_workers, prefetch_batches=2)
    try:
        for step in range(6):
            batch = reader.next_batch(step)
            d = _schedule(step)
            for index, image in zip(batch.camera_indices, batch.images, strict=False):
                full = loader.load_array(index)[0]
                expected, _ = loader.load_array(index, downscale=d)
                assert tuple(image.shape[:2]) == (downscaled_px(sizes[index][0], d), downscaled_px(sizes[index][1], d))
                assert np.array_equal(image.numpy(), expected)
                assert full.shape[:2] == sizes[index]
    finally:
        reader.close()


def test_bad_schedule_value_names_the_step(tmp_path: Path) -> None:
    paths = write_images(tmp_path, [(16, 16)], seed=5)
    stream = ImageBatchStream(make_loader(paths), batch_size=1, seed=0, downscale_at=lambda step: 0)
    with pytest.raises(ValueError, match=r"downscale_at\(0\) must return an int >= 1, got 0"):
        next(iter(stream))


def test_model_gt_image_skips_its_resize_for_images_at_the_rendered_size() -> None:
    # The model's size rule (band_terms.py:BandTerms.gt_image): an image already at the rendered size is
    # used as is, a full-size one is resized; both give the same ground truth here (up to rounding).
    from tests.helpers.model_factory import make_model

    full = _full_decode(LUND_DOOR[0])
    h, w = full.shape[:2]
    for d in (2, 4):
        small = box_downscale(full, d, (downscaled_px(h, d), downscaled_px(w, d)))
        model = make_model(batch_size=1)
        bg = torch.zeros(3, dtype=model.compute_dtype)
        gt_small = model.band_terms.gt_image(torch.from_numpy(small), bg, d, small.shape[:2])
        gt_full = model.band_terms.gt_image(torch.from_numpy(full), bg, d, small.shape[:2])
        assert gt_small.shape == gt_full.shape
        assert (gt_small - gt_full).abs().max() <= 0.5 / 255 + 1e-6  # uint8 rounding of the box mean


@pytest.mark.parametrize("batch_size,num_downscales,schedule", [(1, 2, 100), (4, 2, 3000), (3, 3, 250), (2, 0, 10)])
def test_resolution_schedule_is_the_models_and_pickles_small(
    batch_size: int, num_downscales: int, schedule: int
) -> None:
    import pickle

    from distsplat_ns.utils.cameras import ResolutionSchedule
    from tests.helpers.model_factory import make_model

    model = make_model(batch_size=batch_size, num_downscales=num_downscales, resolution_schedule=schedule)
    rule = ResolutionSchedule(num_downscales, schedule, batch_size)
    steps = list(range(4 * schedule // batch_size + 3))
    assert [rule(t) for t in steps] == [model.downscale_factor_at(t) for t in steps]
    assert len(pickle.dumps(rule)) < 1024  # what forkserver/spawn workers receive


@pytest.mark.parametrize(
    "spec,file_hw,matches",
    [
        (ImageSpec(height=60, width=40), (60, 40), True),
        (ImageSpec(height=60, width=40), (61, 40), False),
        (ImageSpec(height=30, width=20, scale_factor=0.5), (60, 40), True),
        (ImageSpec(height=60, width=40, source_downscale=4, parsed_size_hw=(60, 40)), (242, 162), True),  # floor
        (ImageSpec(height=61, width=41, source_downscale=4, parsed_size_hw=(61, 41)), (242, 162), True),  # ceil
        (ImageSpec(height=60, width=40, source_downscale=4, parsed_size_hw=(60, 40)), (250, 162), False),
    ],
)
def test_file_size_matches_the_camera(spec: ImageSpec, file_hw: tuple[int, int], matches: bool) -> None:
    from distsplat_ns.data.image_loader import file_size_matches

    assert file_size_matches(spec, file_hw) is matches
