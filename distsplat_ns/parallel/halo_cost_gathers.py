"""The step's two small all-gathers, sized by the step's plan: no size is exchanged or read first.

Every rank holds the same ``StepPlan`` (``balance/planner.py``) and the batch's rendered sizes, so
each can compute how many values every rank contributes to:

- the SSIM-halo exchange (:func:`exchange_halo_rows`): for each band with halo rows, the loss
  gradient of those rows, `[halo rows, W, 3]`, for the band that owns them
  (``model/band_backward.py``);
- the cost gather (:func:`gather_step_costs`): for each band, its measured per-tile-row costs
  (``balance/cost.py``); for each rank, the finite verdict, its render time and whether a viewer
  frame is waiting.

Each is one tensor all-gather on the backend's device (``distributed/collectives.py:all_gather_rows``
with the counts given). On a GPU the halo rows stay on the device, and the costs reach the host
in one copy. Pickled through ``all_gather_object``, each took two all-gathers and two host copies,
and the halo rows a third copy of their own (docs/host_cost.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from distsplat_ns.balance.bands import Band
from distsplat_ns.balance.planner import StepPlan
from distsplat_ns.distributed.collectives import all_gather_rows, all_gather_stacked
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.model.band_backward import HaloMessage
from distsplat_ns.model.losses import halo_end_row
from distsplat_ns.utils.host_to_device import host_tensor

#: Channels of a halo row's gradient: the loss is computed on rendered RGB (``model/band_terms.py``).
HALO_CHANNELS = 3

#: Values each rank adds after its bands' costs: the finite verdict, its render time (s), and
#: whether rank 0 took a viewer frame to render in this step (1.0) or not (0.0).
_TRAILING = 3


@dataclass(frozen=True)
class HaloSlot:
    """The halo rows one band renders below its own rows, `[rows, width, HALO_CHANNELS]`.

    Attributes:
        position: The band's batch position.
        start_row_px: First halo row: the band's own end row.
        rows: Halo rows (> 0).
        width: Pixels per row.
    """

    position: int
    start_row_px: int
    rows: int
    width: int

    @property
    def numel(self) -> int:
        return self.rows * self.width * HALO_CHANNELS


def halo_slots(bands: Sequence[Band], sizes_px: Sequence[tuple[int, int]]) -> list[HaloSlot]:
    """The halo rows ``bands`` render, ordered by ``(position, start row)``: what their rank sends.

    ``sizes_px``: the rendered ``(width, height)`` of each batch position. A band that ends at its
    image's bottom has none, so a plan that cuts no image gives no slot at all.
    """
    slots = []
    for band in bands:
        width, height = sizes_px[band.position]
        end = band.end_row_px(height)
        rows = halo_end_row(end, height) - end
        if rows > 0:
            slots.append(HaloSlot(band.position, end, rows, width))
    return sorted(slots, key=lambda s: (s.position, s.start_row_px))


def exchange_halo_rows(
    ctx: DistContext, outgoing: Sequence[HaloMessage], slots_by_rank: Sequence[Sequence[HaloSlot]], dtype: torch.dtype
) -> list[list[HaloMessage]]:
    """Every rank's halo messages, by rank, each rank's in slot order (``backward_bands``'s exchange).

    Args:
        ctx: The process context.
        outgoing: This rank's messages, ``(position, start row, rows)``, one per slot, any order.
        slots_by_rank: Every rank's :func:`halo_slots` for the bands of this exchange. `[R]`.
        dtype: The gradients' dtype, the same on every rank.

    Raises:
        RuntimeError: ``outgoing`` is not one message per slot of this rank, of its shape.

    **Collective:** world group, one all-gather of every halo row; none when no rank has a slot
    (every rank knows it from the plan). **Host sync:** none (gloo stages the rows through host
    memory).
    """
    mine = sorted(outgoing, key=lambda m: (m[0], m[1]))
    sent = [(p, s, tuple(r.shape)) for p, s, r in mine]
    planned = [(s.position, s.start_row_px, (s.rows, s.width, HALO_CHANNELS)) for s in slots_by_rank[ctx.rank]]
    if sent != planned:
        raise RuntimeError(f"rank {ctx.rank}: the bands rendered halo rows {sent}, the step's plan gives {planned}")
    if not ctx.is_distributed or not any(slots_by_rank):
        return [
            [(p, s, rows.to(dtype)) for p, s, rows in mine] if r == ctx.rank else [] for r in range(len(slots_by_rank))
        ]
    if mine:
        flat = torch.cat([rows.reshape(-1).to(dtype) for _, _, rows in mine])
    else:
        flat = torch.zeros(0, dtype=dtype, device=ctx.device)
    gathered = all_gather_rows(ctx, flat, [sum(s.numel for s in slots) for slots in slots_by_rank])
    incoming = []
    for slots, values in zip(slots_by_rank, gathered, strict=True):
        parts = torch.split(values, [s.numel for s in slots]) if slots else ()
        incoming.append(
            [
                (s.position, s.start_row_px, part.view(s.rows, s.width, HALO_CHANNELS))
                for s, part in zip(slots, parts, strict=True)
            ]
        )
    return incoming


@dataclass(frozen=True)
class StepCosts:
    """What every rank measured in a step; the same on every rank after :func:`gather_step_costs`.

    Attributes:
        measured: Per rank, ``(position, first tile row, row costs)`` for each of its bands, in
            plan order (``BandPlanner.observe``'s measurements). `[R][...]`.
        render_s: Per rank, its render time of the step (forward + backward), s. `[R]`.
        nonfinite: The finite verdict: a gradient held NaN/Inf (False where none was computed).
        view_posted: Rank 0 took a viewer frame to render in this step.
    """

    measured: list[list[tuple[int, int, list[float]]]]
    render_s: list[float]
    nonfinite: bool
    view_posted: bool


def gather_step_costs(
    ctx: DistContext,
    plan: StepPlan,
    band_tile_work: Sequence[tuple[Band, torch.Tensor]],
    verdict: torch.Tensor | None,
    render_s: float,
    view_posted: bool,
) -> StepCosts:
    """Every rank's measured band costs, verdict, render time and rank 0's viewer flag.

    Args:
        ctx: The process context.
        plan: The step's plan; this rank rendered ``plan.bands[ctx.rank]``.
        band_tile_work: This rank's ``(band, work per tile `[tile rows, tile columns]`)`` from
            the render (``RowRender.tile_work``), one per band of its plan, any order.
        verdict: The finite verdict, a device flag `[1]` the same on every rank, or None.
        render_s: This rank's render time, s.
        view_posted: This rank took a viewer frame to serve (rank 0 only).

    Raises:
        RuntimeError: ``band_tile_work`` does not hold the plan's bands with their rows.

    **Collective:** world group, one all-gather (every rank's values padded to the longest rank's, all lengths from the plan).
    **Host sync:** one copy of every rank's values: the next step's cut needs the costs.
    """
    work = dict(band_tile_work)
    rows = [[b.num_cost_rows(plan.heights_px[b.position]) for b in rank_bands] for rank_bands in plan.bands]
    bands, own_rows = plan.bands[ctx.rank], rows[ctx.rank]
    if set(work) != set(bands) or any(work[b].shape[0] != n for b, n in zip(bands, own_rows, strict=True)):
        measured = sorted((b.position, b.first_row, c.shape[0]) for b, c in work.items())
        planned = [(b.position, b.first_row, n) for b, n in zip(bands, own_rows, strict=True)]
        raise RuntimeError(
            f"rank {ctx.rank}: the step measured bands {measured} (position, first tile row, rows), its plan gives {planned}"
        )
    # This rank's values padded to the longest rank's, so that every rank's are one row of the
    # gathered buffer, read at once; the host values carry the padding (no operator for it).
    lengths = [sum(n) + _TRAILING for n in rows]
    padding = [0.0] * (max(lengths) - lengths[ctx.rank])
    parts = [work[b].sum(dim=-1).to(ctx.device, torch.float64) for b in bands]
    if verdict is not None:
        parts += [
            verdict.reshape(1).to(ctx.device, torch.float64),
            host_tensor([render_s, float(view_posted), *padding], torch.float64, ctx.device),
        ]
    else:
        parts.append(host_tensor([0.0, render_s, float(view_posted), *padding], torch.float64, ctx.device))
    gathered = all_gather_stacked(ctx, torch.cat(parts))  # [W, longest]
    measured, render_times, verdicts, views = [], [], [], []
    for rank_bands, rank_rows, host in zip(
        plan.bands, rows, gathered.cpu().tolist(), strict=True
    ):  # host sync: the costs decide the next cut
        per_band, start = [], 0
        for band, n in zip(rank_bands, rank_rows, strict=True):
            per_band.append((band.position, band.first_row, host[start : start + n]))
            start += n
        measured.append(per_band)
        bad, seconds, view = host[start : start + _TRAILING]
        verdicts.append(bad)
        render_times.append(seconds)
        views.append(view)
    return StepCosts(measured=measured, render_s=render_times, nonfinite=any(verdicts), view_posted=bool(views[0]))
