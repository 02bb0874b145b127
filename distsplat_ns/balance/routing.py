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

from distsplat_ns.balance.bands import TILE_SIZE, num_tile_rows
from distsplat_ns.utils.host_to_device import host_tensor

MARGIN_PX = 1.0
"""Pixels added to every radius before the tile test (see the module docstring)."""


def footprint_tile_rows(
    means2d: Tensor, radii: Tensor, width: int, height: int, tile_size: int = TILE_SIZE, dtype: torch.dtype = torch.int64
) -> tuple[Tensor, Tensor]:
    """The tile rows ``[first, end)`` each Gaussian's footprint covers. A Gaussian that covers no
    tile of the image (culled, or left/right/above/below of it) gets an empty interval at the
    grid's top or bottom edge, ``[0, 0)`` or ``[tiles_high, tiles_high)``, which meets no band
    (:func:`footprint_touches_rows`).

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
    tiles_wide, tiles_high = -(-width // tile_size), num_tile_rows(height, tile_size)
    # Per side (low edge, high edge): the centre's factor, the clamp's bounds, the x test's bound, the row's sign.
    scale, low, high, past, sign = host_tensor(
        [[-1.0 / tile_size, 1.0 / tile_size], [-tiles_high, 0], [0, tiles_high], [-tiles_wide, 0], [-1, 1]], torch.float64, means.device
    )
    if radius.ndim == means.ndim - 1:  # one radius for both axes
        culled = radius <= 0
        reach = radius[..., None, None]
    else:
        culled = (radius <= 0).any(dim=-1)
        reach = radius[..., None]
    # [..., N, axis, side]: (reach - centre, reach + centre) / tile, whose one ceil is
    # (-floor(low edge), ceil(high edge)) in tiles. Exact in float64 for float32 inputs (sums of
    # two float32 values, and a power-of-two tile), so the same as each edge rounded on its own.
    edges = torch.addcmul(reach.add(MARGIN_PX).div_(tile_size), means[..., None], scale).ceil_()
    beside = (edges[..., 0, :] <= past).any(dim=-1)  # left or right of the image
    rows = (edges[..., 1, :].clamp(low, high) * sign).to(dtype)  # (first, end), clipped to the grid
    first = rows[..., 0].masked_fill_(culled | beside, tiles_high)  # an empty footprint: [tiles_high, end <= tiles_high)
    return first, rows[..., 1]


def touches_rows(first_row: Tensor, end_row: Tensor, band_first_row: int | Tensor, band_end_row: int | Tensor) -> Tensor:
    """Which Gaussians' tile rows ``[first_row, end_row)`` meet the tile rows
    ``[band_first_row, band_end_row)``. `[N]` bool; with several bands' rows as `[bands, 1]`
    tensors and their cameras' ``first_row``/``end_row`` `[bands, N]`, `[bands, N]`."""
    return (first_row < band_end_row) & (end_row > band_first_row) & (end_row > first_row)


def footprint_touches_rows(first_row: Tensor, end_row: Tensor, band_first_row: Tensor, band_end_row: Tensor) -> Tensor:
    """:func:`touches_rows` for the intervals :func:`footprint_tile_rows` returns, in two
    comparisons: its empty intervals lie on the grid's edge (``[0, 0)`` or ``[tiles_high,
    tiles_high)``), and every band's rows lie in the grid, so they fail one of the two."""
    return (first_row < band_end_row) & (end_row > band_first_row)


def touching_rows(first_row: Tensor, end_row: Tensor, band_first_row: int, band_end_row: int) -> Tensor:
    """Indices of the Gaussians :func:`touches_rows` selects, ascending. `[M]` int64."""
    return torch.nonzero(touches_rows(first_row, end_row, band_first_row, band_end_row)).reshape(-1)
