"""Depth during training (``--pipeline.model.output-depth-during-training True``): each band's rows
of splatfacto's training depth.

A band's rows of the expected depth are the whole image's; only splatfacto's fill of uncovered
pixels (alpha 0) with the image's largest depth needs the whole image, and that is the largest of
its bands' maxima (``image_depth_maxima``, all-reduced by the pipeline, then
``fill_empty_depth_``). Returned detached, as splatfacto's loss does not read it
(docs/parity.md, "Depth during training").

Shape letters: C cameras of a projection, N Gaussians, B images in the global batch, H/W pixels.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from distsplat_ns.balance.bands import Band
from distsplat_ns.rendering import Projection


@dataclass
class BandDepth:
    """One band's rows of its image's training depth.

    Attributes:
        band: The band (its ``position`` is the batch position).
        depth: Expected depth of the band's own rows (no SSIM halo). `[rows, W, 1]`, world units,
            detached; after ``fill_empty_depth_`` the uncovered pixels hold the image's largest depth.
        alpha: Accumulated opacity of those rows. `[rows, W, 1]`, detached.
    """

    band: Band
    depth: torch.Tensor
    alpha: torch.Tensor


def with_depth_channel(proj: Projection) -> Projection:
    """``proj`` rendering ``RGB+ED``: the depth appended (detached) as the last colour channel.
    ``means2d`` and the other terms are the same tensors (so gradients and absgrads land where
    they did); the colour channels' gradients flow through the concatenation unchanged."""
    if proj.render_mode == "RGB+ED":
        return proj
    colors = torch.cat([proj.colors, proj.depths.detach()[..., None].to(proj.colors.dtype)], dim=-1)
    return dataclasses.replace(proj, colors=colors, render_mode="RGB+ED")


def band_depth(band: Band, height: int, colors: torch.Tensor, alphas: torch.Tensor) -> BandDepth:
    """The band's own rows of a raster call's ``RGB+ED`` output (``colors`` `[rows, W, 4]`, the
    depth last; ``alphas`` `[rows, W, 1]`), not yet filled."""
    rows = band.num_rows_px(height)
    return BandDepth(band, colors[:rows, :, -1:].detach(), alphas[:rows].detach())


def image_depth_maxima(depths: Sequence[BandDepth], batch_size: int, like: torch.Tensor) -> torch.Tensor:
    """Per batch position, the largest depth over this rank's bands of it (``-inf`` where it has
    none). `[B]`, ``like``'s dtype and device. Local: the pipeline takes the maximum over ranks."""
    maxima = torch.full((batch_size,), float("-inf"), dtype=like.dtype, device=like.device)
    for entry in depths:
        if entry.depth.numel():
            position = entry.band.position
            maxima[position] = torch.maximum(maxima[position], entry.depth.max().to(like.dtype))
    return maxima


def fill_empty_depth_(depths: Sequence[BandDepth], maxima: torch.Tensor) -> None:
    """Splatfacto's fill, in place: where alpha is 0, the image's largest depth (``maxima``,
    every rank's bands of each position: `[B]`)."""
    for entry in depths:
        fill = maxima[entry.band.position].to(entry.depth.dtype)
        entry.depth = torch.where(entry.alpha > 0, entry.depth, fill)
