"""One view (an eval image, a viewer frame) rendered by every rank from its own shard (sharded mode).

No rank holds the whole model, so a view is rendered the way a training band is (docs/sharded.md,
"Views rendered by all ranks"):

1. every rank projects its shard (cropped by the viewer's box, if any) into the view's camera;
2. the footprint costs of the rows (``balance/cost.py:footprint_row_costs``) are summed over ranks
   and the planner's partition (``balance/partition.py:partition_rows``) cuts the image into one
   band per rank of near-equal cost;
3. the training exchange (``parallel/exchange.py:exchange_screen_terms``, under ``no_grad``) sends
   each band's rank the screen-space terms that reach its rows;
4. each rank rasterizes its band from the rows it received, in global-id order;
5. only the band pixels (colour, expected depth, opacity) travel, to rank 0, which stacks them.

Rank 0 gets the image nerfstudio's ``get_outputs`` returns; every other rank gets None.

Shape letters: N Gaussians on this rank, H/W pixels.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from distsplat_ns.balance.bands import TILE_SIZE
from distsplat_ns.balance.cost import footprint_row_costs
from distsplat_ns.balance.partition import partition_rows
from distsplat_ns.distributed.collectives import all_reduce_sum_, gather_rows
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.parallel.exchange import ReceivedProjections, exchange_screen_terms
from distsplat_ns.rendering import project, rasterize_rows

if TYPE_CHECKING:
    from nerfstudio.cameras.cameras import Cameras

    from distsplat_ns.model.distsplat_model import DistSplatModel

#: Channels of a band's pixels sent to rank 0: colour (3, background composited), expected depth, opacity.
_RGB, _DEPTH, _ALPHA = slice(0, 3), slice(3, 4), slice(4, 5)
NUM_PIXEL_CHANNELS = 5


@torch.no_grad()
def render_view_collectively(
    ctx: DistContext, model: DistSplatModel, camera: Cameras
) -> dict[str, torch.Tensor] | None:
    """Render one whole camera from every rank's shard; the image on rank 0 (see the module docstring).

    Args:
        ctx: The process context.
        model: This rank's model (its shard), in eval mode for eval images (downscale 1).
        camera: One camera, the same on every rank.

    Returns:
        On rank 0, ``get_outputs``' dict: ``rgb`` `[H, W, 3]`, ``depth`` `[H, W, 1]`,
        ``accumulation`` `[H, W, 1]`, ``background`` (float32); None on every other rank.

    Raises:
        ValueError: not exactly one camera (every rank raises it before any collective).

    **Collective:** world group, on every rank in the same order with the same camera: one
    all-reduce of the row costs, the exchange's three all-to-alls, then the row counts and one
    gather of the band pixels to rank 0. At ``world_size == 1`` none: the one rank renders every
    row. Rank 0 rendering rows ``[0, 32)`` and rank 1 ``[32, 60)`` of a 60-row view: rank 0
    receives rank 1's 28 rows and returns the 60-row image; rank 1 returns None.
    **Host sync:** the row costs (the cut is made on the host), the exchange's counts, the pixels
    (through rank 0's host on gloo).
    """
    if camera.shape[0] != 1:
        raise ValueError(f"render_view_collectively renders one camera at a time, got {camera.shape[0]}")
    downscale = model._get_downscale_factor()
    inputs = model.render_inputs(camera, downscale)
    width, height = inputs.width, inputs.height
    raw, ids = model.gauss_params, model.gauss_ids
    if model.crop_box is not None and not model.training:
        keep = model.crop_box.within(raw["means"]).reshape(-1)
        raw, ids = {k: v[keep] for k, v in raw.items()}, ids[keep]
    proj = project(
        **model._activated(raw),
        viewmats=inputs.viewmats,
        Ks=inputs.Ks,
        width=width,
        height=height,
        sh_degree=model.sh_degree_at(model.step),
        rasterize_mode=model.config.rasterize_mode,
        backend=model.config.rendering_backend,
    )
    costs = footprint_row_costs(proj.means2d[0], proj.radii[0], height, width)
    all_reduce_sum_(ctx, costs)
    bands = partition_rows([costs.cpu()], ctx.world_size)  # host sync: the cut is a host decision
    received = exchange_screen_terms(ctx, [([0], proj)], ids, bands, 1)
    background = model._get_background_color().to(proj.means2d.dtype)
    pieces = [
        _render_band(received, band.first_row_px, band.num_rows_px(height), width, background)
        for band in bands[ctx.rank]
    ]
    mine = torch.cat(pieces) if pieces else proj.means2d.new_zeros(0, width, NUM_PIXEL_CHANNELS)
    # The partition gives ranks consecutive rows in rank order (rank 0 from row 0): stacking by
    # rank is the image.
    gathered = gather_rows(ctx, mine)
    if gathered is None:
        return None
    image = torch.cat([g.to(model.device) for g in gathered])
    return _outputs(image, background, height, width)


def _render_band(
    received: ReceivedProjections, first_row_px: int, num_rows_px: int, width: int, background: torch.Tensor
) -> torch.Tensor:
    """Rows ``[first_row_px, first_row_px + num_rows_px)`` of the view from the received rows:
    `[rows, W, 5]` (colour over ``background``, expected depth, opacity). Rows no Gaussian reaches
    render from zero received rows: the background, depth and opacity 0."""
    proj = received.projection(0)
    proj = dataclasses.replace(
        proj, colors=torch.cat([proj.colors, proj.depths[..., None]], dim=-1), render_mode="RGB+ED"
    )
    out = rasterize_rows(proj, [first_row_px], num_rows_px, tile_size=TILE_SIZE)
    colors, alphas = out.colors[0], out.alphas[0]
    rgb = torch.clamp(colors[..., :3] + (1 - alphas) * background, 0.0, 1.0)
    return torch.cat([rgb, colors[..., 3:4], alphas], dim=-1)


def _outputs(image: torch.Tensor, background: torch.Tensor, height: int, width: int) -> dict[str, torch.Tensor]:
    """``get_outputs``' dict from the stacked pixels `[H, W, 5]` (as ``model/eval_outputs.py``)."""
    alpha = image[..., _ALPHA]
    depth = image[..., _DEPTH]
    depth = torch.where(alpha > 0, depth, depth.max())
    return {
        "rgb": image[..., _RGB].float(),
        "depth": depth.float(),
        "accumulation": alpha.float(),
        "background": background.expand(height, width, 3).float(),
    }
