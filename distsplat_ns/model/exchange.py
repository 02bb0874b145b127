"""The sharded mode's exchange: screen-space terms to the bands' ranks, their gradients back.

Each rank owns a shard of the Gaussians (docs/sharded.md). A step:

1. ``send_screen_terms``: the owner projects its shard into every camera of the batch (done by
   the model) and sends each band's rank the Gaussians whose footprint reaches the band's tile
   rows (``balance/routing.py``) as rows of screen-space terms -- projected mean, conic, colour
   after SH, opacity (differentiable), depth and radius (not) -- plus their global ids, in one
   all-to-all. A Gaussian is sent once per (camera, destination) however many of that rank's
   bands of the camera it reaches.
2. The band's rank rasterizes what it received (``Received.projection``: per batch position, the
   rows in global-id order, so depth ties break the same way whatever W) and runs the two-phase
   band backward as in the replicated mode (``model/band_backward.py``); the gradients land on
   the received rows.
3. ``return_gradients``: those gradients and gsplat's absgrad go back through the reverse
   all-to-all, and the owner backpropagates them through its projection into its parameters.
   The projected means of the owner then hold the whole batch's screen-space gradients and
   absgrads, so densification statistics are complete at each owner without a reduction.

Shape letters: S rows this rank sent, R rows it received, C cameras of a projection call, N
Gaussians of this rank's shard.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import torch
from torch import Tensor

from distsplat_ns.balance.bands import TILE_SIZE, Band
from distsplat_ns.balance.routing import footprint_tile_rows, touches_rows
from distsplat_ns.distributed.collectives import all_to_all_rows
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.model.losses import halo_end_row
from distsplat_ns.rendering import Projection

#: Columns of a row of screen-space terms: the differentiable ones first.
_MEANS2D, _CONICS, _COLORS, _OPACITY = slice(0, 2), slice(2, 5), slice(5, 8), 8
NUM_DIFFERENTIABLE = 9
_DEPTH, _RADIUS = 9, 10
NUM_COLUMNS = 11
#: Columns of a gradient row: the 9 differentiable terms' gradients, then absgrad (x, y).
NUM_GRAD_COLUMNS = NUM_DIFFERENTIABLE + 2



def exchange_row_bytes(item_bytes: int) -> int:
    """Bytes of one row of screen-space terms (without its int64 id)."""
    return NUM_COLUMNS * item_bytes


def exchange_grad_bytes(item_bytes: int) -> int:
    """Bytes of one row of gradients (with absgrad)."""
    return NUM_GRAD_COLUMNS * item_bytes


ProjectionCall = Tuple[List[int], Projection]
"""Batch positions of a projection call's cameras and the projection of this rank's shard."""


@dataclass
class Sent:
    """What this rank sent, kept for the reverse exchange.

    Attributes:
        rows: The differentiable terms sent, in the projection's graph. `[S, 9]`.
        call_of_row: Which projection call each row came from. `[S]`, int64.
        camera_of_row: Camera index within that call. `[S]`, int64.
        gaussian_of_row: Index into this rank's shard. `[S]`, int64.
        send_counts: Rows sent to each rank. Length W.
        recv_counts: Rows received from each rank. Length W.
        calls: The projection calls (their ``means2d`` get ``.grad`` and ``.absgrad``).
    """

    rows: Tensor
    call_of_row: Tensor
    camera_of_row: Tensor
    gaussian_of_row: Tensor
    send_counts: List[int]
    recv_counts: List[int]
    calls: List[ProjectionCall]

    @property
    def num_rows(self) -> int:
        return int(self.rows.shape[0])


@dataclass
class Received:
    """The rows this rank received and, per batch position it renders, their order.

    Attributes:
        leaf: Every received row, a leaf whose ``.grad`` collects the band backward. `[R, 11]`.
        ids: Global id of each row. `[R]`, int64.
        rows_of_position: Per batch position, indices into ``leaf`` in ascending global id.
        sizes_px: Per batch position, the rendered ``(width, height)`` of its camera (cameras of
            one batch may differ in size).
        backend: The rasterizer backend of the projections.
    """

    leaf: Tensor
    ids: Tensor
    rows_of_position: Dict[int, Tensor]
    sizes_px: Dict[int, Tuple[int, int]]
    backend: str

    def projection(self, position: int) -> Projection:
        """The received Gaussians of ``position`` as a one-camera projection for
        ``rendering.rasterize_rows`` (its ``means2d.absgrad`` collects absgrad).

        **Differentiable:** with respect to ``leaf`` (means2d, conics, colours, opacities).
        """
        rows = self.leaf[self.rows_of_position[position]]
        num = int(rows.shape[0])
        means2d = rows[:, _MEANS2D].contiguous()[None]
        return Projection(
            means2d=means2d,
            conics=rows[:, _CONICS].contiguous()[None],
            depths=rows[:, _DEPTH].detach().contiguous()[None],
            radii=rows[:, _RADIUS].detach().round().to(torch.int32)[None],
            opacities=rows[:, _OPACITY].contiguous()[None],
            colors=rows[:, _COLORS].contiguous()[None],
            width=self.sizes_px[position][0],
            height=self.sizes_px[position][1],
            backend=self.backend,
            render_mode="RGB",
            num_cameras=1,
            num_gaussians=num,
        )


def render_tile_rows(band: Band, height_px: int) -> Tuple[int, int]:
    """The rasterizer's tile rows (``TILE_SIZE``, the whole image's grid) a band renders: its own
    rows and the SSIM halo below them."""
    end_px = halo_end_row(band.end_row_px(height_px), height_px)
    return band.first_row_px // TILE_SIZE, -(-end_px // TILE_SIZE)


def send_screen_terms(
    ctx: DistContext,
    calls: Sequence[ProjectionCall],
    ids: Tensor,
    bands_of_rank: Sequence[Sequence[Band]],
    batch_size: int,
) -> Tuple[Sent, Received]:
    """Send every band's rank the screen-space terms of this shard's Gaussians it needs.

    Args:
        ctx: The process context.
        calls: This shard projected into every camera of the batch, each position once.
        ids: Global id of each Gaussian of the shard. `[N]`, int64.
        bands_of_rank: The step's plan: every rank's bands.
        batch_size: B.

    Returns:
        What was sent (for :func:`return_gradients`) and what was received.

    **Collective:** world group: the per-position row counts, the rows and their ids (three
    all-to-alls; at one rank, none).
    **Host sync:** the row counts.
    **Differentiable:** ``Sent.rows`` stays in the projection's graph; the received rows are a
    new leaf.
    """
    if not calls:
        raise ValueError("send_screen_terms: no projection call (the batch has at least one camera)")
    world = ctx.world_size
    device = ids.device
    where = {position: (c, k) for c, (positions, _) in enumerate(calls) for k, position in enumerate(positions)}
    footprints: Dict[int, Tuple[Tensor, Tensor]] = {}  # per position, computed once for every destination
    counts = torch.zeros(world, batch_size, dtype=torch.int64, device=device)
    pieces, terms, row_ids, call_idx, cam_idx, gauss_idx = [], [], [], [], [], []
    for dest in range(world):
        # A Gaussian goes once per (position, destination): the union over that rank's bands.
        masks: Dict[int, Tensor] = {}
        for band in bands_of_rank[dest]:
            c, k = where[band.position]
            proj = calls[c][1]
            if band.position not in footprints:
                footprints[band.position] = footprint_tile_rows(proj.means2d[k], proj.radii[k], proj.width, proj.height)
            touches = touches_rows(*footprints[band.position], *render_tile_rows(band, proj.height))
            masks[band.position] = masks[band.position] | touches if band.position in masks else touches
        for position in sorted(masks):
            c, k = where[position]
            proj = calls[c][1]
            idx = torch.nonzero(masks[position]).reshape(-1)
            counts[dest, position] = idx.numel()
            pieces.append(
                torch.cat(
                    [proj.means2d[k, idx], proj.conics[k, idx], proj.colors[k, idx][:, :3], proj.opacities[k, idx, None]],
                    dim=-1,
                )
            )
            terms.append(torch.stack([proj.depths[k, idx].detach(), proj.radii[k, idx].to(proj.depths.dtype)], dim=-1))
            row_ids.append(ids[idx])
            call_idx.append(torch.full_like(idx, c))
            cam_idx.append(torch.full_like(idx, k))
            gauss_idx.append(idx)
    dtype = calls[0][1].means2d.dtype
    if pieces:
        rows = torch.cat(pieces)
        payload = torch.cat([rows.detach(), torch.cat(terms)], dim=-1)
        sent_ids = torch.cat(row_ids)
    else:
        rows = torch.zeros(0, NUM_DIFFERENTIABLE, device=device, dtype=dtype)
        payload = torch.zeros(0, NUM_COLUMNS, device=device, dtype=dtype)
        sent_ids = torch.zeros(0, dtype=torch.int64, device=device)
    send_counts = [int(n) for n in counts.sum(dim=1).tolist()]
    # Row counts per (source, position): rank s's row s of the received matrix.
    recv_matrix, _ = all_to_all_rows(ctx, counts, [1] * world, [1] * world)
    recv_counts = [int(n) for n in recv_matrix.sum(dim=1).tolist()]
    recv, _ = all_to_all_rows(ctx, payload, send_counts, recv_counts)
    recv_ids, _ = all_to_all_rows(ctx, sent_ids, send_counts, recv_counts)
    sent = Sent(
        rows=rows,
        call_of_row=_cat_or_empty(call_idx, device),
        camera_of_row=_cat_or_empty(cam_idx, device),
        gaussian_of_row=_cat_or_empty(gauss_idx, device),
        send_counts=send_counts,
        recv_counts=recv_counts,
        calls=list(calls),
    )
    leaf = recv.detach().clone().requires_grad_(True)
    return sent, Received(
        leaf=leaf,
        ids=recv_ids,
        rows_of_position=_rows_by_position(recv_matrix, recv_ids),
        sizes_px={position: (calls[c][1].width, calls[c][1].height) for position, (c, _) in where.items()},
        backend=calls[0][1].backend,
    )


def _cat_or_empty(parts: List[Tensor], device: torch.device) -> Tensor:
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=device)


def _rows_by_position(recv_matrix: Tensor, recv_ids: Tensor) -> Dict[int, Tensor]:
    """Per batch position, the received rows (source-major, then position-major, as sent)
    reordered by ascending global id."""
    offsets: Dict[int, List[Tensor]] = {}
    start = 0
    for source_counts in recv_matrix.tolist():
        for position, n in enumerate(source_counts):
            if n:
                offsets.setdefault(position, []).append(torch.arange(start, start + n, device=recv_ids.device))
                start += n
    out = {}
    for position, parts in offsets.items():
        rows = torch.cat(parts)
        out[position] = rows[torch.argsort(recv_ids[rows], stable=True)]
    return out


def return_gradients(ctx: DistContext, sent: Sent, received: Received, rendered_from: Dict[int, Projection]) -> None:
    """Send the received rows' gradients back to their owners and backpropagate them there.

    Args:
        ctx: The process context.
        sent: This rank's :func:`send_screen_terms` record.
        received: What it received; ``leaf.grad`` holds the band backward's gradients (None when
            this rank rendered nothing).
        rendered_from: Per batch position this rank rendered, the projection it rendered from
            (:meth:`Received.projection`); its ``means2d.absgrad`` (when absgrad was asked for)
            holds gsplat's absgrad of the rows, in ``rows_of_position`` order.

    After the call every projection call's ``means2d.grad`` and ``means2d.absgrad`` hold the
    whole batch's values for this shard, and the parameters' ``.grad`` their gradients.

    **Collective:** world group: one all-to-all of the gradient rows.
    **Differentiable:** runs autograd through the owner's projection.
    """
    leaf = received.leaf
    grads = torch.zeros(leaf.shape[0], NUM_GRAD_COLUMNS, device=leaf.device, dtype=leaf.dtype)
    if leaf.grad is not None:
        grads[:, :NUM_DIFFERENTIABLE] = leaf.grad[:, :NUM_DIFFERENTIABLE]
    for position, proj in rendered_from.items():
        absgrad = getattr(proj.means2d, "absgrad", None)
        if absgrad is not None:
            grads[received.rows_of_position[position], NUM_DIFFERENTIABLE:] += absgrad[0].to(grads.dtype)
    back, _ = all_to_all_rows(ctx, grads, sent.recv_counts, sent.send_counts)
    back = back.to(sent.rows.device, sent.rows.dtype)
    for c, (_, proj) in enumerate(sent.calls):
        if getattr(proj.means2d, "absgrad", None) is None:
            proj.means2d.absgrad = torch.zeros_like(proj.means2d, requires_grad=False)  # type: ignore[attr-defined]
        mine = sent.call_of_row == c
        proj.means2d.absgrad.index_put_(  # type: ignore[attr-defined]
            (sent.camera_of_row[mine], sent.gaussian_of_row[mine]), back[mine, NUM_DIFFERENTIABLE:], accumulate=True
        )
    if sent.num_rows and sent.rows.requires_grad:
        torch.autograd.backward([sent.rows], [back[:, :NUM_DIFFERENTIABLE]])
