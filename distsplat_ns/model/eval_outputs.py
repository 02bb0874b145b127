"""Eval, export and viewer outputs of ``DistSplatModel``: one whole camera rasterized into
nerfstudio's outputs (``render_view``), and an eval image's metrics (``EvalMetrics``).

The model (``model/distsplat_model.py``) decides what is rendered -- its own Gaussians (cropped
for the viewer), or, in sharded training, every rank's shard through the parallel mode's
``view_renderer`` (``parallel/view_render.py``) -- and calls these with what they read.

Shape letters: N Gaussians, H/W pixels, K SH bases.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from nerfstudio.models.splatfacto import SplatfactoModelConfig

from distsplat_ns.model.band_render import RenderInputs
from distsplat_ns.model.colour_metrics import colour_corrected_metrics
from distsplat_ns.rendering import rasterization
from distsplat_ns.utils.logging import get_logger

LOGGER = get_logger(__name__)

LpipsSetting = Literal["auto", "off"]
"""``--pipeline.model.lpips``: "auto" builds LPIPS on first use when its weights load, "off" never."""


def render_view(
    params: dict[str, torch.Tensor],
    inputs: RenderInputs,
    background: torch.Tensor,
    sh_degree: int | None,
    training: bool,
    config: SplatfactoModelConfig,
) -> dict[str, torch.Tensor | None]:
    """One camera rendered whole, as nerfstudio's outputs.

    Args:
        params: The Gaussians to render, activated (``DistSplatModel._activated``): ``means``
            `[N, 3]`, ``quats`` `[N, 4]`, ``scales`` `[N, 3]`, ``opacities`` `[N]`, ``colors``
            `[N, K, 3]` (or `[N, 3]` at SH degree 0).
        inputs: The camera (one), on the Gaussians' device.
        background: The eval background colour. `[3]`.
        sh_degree: The SH degree to render at (None: degree 0).
        training: Whether the model trains (depth is rendered in eval, and where configured).
        config: The model's configuration (rasterize mode, backend, depth during training).

    Returns:
        ``rgb`` `[H, W, 3]`, ``depth`` `[H, W, 1]` (None when not rendered), ``accumulation``
        `[H, W, 1]` and ``background`` (`[H, W, 3]` in eval), float32 whatever the Gaussians'
        precision (metrics and viewer expect it).
    """
    viewmats, Ks, width, height = inputs.viewmats, inputs.Ks, inputs.width, inputs.height
    render_mode = "RGB+ED" if (config.output_depth_during_training or not training) else "RGB"
    render, alpha, _ = rasterization(
        **params,
        viewmats=viewmats,
        Ks=Ks,
        width=width,
        height=height,
        packed=False,
        near_plane=0.01,
        far_plane=1e10,
        render_mode=render_mode,
        sh_degree=sh_degree,
        absgrad=False,
        rasterize_mode=config.rasterize_mode,
        backend=config.rendering_backend,
    )
    rgb = torch.clamp(render[..., :3] + (1 - alpha) * background, 0.0, 1.0)
    depth_im = None
    if render_mode == "RGB+ED":
        depth_im = render[..., 3:4]
        depth_im = torch.where(alpha > 0, depth_im, depth_im.detach().max()).squeeze(0)
    if background.shape[0] == 3 and not training:
        background = background.expand(height, width, 3)
    return {
        "rgb": rgb.squeeze(0).float(),
        "depth": None if depth_im is None else depth_im.float(),
        "accumulation": alpha.squeeze(0).float(),
        "background": background.float(),
    }


class EvalMetrics:
    """PSNR, SSIM and, when its network weights load, LPIPS of an eval image (nerfstudio's keys).

    Args:
        psnr: The PSNR metric (a module of the model, so that it moves with it).
        ssim: The SSIM metric.
        lpips: ``--pipeline.model.lpips``: "auto" builds LPIPS on first use (an offline machine
            gets a one-line notice and no LPIPS), "off" never.
        colour_corrected: ``--pipeline.model.color-corrected-metrics``: also splatfacto's
            ``cc_*`` keys (``model/colour_metrics.py``).
    """

    def __init__(
        self, psnr: torch.nn.Module, ssim: torch.nn.Module, lpips: LpipsSetting, colour_corrected: bool = False
    ) -> None:
        self.psnr = psnr
        self.ssim = ssim
        self.colour_corrected = colour_corrected
        # LPIPS downloads AlexNet weights when built: build it on first use (offline machines).
        self._lpips: Any = None
        self._lpips_state: Literal["unbuilt", "ready", "unavailable"] = "unbuilt" if lpips == "auto" else "unavailable"

    def _lpips_metric(self, device: torch.device) -> Any:
        if self._lpips_state == "unbuilt":
            try:
                from torchmetrics.image.lpip import (
                    LearnedPerceptualImagePatchSimilarity,
                )

                self._lpips = LearnedPerceptualImagePatchSimilarity(normalize=True).to(device)
                self._lpips_state = "ready"
            except Exception as err:  # noqa: BLE001 -- the weights download fails offline (any error): report once, keep going
                self._lpips_state = "unavailable"
                LOGGER.warning(
                    "LPIPS is not reported: its network weights could not be loaded (%s)",
                    str(err).splitlines()[0][:200],
                )
        return self._lpips if self._lpips_state == "ready" else None

    def measure(
        self, gt_rgb: torch.Tensor, predicted_rgb: torch.Tensor
    ) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
        """The metrics of ``predicted_rgb`` against ``gt_rgb``, and the side-by-side image.

        Args:
            gt_rgb: The ground truth, composited. `[H, W, 3]`, in [0, 1].
            predicted_rgb: The render. `[H, W, 3]`, in [0, 1], on the same device.

        Returns:
            ``({"psnr", "ssim"[, "lpips"][, "cc_psnr", ...]}, {"img": [H, 2W, 3]})``.
        """
        combined_rgb = torch.cat([gt_rgb, predicted_rgb], dim=1)
        gt = torch.moveaxis(gt_rgb, -1, 0)[None, ...]
        pred = torch.moveaxis(predicted_rgb, -1, 0)[None, ...]
        metrics = {"psnr": float(self.psnr(gt, pred).item()), "ssim": float(self.ssim(gt, pred))}
        lpips = self._lpips_metric(predicted_rgb.device)
        if lpips is not None:
            metrics["lpips"] = float(lpips(gt, pred))
        if self.colour_corrected:
            metrics.update(colour_corrected_metrics(predicted_rgb, gt_rgb, self.psnr, self.ssim, lpips))
        return metrics, {"img": combined_rgb}
