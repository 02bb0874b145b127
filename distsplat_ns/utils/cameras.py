"""The one conversion between nerfstudio's camera poses and gsplat's view matrices, and the one
rule for image sizes at a downscale.

nerfstudio's ``c2w`` is camera-to-world in OpenGL axes (x right, y up, looking down -z); gsplat's
``w2c`` (``viewmats``) is world-to-camera in OpenCV axes (x right, y down, looking down +z).
"""

from __future__ import annotations

import torch


def c2w_to_viewmat(c2w: torch.Tensor) -> torch.Tensor:
    """OpenCV world-to-camera matrices from OpenGL camera-to-world poses.

    Args:
        c2w: Camera-to-world poses. `[C, 3, 4]` (or `[C, 4, 4]`), float.

    Returns:
        World-to-camera matrices. `[C, 4, 4]`, same dtype and device.

    **Differentiable:** with respect to ``c2w`` (camera optimisation).
    """
    if c2w.dim() != 3 or c2w.shape[-2] not in (3, 4) or c2w.shape[-1] != 4:
        raise ValueError(f"c2w must be [C, 3, 4] or [C, 4, 4], got {tuple(c2w.shape)}")
    flip = torch.tensor([1.0, -1.0, -1.0], dtype=c2w.dtype, device=c2w.device)
    rot = c2w[:, :3, :3] * flip  # OpenGL -> OpenCV camera axes
    trans = c2w[:, :3, 3:4]
    rot_inv = rot.transpose(1, 2)
    viewmat = torch.zeros(c2w.shape[0], 4, 4, dtype=c2w.dtype, device=c2w.device)
    viewmat[:, 3, 3] = 1.0
    viewmat[:, :3, :3] = rot_inv
    viewmat[:, :3, 3:4] = -torch.bmm(rot_inv, trans)
    return viewmat


def downscaled_px(px: int, downscale: int) -> int:
    """An image side (px) rendered at ``1 / downscale`` resolution: truncated, as nerfstudio's
    ``Cameras.rescale_output_resolution`` and splatfacto's resolution schedule do."""
    return int(px / downscale)
