"""Pure-PyTorch EWA projection of 3D Gaussians, following gsplat 1.4.0's pinhole kernel.

This is the reference backend's ``fully_fused_projection``: world -> camera (OpenCV ``w2c``),
covariance from quaternion and scale, the local affine (EWA) approximation of the perspective
projection with gsplat's clamping of ``x/z`` and ``y/z`` (Zwicker et al., "EWA Splatting", 2002;
the clamp keeps the Jacobian of far-off-screen Gaussians bounded, as in the 3DGS reference code),
the ``eps2d`` low-pass blur, the 3-sigma radius and gsplat's culling rules.

Shape legend: ``C`` cameras, ``N`` Gaussians.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["ProjectedGaussians", "project_gaussians", "quats_to_rotmats"]

_FOV_MARGIN = 0.3
"""Fraction of tan(fov/2) by which ``x/z`` may leave the image before the Jacobian is clamped
(gsplat ``persp_proj``; 3DGS uses 1.3 x tan_fov, i.e. the same 0.3 margin)."""

_RADIUS_SIGMAS = 3.0
"""A Gaussian's screen footprint is its 3-sigma extent along the largest eigen-direction."""

_MIN_EIGEN_GAP = 0.01
"""Floor on ``b^2 - det`` under the square root of the largest eigenvalue (gsplat)."""


@dataclass
class ProjectedGaussians:
    """Per-camera 2D Gaussians; entries with ``radii == 0`` are culled and hold zeros.

    Attributes:
        radii: 3-sigma screen radius, 0 where culled. `[C, N]`, int32, px.
        means2d: Projected centres. `[C, N, 2]`, px, pixel centres at +0.5.
        depths: Camera-space z. `[C, N]`, world units.
        conics: Inverse 2D covariance ``(a, b, c)`` of ``[[a, b], [b, c]]``. `[C, N, 3]`, 1/px^2.
        compensations: ``sqrt(det_orig / det_blur)``, or None unless asked for. `[C, N]`.
    """

    radii: Tensor
    means2d: Tensor
    depths: Tensor
    conics: Tensor
    compensations: Tensor | None


def quats_to_rotmats(quats: Tensor) -> Tensor:
    """Rotation matrices from quaternions.

    Args:
        quats: Quaternions, ``(w, x, y, z)``, need not be normalised. `[..., 4]`, float.

    Returns:
        Rotation matrices. `[..., 3, 3]`, same dtype.

    **Differentiable:** with respect to ``quats``.
    """
    w, x, y, z = torch.nn.functional.normalize(quats, dim=-1).unbind(-1)
    rows = [
        1.0 - 2.0 * (y * y + z * z), 2.0 * (x * y - w * z), 2.0 * (x * z + w * y),
        2.0 * (x * y + w * z), 1.0 - 2.0 * (x * x + z * z), 2.0 * (y * z - w * x),
        2.0 * (x * z - w * y), 2.0 * (y * z + w * x), 1.0 - 2.0 * (x * x + y * y),
    ]  # fmt: skip
    return torch.stack(rows, dim=-1).reshape(*quats.shape[:-1], 3, 3)


def _covariances(quats: Tensor, scales: Tensor) -> Tensor:
    """``R diag(s^2) R^T``, computed as ``c I + R diag(s^2 - c) R^T`` with ``c = min(s^2)`` (no grad).

    Equal for any rotation ``R`` (``R R^T = I``), and so is the gradient along rotations. The
    reason: a Gaussian with equal scales (splatfacto's initial Gaussians all are) looks the same
    under every rotation, so its quaternion gradient is exactly 0 -- and here it is computed as 0,
    where ``R diag(s^2) R^T`` leaves rounding noise (~1e-15 against O(10) for the other gradients)
    that depends on the summation order. Adam's eps of 1e-15 turns that noise into steps of about
    the learning rate, different for 1 and 2 processes (docs/float64_exactness.md).
    """
    rotmats = quats_to_rotmats(quats)  # [N, 3, 3]
    variances = scales * scales
    floor = variances.detach().amin(dim=-1, keepdim=True)  # [N, 1]
    m = rotmats * (variances - floor)[:, None, :]  # R @ diag(s^2 - c)
    eye = torch.eye(3, dtype=scales.dtype, device=scales.device)
    return floor[..., None] * eye + m @ rotmats.transpose(-1, -2)


def project_gaussians(
    means: Tensor,
    quats: Tensor,
    scales: Tensor,
    viewmats: Tensor,
    Ks: Tensor,
    width: int,
    height: int,
    *,
    eps2d: float = 0.3,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    radius_clip: float = 0.0,
    calc_compensations: bool = False,
) -> ProjectedGaussians:
    """Project 3D Gaussians into every camera (pinhole), as gsplat's ``fully_fused_projection``.

    Args:
        means: Centres. `[N, 3]`, world units.
        quats: Rotations ``(w, x, y, z)``, need not be normalised. `[N, 4]`.
        scales: Activated standard deviations along the local axes. `[N, 3]`, world units.
        viewmats: World-to-camera (OpenCV: x right, y down, z forward). `[C, 4, 4]`.
        Ks: Intrinsics ``[[fx, 0, cx], [0, fy, cy], [0, 0, 1]]``. `[C, 3, 3]`, px.
        width: Image width, px.
        height: Image height, px.
        eps2d: Added to the 2D covariance diagonal (low-pass filter), px^2.
        near_plane: Gaussians with z below this are culled, world units.
        far_plane: Gaussians with z above this are culled, world units.
        radius_clip: Gaussians with a screen radius <= this are culled, px.
        calc_compensations: Also return the antialiasing factor ``sqrt(det_orig / det_blur)``.

    Returns:
        The projected Gaussians; culled entries (radius 0) hold zeros everywhere.

    **Invariants:** a Gaussian is kept iff ``near <= z <= far``, the blurred determinant is
    positive, ``radius > radius_clip`` and its radius-square overlaps ``[0, W] x [0, H]``.

    **Differentiable:** with respect to ``means``, ``quats``, ``scales`` (and ``viewmats``, ``Ks``,
    untested). Culled entries get zero gradient; no NaN can leak from them.
    """
    rot_w2c = viewmats[:, :3, :3]  # [C, 3, 3]
    t_w2c = viewmats[:, :3, 3]  # [C, 3]
    # A broadcast product, not an einsum: its backward sums the cameras' [C, N, 3] gradients into a
    # contiguous [N, 3] one (the einsum's is transposed, which AccumulateGrad copies), as gsplat's.
    means_c = torch.matmul(means, rot_w2c.transpose(-1, -2)) + t_w2c[:, None, :]  # [C, N, 3]

    covars = _covariances(quats, scales)  # [N, 3, 3]
    covars_c = rot_w2c[:, None] @ covars[None] @ rot_w2c.transpose(-1, -2)[:, None]  # [C, N, 3, 3]

    x, y, z = means_c.unbind(-1)
    fx, fy = Ks[:, 0, 0, None], Ks[:, 1, 1, None]  # [C, 1]
    cx, cy = Ks[:, 0, 2, None], Ks[:, 1, 2, None]

    depth_ok = (z >= near_plane) & (z <= far_plane)
    # Culled entries compute on harmless stand-ins so no inf/NaN reaches the backward pass.
    z_safe = torch.where(depth_ok, z, torch.ones_like(z))
    rz = 1.0 / z_safe
    rz2 = rz * rz

    tan_fovx = 0.5 * width / fx
    tan_fovy = 0.5 * height / fy
    lim_x_pos = (width - cx) / fx + _FOV_MARGIN * tan_fovx
    lim_x_neg = cx / fx + _FOV_MARGIN * tan_fovx
    lim_y_pos = (height - cy) / fy + _FOV_MARGIN * tan_fovy
    lim_y_neg = cy / fy + _FOV_MARGIN * tan_fovy
    tx = z_safe * torch.clamp(x * rz, min=-lim_x_neg, max=lim_x_pos)
    ty = z_safe * torch.clamp(y * rz, min=-lim_y_neg, max=lim_y_pos)

    zeros = torch.zeros_like(z)
    jac = torch.stack([fx * rz, zeros, -fx * tx * rz2, zeros, fy * rz, -fy * ty * rz2], dim=-1).reshape(
        *z.shape, 2, 3
    )  # [C, N, 2, 3]
    covars2d = jac @ covars_c @ jac.transpose(-1, -2)  # [C, N, 2, 2]
    means2d = torch.stack([fx * x * rz + cx, fy * y * rz + cy], dim=-1)  # [C, N, 2]

    cov_a = covars2d[..., 0, 0]
    cov_b = 0.5 * (covars2d[..., 0, 1] + covars2d[..., 1, 0])
    cov_c = covars2d[..., 1, 1]
    det_orig = cov_a * cov_c - cov_b * cov_b
    cov_a = cov_a + eps2d
    cov_c = cov_c + eps2d
    det = cov_a * cov_c - cov_b * cov_b
    det_ok = det > 0
    det_safe = torch.where(det_ok, det, torch.ones_like(det))
    conics = torch.stack([cov_c / det_safe, -cov_b / det_safe, cov_a / det_safe], dim=-1)

    with torch.no_grad():
        half_trace = 0.5 * (cov_a + cov_c)
        lambda_max = half_trace + torch.sqrt(torch.clamp(half_trace * half_trace - det, min=_MIN_EIGEN_GAP))
        radius = torch.ceil(_RADIUS_SIGMAS * torch.sqrt(lambda_max))
        u, v = means2d[..., 0], means2d[..., 1]
        inside = (u + radius > 0) & (u - radius < width) & (v + radius > 0) & (v - radius < height)
        valid = depth_ok & det_ok & (radius > radius_clip) & inside
        radii = torch.where(valid, radius, torch.zeros_like(radius)).to(torch.int32)

    compensations = None
    if calc_compensations:
        ratio = det_orig / det_safe
        ratio_ok = ratio > 0
        # sqrt has an infinite slope at 0: keep non-positive ratios off it (gradient 0 there).
        comp = torch.sqrt(torch.where(ratio_ok, ratio, torch.ones_like(ratio)))
        compensations = torch.where(ratio_ok & valid, comp, torch.zeros_like(comp))

    return ProjectedGaussians(
        radii=radii,
        means2d=torch.where(valid[..., None], means2d, torch.zeros_like(means2d)),
        depths=torch.where(valid, z, torch.zeros_like(z)),
        conics=torch.where(valid[..., None], conics, torch.zeros_like(conics)),
        compensations=compensations,
    )
