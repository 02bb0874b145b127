"""Which Gaussians a band needs: the tile rows each projected footprint covers.

In sharded training (docs/sharded.md) each rank sends a band's rank only the Gaussians whose
footprint reaches the band's tile rows. The footprint is the rasterizer's: the square
``mean2d +- radius`` in tile units, ``floor`` inclusive to ``ceil`` exclusive, as gsplat's
``isect_tiles`` and ``rendering/reference.py:intersect_tiles`` count it, widened by
``MARGIN_PX``: gsplat's kernels round in float32 (possibly with fast-math division), this test in
float64, and a Gaussian sent in excess meets no tile of the band and changes nothing, while one
missing would change pixels.

Shape letters: N Gaussians.
"""

from __future__ import annotations

import torch
from torch import Tensor

from distsplat_ns.balance.bands import TILE_SIZE

MARGIN_PX = 1.0
"""Pixels added to every radius before the tile test (see the module docstring)."""


def footprint_tile_rows(
    means2d: Tensor, radii: Tensor, width: int, height: int, tile_size: int = TILE_SIZE, dtype: torch.dtype = torch.int64
) -> tuple[Tensor, Tensor]:
    """The tile rows ``[first, end)`` each Gaussian's footprint covers; ``end <= first`` for a
    Gaussian that covers no tile of the image (culled, or left/right/above/below of it).

    Args:
        means2d: Projected centres. `[..., N, 2]`, px, (x, y): one camera, or several of one size.
        radii: 3-sigma screen radii, 0 = culled. `[..., N]` or `[..., N, 2]` (x, y), px.
        width: Image width, px.
        height: Image height, px.
        tile_size: Tile side, px.
        dtype: Integer dtype of the result; it must hold the image's tile rows.

    Returns:
        ``(first_row, end_row)``, each `[..., N]` ``dtype``, clipped to the image's tile grid.
    """
    means = means2d.detach().to(torch.float64)
    radius = radii.detach().to(torch.float64)
    if radius.ndim == means.ndim - 1:  # one radius for both axes
        visible = radius > 0
        radius = radius.unsqueeze(-1).expand(*radius.shape, 2)
    else:
        visible = (radius > 0).all(dim=-1)
    reach = (radius + MARGIN_PX) / tile_size
    centre = means / tile_size
    lo = torch.floor(centre - reach)  # whole tiles, exact in float64: converted once, at the end
    hi = torch.ceil(centre + reach)
    tiles_wide, tiles_high = -(-width // tile_size), -(-height // tile_size)
    inside_x = (hi[..., 0] > 0) & (lo[..., 0] < tiles_wide)
    first = lo[..., 1].clamp(0, tiles_high)
    end = hi[..., 1].clamp(0, tiles_high)
    end = torch.where(visible & inside_x, end, first)
    return first.to(dtype), end.to(dtype)


def touches_rows(first_row: Tensor, end_row: Tensor, band_first_row: int | Tensor, band_end_row: int | Tensor) -> Tensor:
    """Which Gaussians' tile rows ``[first_row, end_row)`` meet the tile rows
    ``[band_first_row, band_end_row)``. `[N]` bool; with several bands' rows as `[bands, 1]`
    tensors and their cameras' ``first_row``/``end_row`` `[bands, N]`, `[bands, N]`."""
    return (first_row < band_end_row) & (end_row > band_first_row) & (end_row > first_row)


def touching_rows(first_row: Tensor, end_row: Tensor, band_first_row: int, band_end_row: int) -> Tensor:
    """Indices of the Gaussians :func:`touches_rows` selects, ascending. `[M]` int64."""
    return torch.nonzero(touches_rows(first_row, end_row, band_first_row, band_end_row)).reshape(-1)
