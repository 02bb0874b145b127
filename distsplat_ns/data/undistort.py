"""Undistortion as nerfstudio 1.1.5 does it: the new intrinsics of each camera, then each image remapped.

Pure: numpy and OpenCV (imported lazily). No nerfstudio import: the glue
(``image_specs.undistort_cameras``) hands over nerfstudio's camera model names and intrinsics and
writes the results back into its ``Cameras``; the workers (``image_loader.ImageLoader``) apply the
``UndistortSpec`` of each image.

Two halves, both replicating nerfstudio's ``FullImageDatamanager._undistort_image`` (same float32
K, same OpenCV calls), so that cameras and pixels match its loader bit for bit:

- **Intrinsics, no pixel decoded** (``undistort_intrinsics``): per distinct camera, the optimal new
  camera matrix and valid region (``cv2.getOptimalNewCameraMatrix`` for perspective cameras,
  ``cv2.fisheye.estimateNewCameraMatrixForUndistortRectify`` for fisheye), giving an
  ``UndistortSpec`` and the intrinsics and size of the delivered images.
- **Pixels** (``undistort``): remap of the image and its mask with maps computed once per distinct
  camera and kept in a small per-process cache (``MapCache``): ``cv2.undistort`` rebuilds the same
  maps on every call (it is ``initUndistortRectifyMap`` + ``remap`` in row stripes), so caching
  gives identical pixels for less work. Perspective maps are computed for the kept region only.

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
"""Undistortion map pairs kept per process (one per distinct camera; a 1080x1920 pair takes 12 MB)."""


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
) -> list[Undistortion | None]:
    """The undistortion of each camera, computed from K and the image size alone (no decoding).

    Computed once per distinct camera (model, intrinsics, size and distortion alike).

    Args:
        camera_models: nerfstudio ``CameraType`` name per camera (``"PERSPECTIVE"``, ...). `[C]`.
        fx, fy, cx, cy: Intrinsics in nerfstudio's convention, pixels. `[C]`.
        widths, heights: Image sizes, pixels. `[C]`.
        distortion: nerfstudio distortion parameters (k1, k2, k3, k4, p1, p2 for perspective;
            k1..k4 for fisheye). `[C, 6]`.

    Returns:
        Per camera, its ``Undistortion``, or None where every distortion parameter is 0.

    Raises:
        NotImplementedError: A distorted camera of a model other than perspective or fisheye.
        ValueError: A perspective camera with a non-zero k4 (unsupported by nerfstudio as well).
    """
    import cv2

    num_cameras = len(camera_models)
    for name, values in (("fx", fx), ("fy", fy), ("cx", cx), ("cy", cy), ("widths", widths), ("heights", heights), ("distortion", distortion)):
        if len(values) != num_cameras:
            raise ValueError(f"{name} must have one entry per camera ({num_cameras}), got {len(values)}")
    results: list[Undistortion | None] = [None] * num_cameras
    cache: dict[tuple, Undistortion] = {}
    for i in range(num_cameras):
        params = distortion[i]
        if not np.any(params != 0):
            continue
        key = (camera_models[i], float(fx[i]), float(fy[i]), float(cx[i]), float(cy[i]), int(widths[i]), int(heights[i]), tuple(params.tolist()))
        if key not in cache:
            cache[key] = _undistortion_for(cv2, key, params)
        results[i] = cache[key]
    return results


def _undistortion_for(cv2, key: tuple, params: np.ndarray) -> Undistortion:
    camera_model, fx, fy, cx, cy, width, height, _ = key
    # float32, like Cameras.get_intrinsics_matrices().numpy() in nerfstudio.
    K = np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]], dtype=np.float32)
    if camera_model == "PERSPECTIVE":
        if params[3] != 0:
            raise UserError("perspective cameras with a non-zero 4th Brown parameter (k4) cannot be undistorted (as in nerfstudio)")
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
        "(perspective and fisheye are); use nerfstudio's FullImageDatamanager for this scene"
    )


def _spec(
    camera_model: Literal["perspective", "fisheye"],
    K: np.ndarray,
    dist: np.ndarray,
    used_K: np.ndarray,
    size_wh: tuple[int, int],
    roi_xywh: tuple[int, int, int, int],
) -> UndistortSpec:
    return UndistortSpec(
        camera_model=camera_model,
        K=tuple(float(v) for v in K.reshape(-1)),
        dist=tuple(float(v) for v in dist),
        new_K=tuple(float(v) for v in used_K.reshape(-1)),
        size_wh=size_wh,
        roi_xywh=roi_xywh,
    )


def _result(spec: UndistortSpec, new_K: np.ndarray, width: int, height: int) -> Undistortion:
    return Undistortion(spec, float(new_K[0, 0]), float(new_K[1, 1]), float(new_K[0, 2]), float(new_K[1, 2]), width, height)


class MapCache:
    """Per-process LRU of undistortion maps (a 1080x1920 pair takes 12 MB)."""

    def __init__(self, max_entries: int = MAP_CACHE_ENTRIES) -> None:
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
    mask: np.ndarray | None,
    spec: UndistortSpec,
    cache: MapCache,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
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
