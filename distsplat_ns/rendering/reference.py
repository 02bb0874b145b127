"""Pure-PyTorch tile rasterizer with gsplat 1.4.0's semantics (the CPU backend).

What is reproduced from gsplat's ``isect_tiles`` + ``rasterize_to_pixels`` kernels:

- A Gaussian joins a tile iff its square ``mean2d +- radius`` overlaps the tile (in tile units,
  ``floor(m/ts - r/ts)`` inclusive to ``ceil(m/ts + r/ts)`` exclusive, clamped to the grid).
- Per tile, Gaussians are composited front to back in depth order; ties keep index order (the
  radix sort in gsplat is stable).
- Pixel centres sit at ``+0.5``; ``sigma = 0.5 (a dx^2 + c dy^2) + b dx dy`` with ``dx = mean - px``;
  ``alpha = min(0.999, opacity * exp(-sigma))``; Gaussians with ``sigma < 0`` or
  ``alpha < 1/255`` are skipped; a Gaussian whose next transmittance would be ``<= 1e-4`` is
  not composited and ends the pixel; ``alpha_out = 1 - T_final``; ``color = sum + T_final * bg``.

How: the (tile, Gaussian) intersections are gathered into a padded ``[tiles, pixels, L]`` block
(``L`` = the largest intersection count in the block), alphas are computed for all of them at
once and transmittance is a ``cumprod`` along ``L``. Tiles are processed in chunks of similar
intersection count so padding stays small and memory stays bounded. The backward pass recomputes
each chunk under autograd (checkpointing), so nothing per pixel is kept between forward and
backward; it also yields gsplat's ``absgrad`` (per-pixel ``|d loss / d means2d|`` summed).

Rows of the tile grid may start at any whole-image tile row (``tile_row_starts``): pixel
coordinates stay whole-image coordinates, which makes a band bit-identical to the same rows of
the whole image.

Shape legend: ``C`` cameras, ``N`` Gaussians, ``T`` tiles, ``I`` intersections, ``D`` channels,
``P`` pixels per tile (``tile_size ** 2``), ``L`` intersections per tile in a chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from distsplat_ns.utils.logging import get_logger

__all__ = [
    "DEFAULT_CHUNK_ELEMENTS",
    "TileIntersections",
    "intersect_tiles",
    "rasterize_to_pixels",
]

_LOGGER = get_logger(__name__)

DEFAULT_CHUNK_ELEMENTS = 1 << 21
"""Pixel x intersection pairs processed at once (2M). About 20 float tensors of this size are
alive at the peak of a chunk's backward, i.e. ~170 MB in float32; see ``rasterize_to_pixels``."""

_ALPHA_MAX = 0.999  # gsplat clamps alpha so 1 - alpha never reaches 0 (3DGS, Kerbl et al. 2023)
_ALPHA_MIN = 1.0 / 255.0  # contributions below one 8-bit level are skipped (3DGS)
_T_MIN = 1e-4  # a pixel stops once its transmittance would drop to this (3DGS)


@dataclass
class TileIntersections:
    """Which Gaussians touch which tiles, sorted by (camera, tile, depth).

    Attributes:
        flat_ids: Index into the flattened ``[C * N]`` Gaussians of each intersection. `[I]`, int64.
        tile_offsets: Start of each tile's run in ``flat_ids``, plus the total. `[C * T + 1]`, int64.
        tile_counts: Intersections per tile. `[C, num_tile_rows, num_tile_cols]`, int32.
        tile_size: Tile side, px.
        tile_row_starts: Whole-image tile row of each camera's first grid row. Length C.
    """

    flat_ids: Tensor
    tile_offsets: Tensor
    tile_counts: Tensor
    tile_size: int
    tile_row_starts: List[int]

    @property
    def num_tile_rows(self) -> int:
        return int(self.tile_counts.shape[1])

    @property
    def num_tile_cols(self) -> int:
        return int(self.tile_counts.shape[2])


@torch.no_grad()
def intersect_tiles(
    means2d: Tensor,
    radii: Tensor,
    depths: Tensor,
    tile_size: int,
    num_tile_rows: int,
    num_tile_cols: int,
    tile_row_starts: Optional[Sequence[int]] = None,
) -> TileIntersections:
    """List the (tile, Gaussian) intersections, as gsplat's ``isect_tiles`` (sorted).

    Args:
        means2d: Projected centres in whole-image coordinates. `[C, N, 2]`, px.
        radii: Screen radii, 0 = culled. `[C, N]`, int.
        depths: Sort keys (camera z). `[C, N]`.
        tile_size: Tile side, px.
        num_tile_rows: Rows of the tile grid to cover.
        num_tile_cols: Columns of the tile grid.
        tile_row_starts: Whole-image tile row where each camera's grid starts (default 0).

    Returns:
        The sorted intersections and per-tile counts.

    **Host sync:** none beyond what ``repeat_interleave`` needs for its output size.
    """
    num_cameras, num_gaussians = radii.shape
    device = means2d.device
    if tile_row_starts is None:
        tile_row_starts = [0] * num_cameras
    row_start = torch.tensor(list(tile_row_starts), device=device, dtype=torch.int64)[:, None]

    # Same arithmetic as gsplat (in the means' dtype) so the boundaries agree.
    tile_means = means2d / tile_size
    tile_radii = radii.to(means2d.dtype) / tile_size
    x_min = torch.floor(tile_means[..., 0] - tile_radii).to(torch.int64).clamp(0, num_tile_cols)
    x_max = torch.ceil(tile_means[..., 0] + tile_radii).to(torch.int64).clamp(0, num_tile_cols)
    y_min = (torch.floor(tile_means[..., 1] - tile_radii).to(torch.int64) - row_start).clamp(0, num_tile_rows)
    y_max = (torch.ceil(tile_means[..., 1] + tile_radii).to(torch.int64) - row_start).clamp(0, num_tile_rows)
    span_x = x_max - x_min
    counts = (y_max - y_min) * span_x * (radii > 0)  # [C, N]

    # Front to back per camera; stable so equal depths keep index order, as gsplat's radix sort.
    order = torch.sort(depths, dim=1, stable=True).indices  # [C, N]
    cam = torch.arange(num_cameras, device=device)[:, None]
    flat_sorted = (cam * num_gaussians + order).reshape(-1)
    counts_sorted = counts.reshape(-1)[flat_sorted]
    keep = counts_sorted > 0
    flat_sorted, counts_sorted = flat_sorted[keep], counts_sorted[keep]

    flat_ids = torch.repeat_interleave(flat_sorted, counts_sorted)  # [I]
    first = torch.cumsum(counts_sorted, 0) - counts_sorted
    local = torch.arange(flat_ids.numel(), device=device) - torch.repeat_interleave(first, counts_sorted)
    span_x_i = span_x.reshape(-1)[flat_ids]
    tile_x = x_min.reshape(-1)[flat_ids] + local % span_x_i
    tile_y = y_min.reshape(-1)[flat_ids] + torch.div(local, span_x_i, rounding_mode="floor")
    num_tiles = num_tile_rows * num_tile_cols
    tile_global = (flat_ids // num_gaussians) * num_tiles + tile_y * num_tile_cols + tile_x

    tile_global, perm = torch.sort(tile_global, stable=True)
    flat_ids = flat_ids[perm]
    per_tile = torch.bincount(tile_global, minlength=num_cameras * num_tiles)
    tile_offsets = torch.zeros(num_cameras * num_tiles + 1, dtype=torch.int64, device=device)
    tile_offsets[1:] = torch.cumsum(per_tile, 0)
    return TileIntersections(
        flat_ids=flat_ids,
        tile_offsets=tile_offsets,
        tile_counts=per_tile.reshape(num_cameras, num_tile_rows, num_tile_cols).to(torch.int32),
        tile_size=tile_size,
        tile_row_starts=list(tile_row_starts),
    )


def _composite(
    dx: Tensor, dy: Tensor, conics: Tensor, opacities: Tensor, colors: Tensor, pad_ok: Tensor
) -> Tuple[Tensor, Tensor]:
    """Front-to-back compositing of one chunk of padded tiles.

    Args:
        dx, dy: ``mean - pixel centre``. `[Tc, P, L]`, px.
        conics: `[Tc, L, 3]`. opacities: `[Tc, L]`. colors: `[Tc, L, D]`.
        pad_ok: False on padding. `[Tc, L]`, bool.

    Returns:
        ``(accumulated colour [Tc, P, D], final transmittance [Tc, P])``.
    """
    a, b, c = (t[:, None, :] for t in conics.unbind(-1))
    sigma = 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy  # [Tc, P, L]
    # clamp_min keeps exp finite where sigma < 0 (those are skipped anyway).
    alpha = torch.clamp(opacities[:, None, :] * torch.exp(-sigma.clamp_min(0.0)), max=_ALPHA_MAX)
    valid = pad_ok[:, None, :] & (sigma >= 0) & (alpha >= _ALPHA_MIN)
    one = torch.ones((), dtype=alpha.dtype, device=alpha.device)
    with torch.no_grad():
        # Transmittance after each valid Gaussian; composited iff it stays above _T_MIN. T only
        # decreases, so this also encodes gsplat's "stop at the first failure".
        t_after = torch.cumprod(torch.where(valid, 1.0 - alpha, one), dim=-1)
        composited = valid & (t_after > _T_MIN)
    factors = torch.where(composited, 1.0 - alpha, one)
    t_incl = torch.cumprod(factors, dim=-1)
    t_excl = torch.cat([torch.ones_like(t_incl[..., :1]), t_incl[..., :-1]], dim=-1)
    weights = torch.where(composited, alpha * t_excl, torch.zeros_like(alpha))
    accum = torch.bmm(weights, colors)  # [Tc, P, D]
    return accum, t_incl[..., -1]


@dataclass
class _ChunkPlan:
    tiles: Tensor  # [Tc] global tile ids (camera * T + tile)
    gauss: Tensor  # [Tc, L] flat Gaussian ids (0 on padding)
    pad_ok: Tensor  # [Tc, L]
    px: Tensor  # [Tc, P] pixel-centre x
    py: Tensor  # [Tc, P] pixel-centre y


def _plan_chunks(isects: TileIntersections, dtype: torch.dtype, chunk_elements: int) -> List[_ChunkPlan]:
    """Group non-empty tiles by similar count into chunks of <= chunk_elements pixel-pairs."""
    ts = isects.tile_size
    num_pixels = ts * ts
    device = isects.flat_ids.device
    counts = isects.tile_counts.reshape(-1).to(torch.int64)
    sorted_counts, tile_order = torch.sort(counts, descending=True)
    # host sync: the chunk layout (padded sizes) must be known on the host.
    sorted_list = sorted_counts.tolist()
    num_nonempty = sum(1 for n in sorted_list if n > 0)
    tiles_per_cam = isects.num_tile_rows * isects.num_tile_cols
    row_start = torch.tensor(isects.tile_row_starts, device=device, dtype=torch.int64)
    pix = torch.arange(num_pixels, device=device)
    pix_x = (pix % ts).to(dtype) + 0.5
    pix_y = torch.div(pix, ts, rounding_mode="floor").to(dtype) + 0.5
    plans = []
    start = 0
    while start < num_nonempty:
        width = sorted_list[start]
        if width * num_pixels > chunk_elements:
            _LOGGER.debug("tile with %d intersections exceeds the chunk budget; processed alone", width)
        step = max(1, chunk_elements // (width * num_pixels))
        stop = min(num_nonempty, start + step)
        tiles = tile_order[start:stop]
        lane = torch.arange(width, device=device)
        pad_ok = lane[None, :] < counts[tiles][:, None]
        pair = torch.where(pad_ok, isects.tile_offsets[tiles][:, None] + lane[None, :], 0)
        gauss = torch.where(pad_ok, isects.flat_ids[pair], 0)
        cam = torch.div(tiles, tiles_per_cam, rounding_mode="floor")
        local = tiles % tiles_per_cam
        tile_y = torch.div(local, isects.num_tile_cols, rounding_mode="floor") + row_start[cam]
        tile_x = local % isects.num_tile_cols
        px = (tile_x * ts).to(dtype)[:, None] + pix_x[None, :]
        py = (tile_y * ts).to(dtype)[:, None] + pix_y[None, :]
        plans.append(_ChunkPlan(tiles=tiles, gauss=gauss, pad_ok=pad_ok, px=px, py=py))
        start = stop
    return plans


def _deltas(means2d: Tensor, plan: _ChunkPlan) -> Tuple[Tensor, Tensor]:
    xy = means2d[plan.gauss]  # [Tc, L, 2]
    dx = xy[:, None, :, 0] - plan.px[:, :, None]  # [Tc, P, L]
    dy = xy[:, None, :, 1] - plan.py[:, :, None]
    return dx, dy


class _RasterizeTiles(torch.autograd.Function):
    """Tiles -> (accumulated colour, final transmittance), checkpointed per chunk."""

    @staticmethod
    def forward(ctx, means2d, conics, opacities, colors, plans, num_tiles, num_pixels, absgrad_sink):  # type: ignore[override]
        accum = colors.new_zeros(num_tiles, num_pixels, colors.shape[-1])
        trans = colors.new_ones(num_tiles, num_pixels)
        for plan in plans:
            dx, dy = _deltas(means2d, plan)
            acc, t_final = _composite(
                dx, dy, conics[plan.gauss], opacities[plan.gauss], colors[plan.gauss], plan.pad_ok
            )
            accum[plan.tiles] = acc
            trans[plan.tiles] = t_final
        ctx.save_for_backward(means2d, conics, opacities, colors)
        ctx.plans = plans
        ctx.absgrad_sink = absgrad_sink
        return accum, trans

    @staticmethod
    def backward(ctx, grad_accum, grad_trans):  # type: ignore[override]
        means2d, conics, opacities, colors = ctx.saved_tensors
        grads = [torch.zeros_like(t) for t in (means2d, conics, opacities, colors)]
        sink = ctx.absgrad_sink
        for plan in ctx.plans:
            with torch.enable_grad():
                dx, dy = _deltas(means2d.detach(), plan)
                leaves = [
                    dx.requires_grad_(),
                    dy.requires_grad_(),
                    conics.detach()[plan.gauss].requires_grad_(),
                    opacities.detach()[plan.gauss].requires_grad_(),
                    colors.detach()[plan.gauss].requires_grad_(),
                ]
                acc, t_final = _composite(*leaves, plan.pad_ok)
                g_dx, g_dy, g_conic, g_opac, g_color = torch.autograd.grad(
                    (acc, t_final), leaves, (grad_accum[plan.tiles], grad_trans[plan.tiles])
                )
            ids = plan.gauss.reshape(-1)
            g_xy = torch.stack([g_dx.sum(1), g_dy.sum(1)], dim=-1)  # [Tc, L, 2]
            grads[0].index_add_(0, ids, g_xy.reshape(-1, 2))
            grads[1].index_add_(0, ids, g_conic.reshape(-1, g_conic.shape[-1]))
            grads[2].index_add_(0, ids, g_opac.reshape(-1))
            grads[3].index_add_(0, ids, g_color.reshape(-1, g_color.shape[-1]))
            if sink is not None:
                # gsplat's absgrad: |per-pixel contribution| summed over pixels (a pixel lies in one tile).
                g_abs = torch.stack([g_dx.abs().sum(1), g_dy.abs().sum(1)], dim=-1)
                sink.index_add_(0, ids, g_abs.reshape(-1, 2).to(sink.dtype))
        return grads[0], grads[1], grads[2], grads[3], None, None, None, None


def rasterize_to_pixels(
    means2d: Tensor,
    conics: Tensor,
    colors: Tensor,
    opacities: Tensor,
    image_width: int,
    image_height: int,
    isects: TileIntersections,
    *,
    backgrounds: Optional[Tensor] = None,
    absgrad_sink: Optional[Tensor] = None,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> Tuple[Tensor, Tensor]:
    """Composite the Gaussians of each tile into pixels, as gsplat's ``rasterize_to_pixels``.

    The image covers rows ``tile_row_starts[c] * tile_size + [0, image_height)`` of camera ``c``'s
    whole image (``isects`` decides the grid); pixel coordinates are whole-image coordinates.

    Args:
        means2d: Projected centres (whole image). `[C, N, 2]`, px.
        conics: Inverse 2D covariances ``(a, b, c)``. `[C, N, 3]`, 1/px^2.
        colors: Per-camera colours or features. `[C, N, D]`.
        opacities: Per-camera opacities. `[C, N]`, in [0, 1].
        image_width: Width, px; at most ``num_tile_cols * tile_size``.
        image_height: Rows rendered, px; at most ``num_tile_rows * tile_size``.
        isects: From ``intersect_tiles`` on the same projection.
        backgrounds: Colour behind the Gaussians. `[C, D]`, or None for black.
        absgrad_sink: If given, the backward pass adds gsplat's absgrad into it. `[C, N, 2]`.
        chunk_elements: Budget of (pixel, intersection) pairs per chunk.

    Returns:
        ``(colors [C, H, W, D], alphas [C, H, W, 1])``.

    **Memory:** transient memory is about ``20 x 4 bytes x max(chunk_elements, P x max_count)``
    (float32; x2 for float64) where ``max_count`` is the largest per-tile intersection count;
    between forward and backward only the inputs and the index plan (``O(I)``) are kept.

    **Differentiable:** with respect to ``means2d``, ``conics``, ``colors``, ``opacities`` and
    ``backgrounds`` (first order only).

    **Host sync:** once, to lay out the chunks.
    """
    num_cameras, num_gaussians = opacities.shape
    depth = colors.shape[-1]
    ts = isects.tile_size
    rows, cols = isects.num_tile_rows, isects.num_tile_cols
    plans = _plan_chunks(isects, means2d.dtype, chunk_elements)
    sink_flat = absgrad_sink.view(-1, 2) if absgrad_sink is not None else None
    accum, trans = _RasterizeTiles.apply(
        means2d.reshape(-1, 2),
        conics.reshape(-1, 3),
        opacities.reshape(-1),
        colors.reshape(-1, depth),
        plans,
        num_cameras * rows * cols,
        ts * ts,
        sink_flat,
    )

    def to_image(t: Tensor, channels: int) -> Tensor:
        # [C*T, P, D] -> [C, rows*ts, cols*ts, D] -> crop
        img = t.reshape(num_cameras, rows, cols, ts, ts, channels).permute(0, 1, 3, 2, 4, 5)
        return img.reshape(num_cameras, rows * ts, cols * ts, channels)[:, :image_height, :image_width]

    render_colors = to_image(accum, depth)
    trans_img = to_image(trans[..., None], 1)
    if backgrounds is not None:
        render_colors = render_colors + trans_img * backgrounds[:, None, None, :]
    return render_colors, 1.0 - trans_img
