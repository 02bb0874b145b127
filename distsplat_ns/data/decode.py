"""Turning one image's encoded bytes into the uint8 pixels training uses.

Pure: numpy, torch, PIL, simplejpeg (and, lazily, torchvision and OpenCV). No nerfstudio import:
the nerfstudio glue (``datamanager.py``) computes the per-image ``ImageSpec`` from its cameras and
dataparser outputs.

The steps replicate nerfstudio 1.1.5 exactly (``InputDataset.get_data`` then
``FullImageDatamanager``'s ``_undistort_image``), so pixels match its loader bit for bit:
decode -> resize by ``scale_factor`` (PIL bilinear) -> alpha compositing (``alpha_color``) ->
mask (PIL nearest resize) -> undistortion of image and mask (OpenCV) -> crop to the valid region.

Undistortion uses maps computed once per distinct camera and kept in a small per-process cache:
``cv2.undistort`` rebuilds the same maps on every call (it is ``initUndistortRectifyMap`` +
``remap`` in row stripes), so caching gives identical pixels for less work.

Shape legend: ``H``, ``W``: pixels.
"""

from __future__ import annotations

import io
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np
import torch
from PIL import Image

from distsplat_ns.data.store import EncodedImageStore

DECODERS: tuple[str, ...] = ("pil", "simplejpeg", "torchvision")

_JPEG_MAGIC = b"\xff\xd8\xff"
_MAP_CACHE_ENTRIES = 4


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


def _pil_to_array(pil_image: Image.Image) -> np.ndarray:
    # Same conversion as nerfstudio's InputDataset.get_numpy_image.
    image = np.array(pil_image, dtype="uint8")
    if image.ndim == 2:
        image = image[:, :, None].repeat(3, axis=2)
    return image


def decode_bytes(data: memoryview | bytes, decoder: str) -> np.ndarray:
    """Decode one encoded image to uint8 pixels.

    JPEG goes through ``decoder``; any other format (PNG for Blender-style data) through PIL.

    Args:
        data: The encoded file.
        decoder: One of ``DECODERS``.

    Returns:
        Pixels. `[H, W, C]`, uint8, with ``C`` in {1, 2, 3, 4} as stored (grey JPEGs become RGB).

    Raises:
        ValueError, OSError, RuntimeError: The bytes are corrupt or truncated (decoder's own error).
    """
    if bytes(data[:3]) != _JPEG_MAGIC or decoder == "pil":
        with Image.open(io.BytesIO(data)) as pil_image:
            pil_image.load()
            return _pil_to_array(pil_image)
    if decoder == "simplejpeg":
        import simplejpeg

        # strict=True (the default) turns libjpeg warnings such as "Premature end of JPEG file"
        # into errors: a truncated file must never become a grey-padded training image.
        return simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True)
    if decoder == "torchvision":
        from torchvision.io import ImageReadMode, decode_jpeg

        encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return decode_jpeg(encoded, mode=ImageReadMode.RGB).permute(1, 2, 0).contiguous().numpy()
    raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")


@dataclass(frozen=True)
class UndistortSpec:
    """How to undistort one camera's images (nerfstudio ``_undistort_image`` conventions).

    Attributes:
        camera_model: ``"perspective"`` (OpenCV k1 k2 p1 p2 k3 k4 ...) or ``"fisheye"`` (k1..k4).
        K: Input intrinsics, row-major 3x3, principal point already shifted by -0.5 (OpenCV's
            top-left pixel convention), values as nerfstudio computes them in float32.
        dist: Distortion in OpenCV order (8 values for perspective, 4 for fisheye).
        new_K: Output intrinsics before cropping, row-major 3x3.
        size_wh: Input (and uncropped output) size ``(W, H)`` in pixels.
        roi_xywh: Valid region to crop ``(x, y, w, h)``; the full image for fisheye.
    """

    camera_model: Literal["perspective", "fisheye"]
    K: tuple[float, ...]
    dist: tuple[float, ...]
    new_K: tuple[float, ...]
    size_wh: tuple[int, int]
    roi_xywh: tuple[int, int, int, int]


@dataclass(frozen=True)
class ImageSpec:
    """Everything a worker needs to turn entry ``index`` of a store into training pixels.

    Attributes:
        height: Expected height after ``scale_factor`` and before undistortion, pixels.
        width: Expected width after ``scale_factor`` and before undistortion, pixels.
        scale_factor: Resize factor (nerfstudio ``camera_res_scale_factor``); 1.0 for none.
        alpha_color: RGB in [0, 1] to composite RGBA images over, or None to keep RGBA.
        mask_color: RGB in [0, 1] written where the mask is 0, or None.
        undistort: Undistortion, or None for an undistorted camera.
    """

    height: int
    width: int
    scale_factor: float = 1.0
    alpha_color: Optional[tuple[float, float, float]] = None
    mask_color: Optional[tuple[float, float, float]] = None
    undistort: Optional[UndistortSpec] = None


class _MapCache:
    """Per-process LRU of undistortion maps (a 1080x1920 pair takes 12 MB)."""

    def __init__(self, max_entries: int = _MAP_CACHE_ENTRIES) -> None:
        self.max_entries = max_entries
        self._maps: OrderedDict[tuple, tuple[np.ndarray, np.ndarray]] = OrderedDict()

    def get(self, spec: UndistortSpec, map_type: int) -> tuple[np.ndarray, np.ndarray]:
        import cv2

        key = (spec, map_type)
        maps = self._maps.get(key)
        if maps is not None:
            self._maps.move_to_end(key)
            return maps
        K = np.array(spec.K, dtype=np.float64).reshape(3, 3)
        new_K = np.array(spec.new_K, dtype=np.float64).reshape(3, 3)
        dist = np.array(spec.dist, dtype=np.float64)
        if spec.camera_model == "perspective":
            map1, map2 = cv2.initUndistortRectifyMap(K, dist, None, new_K, spec.size_wh, map_type)
            x, y, w, h = spec.roi_xywh
            # Only the pixels kept by the crop are ever computed.
            maps = (np.ascontiguousarray(map1[y : y + h, x : x + w]), np.ascontiguousarray(map2[y : y + h, x : x + w]))
        else:
            maps = cv2.fisheye.initUndistortRectifyMap(K, dist, np.eye(3), new_K, spec.size_wh, map_type)
        self._maps[key] = maps
        if len(self._maps) > self.max_entries:
            self._maps.popitem(last=False)
        return maps


def undistort(
    image: np.ndarray,
    mask: Optional[np.ndarray],
    spec: UndistortSpec,
    cache: _MapCache,
    out: Optional[np.ndarray] = None,
) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """Undistort and crop an image and its mask, as nerfstudio's ``_undistort_image`` does.

    Args:
        image: Pixels. `[H, W, C]`, uint8.
        mask: Mask. `[H, W, 1]`, bool, or None.
        spec: The camera's undistortion.
        cache: Map cache of this process.
        out: Where to write the image (`[H', W', C]` uint8, C-contiguous), or None to allocate.

    Returns:
        ``(image, mask)``: `[H', W', C]` uint8 and `[H', W', 1]` bool (or None), ``(W', H')`` being
        the ROI size.
    """
    import cv2

    if spec.camera_model == "perspective":
        # cv2.undistort == remap(INTER_LINEAR, BORDER_CONSTANT) with CV_16SC2 maps.
        map1, map2 = cache.get(spec, cv2.CV_16SC2)
        border = cv2.BORDER_CONSTANT
    else:
        map1, map2 = cache.get(spec, cv2.CV_32FC1)
        border = cv2.BORDER_CONSTANT  # OpenCV's default, as nerfstudio's call
    if out is not None and out.shape == (*map1.shape[:2], image.shape[2]) and image.shape[2] in (3, 4):
        cv2.remap(image, map1, map2, interpolation=cv2.INTER_LINEAR, borderMode=border, dst=out)
    else:
        out = cv2.remap(image, map1, map2, interpolation=cv2.INTER_LINEAR, borderMode=border)
    if out.ndim == 2:
        out = out[:, :, None]
    out_mask = None
    if mask is not None:
        mask_u8 = mask.astype(np.uint8) * 255
        if spec.camera_model == "perspective":
            m1, m2 = cache.get(spec, cv2.CV_16SC2)
            warped = cv2.remap(mask_u8, m1, m2, interpolation=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT)
        else:
            K = np.array(spec.K, dtype=np.float64).reshape(3, 3)
            new_K = np.array(spec.new_K, dtype=np.float64).reshape(3, 3)
            warped = cv2.fisheye.undistortImage(mask_u8, K, np.array(spec.dist), None, new_K)
        out_mask = warped.astype(bool)
        if out_mask.ndim == 2:
            out_mask = out_mask[:, :, None]
    return out, out_mask


def _composite_alpha(image: torch.Tensor, alpha_color: tuple[float, float, float]) -> torch.Tensor:
    # Bit-identical to nerfstudio's InputDataset.get_image_uint8 (float32 arithmetic, truncation).
    color = torch.tensor(alpha_color, dtype=torch.float32)
    alpha = image[:, :, -1:] / 255.0
    out = image[:, :, :3] * alpha + 255.0 * color * (1.0 - alpha)
    return torch.clamp(out, min=0, max=255).to(torch.uint8)


def _load_mask(data: memoryview | bytes, scale_factor: float) -> np.ndarray:
    # Same as nerfstudio's get_image_mask_tensor_from_path.
    with Image.open(io.BytesIO(data)) as pil_mask:
        if scale_factor != 1.0:
            width, height = pil_mask.size
            newsize = (int(width * scale_factor), int(height * scale_factor))
            pil_mask = pil_mask.resize(newsize, resample=Image.Resampling.NEAREST)
        mask = np.array(pil_mask)
    if mask.ndim != 2:
        raise ValueError(f"mask images must have 1 channel, got shape {mask.shape}")
    return mask[:, :, None].astype(bool)


class ImageLoader:
    """Decodes dataset images from an ``EncodedImageStore``: the per-image work of every worker.

    Picklable (the stores pickle as shared-memory handles), so it can travel to spawn workers.

    Args:
        images: Encoded images, in dataset order.
        specs: One ``ImageSpec`` per image.
        masks: Encoded masks in dataset order, or None.
        decoder: JPEG decoder, one of ``DECODERS``.
    """

    def __init__(
        self,
        images: EncodedImageStore,
        specs: list[ImageSpec],
        masks: Optional[EncodedImageStore] = None,
        decoder: str = "simplejpeg",
    ) -> None:
        if len(specs) != len(images):
            raise ValueError(f"specs must have one entry per image ({len(images)}), got {len(specs)}")
        if masks is not None and len(masks) != len(images):
            raise ValueError(f"masks must have one entry per image ({len(images)}), got {len(masks)}")
        if decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")
        self.images = images
        self.masks = masks
        self.specs = specs
        self.decoder = decoder
        self._map_cache = _MapCache()

    def __len__(self) -> int:
        return len(self.images)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_map_cache"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._map_cache = _MapCache()

    def max_output_bytes(self) -> int:
        """Upper bound of ``load_array``'s image bytes over the dataset (4 channels for non-JPEG files)."""
        largest = 0
        for i, spec in enumerate(self.specs):
            height, width = spec.height, spec.width
            if spec.undistort is not None:
                width, height = spec.undistort.roi_xywh[2], spec.undistort.roi_xywh[3]
            is_jpeg = self.images.path(i).lower().endswith((".jpg", ".jpeg"))
            channels = 3 if is_jpeg or spec.alpha_color is not None else 4
            largest = max(largest, height * width * channels)
        return largest

    def load(self, index: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Decode and prepare image ``index`` (see ``load_array``) as tensors.

        Returns:
            ``(image, mask)``: image `[H, W, 3]` (or `[H, W, 4]` for RGBA without ``alpha_color``),
            uint8, CPU; mask `[H, W, 1]` bool or None.
        """
        image, mask = self.load_array(index)
        return torch.from_numpy(image), (torch.from_numpy(mask) if mask is not None else None)

    def _decode(self, index: int, out: Optional[np.ndarray]) -> np.ndarray:
        data = self.images.view(index)
        if out is not None and self.decoder == "simplejpeg" and bytes(data[:3]) == _JPEG_MAGIC:
            import simplejpeg

            height, width, _, _ = simplejpeg.decode_jpeg_header(data)
            if height * width * 3 <= out.size:
                return simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True, buffer=out[: height * width * 3])
        return decode_bytes(data, self.decoder)

    def load_array(self, index: int, out: Optional[np.ndarray] = None) -> tuple[np.ndarray, Optional[np.ndarray]]:
        """Decode and prepare image ``index``, writing the pixels into ``out`` where they fit.

        Args:
            index: Dataset index.
            out: Flat uint8 buffer (e.g. a shared decode slot), or None to allocate.

        Returns:
            ``(image, mask)``: image `[H, W, 3]` (or `[H, W, 4]` for RGBA without ``alpha_color``),
            uint8 (a view of ``out`` when it fitted); mask `[H, W, 1]` bool or None.

        Raises:
            ValueError: The image (or its mask) is corrupt, truncated, or not the expected size;
                the message names the file and keeps the decoder's own message.
        """
        spec = self.specs[index]
        path = self.images.path(index)
        # Decode straight into ``out`` only when decoding is the last step.
        direct = spec.scale_factor == 1.0 and spec.undistort is None and spec.mask_color is None
        try:
            image = self._decode(index, out if direct else None)
        except Exception as exc:  # noqa: BLE001 - every decoder error means a bad file here
            raise ValueError(f"cannot decode image {path} (dataset index {index}): {type(exc).__name__}: {exc}") from exc
        if spec.scale_factor != 1.0:
            pil_image = Image.fromarray(image[:, :, 0] if image.shape[2] == 1 else image)
            newsize = (int(image.shape[1] * spec.scale_factor), int(image.shape[0] * spec.scale_factor))
            image = _pil_to_array(pil_image.resize(newsize, resample=Image.Resampling.BILINEAR))
        if image.shape[2] not in (3, 4):
            raise ValueError(f"image {path} (dataset index {index}) has {image.shape[2]} channels, expected 3 or 4")
        if image.shape[:2] != (spec.height, spec.width):
            raise ValueError(
                f"image {path} (dataset index {index}) is {image.shape[1]}x{image.shape[0]} (WxH) after scaling, "
                f"but its camera says {spec.width}x{spec.height}"
            )
        if spec.alpha_color is not None and image.shape[-1] == 4:
            image = _composite_alpha(torch.from_numpy(image), spec.alpha_color).numpy()
        mask = None
        if self.masks is not None:
            mask_path = self.masks.path(index)
            try:
                mask = _load_mask(self.masks.view(index), spec.scale_factor)
            except Exception as exc:  # noqa: BLE001
                raise ValueError(f"cannot decode mask {mask_path} (dataset index {index}): {exc}") from exc
            if mask.shape[:2] != image.shape[:2]:
                raise ValueError(
                    f"mask {mask_path} is {mask.shape[1]}x{mask.shape[0]}, image {path} is "
                    f"{image.shape[1]}x{image.shape[0]} (WxH)"
                )
            if spec.mask_color is not None:
                # nerfstudio writes mask_color (in [0, 1]) into a float image; in uint8 that is x255.
                fill = np.array([round(255 * c) for c in spec.mask_color], dtype=np.uint8)
                image = np.where(mask, image, fill[: image.shape[2]]).astype(np.uint8)
        if spec.undistort is not None:
            x, y, w, h = spec.undistort.roi_xywh
            target = _view_of(out, (h, w, image.shape[2]))
            image, mask = undistort(image, mask, spec.undistort, self._map_cache, out=target)
        elif out is not None and not np.shares_memory(image, out):
            target = _view_of(out, image.shape)
            if target is not None:
                np.copyto(target, image)
                image = target
        return image, mask


def _view_of(out: Optional[np.ndarray], shape: tuple[int, ...]) -> Optional[np.ndarray]:
    """``out``'s first bytes as a C-contiguous array of ``shape``, or None when it is too small."""
    if out is None:
        return None
    size = int(np.prod(shape))
    if size > out.size:
        return None
    return out[:size].reshape(shape)
