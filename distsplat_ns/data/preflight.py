"""Checks of a scene's files before the first training step: cheap, and the same on every rank.

Pure: PIL and the standard library. Every rank fails the same way (one ``ValueError`` naming the
path and what is wrong) before any collective, instead of one rank failing inside a DataLoader
worker thousands of steps later. ``check_data_path`` and ``check_image_headers`` check that the
data path exists, that each image (and mask) has a readable header of the size its camera describes
(``image_loader.file_size_matches``; no pixel decoded), and that a JPEG's primary image ends with
its end-of-image marker (``jpeg_is_complete``). The rules, messages and cost: docs/data.md,
"Checked before the first step". A file that goes bad after start-up is found when it is decoded.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from distsplat_ns.data.image_loader import ImageSpec, file_size_matches
from distsplat_ns.utils.errors import UserError
from distsplat_ns.utils.logging import get_logger, log_rank0

_LOGGER = get_logger(__name__)

_JPEG_SOI = b"\xff\xd8\xff"
"""A JPEG file's first bytes (start-of-image marker and the next marker's prefix), as ``decode.py``
tells JPEG from other formats whatever the file's name."""

_JPEG_EOI = b"\xff\xd9"
_JPEG_SOS = 0xDA
_JPEG_STANDALONE_MARKERS = frozenset({0x01, *range(0xD0, 0xD8)})
"""Markers without a length field (TEM, RST0-7)."""


def check_data_path(path: Path, flag: str) -> None:
    """Raise unless the scene's data path exists.

    Args:
        path: The data directory (or a dataparser's file, e.g. ``transforms.json``).
        flag: The command-line flag that sets it, for the message.

    Raises:
        ValueError: ``path`` does not exist.
    """
    if not Path(path).exists():
        raise UserError(f"data path {path} does not exist (set by {flag})")


def header_size_wh(path: str | Path) -> tuple[int, int]:
    """``(width, height)`` of an image file from its header, without decoding pixels.

    Raises:
        ValueError: The file cannot be opened or its header is not an image's; names the file.
    """
    try:
        with Image.open(path) as image:
            return image.size
    except (OSError, UnidentifiedImageError, SyntaxError) as exc:
        raise UserError(f"image {path} has no readable image header: {type(exc).__name__}: {exc}") from exc


def jpeg_end_offset(data: bytes) -> int | None:
    """Where the primary image of a JPEG file ends: the offset just past its end-of-image marker.

    Walks the marker segments from the start-of-image by their lengths to the first start-of-scan
    (so that an ``FF D9`` inside an earlier segment, e.g. the EXIF thumbnail's, is skipped), then
    finds the first ``FF D9`` after it: entropy-coded data never holds one (``FF`` bytes are
    stuffed as ``FF 00``), and a progressive file's later scans follow the first.

    Args:
        data: The whole file, starting with ``FF D8``.

    Returns:
        The offset past the primary image's ``FF D9``, or None when the file ends before it
        (truncated) or its segments are malformed.
    """
    size = len(data)
    pos = 2  # past the start-of-image marker
    while pos < size:
        if data[pos] != 0xFF:
            return None
        while pos < size and data[pos] == 0xFF:  # a marker may be preceded by fill bytes
            pos += 1
        if pos >= size:
            return None
        marker = data[pos]
        pos += 1
        if marker in _JPEG_STANDALONE_MARKERS:
            continue
        if marker == _JPEG_EOI[1] or pos + 2 > size:  # an end of image before any scan: no pixels
            return None
        length = (data[pos] << 8) | data[pos + 1]
        if length < 2:
            return None
        if marker == _JPEG_SOS:
            end = data.find(_JPEG_EOI, pos + length)
            return None if end < 0 else end + 2
        pos += length
    return None


def jpeg_is_complete(path: str | Path) -> bool:
    """Whether ``path`` is not a JPEG, or is one whose primary image ends with its end-of-image marker.

    Two bytes are read when the file ends with ``FF D9`` (the usual case); otherwise the whole file
    (``jpeg_end_offset``), which accepts padding and appended blocks after the marker.

    Raises:
        OSError: The file cannot be read.
    """
    with open(path, "rb") as fh:
        if fh.read(3) != _JPEG_SOI:
            return True
        fh.seek(-2, os.SEEK_END)
        if fh.read(2) == _JPEG_EOI:
            return True
        fh.seek(0)
        return jpeg_end_offset(fh.read()) is not None


def check_image_headers(
    image_paths: Sequence[str | Path],
    specs: Sequence[ImageSpec],
    mask_paths: Sequence[str | Path] | None = None,
    what: str = "image",
    truncated_ok: bool = False,
) -> None:
    """Check every file's header, size against its camera, and JPEG end (see the module docstring).

    Args:
        image_paths: The image files, in dataset order.
        specs: One ``ImageSpec`` per image (the camera's size before undistortion).
        mask_paths: Mask files in dataset order, or None.
        what: What the files are, for messages (``"train image"``).
        truncated_ok: Log a truncated JPEG (one warning line naming it) instead of raising: the
            worker then drops it when it is drawn (``skip_corrupt_images``).

    Raises:
        ValueError: The first file whose header is unreadable, whose size does not match, or that
            is a JPEG without its end-of-image marker, named, with its dataset index.
    """
    if len(specs) != len(image_paths):
        raise ValueError(f"specs must have one entry per image ({len(image_paths)}), got {len(specs)}")
    for index, (path, spec) in enumerate(zip(image_paths, specs, strict=False)):
        size_wh = header_size_wh(path)
        if not file_size_matches(spec, (size_wh[1], size_wh[0])):
            expected = f"{spec.width}x{spec.height}"
            if spec.parsed_size_hw is not None:
                expected = f"{spec.parsed_size_hw[1]}x{spec.parsed_size_hw[0]} at 1/{spec.source_downscale} of the file"
            elif spec.scale_factor != 1.0:
                expected += f" after scaling the file by {spec.scale_factor}"
            raise UserError(
                f"{what} {path} (dataset index {index}) is {size_wh[0]}x{size_wh[1]} (WxH), but its camera says {expected}"
            )
        _check_jpeg_end(path, f"{what} {path} (dataset index {index})", truncated_ok)
        if mask_paths is not None:
            mask_wh = header_size_wh(mask_paths[index])
            if mask_wh != size_wh:
                raise UserError(
                    f"mask {mask_paths[index]} (dataset index {index}) is {mask_wh[0]}x{mask_wh[1]} (WxH), "
                    f"its image {path} is {size_wh[0]}x{size_wh[1]}"
                )
            _check_jpeg_end(mask_paths[index], f"mask {mask_paths[index]} (dataset index {index})", truncated_ok)


def _check_jpeg_end(path: str | Path, name: str, truncated_ok: bool) -> None:
    """Raise (or, with ``truncated_ok``, log) when ``path`` is a JPEG without its end-of-image marker."""
    if jpeg_is_complete(path):
        return
    message = f"{name} is truncated: its {os.path.getsize(path)} bytes end before the JPEG end-of-image marker (FF D9)"
    if not truncated_ok:
        raise UserError(message)
    log_rank0(_LOGGER, "%s; it is skipped when drawn (skip_corrupt_images)", message, level=logging.WARNING)
