"""Encoded image bytes to RGB(A) uint8 pixels: the JPEG decoders, PIL for other formats, DCT-domain scaling.

Pure: numpy, torch, PIL, simplejpeg (and, lazily, torchvision). What is done with the pixels
(resize, alpha, mask, undistortion) is ``image_loader.py``'s.

Every decoder returns RGB, or RGBA when the file has alpha, whatever the file's colour space; a JPEG
may be decoded at ``1 / s`` in the DCT domain (docs/data.md, "Decode at the training scale",
"Colour").

Shape legend: ``H``, ``W``: pixels.
"""

from __future__ import annotations

import io
from typing import Literal, get_args

import numpy as np
import torch
from PIL import Image

Decoder = Literal["pil", "simplejpeg", "torchvision"]
"""A JPEG decoder (PNG and other formats always use PIL)."""
DECODERS: tuple[Decoder, ...] = get_args(Decoder)
DecoderChoice = Literal["auto", Decoder]
"""``--pipeline.datamanager.decoder``: a decoder, or "auto" (:func:`default_decoder`)."""
DECODER_CHOICES: tuple[DecoderChoice, ...] = get_args(DecoderChoice)

_JPEG_MAGIC = b"\xff\xd8\xff"


def default_decoder() -> str:
    """The fastest JPEG decoder available.

    Measured on the fox frames (1080x1920 JPEG, one core, docs/data.md): simplejpeg 183 images/s,
    torchvision.io.decode_jpeg 169/s, PIL 50/s; all three give identical pixels.
    """
    try:
        import simplejpeg  # noqa: F401
    except ImportError:
        pass
    else:
        return "simplejpeg"
    try:
        from torchvision.io import decode_jpeg  # noqa: F401
    except ImportError:
        return "pil"
    return "torchvision"


def _has_alpha(pil_image: Image.Image) -> bool:
    return pil_image.mode in ("RGBA", "LA", "PA", "La", "RGBa") or (
        pil_image.mode == "P" and "transparency" in pil_image.info
    )


def pil_to_array(pil_image: Image.Image) -> np.ndarray:
    """RGB (or RGBA when the image has alpha) uint8 pixels of any PIL image.

    Grey becomes RGB by repeating the channel (as nerfstudio's ``InputDataset.get_numpy_image``);
    CMYK, YCbCr, palette and other modes go through PIL's ``convert``: a CMYK JPEG must never reach
    training as 4-channel data.
    """
    if pil_image.mode not in ("RGB", "RGBA", "L"):
        pil_image = pil_image.convert("RGBA" if _has_alpha(pil_image) else "RGB")
    image = np.array(pil_image, dtype="uint8")
    if image.ndim == 2:
        image = image[:, :, None].repeat(3, axis=2)
    return image


def read_size_hw(data: memoryview | bytes) -> tuple[int, int]:
    """``(height, width)`` of an encoded image from its header, without decoding the pixels."""
    if bytes(data[:3]) == _JPEG_MAGIC:
        try:
            import simplejpeg
        except ImportError:
            pass
        else:
            height, width, _, _ = simplejpeg.decode_jpeg_header(data)
            return int(height), int(width)
    with Image.open(io.BytesIO(data)) as pil_image:
        return pil_image.size[1], pil_image.size[0]


def decode_bytes(
    data: memoryview | bytes, decoder: str, scale: int = 1, buffer: np.ndarray | None = None
) -> np.ndarray:
    """Decode one encoded image to RGB (or RGBA) uint8 pixels, for JPEGs at ``1 / scale`` in the DCT domain.

    JPEG goes through ``decoder``; any other format (PNG for Blender-style data, also when named
    ``.jpg``) through PIL. ``scale`` applies to JPEGs decoded by simplejpeg or PIL (libjpeg-turbo's
    scaled IDCT gives ``ceil(H / scale) x ceil(W / scale)`` pixels); torchvision and other formats
    decode at full size; ``decode_at_scale`` tells the caller which happened.

    Args:
        data: The encoded file.
        decoder: One of ``DECODERS``.
        scale: DCT-domain scale denominator, 1, 2, 4 or 8.
        buffer: Flat uint8 array to decode into (simplejpeg only) when it is large enough, or None.

    Returns:
        Pixels. `[H', W', 3]`, or `[H', W', 4]` when the file has alpha (PNG), uint8, RGB(A) whatever
        the file's colour space (grey and CMYK JPEGs become RGB).

    Raises:
        ValueError, OSError, RuntimeError: The bytes are corrupt or truncated (decoder's own error).
    """
    if decoder not in DECODERS:
        raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")
    if scale not in (1, 2, 4, 8):
        raise ValueError(f"scale must be 1, 2, 4 or 8, got {scale}")
    is_jpeg = bytes(data[:3]) == _JPEG_MAGIC
    if not is_jpeg or decoder == "pil":
        with Image.open(io.BytesIO(data)) as pil_image:
            if is_jpeg and scale > 1:
                width, height = pil_image.size
                # draft picks the largest scale s <= min(W // w, H // h): floor sizes give exactly ``scale``.
                if width >= scale and height >= scale:
                    pil_image.draft(pil_image.mode, (width // scale, height // scale))
            pil_image.load()
            return pil_to_array(pil_image)
    if decoder == "simplejpeg":
        import simplejpeg

        kwargs: dict = {}
        if scale > 1:
            height, width, _, _ = simplejpeg.decode_jpeg_header(data)
            # simplejpeg picks the smallest libjpeg-turbo scale giving at least these sizes.
            kwargs = {"min_height": -(-height // scale), "min_width": -(-width // scale)}
        if buffer is not None:
            height, width, _, _ = simplejpeg.decode_jpeg_header(data, **kwargs)
            if height * width * 3 <= buffer.size:
                kwargs["buffer"] = buffer[: height * width * 3]
        # strict=True (the default) turns libjpeg warnings such as "Premature end of JPEG file"
        # into errors: a truncated file must never become a grey-padded training image. libjpeg-turbo
        # converts grey, YCbCr and CMYK/YCCK JPEGs to RGB itself.
        return simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True, **kwargs)
    from torchvision.io import ImageReadMode, decode_jpeg

    encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    # ImageReadMode.RGB converts grey and CMYK JPEGs (torchvision >= 0.19).
    return decode_jpeg(encoded, mode=ImageReadMode.RGB).permute(1, 2, 0).contiguous().numpy()


def decode_at_scale(
    data: memoryview | bytes, decoder: str, scale: int, buffer: np.ndarray | None = None
) -> tuple[np.ndarray, int]:
    """``decode_bytes`` at DCT scale ``1 / scale`` where the decoder can, and the scale it really used.

    Returns:
        ``(pixels, used)``: pixels as ``decode_bytes`` returns them, and ``used`` = ``scale`` when
        the JPEG was decoded in the DCT domain, else 1 (torchvision, PNG, or a JPEG PIL cannot draft).
    """
    image = decode_bytes(data, decoder, scale, buffer)
    if scale == 1:
        return image, 1
    full_h, full_w = read_size_hw(data)
    if image.shape[:2] == (full_h, full_w):
        return image, 1
    if image.shape[:2] == (-(-full_h // scale), -(-full_w // scale)):
        return image, scale
    raise RuntimeError(f"decoding {full_w}x{full_h} px at 1/{scale} gave {image.shape[1]}x{image.shape[0]} px")
