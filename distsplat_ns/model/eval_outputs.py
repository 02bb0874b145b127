"""Eval, export and viewer rendering of ``DistSplatModel``: one whole camera at a time. Where the
model holds every Gaussian it renders them itself (never a collective); in sharded training the
parallel mode's ``view_renderer`` renders the camera from every rank's shard
(``parallel/view_render.py``).

A mixin of ``DistSplatModel`` (``model/distsplat_model.py``), ahead of splatfacto's methods.
"""

from __future__ import annotations

from typing import Any

import torch
from nerfstudio.cameras.cameras import Cameras
from nerfstudio.utils.colors import get_color

from distsplat_ns.model.colour_metrics import colour_corrected_metrics
from distsplat_ns.rendering import rasterization
from distsplat_ns.utils.logging import get_logger

LOGGER = get_logger(__name__)


class EvalOutputs:
    """``get_outputs`` and the eval metrics of ``DistSplatModel`` (its attributes: ``view_renderer``,
    ``gauss_params``, ``config``, ``render_inputs``, ...)."""

    def get_outputs(self, camera: Cameras) -> dict[str, torch.Tensor | list] | None:
        """Render one whole camera for eval, export and the viewer.

        Returns:
            nerfstudio's outputs; None on a rank other than 0 whose mode renders views as
            collectives (it took part, rank 0 holds the image).

        **Collective:** only through ``view_renderer`` (sharded training: on every rank in the
        same order from the training thread; a viewer thread's call posts the camera instead).
        Without one, local.
        """
        if not isinstance(camera, Cameras):
            raise TypeError(f"get_outputs expects nerfstudio Cameras, got {type(camera).__name__}")
        if camera.shape[0] != 1:
            raise ValueError(f"get_outputs renders one camera at a time, got {camera.shape[0]}")
        if self.view_renderer is not None:
            return self.view_renderer(camera)
        raw = self.gauss_params
        crop_ids = None
        if self.crop_box is not None and not self.training:
            crop_ids = self.crop_box.within(raw["means"]).squeeze()
            if crop_ids.sum() == 0:
                return self.get_empty_outputs(int(camera.width.item()), int(camera.height.item()), self.background_color)
        params = self._activated(raw)
        if crop_ids is not None:
            params = {k: v[crop_ids] for k, v in params.items()}
        downscale = self._get_downscale_factor()
        inputs = self.render_inputs(camera, downscale)
        viewmats, Ks, width, height = inputs.viewmats, inputs.Ks, inputs.width, inputs.height
        render_mode = "RGB+ED" if (self.config.output_depth_during_training or not self.training) else "RGB"
        render, alpha, _ = rasterization(
            **params, viewmats=viewmats, Ks=Ks, width=width, height=height, packed=False,
            near_plane=0.01, far_plane=1e10, render_mode=render_mode, sh_degree=self.sh_degree_at(self.step),
            absgrad=False, rasterize_mode=self.config.rasterize_mode, backend=self.config.rendering_backend,
        )
        background = self._get_background_color()
        rgb = torch.clamp(render[..., :3] + (1 - alpha) * background, 0.0, 1.0)
        depth_im = None
        if render_mode == "RGB+ED":
            depth_im = render[..., 3:4]
            depth_im = torch.where(alpha > 0, depth_im, depth_im.detach().max()).squeeze(0)
        if background.shape[0] == 3 and not self.training:
            background = background.expand(height, width, 3)
        # Outputs are float32 whatever the parameters' precision (metrics and viewer expect it).
        return {
            "rgb": rgb.squeeze(0).float(),
            "depth": None if depth_im is None else depth_im.float(),
            "accumulation": alpha.squeeze(0).float(),
            "background": background.float(),
        }

    def _get_background_color(self) -> torch.Tensor:
        if self.config.background_color == "random":
            # Only the eval/viewer path reaches here; training uses training_background().
            return self.background_color.to(self.device)
        return get_color(self.config.background_color).to(self.device)

    def _lpips_metric(self) -> Any:
        if self._lpips_state == "unbuilt":
            try:
                from torchmetrics.image.lpip import (
                    LearnedPerceptualImagePatchSimilarity,
                )

                self._lpips = LearnedPerceptualImagePatchSimilarity(normalize=True).to(self.device)
                self._lpips_state = "ready"
            except Exception as err:  # noqa: BLE001 -- the weights download fails offline (any error): report once, keep going
                self._lpips_state = "unavailable"
                LOGGER.warning("LPIPS is not reported: its network weights could not be loaded (%s)", str(err).splitlines()[0][:200])
        return self._lpips if self._lpips_state == "ready" else None

    def get_image_metrics_and_images(
        self, outputs: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]
    ) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
        gt_rgb = self.composite_with_background(self.get_gt_img(batch["image"]), outputs["background"])
        predicted_rgb = outputs["rgb"]
        combined_rgb = torch.cat([gt_rgb, predicted_rgb], dim=1)
        gt = torch.moveaxis(gt_rgb, -1, 0)[None, ...]
        pred = torch.moveaxis(predicted_rgb, -1, 0)[None, ...]
        metrics = {"psnr": float(self.psnr(gt, pred).item()), "ssim": float(self.ssim(gt, pred))}
        lpips = self._lpips_metric()
        if lpips is not None:
            metrics["lpips"] = float(lpips(gt, pred))
        if self.config.color_corrected_metrics:
            metrics.update(colour_corrected_metrics(predicted_rgb, gt_rgb, self.psnr, self.ssim, lpips))
        return metrics, {"img": combined_rgb}

