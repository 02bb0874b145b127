"""The tile compositor of the gsplat CPU shim (tests/helpers/gsplat_cpu.py): gsplat's
``rasterize_to_pixels`` forward and backward kernels on torch ops, for gsplat 1.4.0 and 1.5.3.

It honours what the kernel is handed: each pixel composites only the entries its tile's run of
``flatten_ids`` lists (``isect_offsets``), in that order, with the kernel's rules
(gsplat's cuda/csrc/rasterize_to_pixels_fwd.cu, the 3DGS rules of Kerbl et al. 2023):

- pixel centres at ``+0.5``; ``sigma = 0.5 (a dx^2 + c dy^2) + b dx dy`` with ``dx = mean - px``;
- ``alpha = min(0.999, opacity exp(-sigma))``; an entry with ``sigma < 0`` or ``alpha < 1/255`` is
  skipped;
- an entry whose transmittance after it would be ``<= 1e-4`` is not composited and ends the pixel;
- ``alpha_out = 1 - T``, ``colour = sum + T bg``; ``last_ids``: the position in ``flatten_ids`` of
  the pixel's last composited entry (0 if none);
- a tile whose ``masks`` entry is False gets the background, alpha 0.

Tiles are processed in chunks, each as a dense ``[tiles, pixels, L]`` block (each tile's list
padded to the chunk's longest, ``L``). The backward recomputes each chunk under autograd on
detached inputs (the kernel's gradient rules are those of this forward: the clamp at 0.999 passes
no gradient, skipped entries none) and returns ``torch.autograd.grad``. absgrad is the sum over
pixels of ``|d loss / d mean2d|`` of each (pixel, entry) pair: the pair's ``dx``/``dy`` are its own
tensors in the block, so their gradients are exactly the per-pixel terms the kernel sums.

Shape legend: ``C`` cameras, ``E`` entries (``C * N`` unpacked, ``nnz`` packed), ``D`` channels,
``I`` intersections, ``Tc`` tiles in a chunk, ``P`` pixels per tile, ``L`` padded entries per tile.
"""

from __future__ import annotations

import torch
from torch import Tensor

ALPHA_MAX = 0.999  # the kernel's clamp, so 1 - alpha never reaches 0
ALPHA_MIN = 1.0 / 255.0  # below one 8-bit level an entry is skipped
T_MIN = 1e-4  # a pixel ends before its transmittance would fall to this
CHUNK_ELEMENTS = 1 << 20
"""Dense (pixel, entry) elements per chunk (1M: ~4 MB per float32 block; the backward keeps ~15 such
blocks alive under autograd)."""


def _layout(
    isect_offsets: Tensor, num_isects: int, masks: Tensor | None, num_pixels: int
) -> tuple[Tensor, Tensor, list]:
    """Each tile's run ``[start, start + count)`` of ``flatten_ids`` (masked tiles: empty) and the
    chunks of tiles (longest runs first), as ``[(tiles, width)]``. Host sync: the chunk widths."""
    starts = isect_offsets.reshape(-1).to(torch.int64)
    ends = torch.cat([starts[1:], starts.new_full((1,), num_isects)])
    counts = ends - starts
    if masks is not None:
        counts = torch.where(masks.reshape(-1), counts, 0)
    sorted_counts, order = torch.sort(counts, descending=True, stable=True)
    widths = sorted_counts.tolist()  # host sync: the padded widths decide the chunks
    chunks = []
    first, num_tiles = 0, len(widths)
    while first < num_tiles and widths[first] > 0:
        width = widths[first]
        stop = min(num_tiles, first + max(1, CHUNK_ELEMENTS // (width * num_pixels)))
        while widths[stop - 1] == 0:
            stop -= 1
        chunks.append((order[first:stop], width))
        first = stop
    return starts, counts, chunks


def _pixel_centres(tiles: Tensor, tile_size: int, tile_width: int, tile_height: int, dtype) -> tuple[Tensor, Tensor]:
    """Pixel centres of every pixel of the given tiles (global tile ids, camera-major). `[Tc, P]`."""
    local = tiles % (tile_width * tile_height)
    ty, tx = local // tile_width, local % tile_width
    p = torch.arange(tile_size * tile_size, device=tiles.device)
    px = (tx[:, None] * tile_size + p % tile_size).to(dtype) + 0.5
    py = (ty[:, None] * tile_size + p // tile_size).to(dtype) + 0.5
    return px, py


def _chunk_lists(starts: Tensor, counts: Tensor, tiles: Tensor, width: int, flatten_ids: Tensor):
    """A chunk's padded lists `[Tc, L]`: positions in ``flatten_ids``, entries, and which lanes are listed."""
    lane = torch.arange(width, device=tiles.device)
    lane_ok = lane[None, :] < counts[tiles][:, None]
    position = torch.where(lane_ok, starts[tiles][:, None] + lane[None, :], 0)
    gauss = flatten_ids[position].to(torch.int64)
    return position, gauss, lane_ok


# Per-entry features packed in one [E, 6 + D] tensor, so a chunk needs one gather (and its backward
# one index_add): columns x, y | conic a, b, c | opacity | colour.
_X, _Y, _A, _B, _C, _O, _COLOUR = 0, 1, 2, 3, 4, 5, 6


def _alpha(f: Tensor, px: Tensor, py: Tensor) -> tuple[Tensor, Tensor]:
    """``(sigma, alpha)`` of (pixel, entry) pairs from features ``f`` `[Tc, P or 1, L, 6 + D]` and pixel
    centres `[Tc, P, 1]`, the kernel's formulas (``_find`` and ``_composite`` both use it: one arithmetic)."""
    x, y, a, b, c, o = f[..., :_COLOUR].unbind(-1)  # one unbind: its backward is one stack, not six
    dx = x - px
    dy = y - py
    sigma = torch.addcmul(torch.addcmul(a * dx * dx, c * dy, dy) * 0.5, b * dx, dy)
    # clamp_min: exp stays finite (and its gradient defined) where sigma < 0; those are skipped.
    alpha = torch.clamp(o * torch.exp(-sigma.clamp_min(0.0)), max=ALPHA_MAX)
    return sigma, alpha


@torch.no_grad()
def _find(feats: Tensor, gauss: Tensor, lane_ok: Tensor, px: Tensor, py: Tensor) -> tuple[Tensor, Tensor]:
    """Which listed entries each pixel composites, in list order: ``(lanes [Tc, P, K], composited [Tc, P, K])``.

    First the dense ``[Tc, P, L]`` block keeps the candidates, ``0 <= sigma <= ln(255 o)`` plus a
    rounding margin (``alpha >= 1/255`` without the exp; this pass is most of the shim's time), packed
    per pixel in list order (``K``: the most candidates of a pixel in the chunk). On those, with the
    compositor's own arithmetic (``_alpha``), the kernel's rules: skipped when ``sigma < 0`` or
    ``alpha < 1/255``; an entry whose transmittance after it would be ``<= 1e-4`` ends the pixel (T only
    falls, so every later entry fails that test too). Host sync: ``K``."""
    f = feats[gauss][:, None]  # [Tc, 1, L, F]
    dx = f[..., _X] - px[..., None]  # [Tc, P, L]
    dy = f[..., _Y] - py[..., None]
    sigma = (f[..., _A] * dx).mul_(dx).addcmul_(f[..., _C] * dy, dy).mul_(0.5).addcmul_(f[..., _B] * dx, dy)
    del dx, dy
    # sigma <= ln(255 o) <=> o exp(-sigma) >= 1/255; the margin (1e-3 + 1e-5 |ln 255 o|, ~100 float32 ulp)
    # keeps every pair whose exact alpha passes, whatever the rounding of sigma and exp.
    limit = torch.log(f[..., _O].clamp_min(1e-30) / ALPHA_MIN)
    limit = torch.where(lane_ok[:, None, :], limit + 1e-3 + 1e-5 * limit.abs(), -1.0)  # padding: never
    candidate = (sigma >= -1e-3).logical_and_(sigma <= limit)
    del sigma
    num = candidate.sum(dim=-1)  # [Tc, P]
    most = int(num.max()) if num.numel() else 0  # host sync: the compact width
    slot = torch.where(candidate, candidate.cumsum(dim=-1) - 1, most)  # not a candidate: a spare slot
    lane = torch.arange(lane_ok.shape[1], device=lane_ok.device).expand_as(slot)
    lanes = torch.zeros(*slot.shape[:2], most + 1, dtype=torch.int64, device=lane_ok.device).scatter_(-1, slot, lane)
    lanes = lanes[..., :most]
    listed = torch.arange(most, device=lane_ok.device) < num[..., None]
    sigma, alpha = _alpha(feats[_per_pixel(gauss, lanes)], px[..., None], py[..., None])
    ok = listed & (sigma >= 0) & (alpha >= ALPHA_MIN)
    composited = ok & (torch.cumprod(torch.where(ok, 1.0 - alpha, 1.0), dim=-1) > T_MIN)
    return lanes, composited


def _per_pixel(lane_values: Tensor, lanes: Tensor) -> Tensor:
    """``lane_values`` `[Tc, L]` at each pixel's composited lanes `[Tc, P, K]`."""
    return torch.gather(lane_values[:, None, :].expand(-1, lanes.shape[1], -1), 2, lanes)


def _composite(f: Tensor, slot_ok: Tensor, px: Tensor, py: Tensor) -> tuple[Tensor, Tensor]:
    """Front to back over each pixel's composited entries (features ``f`` `[Tc, P, K, F]`): ``(colour
    [Tc, P, D], final transmittance [Tc, P])``; T is the running float product in list order, as the kernel's."""
    _, alpha = _alpha(f, px[..., None], py[..., None])
    alpha = torch.where(slot_ok, alpha, 0.0)
    after = torch.cumprod(1.0 - alpha, dim=-1)
    before = torch.cat([torch.ones_like(after[..., :1]), after[..., :-1]], dim=-1)
    colour = ((alpha * before)[..., None] * f[..., _COLOUR:]).sum(dim=-2)
    t_final = after[..., -1] if after.shape[-1] else torch.ones_like(px)
    return colour, t_final


def _features(means2d: Tensor, conics: Tensor, colors: Tensor, opacities: Tensor) -> Tensor:
    """The packed features `[E, 6 + D]` (E: ``C * N`` unpacked, ``nnz`` packed)."""
    num = opacities.numel()
    return torch.cat(
        [
            means2d.reshape(num, 2),
            conics.reshape(num, 3),
            opacities.reshape(num, 1),
            colors.reshape(num, colors.shape[-1]),
        ],
        dim=-1,
    )


def _tile_major(image: Tensor, tile_size: int, tile_width: int, tile_height: int) -> Tensor:
    """``[C, H, W, D]`` -> ``[C * th * tw, P, D]`` (pixels past the image: 0)."""
    num_cameras, height, width, depth = image.reshape(-1, *image.shape[-3:]).shape
    image = image.reshape(num_cameras, height, width, depth)
    padded = image.new_zeros(num_cameras, tile_height * tile_size, tile_width * tile_size, depth)
    padded[:, :height, :width] = image
    tiles = padded.reshape(num_cameras, tile_height, tile_size, tile_width, tile_size, depth).permute(0, 1, 3, 2, 4, 5)
    return tiles.reshape(-1, tile_size * tile_size, depth)


def _image(tiles: Tensor, num_cameras: int, tile_size: int, tile_width: int, tile_height: int, height: int, width: int):
    """``[C * th * tw, P, D]`` -> ``[C, H, W, D]``."""
    depth = tiles.shape[-1]
    img = tiles.reshape(num_cameras, tile_height, tile_width, tile_size, tile_size, depth).permute(0, 1, 3, 2, 4, 5)
    return img.reshape(num_cameras, tile_height * tile_size, tile_width * tile_size, depth)[:, :height, :width]


def rasterize_fwd(
    means2d: Tensor,
    conics: Tensor,
    colors: Tensor,
    opacities: Tensor,
    backgrounds: Tensor | None,
    masks: Tensor | None,
    width: int,
    height: int,
    tile_size: int,
    isect_offsets: Tensor,
    flatten_ids: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(render_colors [C, H, W, D], render_alphas [C, H, W, 1], last_ids [C, H, W] int32)``."""
    *image_dims, tile_height, tile_width = isect_offsets.shape  # image_dims: [C] (1.4.0), [..., C] (1.5.3)
    num_cameras = isect_offsets.numel() // (tile_height * tile_width)
    feats = _features(means2d, conics, colors, opacities)
    depth = colors.shape[-1]
    starts, counts, chunks = _layout(isect_offsets, flatten_ids.numel(), masks, tile_size * tile_size)
    num_tiles = counts.numel()
    accum = feats.new_zeros(num_tiles, tile_size * tile_size, depth)
    trans = feats.new_ones(num_tiles, tile_size * tile_size)
    last = torch.zeros(num_tiles, tile_size * tile_size, dtype=torch.int64, device=feats.device)
    for tiles, chunk_width in chunks:
        position, gauss, lane_ok = _chunk_lists(starts, counts, tiles, chunk_width, flatten_ids)
        px, py = _pixel_centres(tiles, tile_size, tile_width, tile_height, feats.dtype)
        lanes, slot_ok = _find(feats, gauss, lane_ok, px, py)
        colour, t_final = _composite(feats[_per_pixel(gauss, lanes)], slot_ok, px, py)
        accum[tiles] = colour
        trans[tiles] = t_final
        last[tiles] = torch.where(slot_ok, _per_pixel(position, lanes), 0).amax(dim=-1) if lanes.shape[-1] else 0
    render_colors = _image(accum, num_cameras, tile_size, tile_width, tile_height, height, width)
    t_img = _image(trans[..., None], num_cameras, tile_size, tile_width, tile_height, height, width)
    if backgrounds is not None:
        render_colors = render_colors + t_img * backgrounds.reshape(num_cameras, 1, 1, depth)
    last_ids = _image(last[..., None], num_cameras, tile_size, tile_width, tile_height, height, width)[..., 0]
    return (
        render_colors.reshape(*image_dims, height, width, depth).contiguous(),
        (1.0 - t_img).reshape(*image_dims, height, width, 1).contiguous(),
        last_ids.to(torch.int32).reshape(*image_dims, height, width).contiguous(),
    )


def rasterize_bwd(
    means2d: Tensor,
    conics: Tensor,
    colors: Tensor,
    opacities: Tensor,
    backgrounds: Tensor | None,
    masks: Tensor | None,
    width: int,
    height: int,
    tile_size: int,
    isect_offsets: Tensor,
    flatten_ids: Tensor,
    render_alphas: Tensor,
    last_ids: Tensor,
    v_render_colors: Tensor,
    v_render_alphas: Tensor,
    absgrad: bool,
) -> tuple[Tensor | None, Tensor, Tensor, Tensor, Tensor]:
    """``(v_means2d_abs or None, v_means2d, v_conics, v_colors, v_opacities)``, each shaped as its input.

    ``render_alphas`` and ``last_ids`` (what the kernel walks back from) are not needed: the
    composited set is recomputed."""
    del render_alphas, last_ids
    tile_height, tile_width = isect_offsets.shape[-2:]
    feats = _features(means2d, conics, colors, opacities).detach()
    starts, counts, chunks = _layout(isect_offsets, flatten_ids.numel(), masks, tile_size * tile_size)
    v_col_tiles = _tile_major(v_render_colors, tile_size, tile_width, tile_height)  # [T, P, D]
    v_t_tiles = -_tile_major(v_render_alphas, tile_size, tile_width, tile_height)[..., 0]  # alpha_out = 1 - T
    if backgrounds is not None:
        # colour = sum + T bg: T's cotangent gains v_colour . bg (the kernel's background term).
        per_image_bg = backgrounds.reshape(-1, backgrounds.shape[-1])
        per_tile_bg = per_image_bg.repeat_interleave(tile_height * tile_width, dim=0)[:, None, :]
        v_t_tiles = v_t_tiles + (v_col_tiles * per_tile_bg).sum(-1)
    v_feats = torch.zeros_like(feats)
    v_abs = feats.new_zeros(feats.shape[0], 2) if absgrad else None
    for tiles, chunk_width in chunks:
        _, gauss, lane_ok = _chunk_lists(starts, counts, tiles, chunk_width, flatten_ids)
        px, py = _pixel_centres(tiles, tile_size, tile_width, tile_height, feats.dtype)
        lanes, slot_ok = _find(feats, gauss, lane_ok, px, py)  # as the forward found them
        if lanes.shape[-1] == 0:
            continue
        pair_gauss = _per_pixel(gauss, lanes).reshape(-1)
        with torch.enable_grad():
            # Each (pixel, entry) pair's features are their own leaf: its x, y gradient is that
            # pixel's own d loss / d mean2d, which absgrad sums as |.|.
            f = feats[pair_gauss].reshape(*lanes.shape, -1).requires_grad_()
            colour, t_final = _composite(f, slot_ok, px, py)
            (v_f,) = torch.autograd.grad((colour, t_final), (f,), (v_col_tiles[tiles], v_t_tiles[tiles]))
        v_f = torch.where(slot_ok[..., None], v_f, 0.0).reshape(pair_gauss.numel(), -1)  # padding: nothing
        v_feats.index_add_(0, pair_gauss, v_f)
        if v_abs is not None:
            v_abs.index_add_(0, pair_gauss, v_f[:, _X : _Y + 1].abs())
    v_m, v_con, v_op, v_col = v_feats.split([2, 3, 1, v_feats.shape[1] - _COLOUR], dim=1)
    shaped = (
        v_m.reshape(means2d.shape),
        v_con.reshape(conics.shape),
        v_col.reshape(colors.shape),
        v_op.reshape(opacities.shape),
    )
    return (v_abs.reshape(means2d.shape) if v_abs is not None else None, *shaped)
