"""Checks of a scene's files before the first training step: cheap, and the same on every rank.

Pure: PIL and the standard library. Every rank runs the same checks on the same files, so every
rank fails the same way (one ``ValueError`` naming the path and what is wrong) before any
collective, instead of one rank failing inside a DataLoader worker thousands of steps later.

What is checked (``data_path_exists``, ``check_image_headers``):
- the data path exists;
- each image file (and mask) has a readable header: only the header is read (PIL opens lazily),
  about 0.1 ms per file, no pixel is decoded;
- the size in the header is the one the camera describes (``image_loader.file_size_matches``: after
  ``camera_res_scale_factor``, or at 1/N when a dataparser downscale is decoded on the fly), and a
  mask has its image's size.

A file truncated after its header is found when it is decoded (the worker's error names it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from PIL import Image, UnidentifiedImageError

from distsplat_ns.data.image_loader import ImageSpec, file_size_matches
from distsplat_ns.utils.errors import UserError


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


def check_image_headers(
    image_paths: Sequence[str | Path],
    specs: Sequence[ImageSpec],
    mask_paths: Optional[Sequence[str | Path]] = None,
    what: str = "image",
) -> None:
    """Check every file's header and size against its camera (see the module docstring).

    Args:
        image_paths: The image files, in dataset order.
        specs: One ``ImageSpec`` per image (the camera's size before undistortion).
        mask_paths: Mask files in dataset order, or None.
        what: What the files are, for messages (``"train image"``).

    Raises:
        ValueError: The first file whose header is unreadable or whose size does not match, named,
            with its dataset index.
    """
    if len(specs) != len(image_paths):
        raise ValueError(f"specs must have one entry per image ({len(image_paths)}), got {len(specs)}")
    for index, (path, spec) in enumerate(zip(image_paths, specs)):
        size_wh = header_size_wh(path)
        if not file_size_matches(spec, (size_wh[1], size_wh[0])):
            expected = f"{spec.width}x{spec.height}"
            if spec.parsed_size_hw is not None:
                expected = f"{spec.parsed_size_hw[1]}x{spec.parsed_size_hw[0]} at 1/{spec.source_downscale} of the file"
            elif spec.scale_factor != 1.0:
                expected += f" after scaling the file by {spec.scale_factor}"
            raise UserError(
                f"{what} {path} (dataset index {index}) is {size_wh[0]}x{size_wh[1]} (WxH), "
                f"but its camera says {expected}"
            )
        if mask_paths is not None:
            mask_wh = header_size_wh(mask_paths[index])
            if mask_wh != size_wh:
                raise UserError(
                    f"mask {mask_paths[index]} (dataset index {index}) is {mask_wh[0]}x{mask_wh[1]} (WxH), "
                    f"its image {path} is {size_wh[0]}x{size_wh[1]}"
                )
