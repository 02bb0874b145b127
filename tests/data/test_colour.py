"""Every decoder returns RGB (RGBA when the file has alpha) whatever the file's colour space (CPU).

A CMYK JPEG decoded by PIL used to reach training as 4-channel data; grey, CMYK, RGB JPEGs and a
PNG named ``.jpg`` must all come out as 3 channels (4 only for a file with alpha), at full size and
decoded at scale.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from distsplat_ns.data.decode import DECODERS, decode_bytes
from tests.helpers.data_fixtures import make_loader

# Smooth content (DCT-friendly) with odd sizes, so scaled decodes have partial blocks.
H, W = 37, 53


def _rgb() -> np.ndarray:
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:H, 0:W]
    base = np.stack([xx * 255 / W, yy * 255 / H, (xx + yy) * 255 / (W + H)], axis=-1)
    return np.clip(base + rng.normal(0, 4, base.shape), 0, 255).astype(np.uint8)


def _encode(mode: str) -> tuple[bytes, int]:
    """The file's bytes and the channel count every decoder must return."""
    buffer = io.BytesIO()
    image = Image.fromarray(_rgb())
    if mode == "png-as-jpg":
        image.save(buffer, "PNG")
        return buffer.getvalue(), 3
    if mode == "rgba-png-as-jpg":
        alpha = Image.fromarray(np.full((H, W), 128, np.uint8))
        image.putalpha(alpha)
        image.save(buffer, "PNG")
        return buffer.getvalue(), 4
    if mode == "grey-png-as-jpg":
        image.convert("L").save(buffer, "PNG")
        return buffer.getvalue(), 3
    image.convert(mode).save(buffer, "JPEG", quality=95)
    return buffer.getvalue(), 3


COLOUR_SPACES = ["L", "CMYK", "RGB", "png-as-jpg", "rgba-png-as-jpg", "grey-png-as-jpg"]


def _reference(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        has_alpha = image.mode in ("RGBA", "LA")
        return np.array(image.convert("RGBA" if has_alpha else "RGB"))


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("mode", COLOUR_SPACES)
def test_decoder_returns_rgb_whatever_the_colour_space(mode: str, decoder: str) -> None:
    data, channels = _encode(mode)
    image = decode_bytes(data, decoder)
    assert image.dtype == np.uint8 and image.shape == (H, W, channels)
    # Tolerance 1 grey level: libjpeg-turbo's own CMYK -> RGB (simplejpeg) rounds differently from
    # PIL's convert (measured: at most 1 level); grey and YCbCr JPEGs and PNGs agree exactly.
    assert np.abs(image.astype(int) - _reference(data).astype(int)).max() <= 1


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("mode", COLOUR_SPACES)
def test_decoder_returns_rgb_when_decoding_at_scale(mode: str, decoder: str) -> None:
    data, channels = _encode(mode)
    image = decode_bytes(data, decoder, scale=2)
    # DCT-scaled JPEGs are ceil(H / 2) x ceil(W / 2); torchvision and PNGs decode at full size.
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == channels
    assert image.shape[:2] in ((H, W), (-(-H // 2), -(-W // 2)))


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("mode", COLOUR_SPACES)
@pytest.mark.parametrize("downscale", [1, 2])
def test_loader_delivers_rgb_whatever_the_colour_space(tmp_path: Path, mode: str, decoder: str, downscale: int) -> None:
    data, channels = _encode(mode)
    path = tmp_path / "image.jpg"  # the extension lies for the PNGs on purpose
    path.write_bytes(data)
    image, _ = make_loader([path], decoder=decoder).load(0, downscale=downscale)
    assert image.dtype.is_floating_point is False
    assert tuple(image.shape) == (H // downscale, W // downscale, channels)
