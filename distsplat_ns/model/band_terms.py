"""What a band's loss is made of in ``DistSplatModel``: the ground truth at the rendered size, the
band's L1 and D-SSIM terms (with splatfacto's bilateral-grid colour correction of the band's rows)
and the batch-independent regularisers (MCMC's opacity and scale terms, the scale-ratio term, the
grids' total variation and the camera optimizer's penalty).

``BandTerms`` is an object the model (``model/distsplat_model.py``) builds from its configuration
and calls from ``forward_bands`` with the tensors and modules each term reads.

Shape letters: H/W pixels, N Gaussians.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from nerfstudio.cameras.camera_optimizers import CameraOptimizer
from nerfstudio.model_components.lib_bilagrid import BilateralGrid, color_affine_transform, total_variation_loss
from nerfstudio.models.splatfacto import SplatfactoModelConfig, resize_image

from distsplat_ns.balance.bands import Band
from distsplat_ns.gaussians.mcmc import MCMCConfig, MCMCRegularizers, mcmc_regularizers
from distsplat_ns.model.band_backward import PixelLink, link_pixels
from distsplat_ns.model.band_render import RegularizerShare
from distsplat_ns.model.camera_adjust import camera_loss_terms
from distsplat_ns.model.losses import band_loss, halo_end_row

#: ``(image [H, W, 3 or 4], background [3]) -> [H, W, 3]``: splatfacto's ``composite_with_background``.
Composite = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class BandTerms:
    """The ground truth, per-band loss terms and regularisers of one model (see the module docstring).

    Args:
        config: The model's configuration (scale regularisation, bilateral grid).
        mcmc: The MCMC settings under ``--pipeline.model.strategy mcmc`` (their regularisers), else None.
        composite: Composites an image with alpha over a background (splatfacto's
            ``composite_with_background``).
    """

    def __init__(self, config: SplatfactoModelConfig, mcmc: MCMCConfig | None, composite: Composite) -> None:
        self.config = config
        self.mcmc = mcmc
        self.composite = composite

    def gt_image(
        self, image: torch.Tensor, background: torch.Tensor, downscale: int, size_px: tuple[int, int]
    ) -> torch.Tensor:
        """Ground truth at the rendered resolution, composited over ``background`` if it has alpha,
        on ``background``'s device and in its dtype (the model's: ``training_background``).

        Args:
            image: `[H, W, 3 or 4]`, uint8 or float in [0, 1], at full size or already at the
                rendered size ``size_px`` (the datamanager may decode at the training scale).
            background: The image's background colour. `[3]`.
            size_px: Rendered ``(height, width)``.
        """
        device, dtype = background.device, background.dtype
        if image.dtype == torch.uint8:
            image = image.to(device, dtype) / 255.0
        image = image.to(device, dtype)
        if downscale > 1 and tuple(image.shape[:2]) != tuple(size_px):
            image = resize_image(image, downscale).to(dtype)  # resize_image returns float32
        return self.composite(image, background)

    def ground_truths(
        self,
        images: Sequence[torch.Tensor],
        masks: Sequence[torch.Tensor | None],
        backgrounds: Sequence[torch.Tensor],
        downscale: int,
        sizes_px: Sequence[tuple[int, int]],
    ) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """Each image and mask at its camera's rendered ``(width, height)``, composited (:meth:`gt_image`).

        Raises:
            ValueError: an image does not match its camera's size.
        """
        gts, gt_masks = [], []
        for img, mask, bg, (width, height) in zip(images, masks, backgrounds, sizes_px, strict=False):
            gt = self.gt_image(img, bg, downscale, (height, width))
            if gt.shape[0] != height or gt.shape[1] != width:
                raise ValueError(
                    f"image of {tuple(gt.shape[:2])} px does not match its camera's {height}x{width} px (after downscale {downscale})"
                )
            gts.append(gt)
            gt_masks.append(
                None if mask is None else _downscale_mask(mask.to(bg.device, bg.dtype), downscale, (height, width))
            )
        return gts, gt_masks

    def band_terms(
        self,
        colors: torch.Tensor,
        alphas: torch.Tensor,
        gt: torch.Tensor,
        mask: torch.Tensor | None,
        background: torch.Tensor,
        band: Band,
        height: int,
        links: list[PixelLink],
        bil_grids: BilateralGrid | None = None,
        grid_index: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One band's L1 and D-SSIM sums (``model/losses.py:band_loss``) from its rasterized rows
        and halo; the band's pixel link is appended to ``links``. With ``grid_index``, the rows are
        colour-corrected by that image's grid of ``bil_grids`` first."""
        first, end = band.first_row_px, band.end_row_px(height)
        halo_end = halo_end_row(end, height)
        rows = halo_end - first
        pred = torch.clamp(colors[:rows, :, :3] + (1 - alphas[:rows]) * background, 0.0, 1.0)
        if grid_index is not None:
            pred = bilateral_grid_rows(bil_grids, pred, grid_index, first, height)
        # The loss sees a detached copy of the rendered pixels (model/band_backward.py explains why).
        link = link_pixels(pred, band.position, first, end)
        links.append(link)
        target = gt[first:halo_end]
        shown = link.leaf
        if mask is not None:
            m = mask[first:halo_end]
            shown, target = shown * m, target * m
        return band_loss(shown, target, first, end, height)

    def regularizers(
        self,
        step: int,
        share: RegularizerShare,
        opacities: torch.Tensor,
        scales: torch.Tensor,
        training: bool,
        bil_grids: BilateralGrid | None,
        camera_optimizer: CameraOptimizer,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The batch-independent loss terms this rank adds (``share``): its Gaussians' part of the
        means over all ranks' Gaussians (the scale term; under MCMC main's opacity and scale terms,
        every step), and the camera optimizer's penalty.

        Args:
            step: The training step.
            share: Which terms this rank adds.
            opacities: This rank's Gaussians' opacity logits. `[N, 1]`.
            scales: Their log scales. `[N, 3]`.
            training: Whether the model trains (the camera terms are training-only).
            bil_grids: The model's bilateral grids (with ``use_bilateral_grid``), else None.
            camera_optimizer: The model's camera optimizer.

        Returns:
            ``(total, named)``: the terms' sum, and this rank's shares of the MCMC terms under
            main's loss-dict keys (present, as there, when the weight is positive; zero on a
            rank that adds no share), detached: summed over ranks, the whole model's values.

        **Differentiable:** ``total``, with respect to the scales and opacities (and camera adjustments).
        """
        total = opacities.new_zeros(())
        named: dict[str, torch.Tensor] = {}
        if self.mcmc is not None:
            weights = (self.mcmc.mcmc_opacity_reg, self.mcmc.mcmc_scale_reg)
            terms = (
                mcmc_regularizers(
                    opacities, scales, share.num_gaussians_total, opacity_reg=weights[0], scale_reg=weights[1]
                )
                if share.scale_term
                else MCMCRegularizers(total, total)
            )
            total = total + terms.opacity + terms.scale
            keys = ("mcmc_opacity_reg", "mcmc_scale_reg")  # nerfstudio main's splatfacto get_loss_dict
            named = {key: value.detach() for key, value, weight in zip(keys, terms, weights, strict=True) if weight > 0}
        if self.config.use_scale_regularization and step % 10 == 0 and share.scale_term:
            scale_exp = torch.exp(scales)
            ratio = scale_exp.amax(dim=-1) / scale_exp.amin(dim=-1)
            excess = torch.clamp_min(ratio, self.config.max_gauss_ratio) - self.config.max_gauss_ratio
            total = total + 0.1 * (excess.sum() / max(share.num_gaussians_total, 1))
        if share.camera_penalty and training and self.config.use_bilateral_grid:
            # Splatfacto's 10 x total variation of every grid, once per step (batch-independent:
            # one rank adds it, and it is not averaged over the batch's images or bands).
            total = total + 10 * total_variation_loss(bil_grids.grids)
        # nerfstudio's camera_opt_regularizer, once per step (model/camera_adjust.py).
        for key, value in camera_loss_terms(camera_optimizer, share.camera_penalty and training, total).items():
            total = total + value
            named[key] = value.detach()
        return total, named


def _downscale_mask(mask: torch.Tensor, downscale: int, size_px: tuple[int, int]) -> torch.Tensor:
    """``mask`` (on the device, in the model's dtype) at the rendered ``(height, width)``."""
    if downscale > 1 and tuple(mask.shape[:2]) != tuple(size_px):
        mask = resize_image(mask, downscale).to(mask.dtype)
    return mask


def bilateral_grid_rows(
    bil_grids: BilateralGrid, rgb: torch.Tensor, grid_index: int, first_row_px: int, height: int
) -> torch.Tensor:
    """Splatfacto's bilateral-grid correction (``_apply_bilateral_grid``) of rows
    ``first_row_px ..`` of an image ``height`` rows tall: a band is a slice of the same
    per-pixel operation, so its pixel coordinates are the whole image's (``linspace(0, 1, H)``
    cut to the band's rows), and the grid is the image's (``grid_index``).

    Args:
        bil_grids: The model's bilateral grids (one per training image).
        rgb: The band's composited colours. `[rows, W, 3]`, in [0, 1].
        grid_index: The image's training-camera index.
        first_row_px: The band's first row in the image.
        height: The image's rendered height, px.

    Returns:
        The corrected colours, `[rows, W, 3]` (not clamped, as splatfacto's).

    **Differentiable:** with respect to ``rgb`` and the grids. **Host sync:** none (the
    grid index is a host int; nerfstudio's ``slice`` would call ``torch.unique``).
    """
    rows, width = rgb.shape[0], rgb.shape[1]
    ys = torch.linspace(0, 1.0, height, device=rgb.device)[first_row_px : first_row_px + rows]
    xs = torch.linspace(0, 1.0, width, device=rgb.device)
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
    xy = torch.stack([grid_x, grid_y], dim=-1).unsqueeze(0).to(rgb.dtype)  # [1, rows, W, 2]
    idx = torch.full((1,), grid_index, device=rgb.device, dtype=torch.long)
    affine = bil_grids(xy, rgb.unsqueeze(0), idx)
    return color_affine_transform(affine, rgb.unsqueeze(0)).reshape(rgb.shape)
