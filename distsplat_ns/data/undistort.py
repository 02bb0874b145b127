"""Undistortion as nerfstudio 1.1.5 does it: the new intrinsics of each camera, then each image remapped.

Two halves, both replicating nerfstudio's ``FullImageDatamanager._undistort_image`` bit for bit (same
float32 K, OpenCV calls and, for FISHEYE624, torch operations): ``undistort_intrinsics`` (new K and
valid region per distinct camera, no pixel decoded) and ``undistort`` (the remap of image and mask,
maps cached per process in ``MapCache``). Pure: numpy, OpenCV and, for FISHEYE624 alone,
nerfstudio's projection functions, all imported lazily. Models, conventions and the map cache:
docs/data.md, "Decoding and hand-over".

Shape legend: ``H``, ``W``: pixels. ``C``: cameras.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from distsplat_ns.utils.errors import UserError

MAP_CACHE_ENTRIES = 4
"""Undistortion map pairs kept per process (one per distinct camera; a 1080x1920 pair takes 12 MB,
a 1408x1408 FISHEYE624 pair 16 MB plus its 2 MB mask)."""

CameraModel = Literal["perspective", "fisheye", "fisheye624"]


@dataclass(frozen=True)
class UndistortSpec:
    """How to undistort one camera's images (nerfstudio ``_undistort_image`` conventions).

    Attributes:
        camera_model: ``"perspective"`` (OpenCV k1 k2 p1 p2 k3 k4 ...), ``"fisheye"`` (k1..k4) or
            ``"fisheye624"`` (k0..k5, p0, p1, s0..s3: nerfstudio's FISHEYE624).
        K: Input intrinsics, row-major 3x3, float32 values as nerfstudio computes them; principal
            point shifted by -0.5 (OpenCV's top-left pixel convention) except for fisheye624,
            whose projection takes the camera's own fx, fy, cx, cy.
        dist: Distortion in OpenCV order (8 values for perspective, 4 for fisheye), or
            nerfstudio's 12 FISHEYE624 parameters.
        new_K: Output intrinsics before cropping, row-major 3x3 (fisheye624: the delivered
            pinhole camera, float32 values).
        size_wh: Input size ``(W, H)`` in pixels (also the uncropped output size, except for
            fisheye624).
        roi_xywh: Valid region to crop ``(x, y, w, h)``; the full output for fisheye and fisheye624.
        crop_radius_px: fisheye624 only: radius of the valid circle of the input image
            (transforms.json's ``fisheye_crop_radius``), pixels; None for the other models.
    """

    camera_model: CameraModel
    K: tuple[float, ...]
    dist: tuple[float, ...]
    new_K: tuple[float, ...]
    size_wh: tuple[int, int]
    roi_xywh: tuple[int, int, int, int]
    crop_radius_px: float | None = None


@dataclass(frozen=True)
class Undistortion:
    """One camera's undistortion and the camera it leaves.

    Attributes:
        spec: What the workers apply to the camera's images.
        fx, fy, cx, cy: Intrinsics of the delivered (undistorted, cropped) images, pixels, in
            nerfstudio's convention (principal point of the pixel grid, not OpenCV's top-left).
        width, height: Size of the delivered images, pixels.
    """

    spec: UndistortSpec
    fx: float
    fy: float
    cx: float
    cy: float
    width: int
    height: int


def undistort_intrinsics(
    camera_models: Sequence[str],
    fx: np.ndarray,
    fy: np.ndarray,
    cx: np.ndarray,
    cy: np.ndarray,
    widths: np.ndarray,
    heights: np.ndarray,
    distortion: np.ndarray,
    fisheye_crop_radius: Sequence[float | None] | None = None,
) -> list[Undistortion | None]:
    """The undistortion of each camera from K and the image size alone (no decoding), computed
    once per distinct camera.

    Args:
        camera_models: nerfstudio ``CameraType`` name per camera (``"PERSPECTIVE"``, ...). `[C]`.
        fx, fy, cx, cy: Intrinsics in nerfstudio's convention, pixels. `[C]`.
        widths, heights: Image sizes, pixels. `[C]`.
        distortion: nerfstudio distortion parameters (k1, k2, k3, k4, p1, p2 for perspective;
            k1..k4 for fisheye; k0..k5, p0, p1, s0..s3 for FISHEYE624). `[C, 6]` (`[C, 12]` with
            FISHEYE624 cameras).
        fisheye_crop_radius: Per camera, the radius of the valid image circle (nerfstudio's
            ``fisheye_crop_radius`` camera metadata), pixels, or None; None: no camera has one.
            Used by FISHEYE624 cameras only (nerfstudio's fisheye undistortion ignores it). `[C]`.

    Returns:
        Per camera, its ``Undistortion``, or None where every distortion parameter is 0.

    Raises:
        NotImplementedError: A distorted camera of a model other than perspective, fisheye or
            FISHEYE624.
        ValueError: A perspective camera with a non-zero k4 (unsupported by nerfstudio as well);
            a distorted FISHEYE624 camera without a usable ``fisheye_crop_radius``.
    """
    import cv2

    num_cameras = len(camera_models)
    radii = list(fisheye_crop_radius) if fisheye_crop_radius is not None else [None] * num_cameras
    for name, values in (
        ("fx", fx),
        ("fy", fy),
        ("cx", cx),
        ("cy", cy),
        ("widths", widths),
        ("heights", heights),
        ("distortion", distortion),
        ("fisheye_crop_radius", radii),
    ):
        if len(values) != num_cameras:
            raise ValueError(f"{name} must have one entry per camera ({num_cameras}), got {len(values)}")
    results: list[Undistortion | None] = [None] * num_cameras
    cache: dict[tuple, Undistortion] = {}
    for i in range(num_cameras):
        params = distortion[i]
        if not np.any(params != 0):
            continue
        key = (
            camera_models[i],
            float(fx[i]),
            float(fy[i]),
            float(cx[i]),
            float(cy[i]),
            int(widths[i]),
            int(heights[i]),
            tuple(params.tolist()),
        )
        if camera_models[i] == "FISHEYE624":
            key = (*key, _crop_radius(radii[i]))
        if key not in cache:
            cache[key] = _undistortion_for(cv2, key, params)
        results[i] = cache[key]
    return results


def _crop_radius(radius: object) -> float:
    """A FISHEYE624 camera's crop radius, checked: a number of pixels giving an image of >= 1 pixel."""
    if radius is None:
        raise UserError(
            "FISHEYE624 cameras need fisheye_crop_radius in transforms.json (the radius of the images' valid circle, "
            "pixels) to be undistorted, as in nerfstudio"
        )
    if isinstance(radius, bool) or not isinstance(radius, (int, float, np.integer, np.floating)) or not radius >= 0.5:
        raise UserError(f"fisheye_crop_radius in transforms.json must be a number of pixels >= 0.5, got {radius!r}")
    return float(radius)


def _undistortion_for(cv2, key: tuple, params: np.ndarray) -> Undistortion:
    camera_model, fx, fy, cx, cy, width, height = key[:7]
    # float32, like Cameras.get_intrinsics_matrices().numpy() in nerfstudio.
    K = np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]], dtype=np.float32)
    if camera_model == "FISHEYE624":
        return _fisheye624_undistortion(key, params, K)
    if camera_model == "PERSPECTIVE":
        if params[3] != 0:
            raise UserError(
                "perspective cameras with a non-zero 4th Brown parameter (k4) cannot be undistorted (as in nerfstudio)"
            )
        dist = np.array([params[0], params[1], params[4], params[5], params[2], params[3], 0, 0])
        K[0, 2] = K[0, 2] - 0.5
        K[1, 2] = K[1, 2] - 0.5
        new_K, roi = cv2.getOptimalNewCameraMatrix(K, dist, (width, height), 0)
        used_K = new_K.copy()
        x, y, w, h = (int(v) for v in roi)
        new_K[0, 2] -= x
        new_K[1, 2] -= y
        new_K[0, 2] = new_K[0, 2] + 0.5
        new_K[1, 2] = new_K[1, 2] + 0.5
        return _result(_spec("perspective", K, dist, used_K, (width, height), (x, y, w, h)), new_K, w, h)
    if camera_model == "FISHEYE":
        K[0, 2] = K[0, 2] - 0.5
        K[1, 2] = K[1, 2] - 0.5
        dist = np.array([params[0], params[1], params[2], params[3]])
        new_K = cv2.fisheye.estimateNewCameraMatrixForUndistortRectify(K, dist, (width, height), np.eye(3), balance=0)
        used_K = new_K.copy()
        new_K[0, 2] = new_K[0, 2] + 0.5
        new_K[1, 2] = new_K[1, 2] + 0.5
        return _result(_spec("fisheye", K, dist, used_K, (width, height), (0, 0, width, height)), new_K, width, height)
    raise NotImplementedError(
        f"undistortion of {camera_model} cameras is not supported by ParallelFullImageDatamanager "
        "(perspective, fisheye and FISHEYE624 are); use nerfstudio's FullImageDatamanager for this scene"
    )


def _fisheye624_undistortion(key: tuple, params: np.ndarray, K: np.ndarray) -> Undistortion:
    """A square pinhole camera over the crop circle's field of view, as nerfstudio's FISHEYE624 case.

    The same float32 torch operations in the same order: the field of view is the larger of the
    top-bottom and left-right angles between rays through the circle's edge points (docs/data.md,
    "Decoding and hand-over").
    """
    import torch
    from nerfstudio.cameras.camera_utils import fisheye624_unproject_helper

    _, fx, fy, cx, cy, width, height, _, radius = key
    model = _fisheye624_params(fx, fy, cx, cy, params)
    centre_x = torch.tensor([cx], dtype=torch.float32)
    centre_y = torch.tensor([cy], dtype=torch.float32)
    # float32 subtraction of the Python radius, as nerfstudio's on its camera's [1] tensors.
    edges = [
        (centre_x, centre_y - radius),
        (centre_x, centre_y + radius),
        (centre_x - radius, centre_y),
        (centre_x + radius, centre_y),
    ]
    points = torch.tensor([[float(u), float(v)] for u, v in edges], dtype=torch.float32)
    top, bottom, left, right = fisheye624_unproject_helper(points[None], params=model[None]).squeeze(dim=0)

    def angle(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.acos(torch.sum(a * b / torch.linalg.norm(a) / torch.linalg.norm(b)))

    fov = torch.max(angle(top, bottom), angle(left, right))
    side = int(radius * 2)
    new_K = torch.eye(3)
    new_K[0, 0] = new_K[1, 1] = side / (2 * torch.tan(fov / 2.0))
    new_K[0, 2] = new_K[1, 2] = (side - 1) / 2.0
    spec = _spec("fisheye624", K, params, new_K.numpy(), (width, height), (0, 0, side, side), radius)
    return _result(spec, new_K.numpy(), side, side)


def _fisheye624_params(fx: float, fy: float, cx: float, cy: float, dist: Sequence[float] | np.ndarray):
    """nerfstudio's FISHEYE624 parameter vector ``[fx, fy, cx, cy, k0..k5, p0, p1, s0..s3]``. `[16]` float32 tensor."""
    import torch

    return torch.tensor([fx, fy, cx, cy, *(float(v) for v in dist)], dtype=torch.float32)


def _spec(
    camera_model: CameraModel,
    K: np.ndarray,
    dist: np.ndarray,
    used_K: np.ndarray,
    size_wh: tuple[int, int],
    roi_xywh: tuple[int, int, int, int],
    crop_radius_px: float | None = None,
) -> UndistortSpec:
    return UndistortSpec(
        camera_model=camera_model,
        K=tuple(float(v) for v in K.reshape(-1)),
        dist=tuple(float(v) for v in dist),
        new_K=tuple(float(v) for v in used_K.reshape(-1)),
        size_wh=size_wh,
        roi_xywh=roi_xywh,
        crop_radius_px=crop_radius_px,
    )


def _result(spec: UndistortSpec, new_K: np.ndarray, width: int, height: int) -> Undistortion:
    return Undistortion(
        spec, float(new_K[0, 0]), float(new_K[1, 1]), float(new_K[0, 2]), float(new_K[1, 2]), width, height
    )


class MapCache:
    """Per-process LRU of undistortion maps (a 1080x1920 pair takes 12 MB), with the generated
    mask of each FISHEYE624 camera.

    Attributes:
        num_built: Map pairs computed so far by this process (a cache hit adds nothing).
    """

    def __init__(self, max_entries: int = MAP_CACHE_ENTRIES) -> None:
        self.max_entries = max_entries
        self.num_built = 0
        # (spec, map_type) -> (map1, map2) or, for fisheye624, (map1, map2, generated mask).
        self._maps: OrderedDict[tuple, tuple[np.ndarray, ...]] = OrderedDict()

    def get(self, spec: UndistortSpec, map_type: int) -> tuple[np.ndarray, np.ndarray]:
        """The remap maps of ``spec``'s camera (``map_type``: an OpenCV map type; fisheye624 maps
        are always float32), built on first use."""
        entry = self._entry(spec, map_type)
        return entry[0], entry[1]

    def generated_mask(self, spec: UndistortSpec) -> np.ndarray:
        """The mask a fisheye624 camera's undistorted images get: True where the remap reads
        inside the crop circle. `[H', W']` bool, shared: callers copy it before handing it out."""
        import cv2

        if spec.camera_model != "fisheye624":
            raise ValueError(f"only fisheye624 undistortion generates a mask, got a {spec.camera_model} spec")
        return self._entry(spec, cv2.CV_32FC1)[2]

    def _entry(self, spec: UndistortSpec, map_type: int) -> tuple[np.ndarray, ...]:
        import cv2

        if spec.camera_model == "fisheye624":
            map_type = cv2.CV_32FC1
        key = (spec, map_type)
        entry = self._maps.get(key)
        if entry is not None:
            self._maps.move_to_end(key)
            return entry
        if spec.camera_model == "fisheye624":
            entry = _fisheye624_maps_and_mask(spec)
        else:
            K = np.array(spec.K, dtype=np.float64).reshape(3, 3)
            new_K = np.array(spec.new_K, dtype=np.float64).reshape(3, 3)
            dist = np.array(spec.dist, dtype=np.float64)
            if spec.camera_model == "perspective":
                map1, map2 = cv2.initUndistortRectifyMap(K, dist, None, new_K, spec.size_wh, map_type)
                x, y, w, h = spec.roi_xywh
                # Only the pixels kept by the crop are ever computed.
                entry = (
                    np.ascontiguousarray(map1[y : y + h, x : x + w]),
                    np.ascontiguousarray(map2[y : y + h, x : x + w]),
                )
            else:
                entry = tuple(cv2.fisheye.initUndistortRectifyMap(K, dist, np.eye(3), new_K, spec.size_wh, map_type))
        self.num_built += 1
        self._maps[key] = entry
        if len(self._maps) > self.max_entries:
            self._maps.popitem(last=False)
        return entry


def _fisheye624_maps_and_mask(spec: UndistortSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Float32 remap maps and generated mask of a fisheye624 camera, as nerfstudio 1.1.5 builds them.

    The delivered grid unprojected through ``new_K`` and projected by nerfstudio's
    ``fisheye624_project`` (same float32 operations and point order), laid out x-major and with
    *v* as the x map as nerfstudio does, kept for parity (docs/data.md, "Limits and follow-ups").
    The mask is the crop circle remapped with the same maps, True where any of it is read.
    Returns ``(map_x, map_y, mask)``: `[H', W']` float32, float32, bool.
    """
    import cv2
    import torch
    from nerfstudio.cameras.camera_utils import fisheye624_project

    assert spec.crop_radius_px is not None  # set with camera_model "fisheye624" (_fisheye624_undistortion)
    fx, _, cx, _, fy, cy = spec.K[:6]
    model = _fisheye624_params(fx, fy, cx, cy, spec.dist)
    side_x, side_y = spec.roi_xywh[2], spec.roi_xywh[3]
    new_K = torch.tensor(spec.new_K, dtype=torch.float32).reshape(3, 3)
    xs, ys = torch.meshgrid(
        torch.arange(side_x, dtype=torch.float32), torch.arange(side_y, dtype=torch.float32), indexing="ij"
    )
    pixels = torch.stack([xs, ys, torch.ones((side_x, side_y), dtype=torch.float32)], dim=-1).reshape(
        (side_x * side_y, 3)
    )
    rays = torch.einsum("ij,bj->bi", torch.linalg.inv(new_K), pixels)
    uv = fisheye624_project(xyz=rays[None], params=model[None, :]).reshape((side_x, side_y, 2)).numpy()
    map_x, map_y = np.ascontiguousarray(uv[..., 1]), np.ascontiguousarray(uv[..., 0])
    width, height = spec.size_wh
    rows, cols = np.mgrid[:height, :width]
    # sqrt of the exact integer sum: the float64 value np.linalg.norm gives nerfstudio.
    inside = np.sqrt((rows - height // 2) ** 2 + (cols - width // 2) ** 2) < spec.crop_radius_px
    warped = cv2.remap(
        inside.astype(np.uint8) * 255,
        map_x,
        map_y,
        interpolation=cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_CONSTANT,
        borderValue=0,
    )
    return map_x, map_y, warped != 0


def undistort(
    image: np.ndarray,
    mask: np.ndarray | None,
    spec: UndistortSpec,
    cache: MapCache,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Undistort and crop an image and its mask, as nerfstudio's ``_undistort_image`` does.

    Args:
        image: Pixels. `[H, W, C]`, uint8.
        mask: Mask. `[H, W, 1]`, bool, or None (always None for fisheye624: it generates its own).
        spec: The camera's undistortion.
        cache: Map cache of this process.
        out: Where to write the image (`[H', W', C]` uint8, C-contiguous), or None to allocate.

    Returns:
        ``(image, mask)``: `[H', W', C]` uint8 and `[H', W', 1]` bool (or None), ``(W', H')`` being
        the ROI size. fisheye624: the mask is the generated one (a fresh copy of the cached mask).

    Raises:
        ValueError: A mask given with a fisheye624 spec (the glue refuses mask files for them).
    """
    import cv2

    if spec.camera_model == "fisheye624" and mask is not None:
        raise ValueError(
            "fisheye624 undistortion generates its own mask; mask files are refused at start-up (image_specs.py)"
        )
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
    if spec.camera_model == "fisheye624":
        # A copy: the cached mask must not be shared with tensors that leave this function.
        out_mask = cache.generated_mask(spec)[:, :, None].copy()
    elif mask is not None:
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
