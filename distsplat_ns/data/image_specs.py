"""Per-image decode instructions from a nerfstudio dataset: cameras undistorted, one ``ImageSpec`` per image.

nerfstudio glue. ``undistort_cameras`` rewrites a split's ``InputDataset.cameras`` to the
intrinsics and sizes of the delivered images (``undistort.py``'s arithmetic, no decode);
``image_specs`` tells the workers, per image, the file's size, resize, alpha and mask colours and
undistortion (``image_loader.ImageSpec``, picklable, free of nerfstudio). FISHEYE624 cameras take
their crop radius from ``fisheye_crop_radius`` and generate their masks, so mask files are refused
with them (as nerfstudio's loader asserts).

Shape legend: ``C``: cameras.
"""

from __future__ import annotations

from nerfstudio.cameras.cameras import Cameras, CameraType
from nerfstudio.data.dataparsers.base_dataparser import DataparserOutputs
from nerfstudio.data.datasets.base_dataset import InputDataset

from distsplat_ns.data.dataparse import parsed_size_hw
from distsplat_ns.data.image_loader import ImageSpec
from distsplat_ns.data.undistort import UndistortSpec, undistort_intrinsics
from distsplat_ns.utils.errors import UserError


def undistort_cameras(cameras: Cameras) -> list[UndistortSpec | None]:
    """Rewrite ``cameras`` in place to the intrinsics of their undistorted images.

    nerfstudio 1.1.5's ``_undistort_image`` arithmetic (``undistort.undistort_intrinsics``), no
    image decoded. Distortion parameters are zeroed so that the cameras describe the delivered
    pixels (nerfstudio keeps them; the camera type stays). FISHEYE624 cameras use
    ``cameras.metadata["fisheye_crop_radius"]`` (one radius for all cameras, pixels, not rescaled).

    Args:
        cameras: A flat batch of cameras (`[C]`), e.g. ``InputDataset.cameras`` after scaling.

    Returns:
        Per camera, its ``UndistortSpec`` or None (no distortion).

    Raises:
        NotImplementedError: A distorted camera of a model other than perspective, fisheye or FISHEYE624.
        ValueError: A perspective camera with a non-zero k4 (unsupported by nerfstudio as well); a
            distorted FISHEYE624 camera without a usable ``fisheye_crop_radius``.
    """
    if len(cameras.shape) != 1:
        raise ValueError(f"cameras must have one batch dimension, got shape {tuple(cameras.shape)}")
    num_cameras = cameras.shape[0]
    if cameras.distortion_params is None:
        return [None] * num_cameras
    # Dataparsers may hand out expanded views (one row shared by all cameras): write to copies.
    for name in ("fx", "fy", "cx", "cy", "width", "height", "distortion_params"):
        setattr(cameras, name, getattr(cameras, name).clone())
    radius = cameras.metadata.get("fisheye_crop_radius") if cameras.metadata is not None else None
    results = undistort_intrinsics(
        [CameraType(int(t)).name for t in cameras.camera_type[:, 0].tolist()],
        cameras.fx[:, 0].cpu().numpy(),
        cameras.fy[:, 0].cpu().numpy(),
        cameras.cx[:, 0].cpu().numpy(),
        cameras.cy[:, 0].cpu().numpy(),
        cameras.width[:, 0].cpu().numpy(),
        cameras.height[:, 0].cpu().numpy(),
        cameras.distortion_params.detach().cpu().numpy().copy(),
        fisheye_crop_radius=[radius] * num_cameras,
    )
    for i, result in enumerate(results):
        if result is None:
            continue
        cameras.fx[i] = result.fx
        cameras.fy[i] = result.fy
        cameras.cx[i] = result.cx
        cameras.cy[i] = result.cy
        cameras.width[i] = result.width
        cameras.height[i] = result.height
        cameras.distortion_params[i] = 0.0
    return [result.spec if result is not None else None for result in results]


def image_specs(
    dataset: InputDataset,
    undistort: list[UndistortSpec | None],
    heights: list[int],
    widths: list[int],
    source_downscale: int = 1,
) -> list[ImageSpec]:
    """Per-image decode instructions for ``dataset`` (sizes before undistortion); files are
    decoded at ``1 / source_downscale`` (a dataparser downscale without its images_N folder).

    Raises:
        ValueError: Mask files together with undistorted FISHEYE624 cameras (they generate their masks).
    """
    outputs: DataparserOutputs = dataset._dataparser_outputs
    if outputs.mask_filenames is not None and any(u is not None and u.camera_model == "fisheye624" for u in undistort):
        raise UserError(
            "mask files (mask_path in transforms.json) cannot be used with FISHEYE624 cameras: their undistortion "
            "generates the mask from fisheye_crop_radius (nerfstudio refuses them too); remove mask_path"
        )
    parsed = parsed_size_hw(outputs) if source_downscale > 1 else [None] * len(dataset)
    alpha = outputs.alpha_color
    alpha_color = tuple(float(v) for v in alpha.reshape(-1).tolist()) if alpha is not None else None
    mask_color = tuple(float(v) for v in dataset.mask_color) if dataset.mask_color else None
    return [
        ImageSpec(
            height=heights[i],
            width=widths[i],
            scale_factor=float(dataset.scale_factor),
            alpha_color=alpha_color,  # type: ignore[arg-type]
            mask_color=mask_color,  # type: ignore[arg-type]
            undistort=undistort[i],
            source_downscale=source_downscale,
            parsed_size_hw=parsed[i],
        )
        for i in range(len(dataset))
    ]
