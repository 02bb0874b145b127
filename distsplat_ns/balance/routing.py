"""Which Gaussians a band needs: the tile rows each projected footprint covers.

In sharded training (docs/sharded.md) each rank sends a band's rank only the Gaussians whose
footprint reaches the band's tile rows. The footprint is the rasterizer's: the square
``mean2d +- radius`` in tile units, ``floor`` inclusive to ``ceil`` exclusive, as gsplat's
``isect_tiles`` and ``rendering/reference.py:intersect_tiles`` count it, widened by
``MARGIN_PX``: gsplat's kernels round in float32 (possibly with fast-math division), and so does
the exchange's test (:func:`footprint_touches_px`); a Gaussian sent in excess meets no tile of the
band and changes nothing, while one missing would change pixels.

Shape letters: N Gaussians.
"""

from __future__ import annotations

import torch
from torch import Tensor

from distsplat_ns.balance.bands import TILE_SIZE, num_tile_rows

MARGIN_PX = 1.0
"""Pixels added to every radius before the tile test (see the module docstring)."""


def footprint_reach_px(means2d: Tensor, radii: Tensor) -> tuple[Tensor, Tensor]:
    """Each Gaussian's centre row and vertical reach, px: ``(y, radius + MARGIN_PX)``, the reach
    ``-inf`` where culled (radius 0), so that it meets no band. Three operators, no copy of the
    centres (``y`` is a view). The x axis is not tested: both projections (``rendering/projection.py``
    and gsplat's) cull a Gaussian whose square misses the image, so a kept one meets the image's
    columns.

    Args:
        means2d: Projected centres. `[..., N, 2]`, px, (x, y).
        radii: 3-sigma screen radii, 0 = culled. `[..., N]` or `[..., N, 2]` (x, y: the y one is
            used; a Gaussian culled on x alone is sent in excess, which changes nothing), px;
            integers (both projections' int32) or any tensor outside autograd's graph.

    Returns:
        ``(y, reach)``, each `[..., N]`, px; ``reach`` float (an integer radius becomes float32
        in the margin's sum).
    """
    radius = radii[..., 1] if radii.ndim == means2d.ndim else radii  # integers: never in a graph, no detach
    reach = radius.add(MARGIN_PX).masked_fill_(radius <= 0, float("-inf"))
    return means2d.detach()[..., 1], reach


def band_extent_px(first_tile_row: int, end_tile_row: int, tile_size: int = TILE_SIZE) -> tuple[int, int]:
    """A band of tile rows ``[first, end)`` as its middle row and its half height, px: whole
    numbers (an even tile side), for the exchange's int64 band table."""
    if tile_size % 2:
        raise ValueError(f"band_extent_px: the tile side must be even, got {tile_size}")
    return (first_tile_row + end_tile_row) * tile_size // 2, (end_tile_row - first_tile_row) * tile_size // 2


def footprint_touches_px(y: Tensor, reach: Tensor, band_middle_px: Tensor, band_half_px: Tensor) -> Tensor:
    """Which footprints (:func:`footprint_reach_px`) meet the band of :func:`band_extent_px`:
    ``|y - middle| < reach + half``, i.e. ``y - reach < end * T`` and ``y + reach > first * T``
    (``reach`` = radius + ``MARGIN_PX``), which for whole tile rows are ``floor((y - reach) / T) <
    end`` and ``ceil((y + reach) / T) > first``: the Gaussians :func:`touches_rows`
    selects from :func:`footprint_tile_rows`, without rounding to tiles. `[N]` bool; several
    bands as `[bands, 1]` bounds against their cameras' `[bands, N]`. Four operators.

    In float32 the one rounding of ``y - middle`` is below an ulp of ``|y|`` (gsplat's own
    rounding likewise), far below ``MARGIN_PX`` for any footprint that reaches an image under 2^21 px.
    """
    return (y - band_middle_px).abs_() < reach + band_half_px


def footprint_tile_rows(
    means2d: Tensor, radii: Tensor, height: int, tile_size: int = TILE_SIZE, dtype: torch.dtype = torch.int64
) -> tuple[Tensor, Tensor]:
    """The tile rows ``[first, end)`` each Gaussian's footprint covers: ``y -+ (radius +
    MARGIN_PX)`` (:func:`footprint_reach_px`) in float64, exact for float32 inputs, ``floor`` low
    and ``ceil`` high, clipped to the image's tile grid. A culled Gaussian gets ``[tiles_high,
    0)``, which is empty.

    Args:
        means2d: Projected centres. `[..., N, 2]`, px, (x, y).
        radii: 3-sigma screen radii, 0 = culled. `[..., N]` or `[..., N, 2]` (x, y), px.
        height: Image height, px (the grid's columns are not tested: see :func:`footprint_reach_px`).
        tile_size: Tile side, px.
        dtype: Integer dtype of the result; it must hold the image's tile rows.

    Returns:
        ``(first_row, end_row)``, each `[..., N]` ``dtype``.
    """
    y, reach = footprint_reach_px(means2d.to(torch.float64), radii.to(torch.float64))
    low, high = y - reach, y + reach
    tiles_high = num_tile_rows(height, tile_size)
    first = torch.floor(low / tile_size).clamp_(0, tiles_high).to(dtype)
    end = torch.ceil(high / tile_size).clamp_(0, tiles_high).to(dtype)
    return first, end


def touches_rows(
    first_row: Tensor, end_row: Tensor, band_first_row: int | Tensor, band_end_row: int | Tensor
) -> Tensor:
    """Which Gaussians' tile rows ``[first_row, end_row)`` meet the tile rows
    ``[band_first_row, band_end_row)``. `[N]` bool; with several bands' rows as `[bands, 1]`
    tensors and their cameras' ``first_row``/``end_row`` `[bands, N]`, `[bands, N]`."""
    return (first_row < band_end_row) & (end_row > band_first_row) & (end_row > first_row)


def touching_rows(first_row: Tensor, end_row: Tensor, band_first_row: int, band_end_row: int) -> Tensor:
    """Indices of the Gaussians :func:`touches_rows` selects, ascending. `[M]` int64."""
    return torch.nonzero(touches_rows(first_row, end_row, band_first_row, band_end_row)).reshape(-1)
