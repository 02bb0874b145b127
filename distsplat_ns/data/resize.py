"""Integer downscales of decoded pixels: the DCT scale to ask libjpeg-turbo for, and the exact box average.

Pure: numpy (and, lazily, OpenCV). The box average is splatfacto's ``resize_image`` rule (a
stride-``f`` box convolution over the top-left ``(H // f) * f`` x ``(W // f) * f`` pixels), rounded
to uint8; docs/data.md ("Decode at the training scale") says how ``image_loader.py`` combines both.

Shape legend: ``H``, ``W``: pixels. ``C``: channels.
"""

from __future__ import annotations

import numpy as np


def dct_scale(factor: int) -> int:
    """The largest libjpeg-turbo DCT-domain scale denominator (1, 2, 4 or 8) that divides ``factor``."""
    for scale in (8, 4, 2):
        if factor % scale == 0:
            return scale
    return 1


def box_downscale(image: np.ndarray, factor: int, size_hw: tuple[int, int]) -> np.ndarray:
    """Each output pixel the mean of an ``factor x factor`` block of ``image``, rounded to uint8.

    The blocks tile the top-left ``size_hw * factor`` pixels (the rest is dropped): splatfacto's
    ``resize_image`` (a stride-``factor`` box convolution), to within 0.5 of its float result.
    With ``factor == 1`` the image is cropped to ``size_hw``.

    Args:
        image: Pixels. `[H, W, C]`, uint8, with ``H >= size_hw[0] * factor`` and ``W >= size_hw[1] * factor``.
        factor: Integer downscale.
        size_hw: Output ``(height, width)``.

    Returns:
        Pixels. `[size_hw[0], size_hw[1], C]`, uint8.
    """
    height, width = size_hw
    if image.shape[0] < height * factor or image.shape[1] < width * factor:
        raise ValueError(f"box_downscale: {image.shape[:2]} px cannot give {size_hw} px at factor {factor}")
    cropped = image[: height * factor, : width * factor]
    if factor == 1 or height == 0 or width == 0:  # an image smaller than the factor renders empty
        return cropped[:height, :width]
    import cv2

    # INTER_AREA at an integer factor is the block mean (OpenCV's resizeAreaFast), rounded.
    out = cv2.resize(cropped, (width, height), interpolation=cv2.INTER_AREA)
    return out[:, :, None] if out.ndim == 2 else out


def fit_to_size(image: np.ndarray, factor: int, size_hw: tuple[int, int]) -> np.ndarray:
    """``box_downscale`` when ``size_hw * factor`` fits in ``image``, else an area resize to ``size_hw``.

    The second case only arises for a dataparser that rounds downscaled sizes up
    (``downscale_rounding_mode`` round/ceil): no block grid then matches both sizes.
    """
    if image.shape[0] >= size_hw[0] * factor and image.shape[1] >= size_hw[1] * factor:
        return box_downscale(image, factor, size_hw)
    import cv2

    out = cv2.resize(image, (size_hw[1], size_hw[0]), interpolation=cv2.INTER_AREA)
    return out[:, :, None] if out.ndim == 2 else out
