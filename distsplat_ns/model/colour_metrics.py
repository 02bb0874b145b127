"""Splatfacto's colour-corrected eval metrics (``--pipeline.model.color-corrected-metrics True``).

The render is colour-matched to the ground truth (nerfstudio's ``color_correct``: an affine colour
map fitted by least squares over the unsaturated pixels), then scored as the uncorrected image is.
Computed on rank 0 from the whole eval image in both parallel modes (sharded: the image every rank
rendered a band of, ``parallel/view_render.py``).

Shape letters: H/W pixels.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from nerfstudio.model_components.lib_bilagrid import color_correct

Metric = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def colour_corrected_metrics(
    predicted_rgb: torch.Tensor, gt_rgb: torch.Tensor, psnr: Metric, ssim: Metric, lpips: Metric | None
) -> dict[str, float]:
    """Splatfacto's ``cc_psnr``, ``cc_ssim`` and (when LPIPS is available) ``cc_lpips``.

    Args:
        predicted_rgb: The rendered image. `[H, W, 3]`, float in [0, 1].
        gt_rgb: The ground truth, composited. `[H, W, 3]`, float in [0, 1].
        psnr, ssim, lpips: The model's metrics, called as ``metric(gt, image)`` on `[1, 3, H, W]`.

    **Host sync:** the metric values.
    """
    corrected = torch.moveaxis(color_correct(predicted_rgb, gt_rgb), -1, 0)[None, ...]
    gt = torch.moveaxis(gt_rgb, -1, 0)[None, ...]
    metrics = {
        "cc_psnr": float(psnr(gt, corrected).item()),
        "cc_ssim": float(ssim(gt, corrected)),
    }  # host sync: reported
    if lpips is not None:
        metrics["cc_lpips"] = float(lpips(gt, corrected))
    return metrics
