"""A deliberately naive rasterizer: the executable spec the reference backend is checked against.

It walks the Gaussians of each camera one at a time in depth order (stable), every pixel in
parallel, and applies gsplat 1.4.0's per-pixel rules literally: tile membership from the 3-sigma
square, ``alpha = min(0.999, o exp(-sigma))``, skip ``sigma < 0`` or ``alpha < 1/255``, stop once
the next transmittance would be ``<= 1e-4``. Plain autograd gives its gradients; per-pixel copies
of ``means2d`` give absgrad. Only for tiny images.

Shape legend: ``C`` cameras, ``N`` Gaussians, ``H``, ``W`` pixels, ``D`` channels.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def naive_rasterize(
    means2d: Tensor,
    conics: Tensor,
    colors: Tensor,
    opacities: Tensor,
    radii: Tensor,
    depths: Tensor,
    width: int,
    height: int,
    tile_size: int = 16,
    backgrounds: Tensor | None = None,
    pixel_means2d: Tensor | None = None,
    pair_counts: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Render ``[C, H, W, D]`` colours and ``[C, H, W, 1]`` alphas from a projection.

    ``pixel_means2d`` (`[C, N, H, W, 2]`), if given, replaces ``means2d`` pixel by pixel so that
    its ``.grad`` holds every pixel's own contribution (for absgrad). ``pair_counts`` (`[C, H, W]`
    int64 zeros), if given, receives how many Gaussians each pixel composited.
    """
    num_cameras, _num_gaussians = opacities.shape
    dtype, device = means2d.dtype, means2d.device
    rows = torch.arange(height, device=device)
    cols = torch.arange(width, device=device)
    py = (rows.to(dtype) + 0.5)[:, None].expand(height, width)
    px = (cols.to(dtype) + 0.5)[None, :].expand(height, width)
    tile_y = (rows // tile_size)[:, None].expand(height, width)
    tile_x = (cols // tile_size)[None, :].expand(height, width)
    out_colors, out_alphas = [], []
    for c in range(num_cameras):
        trans = torch.ones(height, width, dtype=dtype, device=device)
        done = torch.zeros(height, width, dtype=torch.bool, device=device)
        acc = torch.zeros(height, width, colors.shape[-1], dtype=dtype, device=device)
        order = torch.sort(depths[c], stable=True).indices.tolist()
        for g in order:
            radius = int(radii[c, g])
            if radius <= 0:
                continue
            mx, my = (float(v) for v in means2d[c, g].detach())
            t_min_x = math.floor(mx / tile_size - radius / tile_size)
            t_max_x = math.ceil(mx / tile_size + radius / tile_size)
            t_min_y = math.floor(my / tile_size - radius / tile_size)
            t_max_y = math.ceil(my / tile_size + radius / tile_size)
            in_tile = (tile_x >= t_min_x) & (tile_x < t_max_x) & (tile_y >= t_min_y) & (tile_y < t_max_y)
            if pixel_means2d is not None:
                dx = pixel_means2d[c, g, ..., 0] - px
                dy = pixel_means2d[c, g, ..., 1] - py
            else:
                dx = means2d[c, g, 0] - px
                dy = means2d[c, g, 1] - py
            a, b, cc = conics[c, g]
            sigma = 0.5 * (a * dx * dx + cc * dy * dy) + b * dx * dy
            alpha = torch.clamp(opacities[c, g] * torch.exp(-sigma.clamp_min(0)), max=0.999)
            valid = in_tile & ~done & (sigma >= 0) & (alpha >= 1.0 / 255.0)
            next_trans = trans * (1 - alpha)
            stop = valid & (next_trans <= 1e-4)
            done = done | stop
            take = valid & ~stop
            if pair_counts is not None:
                pair_counts[c] += take
            weight = torch.where(take, alpha * trans, torch.zeros_like(alpha))
            acc = acc + weight[..., None] * colors[c, g]
            trans = torch.where(take, next_trans, trans)
        if backgrounds is not None:
            acc = acc + trans[..., None] * backgrounds[c]
        out_colors.append(acc)
        out_alphas.append((1 - trans)[..., None])
    return torch.stack(out_colors), torch.stack(out_alphas)
