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

How, in two phases:

1. *Find* (no autograd): tiles are grouped by similar intersection count into blocks; in each
   block the (tile, Gaussian) intersections are padded into a ``[tiles, pixels, L]`` layout and
   ``sigma`` -- a quadratic in the pixel's offset from the tile centre -- is evaluated for all
   of them as one batched matmul (per-pixel basis x per-pair coefficients), only to find the
   pairs that can pass the 1/255 cut-off (``sigma <= ln(255 opacity)`` plus a rounding margin).
   In real scenes that is a few percent of the block. The exact gsplat tests then run on that
   short list, and pairs past a pixel's early termination are dropped. What remains -- the
   *composited* pairs, pixel-major and front to back within a pixel -- is all the later phase
   sees. Their count per tile is returned with the image: the time follows it, so it is the
   balancer's cost on this backend (``rendering/api.py:WORK_UNITS``).
2. *Composite* (differentiable): per pair ``alpha``, ``log(1 - alpha)``, a segmented exclusive
   cumulative sum (float64) per pixel gives the transmittance in front of each pair, and
   ``index_add`` sums the weighted colours per pixel. It runs in chunks of pairs inside a custom
   autograd Function whose backward recomputes each chunk under autograd (checkpointing): between
   forward and backward only the pair list (24 bytes per pair in float32) is kept. The backward also yields
   gsplat's ``absgrad``: each pair is one pixel's contribution, so ``|d loss / d mean2d|`` per
   pair is exactly the per-pixel term gsplat sums.

Rows of the tile grid may start at any whole-image tile row (``tile_row_starts``): pixel
coordinates stay whole-image coordinates, which makes a band bit-identical to the same rows of
the whole image.

Shape legend: ``C`` cameras, ``N`` Gaussians, ``T`` tiles, ``I`` intersections, ``D`` channels,
``P`` pixels per tile (``tile_size ** 2``), ``L`` intersections per tile in a chunk, ``V``
composited (pixel, Gaussian) pairs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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

DEFAULT_CHUNK_ELEMENTS = 1 << 20
"""Dense (pixel, intersection) block size of the find phase (1M); the composite phase works on
``chunk_elements // 8`` pairs at a time. See ``rasterize_to_pixels`` for the memory bound.
Larger values were not faster on CPU (20k Gaussians, 256x256: same time at 256k, 1M and 4M)."""

_PAIRS_PER_ELEMENT = 8  # composite-phase chunk = chunk_elements // 8 pairs (~8x the bytes per entry)

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
    tile_row_starts: list[int]

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
    tile_row_starts: Sequence[int] | None = None,
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


# Per-Gaussian features are packed into one [C * N, 6 + D] tensor so each chunk needs one gather
# (and its backward one index_add): columns x, y | conic a, b, c | opacity | colour.
_X, _Y, _A, _B, _C, _O, _COLOR = 0, 1, 2, 3, 4, 5, 6


@dataclass
class _PairChunk:
    """Composited (pixel, Gaussian) pairs: pixel-major, front to back within a pixel.

    Attributes:
        gauss: Flat Gaussian id in ``[C * N]``. `[V]`, int64.
        pix: Tile-major pixel id ``tile * P + (y % ts) * ts + x % ts``. `[V]`, int64.
        px, py: That pixel's centre in whole-image coordinates. `[V]`, px.
    """

    gauss: Tensor
    pix: Tensor
    px: Tensor
    py: Tensor


def _tile_pixel_centres(tiles: Tensor, isects: TileIntersections, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Whole-image pixel centres (``+0.5``) of every pixel of the given global tiles. `[Tc, P]`."""
    ts = isects.tile_size
    tiles_per_cam = isects.num_tile_rows * isects.num_tile_cols
    cam = torch.div(tiles, tiles_per_cam, rounding_mode="floor")
    local = tiles - cam * tiles_per_cam
    row_start = torch.tensor(isects.tile_row_starts, device=tiles.device, dtype=torch.int64)
    tile_y = torch.div(local, isects.num_tile_cols, rounding_mode="floor")
    tile_x = local - tile_y * isects.num_tile_cols
    tile_y = tile_y + row_start[cam]
    offsets = torch.arange(ts * ts, device=tiles.device)
    off_y = torch.div(offsets, ts, rounding_mode="floor")
    px = (tile_x[:, None] * ts + (offsets - off_y * ts)[None, :]).to(dtype) + 0.5
    py = (tile_y[:, None] * ts + off_y[None, :]).to(dtype) + 0.5
    return px, py


def _alpha_of(feats: Tensor, px: Tensor, py: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(dx, dy, sigma, alpha)`` of pairs with packed features `[V, 6 + D]`, gsplat's formulas."""
    dx = feats[:, _X] - px
    dy = feats[:, _Y] - py
    sigma = 0.5 * (feats[:, _A] * dx * dx + feats[:, _C] * dy * dy) + feats[:, _B] * dx * dy
    # clamp_min keeps exp finite where sigma < 0 (those pairs are skipped anyway).
    alpha = torch.clamp(feats[:, _O] * torch.exp(-sigma.clamp_min(0.0)), max=_ALPHA_MAX)
    return dx, dy, sigma, alpha


def _segment_starts(pix: Tensor) -> Tensor:
    """For each entry of a pixel-major list, the index of its pixel's first entry."""
    idx = torch.arange(pix.numel(), device=pix.device)
    is_first = torch.ones_like(pix, dtype=torch.bool)
    is_first[1:] = pix[1:] != pix[:-1]
    return torch.cummax(torch.where(is_first, idx, torch.zeros_like(idx)), dim=0).values


def _log_transmittance(log_keep: Tensor, first: Tensor) -> Tensor:
    """log T in front of each pair, from ``log(1 - alpha)`` per pair (float64), per pixel segment.

    Summed in float64: the running sum spans many pixels, and float32 would lose the small
    per-pixel differences against its growing magnitude.
    """
    running = torch.cumsum(log_keep, dim=0) - log_keep  # exclusive
    return running - running[first]


@torch.no_grad()
def _find_composited(feats: Tensor, isects: TileIntersections, chunk_elements: int) -> tuple[list[_PairChunk], Tensor]:
    """Phase 1: the composited (pixel, Gaussian) pairs of every tile, grouped into chunks, and
    how many each tile has (`[C * T]`, int64: the work of phase 2, ``rasterize_to_pixels``)."""
    num_pixels = isects.tile_size**2
    device, dtype = feats.device, feats.dtype
    counts = isects.tile_counts.reshape(-1).to(torch.int64)
    sorted_counts, tile_order = torch.sort(counts, descending=True)
    # host sync: the block layout (padded widths) must be known on the host.
    sorted_list = sorted_counts.tolist()
    num_nonempty = sum(1 for n in sorted_list if n > 0)
    ts = isects.tile_size
    opacities = feats[:, _O]
    # ln(255 o): alpha = o exp(-sigma) >= 1/255 needs sigma <= this; -1 (never) when o < 1/255.
    max_sigma = torch.where(opacities >= _ALPHA_MIN, torch.log(255.0 * opacities.clamp_min(_ALPHA_MIN)), -1.0)
    # sigma is a quadratic in the pixel offset (di, dj) from the tile centre, so the whole
    # [Tc, P, L] block is one batched matmul of a per-pixel basis [P, 6] with per-pair
    # coefficients [Tc, 6, L] (three passes over the block instead of ~15 elementwise ones).
    offsets = torch.arange(num_pixels, device=device)
    di = (offsets % ts).to(dtype) + (0.5 - ts / 2)
    dj = torch.div(offsets, ts, rounding_mode="floor").to(dtype) + (0.5 - ts / 2)
    basis = torch.stack([0.5 * di * di, di * dj, 0.5 * dj * dj, -di, -dj, torch.ones_like(di)], dim=-1)  # [P, 6]
    geometry = feats[:, :_COLOR].contiguous()  # x, y, a, b, c, o: all the find phase reads
    found: list[_PairChunk] = []
    pairs_per_tile = torch.zeros_like(counts)
    start = 0
    while start < num_nonempty:
        width = sorted_list[start]
        if width * num_pixels > chunk_elements:
            _LOGGER.debug("tile with %d intersections exceeds the chunk budget; processed alone", width)
        stop = min(num_nonempty, start + max(1, chunk_elements // (width * num_pixels)))
        tiles = tile_order[start:stop]
        lane = torch.arange(width, device=device)
        pad_ok = lane[None, :] < counts[tiles][:, None]
        gauss = isects.flat_ids[torch.where(pad_ok, isects.tile_offsets[tiles][:, None] + lane[None, :], 0)]
        block_px, block_py = _tile_pixel_centres(tiles, isects, dtype)  # [Tc, P]
        centre_x = block_px[:, :1] - 0.5 + ts / 2  # [Tc, 1]
        centre_y = block_py[:, :1] - 0.5 + ts / 2
        f = geometry[gauss]  # [Tc, L, 6]
        a, b, c = f[..., _A], f[..., _B], f[..., _C]
        u, v = f[..., _X] - centre_x, f[..., _Y] - centre_y  # mean - tile centre
        au_bv, bu_cv = a * u + b * v, b * u + c * v
        const = 0.5 * u * au_bv + 0.5 * v * bu_cv  # 0.5 a u^2 + b u v + 0.5 c v^2
        # Rounding of the expansion is bounded by a few ulp of the largest term; 1e-5 of the term
        # magnitudes (>100 ulp in float32) plus 1e-3 keeps every pair that passes exactly.
        au, av = u.abs() + ts / 2, v.abs() + ts / 2
        margin = 1e-3 + 1e-5 * (0.5 * a.abs() * au * au + b.abs() * au * av + 0.5 * c.abs() * av * av + 1.0)
        limit = torch.where(pad_ok, max_sigma[gauss] + margin, float("-inf"))  # padding: never
        coeffs = torch.stack([a, b, c, au_bv, bu_cv, const - limit], dim=1)  # [Tc, 6, L]
        candidate = torch.matmul(basis, coeffs) <= 0  # sigma <= limit, [Tc, P, L]
        flat = candidate.reshape(-1).nonzero().squeeze(1)  # row-major: pixel-major, then depth
        in_block = torch.div(flat, width, rounding_mode="floor")  # tile_in_chunk * P + pixel
        tile_idx = torch.div(in_block, num_pixels, rounding_mode="floor")
        cand_gauss = gauss.reshape(-1)[tile_idx * width + (flat - in_block * width)]
        cand_pix = tiles[tile_idx] * num_pixels + (in_block - tile_idx * num_pixels)
        px, py = block_px.reshape(-1)[in_block], block_py.reshape(-1)[in_block]

        # The exact gsplat tests, on the short list, with the same arithmetic as phase 2.
        _, _, sig, alpha = _alpha_of(geometry[cand_gauss], px, py)
        valid = (sig >= 0) & (alpha >= _ALPHA_MIN)
        log_keep = torch.where(valid, torch.log1p(-alpha.to(torch.float64)), 0.0)
        log_after = _log_transmittance(log_keep, _segment_starts(cand_pix)) + log_keep
        # Composited iff valid and the transmittance after it stays above 1e-4; T only falls
        # within a pixel, so this also drops everything after gsplat's early stop.
        keep = (valid & (torch.exp(log_after) > _T_MIN)).nonzero().squeeze(1)
        found.append(_PairChunk(cand_gauss[keep], cand_pix[keep], px[keep], py[keep]))
        # ``flat`` and ``keep`` are ascending and a tile's entries are contiguous in ``flat``, so
        # two searches over the block's tile boundaries count each tile's kept pairs.
        tile_bounds = torch.arange(tiles.numel() + 1, device=device) * (num_pixels * width)
        kept_bounds = torch.searchsorted(keep, torch.searchsorted(flat, tile_bounds))
        pairs_per_tile[tiles] = kept_bounds[1:] - kept_bounds[:-1]
        start = stop
    return _group_pairs(found, max(1, chunk_elements // _PAIRS_PER_ELEMENT)), pairs_per_tile


def _group_pairs(parts: list[_PairChunk], max_pairs: int) -> list[_PairChunk]:
    """Concatenate per-block pair lists into chunks of about ``max_pairs`` (whole tiles each).

    ``parts`` is emptied as it goes: a block's pairs are released once copied into their chunk
    (a chunk of one block is that block, uncopied), so the find phase holds the image's pairs
    once plus one chunk, not twice (docs/sharded.md, "Capacity with W in device bytes").
    """
    chunks: list[_PairChunk] = []
    group: list[_PairChunk] = []
    size = 0

    def flush() -> None:
        if len(group) == 1:
            chunks.append(group[0])
        elif group:
            chunks.append(
                _PairChunk(*(torch.cat([getattr(p, k) for p in group]) for k in ("gauss", "pix", "px", "py")))
            )
        group.clear()

    parts.reverse()  # popped from the end: first block first
    while parts:
        part = parts.pop()
        if size and size + part.gauss.numel() > max_pairs:
            flush()
            size = 0
        group.append(part)
        size += part.gauss.numel()
        del part
    flush()
    return chunks


def _composite(feats: Tensor, chunk: _PairChunk, first: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Phase 2 on one chunk of composited pairs (packed features per pair `[V, 6 + D]`).

    Returns:
        ``(weighted colour per pair [V, D], log(1 - alpha) per pair [V] float64, dx, dy)``; the
        caller sums the first two per pixel (the second gives ``log T_final``).
    """
    dx, dy, _, alpha = _alpha_of(feats, chunk.px, chunk.py)
    log_keep = torch.log1p(-alpha.to(torch.float64))
    weights = alpha * torch.exp(_log_transmittance(log_keep, first)).to(alpha.dtype)
    return weights[:, None] * feats[:, _COLOR:], log_keep, dx, dy


class _CompositePairs(torch.autograd.Function):
    """Packed features -> per-pixel (accumulated colour, final transmittance), checkpointed."""

    @staticmethod
    def forward(ctx, feats, chunks, num_pixels_total, absgrad_sink):  # type: ignore[override]
        num_channels = feats.shape[1] - _COLOR
        accum = feats.new_zeros(num_pixels_total, num_channels)
        log_trans = torch.zeros(num_pixels_total, dtype=torch.float64, device=feats.device)
        for chunk in chunks:
            contrib, log_keep, _, _ = _composite(feats[chunk.gauss], chunk, _segment_starts(chunk.pix))
            accum.index_add_(0, chunk.pix, contrib)
            log_trans.index_add_(0, chunk.pix, log_keep)
        trans = torch.exp(log_trans).to(feats.dtype)
        ctx.save_for_backward(feats, trans)
        ctx.chunks, ctx.absgrad_sink = chunks, absgrad_sink
        return accum, trans

    @staticmethod
    def backward(ctx, grad_accum, grad_trans):  # type: ignore[override]
        feats, trans = ctx.saved_tensors
        grad_feats = torch.zeros_like(feats)
        grad_log_trans = (grad_trans * trans).to(torch.float64)  # T = exp(sum log(1 - alpha))
        sink = ctx.absgrad_sink
        for chunk in ctx.chunks:
            with torch.enable_grad():
                leaf = feats.detach()[chunk.gauss].requires_grad_()
                contrib, log_keep, dx, dy = _composite(leaf, chunk, _segment_starts(chunk.pix))
                outputs, cotangents = (contrib, log_keep), (grad_accum[chunk.pix], grad_log_trans[chunk.pix])
                if sink is None:
                    (g_leaf,) = torch.autograd.grad(outputs, (leaf,), cotangents)
                else:
                    g_leaf, g_dx, g_dy = torch.autograd.grad(outputs, (leaf, dx, dy), cotangents)
            grad_feats.index_add_(0, chunk.gauss, g_leaf)
            if sink is not None:
                # gsplat's absgrad: each pair is one pixel's own contribution to d loss / d mean2d.
                sink.index_add_(0, chunk.gauss, torch.stack([g_dx.abs(), g_dy.abs()], dim=-1).to(sink.dtype))
        return grad_feats, None, None, None


def rasterize_to_pixels(
    means2d: Tensor,
    conics: Tensor,
    colors: Tensor,
    opacities: Tensor,
    image_width: int,
    image_height: int,
    isects: TileIntersections,
    *,
    backgrounds: Tensor | None = None,
    absgrad_sink: Tensor | None = None,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> tuple[Tensor, Tensor, Tensor]:
    """Composite the Gaussians of each tile into pixels, as gsplat's ``rasterize_to_pixels``, and
    count each tile's work.

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
        chunk_elements: Memory knob: the find phase evaluates blocks of at most this many
            (pixel, intersection) pairs (a single tile with more is processed alone); the
            composite phase works on ``chunk_elements // 8`` composited pairs at a time.

    Returns:
        ``(colors [C, H, W, D], alphas [C, H, W, 1], pairs_per_tile [C, rows, cols])``; the last
        (int64) counts each tile's composited (pixel, Gaussian) pairs: what the composite phase
        and its backward process, so this backend's time follows their sum, not the tile
        intersections (docs/balance.md, "The reference backend's cost unit").

    **Memory:** transient peaks, float32: in the find phase about
    ``5 bytes x max(chunk_elements, P x max_count)`` (a block and its boolean mask;
    ``max_count`` is the largest per-tile intersection count) plus its candidate list; in a
    composite chunk's backward about ``45 bytes x chunk_elements`` (measured), i.e. ~50 MB at
    the default 1M. Between forward and backward only 24 bytes per composited pair are kept,
    plus the ``[C, H, W, D]`` outputs. (20k Gaussians at 256x256: +66 MB forward, +132 MB
    backward over the process baseline.)

    **Differentiable:** with respect to ``means2d``, ``conics``, ``colors``, ``opacities`` and
    ``backgrounds`` (first order only).

    **Host sync:** once, to lay out the find phase's blocks.
    """
    num_cameras, _num_gaussians = opacities.shape
    depth = colors.shape[-1]
    ts = isects.tile_size
    rows, cols = isects.num_tile_rows, isects.num_tile_cols
    feats = torch.cat(
        [means2d.reshape(-1, 2), conics.reshape(-1, 3), opacities.reshape(-1, 1), colors.reshape(-1, depth)], dim=-1
    )  # [C * N, 6 + D]
    chunks, pairs_per_tile = _find_composited(feats.detach(), isects, chunk_elements)
    sink_flat = absgrad_sink.view(-1, 2) if absgrad_sink is not None else None
    accum, trans = _CompositePairs.apply(feats, chunks, num_cameras * rows * cols * ts * ts, sink_flat)

    def to_image(t: Tensor, channels: int) -> Tensor:
        # tile-major [C*T*P, D] -> [C, rows*ts, cols*ts, D] -> crop
        img = t.reshape(num_cameras, rows, cols, ts, ts, channels).permute(0, 1, 3, 2, 4, 5)
        return img.reshape(num_cameras, rows * ts, cols * ts, channels)[:, :image_height, :image_width]

    render_colors = to_image(accum, depth)
    trans_img = to_image(trans[:, None], 1)
    if backgrounds is not None:
        render_colors = render_colors + trans_img * backgrounds[:, None, None, :]
    return render_colors, 1.0 - trans_img, pairs_per_tile.reshape(num_cameras, rows, cols)
