"""Camera pose optimisation (``--pipeline.model.camera-optimizer.mode SO3xR3 | SE3``) on batches of
band cameras.

Each camera of a step carries its training-camera index under :data:`TRAIN_CAMERA_IDS` (`[C, 1]`,
kept through ``Cameras`` slicing and ``.to``), and :func:`adjusted_camera_to_worlds` applies each
camera's own adjustment exactly as nerfstudio's ``CameraOptimizer.apply_to_camera`` does. A band is
a crop of its adjusted camera. Only training renders are adjusted (``DistSplatModel.render_inputs``
checks ``training``); a camera without an index (viser's) is used as given. Why and how the
gradient is summed: docs/parity.md, "Camera pose optimisation".

Shape letters: C cameras.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from distsplat_ns.utils.host_to_device import to_device

if TYPE_CHECKING:
    from nerfstudio.cameras.camera_optimizers import CameraOptimizer
    from nerfstudio.cameras.cameras import Cameras

#: ``Cameras.metadata`` key of each camera's training-camera index. `[C, 1]`, int64.
TRAIN_CAMERA_IDS = "distsplat_train_camera_ids"


def with_train_camera_ids(cameras: Cameras, camera_ids: Sequence[int]) -> Cameras:
    """``cameras`` (a batch's, freshly sliced from the training cameras) with each camera's
    training-camera index in its metadata, in place; returned for chaining.

    Raises:
        ValueError: not one id per camera.
    """
    ids = torch.tensor(list(camera_ids), dtype=torch.long).reshape(-1, 1)
    if ids.shape[0] != len(cameras):
        raise ValueError(f"with_train_camera_ids: {ids.shape[0]} ids for {len(cameras)} cameras")
    cameras.metadata = {**(cameras.metadata or {}), TRAIN_CAMERA_IDS: ids}
    return cameras


def train_camera_ids(cameras: Cameras) -> torch.Tensor | None:
    """Each camera's training-camera index `[C]` (int64, on the cameras' device): ours
    (:data:`TRAIN_CAMERA_IDS`), else splatfacto's single ``cam_idx``; None when neither is there."""
    metadata = cameras.metadata or {}
    if TRAIN_CAMERA_IDS in metadata:
        return metadata[TRAIN_CAMERA_IDS].reshape(-1)
    if "cam_idx" in metadata and len(cameras) == 1:
        return torch.tensor([int(metadata["cam_idx"])], dtype=torch.long)
    return None


def adjusted_camera_to_worlds(camera_optimizer: CameraOptimizer, cameras: Cameras) -> torch.Tensor:
    """Each camera's pose with its learned adjustment: ``apply_to_camera``'s formula per camera.

    Args:
        camera_optimizer: The model's (mode off: the poses are returned as given).
        cameras: The cameras, with :data:`TRAIN_CAMERA_IDS` (or one ``cam_idx``); without either
            they are returned as given (nerfstudio's viewer cameras).

    Returns:
        OpenGL camera-to-world `[C, 3, 4]`: when adjusted, in the adjustments' dtype (float64 in
        the float64 mode) and on their device; otherwise as given.

    **Differentiable:** with respect to the camera optimizer's ``pose_adjustment``.
    **Host sync:** none (host-side ids and poses are sent to the parameters' device without waiting).
    """
    c2w = cameras.camera_to_worlds
    ids = train_camera_ids(cameras) if camera_optimizer.config.mode != "off" else None
    if ids is None:
        return c2w
    adjustment = camera_optimizer.pose_adjustment
    adj = camera_optimizer(to_device(ids, adjustment.device))  # [C, 3, 4]
    c2w = to_device(c2w, adjustment.device).to(adj.dtype)
    return torch.cat([torch.bmm(adj[..., :3, :3], c2w[..., :3, :3]), c2w[..., :3, 3:] + adj[..., :3, 3:]], dim=-1)


def camera_optimizer_metrics(camera_optimizer: CameraOptimizer) -> dict[str, float]:
    """Splatfacto's training metrics of the adjustments (``CameraOptimizer.get_metrics_dict``:
    translation and rotation size, mean and max; none with the mode off), as floats. Every rank
    holds the same adjustments: rank 0 logs them once.

    **Host sync:** the four numbers (logging steps only).
    """
    metrics: dict = {}
    camera_optimizer.get_metrics_dict(metrics)
    return {key: float(value) for key, value in metrics.items()}  # host sync: logged figures


def camera_loss_terms(camera_optimizer: CameraOptimizer, adds: bool, like: torch.Tensor) -> dict[str, torch.Tensor]:
    """nerfstudio's camera-optimizer loss terms (``get_loss_dict``: ``camera_opt_regularizer``)
    this rank adds to its loss share: the terms where ``adds`` (one rank per step), zeros of
    ``like``'s dtype under the same keys elsewhere (so the logged sum over ranks is splatfacto's);
    none with the mode off.

    **Differentiable:** with respect to ``pose_adjustment`` (where ``adds``).
    """
    if camera_optimizer.config.mode == "off":
        return {}
    terms: dict[str, torch.Tensor] = {}
    if adds:
        camera_optimizer.get_loss_dict(terms)
        return {key: value.to(like.dtype) for key, value in terms.items()}
    return {"camera_opt_regularizer": like.new_zeros(())}
