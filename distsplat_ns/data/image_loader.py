"""One dataset image from its encoded bytes to the pixels training uses: the per-image work of every worker.

Pure: numpy, torch, PIL (and, through the sibling modules, the decoders and OpenCV); the nerfstudio
glue (``image_specs.py``) computes each image's ``ImageSpec``. The steps replicate nerfstudio 1.1.5
bit for bit (``InputDataset.get_data`` then ``_undistort_image``): decode, resize by
``scale_factor``, alpha, mask, undistortion (FISHEYE624: a generated mask), crop. An image wanted at
``1 / f`` of its size is decoded at a DCT-domain scale and box-averaged exactly as splatfacto's
``resize_image`` (docs/data.md, "Decoding and hand-over", "Decode at the training scale").

Shape legend: ``H``, ``W``: pixels.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from distsplat_ns.data.decode import DECODERS, decode_at_scale, pil_to_array, read_size_hw
from distsplat_ns.data.resize import box_downscale, dct_scale, fit_to_size
from distsplat_ns.data.store import EncodedImageStore
from distsplat_ns.data.undistort import MapCache, UndistortSpec, undistort
from distsplat_ns.utils.errors import UserError


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
        source_downscale: The file is this many times larger than the camera before
            ``scale_factor`` (a dataparser downscale factor without a pre-made ``images_N``
            folder): it is decoded at ``1 / source_downscale`` (DCT scale + box average).
        parsed_size_hw: The camera's ``(height, width)`` before ``scale_factor``, i.e. the size the
            file is brought to; required when ``source_downscale > 1``.
    """

    height: int
    width: int
    scale_factor: float = 1.0
    alpha_color: tuple[float, float, float] | None = None
    mask_color: tuple[float, float, float] | None = None
    undistort: UndistortSpec | None = None
    source_downscale: int = 1
    parsed_size_hw: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.source_downscale < 1:
            raise ValueError(f"source_downscale must be >= 1, got {self.source_downscale}")
        if self.source_downscale > 1 and self.parsed_size_hw is None:
            raise ValueError("parsed_size_hw is required when source_downscale > 1")

    @property
    def base_size_hw(self) -> tuple[int, int]:
        """``(height, width)`` the file is brought to before ``scale_factor`` (``parsed_size_hw``;
        without it, ``(height, width)``, which is that size when ``scale_factor`` is 1)."""
        return self.parsed_size_hw if self.parsed_size_hw is not None else (self.height, self.width)

    @property
    def output_size_hw(self) -> tuple[int, int]:
        """``(height, width)`` of the delivered image at full training resolution (after undistortion)."""
        if self.undistort is not None:
            return self.undistort.roi_xywh[3], self.undistort.roi_xywh[2]
        return self.height, self.width

    @property
    def decodes_at_scale(self) -> bool:
        """Whether the training-scale downscale can be folded into the decode (no per-pixel step
        before it that does not commute with a box average: resize, alpha, mask colour, undistortion)."""
        return (
            self.scale_factor == 1.0 and self.undistort is None and self.mask_color is None and self.alpha_color is None
        )


def file_size_matches(spec: ImageSpec, file_hw: tuple[int, int]) -> bool:
    """Whether a file of ``file_hw`` = ``(height, width)`` pixels is the one ``spec``'s camera describes
    before ``scale_factor``: its size, or any rounding (floor, round, ceil: the dataparsers' options)
    of its size / ``spec.source_downscale`` when decoded at that scale."""
    if spec.parsed_size_hw is None:  # the file is the camera's size, then resized by scale_factor
        return all(
            int(side * spec.scale_factor) == want
            for side, want in zip(file_hw, (spec.height, spec.width), strict=False)
        )
    n = spec.source_downscale
    return all(side // n <= base <= -(-side // n) for side, base in zip(file_hw, spec.parsed_size_hw, strict=False))


def _composite_alpha(image: torch.Tensor, alpha_color: tuple[float, float, float]) -> torch.Tensor:
    # Bit-identical to nerfstudio's InputDataset.get_image_uint8 (float32 arithmetic, truncation).
    color = torch.tensor(alpha_color, dtype=torch.float32)
    alpha = image[:, :, -1:] / 255.0
    out = image[:, :, :3] * alpha + 255.0 * color * (1.0 - alpha)
    return torch.clamp(out, min=0, max=255).to(torch.uint8)


def _load_mask(
    data: memoryview | bytes, scale_factor: float, base_size_hw: tuple[int, int] | None = None
) -> np.ndarray:
    # Same as nerfstudio's get_image_mask_tensor_from_path; a mask file larger than its camera
    # (dataparser downscale without masks_N) is first resized with nearest neighbour, as nerfstudio
    # makes masks_N.
    with Image.open(io.BytesIO(data)) as pil_mask:
        if base_size_hw is not None and pil_mask.size != (base_size_hw[1], base_size_hw[0]):
            pil_mask = pil_mask.resize((base_size_hw[1], base_size_hw[0]), resample=Image.Resampling.NEAREST)
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
        masks: EncodedImageStore | None = None,
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
        self._map_cache = MapCache()

    def __len__(self) -> int:
        return len(self.images)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_map_cache"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._map_cache = MapCache()

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

    def load(self, index: int, downscale: int = 1) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Decode and prepare image ``index`` (see ``load_array``) as tensors.

        Returns:
            ``(image, mask)``: image `[H, W, 3]` (or `[H, W, 4]` for RGBA without ``alpha_color``),
            uint8, CPU; mask `[H, W, 1]` bool or None.
        """
        image, mask = self.load_array(index, downscale=downscale)
        return torch.from_numpy(image), (torch.from_numpy(mask) if mask is not None else None)

    def _check_file_size(self, index: int, data: memoryview | bytes) -> tuple[int, int]:
        """The file's ``(height, width)`` from its header, checked against the camera where it decides the geometry."""
        spec = self.specs[index]
        try:
            file_hw = read_size_hw(data)
        except Exception as exc:
            raise UserError(
                f"cannot decode image {self.images.path(index)} (dataset index {index}): {type(exc).__name__}: {exc}"
            ) from exc
        base_h, base_w = spec.base_size_hw
        n = spec.source_downscale
        if not file_size_matches(spec, file_hw):
            raise UserError(
                f"image {self.images.path(index)} (dataset index {index}) is {file_hw[1]}x{file_hw[0]} (WxH), "
                f"but its camera says {base_w}x{base_h}" + (f" at 1/{n} of the file's size" if n > 1 else "")
            )
        return file_hw

    def _decode_to(
        self, index: int, data: memoryview | bytes, factor: int, size_hw: tuple[int, int], out: np.ndarray | None
    ) -> np.ndarray:
        """The file decoded and brought to ``size_hw`` = its size / ``factor`` (DCT scale, then box)."""
        scale = dct_scale(factor)
        file_hw = self._check_file_size(index, data) if factor > 1 or out is not None else None
        # Straight into ``out`` only when nothing follows the decode.
        direct = (
            out is not None
            and file_hw is not None
            and (-(-file_hw[0] // scale), -(-file_hw[1] // scale)) == size_hw
            and scale == factor
        )
        try:
            image, used = decode_at_scale(data, self.decoder, scale, out if direct else None)
        except Exception as exc:
            raise UserError(
                f"cannot decode image {self.images.path(index)} (dataset index {index}): {type(exc).__name__}: {exc}"
            ) from exc
        if factor == 1 or (used == factor and image.shape[:2] == size_hw):
            return image
        return fit_to_size(image, factor // used, size_hw)

    def load_array(
        self, index: int, out: np.ndarray | None = None, downscale: int = 1
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Decode and prepare image ``index`` at ``1 / downscale`` of its training resolution.

        The image comes out at ``downscaled_px`` of ``spec.output_size_hw``, folded into the decode
        where ``ImageSpec.decodes_at_scale``; masks stay at full training resolution
        (docs/data.md, "Decode at the training scale").

        Args:
            index: Dataset index.
            out: Flat uint8 buffer (e.g. a shared decode slot), or None to allocate.
            downscale: Integer render downscale of the step (1: full resolution).

        Returns:
            ``(image, mask)``: image `[H, W, 3]` (or `[H, W, 4]` for RGBA without ``alpha_color``),
            uint8 (a view of ``out`` when it fitted); mask `[H, W, 1]` bool or None.

        Raises:
            ValueError: The image (or its mask) is corrupt, truncated, or not the expected size;
                the message names the file and keeps the decoder's own message.
        """
        if not isinstance(downscale, int) or downscale < 1:
            raise ValueError(f"downscale must be an int >= 1, got {downscale!r}")
        spec = self.specs[index]
        image, late_downscale = self._decoded_image(index, out, downscale)
        mask = None
        if self.masks is not None:
            mask = self._mask(index)
            if spec.mask_color is not None:
                # nerfstudio writes mask_color (in [0, 1]) into a float image; in uint8 that is x255.
                fill = np.array([round(255 * c) for c in spec.mask_color], dtype=np.uint8)
                image = np.where(mask, image, fill[: image.shape[2]]).astype(np.uint8)
        if spec.undistort is not None:
            target = (
                _view_of(out, (spec.undistort.roi_xywh[3], spec.undistort.roi_xywh[2], image.shape[2]))
                if late_downscale == 1
                else None
            )
            image, mask = undistort(image, mask, spec.undistort, self._map_cache, out=target)
        if late_downscale > 1:
            out_h, out_w = spec.output_size_hw
            image = box_downscale(
                image, late_downscale, (out_h // downscale, out_w // downscale)
            )  # utils.cameras.downscaled_px
        if out is not None and not np.shares_memory(image, out):
            target = _view_of(out, image.shape)
            if target is not None:
                np.copyto(target, image)
                image = target
        return image, mask

    def _decoded_image(self, index: int, out: np.ndarray | None, downscale: int) -> tuple[np.ndarray, int]:
        """Image ``index`` decoded, rescaled by ``scale_factor``, checked and alpha-composited, before
        any mask, undistortion or late box average; and the downscale still to apply (1 when the
        decode folded it in)."""
        spec = self.specs[index]
        path = self.images.path(index)
        try:
            data = self.images.view(index)
        except OSError as exc:  # a file read from disk (disk mode) that went away or cannot be read
            raise UserError(f"cannot decode image {path} (dataset index {index}): {type(exc).__name__}: {exc}") from exc
        if spec.decodes_at_scale:
            base_h, base_w = spec.base_size_hw
            image = self._decode_to(
                index, data, spec.source_downscale * downscale, (base_h // downscale, base_w // downscale), out
            )
            late_downscale = 1
        else:
            image = self._decode_to(index, data, spec.source_downscale, spec.base_size_hw, None)
            late_downscale = downscale
        if spec.scale_factor != 1.0:
            pil_image = Image.fromarray(image[:, :, 0] if image.shape[2] == 1 else image)
            newsize = (int(image.shape[1] * spec.scale_factor), int(image.shape[0] * spec.scale_factor))
            image = pil_to_array(pil_image.resize(newsize, resample=Image.Resampling.BILINEAR))
        if image.shape[2] not in (3, 4):
            raise UserError(f"image {path} (dataset index {index}) has {image.shape[2]} channels, expected 3 or 4")
        expected_hw = (
            (spec.height // downscale, spec.width // downscale) if spec.decodes_at_scale else (spec.height, spec.width)
        )
        if image.shape[:2] != expected_hw:
            raise UserError(
                f"image {path} (dataset index {index}) is {image.shape[1]}x{image.shape[0]} (WxH) after scaling, "
                f"but its camera says {expected_hw[1]}x{expected_hw[0]}"
            )
        if spec.alpha_color is not None and image.shape[-1] == 4:
            image = _composite_alpha(torch.from_numpy(image), spec.alpha_color).numpy()
        return image, late_downscale

    def _mask(self, index: int) -> np.ndarray:
        """Mask ``index`` at full training resolution, checked against its image's size. `[H, W, 1]` bool."""
        spec = self.specs[index]
        mask_path = self.masks.path(index)
        try:
            mask = _load_mask(
                self.masks.view(index), spec.scale_factor, spec.base_size_hw if spec.source_downscale > 1 else None
            )
        except Exception as exc:
            raise UserError(f"cannot decode mask {mask_path} (dataset index {index}): {exc}") from exc
        if mask.shape[:2] != (spec.height, spec.width):
            raise UserError(
                f"mask {mask_path} is {mask.shape[1]}x{mask.shape[0]}, image {self.images.path(index)} is {spec.width}x{spec.height} (WxH)"
            )
        return mask


def _view_of(out: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray | None:
    """``out``'s first bytes as a C-contiguous array of ``shape``, or None when it is too small."""
    if out is None:
        return None
    size = int(np.prod(shape))
    if size > out.size:
        return None
    return out[:size].reshape(shape)
