"""The sharded mode's exchange: screen-space terms to the bands' ranks, one differentiable operation.

Each rank owns a shard of the Gaussians (docs/sharded.md). A step:

1. ``exchange_screen_terms``: the owner has projected its shard into every camera of the batch
   (``parallel/sharded.py``) and sends each band's rank the Gaussians whose footprint reaches the
   band's tile rows (``balance/routing.py``) as rows of screen-space terms -- projected mean, conic,
   colour after SH, opacity (differentiable), depth and radius (not) -- plus their global ids, in
   one all-to-all. A Gaussian is sent once per (camera, destination) however many of that rank's
   bands of the camera it reaches.
2. The band's rank rasterizes what it received (``ReceivedProjections``, a ``ProjectionSource``:
   per batch position, the rows in global-id order, so depth ties break the same way whatever W)
   and runs the two-phase band backward as in the replicated mode (``model/band_backward.py``).
3. The exchange is a ``torch.autograd.Function`` (``_ScreenTermExchange``): its backward, reached in
   that same backward pass, sends the received rows' gradients and gsplat's absgrad back through the
   reverse all-to-all, deposits the absgrad on the owner's projected means as the band render does,
   and hands autograd the sent rows' gradients, which flow on through the owner's projection. The
   owner's projected means then hold the whole batch's screen-space gradients and absgrads, so the
   densification statistics are complete at each owner without a reduction.

Shape letters: S rows this rank sent, R rows it received, C cameras of a projection call, N
Gaussians of this rank's shard.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from distsplat_ns.balance.bands import TILE_SIZE, Band
from distsplat_ns.balance.routing import band_extent_px, footprint_reach_px, footprint_touches_px
from distsplat_ns.distributed.collectives import all_gather_stacked, all_to_all_rows
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.distributed.torch_compat import nonzero_of_size
from distsplat_ns.model.band_render import Projector, RenderGroup, StatisticsProjection
from distsplat_ns.model.losses import halo_end_row
from distsplat_ns.rendering import Projection
from distsplat_ns.utils.host_to_device import host_tensor

if TYPE_CHECKING:
    from nerfstudio.cameras.cameras import Cameras

    from distsplat_ns.utils.cameras import BatchCameras

#: Columns of a row of screen-space terms, field by field: means2d, conics, colours, opacity (the
#: differentiable ones), depth, radius (its bits).
_TERM_COLUMNS = (2, 3, 3, 1, 1, 1)
NUM_DIFFERENTIABLE = sum(_TERM_COLUMNS[:4])
NUM_COLUMNS = sum(_TERM_COLUMNS)
#: Columns of a gradient row: means2d's, conics', colours' gradients, then the opacity's and the
#: absgrad (x, y) in the depth's and radius's columns (which have no gradient): a received row's
#: gradient is a row of its own width.
_GRAD_COLUMNS = (2, 3, 3, 3)
NUM_GRAD_COLUMNS = sum(_GRAD_COLUMNS)
assert NUM_GRAD_COLUMNS == NUM_COLUMNS


def exchange_row_bytes(item_bytes: int) -> int:
    """Bytes of one row of screen-space terms (without its int64 id)."""
    return NUM_COLUMNS * item_bytes


def exchange_grad_bytes(item_bytes: int) -> int:
    """Bytes of one row of gradients (with absgrad)."""
    return NUM_GRAD_COLUMNS * item_bytes


ProjectionCall = tuple[list[int], Projection]
"""Batch positions of a projection call's cameras and the projection of this rank's shard."""

Timer = Callable[[], AbstractContextManager[None]]
"""A context manager factory that counts the time inside it as communication."""


@dataclass
class Route:
    """Where every row went, kept for the reverse exchange in backward.

    Attributes:
        ctx: The process context.
        camera_of_row: Each sent row's camera among the projection calls' cameras, laid end to
            end (call 0's, then call 1's, ...). `[S]`, int64.
        gaussian_of_row: Index into this rank's shard. `[S]`, int64.
        send_counts: Rows sent to each rank. Length W.
        recv_counts: Rows received from each rank. Length W.
        calls: The shard's projection calls (their ``means2d`` get ``.grad`` and ``.absgrad``).
        rows_of_position: Per batch position this rank renders, indices of the received rows in
            ascending global id (empty where no Gaussian reaches its bands).
        rendered_from: Per received batch position, the projection rendered from it (filled,
            every position at once, by the first ``ReceivedProjections.projection``; the
            ``means2d.absgrad`` of those rendered is read in backward).
        timer: Counts the reverse all-to-all as communication.
    """

    ctx: DistContext
    camera_of_row: Tensor
    gaussian_of_row: Tensor
    send_counts: list[int]
    recv_counts: list[int]
    calls: list[ProjectionCall]
    rows_of_position: dict[int, Tensor]
    rendered_from: dict[int, Projection] = field(default_factory=dict)
    timer: Timer = contextlib.nullcontext

    @property
    def num_rows(self) -> int:
        return int(self.camera_of_row.shape[0])

    def payload_bytes(self, item_bytes: int) -> int:
        """Payload bytes that leave this rank in both directions: terms and int64 ids out,
        gradients and absgrads back (0 at one rank)."""
        if not self.ctx.is_distributed:
            return 0
        rank = self.ctx.rank
        rows_out = self.num_rows - self.send_counts[rank]
        grads_out = sum(self.recv_counts) - self.recv_counts[rank]
        return rows_out * (exchange_row_bytes(item_bytes) + 8) + grads_out * exchange_grad_bytes(item_bytes)


class _ScreenTermExchange(torch.autograd.Function):
    """Forward: the rows ``(Route.camera_of_row, Route.gaussian_of_row)`` of every field, sent with
    their global ids by the all-to-all of ``Route.send_counts``, one collective: each int64 id
    rides in the payload as its bytes, ``8 / itemsize`` columns of the terms' dtype after the
    terms (bits are copied, never computed on). Returns the received rows' terms `[1, R, 11]` (a view
    of the received buffer), their ids `[R]` int64 and a token (an empty view of the received
    rows, which the band backward anchors, so that this backward runs, a collective, even on a
    rank that rendered nothing).
    Backward: the terms' gradient rows arrive with their absgrads in the depth's and radius's
    columns (``_ReceivedFields``) and go back as they are, by the reverse all-to-all; the absgrad
    lands on the owner's projected means, and the terms' gradients go into the four fields' rows,
    all in one zeroed buffer (autograd's backward of one index per field would zero one buffer
    each: docs/host_cost.md).

    **Collective:** world group, in forward and in backward on every rank.
    **Differentiable:** with respect to means2d `[C, N, 2]`, conics `[C, N, 3]`, colours
    `[C, N, K]` (the first 3 channels are sent) and opacities `[C, N]`; not the depths `[C, N]`,
    radii `[C, N]` int32 (their bits ride in one column, as the ids' do) and ids `[N]`.
    """

    @staticmethod
    def forward(
        fn_ctx,
        means2d: Tensor,
        conics: Tensor,
        colors: Tensor,
        opacities: Tensor,
        depths: Tensor,
        radii: Tensor,
        ids: Tensor,
        route: Route,
    ) -> tuple[Tensor, Tensor, Tensor]:
        fn_ctx.route = route
        fn_ctx.field_shapes = (means2d.shape, conics.shape, colors.shape, opacities.shape)
        fn_ctx.sent_dtype = dtype = means2d.dtype
        fn_ctx.set_materialize_grads(
            False
        )  # no zeros for the ids' gradient, nor the terms' where no band rendered them
        # Every field's columns side by side for every (camera, Gaussian), then one index of the
        # sent rows: two operators whatever the fields. An id rides as its bytes, 8 / itemsize
        # columns of the terms' dtype; a radius as its bits, one column.
        id_columns = ids[:, None].view(dtype)
        terms = torch.cat(
            [
                means2d,
                conics,
                _rgb(colors),
                opacities[..., None],
                depths[..., None],
                radii.to(_int_of_size(dtype)).view(dtype)[..., None],
                id_columns.expand(means2d.shape[0], *id_columns.shape),
            ],
            dim=-1,
        )  # [C, N, 11 + 8 / itemsize]
        payload = terms[route.camera_of_row, route.gaussian_of_row]
        recv, _ = all_to_all_rows(route.ctx, payload, route.send_counts, route.recv_counts)
        recv_ids = recv[:, NUM_COLUMNS:].clone(memory_format=torch.contiguous_format).view(torch.int64).view(-1)
        fn_ctx.mark_non_differentiable(recv_ids)
        # The terms as one camera's rows `[1, R, 11]`, the projections' shape: the received fields
        # are then views of no other shape (``_ReceivedFields``).
        return recv[None, :, :NUM_COLUMNS], recv_ids, recv[:0]  # the token: no rows

    @staticmethod
    def backward(fn_ctx, grad_terms: Tensor | None, _grad_ids: None, _grad_token: Tensor | None):
        route: Route = fn_ctx.route
        if grad_terms is None:  # no band rendered a received row: zeros go back, still collectively
            rows = torch.zeros(
                sum(route.recv_counts), NUM_GRAD_COLUMNS, dtype=fn_ctx.sent_dtype, device=route.camera_of_row.device
            )
        else:
            rows = grad_terms[0]
        with route.timer():
            back, _ = all_to_all_rows(route.ctx, rows, route.recv_counts, route.send_counts)
        field_grads = _rows_into_fields(route, back, fn_ctx.field_shapes)
        # The route holds projections whose tensors' graph holds this node, which holds the route:
        # a cycle through autograd's C++ side that Python's collector cannot see, so every step's
        # projections stayed alive. The pipeline keeps its own reference to read the statistics.
        fn_ctx.route = None
        return (*field_grads, None, None, None, None)


def _rgb(colors: Tensor) -> Tensor:
    """The first 3 channels of colours `[..., K]`: the colours themselves at K = 3 (no view to make)."""
    return colors if colors.shape[-1] == 3 else colors[..., :3]


def _int_of_size(dtype: torch.dtype) -> torch.dtype:
    """The integer dtype as wide as the float ``dtype``: a radius rides in one column as its bits."""
    return {16: torch.int16, 32: torch.int32, 64: torch.int64}[torch.finfo(dtype).bits]


def _rows_into_fields(route: Route, back: Tensor, shapes: Sequence[torch.Size]) -> list[Tensor]:
    """The returned gradient rows `[S, 11]` added at the sent rows into zeroed means2d, conics,
    colours and opacities gradients of ``shapes`` (a row sent to several ranks sums, as autograd's
    backward of an index does), which it returns, and their absgrads into the shard's projected
    means (``means2d.absgrad``, :func:`_deposit_absgrad`). All are parts of one zeroed buffer:
    the means', conics' and colours' gradients contiguous (gsplat's projection and SH kernels
    would copy strided ones), the opacities' and the absgrads side by side `[C, N, 3]`, as the
    rows hold them, filled by one index (elementwise operators and the statistics' norm read them
    strided, without a copy)."""
    rows = (route.camera_of_row, route.gaussian_of_row)
    means_shape, conics_shape, colors_shape, opacities_shape = shapes
    parts = [means_shape, conics_shape, colors_shape, (*opacities_shape, 3)]
    numels = [math.prod(shape) for shape in parts]
    means2d, conics, colors, tail = (
        part.view(shape) for part, shape in zip(back.new_zeros(sum(numels)).split(numels), parts, strict=True)
    )
    # The row's columns split once: means, conics, colours, then the opacity's and the absgrads'.
    back_means2d, back_conics, back_colors, back_tail = back.split(_GRAD_COLUMNS, dim=1)
    means2d.index_put_(rows, back_means2d, accumulate=True)
    conics.index_put_(rows, back_conics, accumulate=True)
    _rgb(colors).index_put_(rows, back_colors, accumulate=True)
    tail.index_put_(rows, back_tail, accumulate=True)
    _deposit_absgrad(route, tail[..., 1:])
    return [means2d, conics, colors, tail[..., 0]]


class _ReceivedFields(torch.autograd.Function):
    """The received rows at ``index`` (`[M]`, unique), as the fields a one-camera projection holds:
    means2d `[1, M, 2]`, conics `[1, M, 3]`, colours `[1, M, 3]`, opacities `[1, M]`
    (differentiable), depths `[1, M]` and radii `[1, M]` int32 (not; sent as their bits). One
    function rather than autograd's index per field: its backward writes the four fields'
    gradients, with the absgrads the rasterizer left on ``route.rendered_from``'s means (positions
    ascending, as ``index`` lists their rows), into the leaf's rows with one concatenation and one
    indexed copy, where autograd's backward of the indexes fills a zeroed buffer per field and adds
    them (docs/host_cost.md). The fields' leading camera axis comes from the leaf's: no view per
    field, nor its backward's.

    **Differentiable:** with respect to ``leaf`` `[1, R, 11]` (its first ``NUM_DIFFERENTIABLE``
    columns; the gradient's last two columns are the absgrads).
    """

    @staticmethod
    def forward(fn_ctx, leaf: Tensor, index: Tensor, route: Route):
        fn_ctx.save_for_backward(index)
        fn_ctx.route = route
        fn_ctx.set_materialize_grads(False)  # no zeros for the depths' and radii's gradients (never read)
        fn_ctx.leaf_shape = leaf.shape
        # One index per field, of its columns: each field comes out contiguous, with no copy after.
        means2d, conics, colors, *scalars = (
            columns.index_select(1, index) for columns in leaf.split(_TERM_COLUMNS, dim=2)
        )
        opacities, depths, radii = (values[..., 0] for values in scalars)  # [1, M, 1] -> [1, M]
        radii = radii.view(_int_of_size(leaf.dtype)).to(torch.int32)  # the bits sent; a no-op at float32
        fn_ctx.mark_non_differentiable(depths, radii)
        return means2d, conics, colors, opacities, depths, radii

    @staticmethod
    def backward(fn_ctx, grad_means2d, grad_conics, grad_colors, grad_opacities, _depths, _radii):
        (index,) = fn_ctx.saved_tensors
        route: Route = fn_ctx.route
        fn_ctx.route = None  # the route holds the projections, whose graph holds this node
        means = [route.rendered_from[p].means2d for p in sorted(route.rendered_from)]  # as ``index`` lists their rows
        # Each field's gradient `[1, M, columns]` (the opacities' gets its column's axis).
        grads = [grad_means2d, grad_conics, grad_colors, None if grad_opacities is None else grad_opacities[..., None]]
        like = next(g for g in grads if g is not None)  # autograd calls backward only when one is
        absgrads = [getattr(m, "absgrad", None) for m in means]
        if any(a is not None for a in absgrads):
            parts = [like.new_zeros(1, m.shape[1], 2) if a is None else a for a, m in zip(absgrads, means, strict=True)]
            grads.append(_joined(parts, dim=1))
        else:
            grads.append(None)  # no absgrad asked for (the strategy's ``absgrad`` off)
        widths = (*_TERM_COLUMNS[:4], 2)  # the absgrads' 2 in the depth's and radius's columns
        columns = torch.cat(
            [
                like.new_zeros(1, index.shape[0], w) if g is None else g.to(like.dtype)
                for g, w in zip(grads, widths, strict=True)
            ],
            dim=2,
        )  # [1, M, 11], the leaf's column order, absgrads in the depth's and radius's columns
        grad_leaf = like.new_zeros(fn_ctx.leaf_shape)
        grad_leaf.index_copy_(1, index, columns)
        return grad_leaf, None, None


def _deposit_absgrad(route: Route, summed: Tensor) -> None:
    """Add the returned absgrads, summed per (camera, Gaussian) over all calls' cameras `[C, N,
    2]`, to the shard's projected means (``means2d.absgrad``): each call takes its cameras' part
    -- no per-call selection of rows."""
    for (_, proj), part in zip(route.calls, _parts(summed, [len(p) for p, _ in route.calls]), strict=True):
        if getattr(proj.means2d, "absgrad", None) is None:
            proj.means2d.absgrad = part  # type: ignore[attr-defined]
        else:
            proj.means2d.absgrad += part  # type: ignore[attr-defined]


@dataclass
class ReceivedProjections:
    """The rows this rank received, as a ``ProjectionSource`` for ``DistSplatModel.forward_bands``.

    Attributes:
        leaf: Every received row's terms, the exchange's output, as one camera's. `[1, R, 11]`.
        ids: Global id of each row. `[R]`, int64.
        route: The exchange's record (counts, the shard's projection calls, the rows per position).
        sizes_px: Per batch position, the rendered ``(width, height)`` of its camera.
        backend: The rasterizer backend of the projections.
        calls: Empty: this rank renders no projection of its own Gaussians.
        token: The exchange's empty output, anchored so that its backward runs on every rank.
        anchors: ``(token,)``.
    """

    leaf: Tensor
    token: Tensor
    ids: Tensor
    route: Route
    sizes_px: dict[int, tuple[int, int]]
    backend: str
    calls: list[StatisticsProjection] = field(default_factory=list)

    @property
    def anchors(self) -> tuple[Tensor, ...]:
        """The exchange's token: its backward (the reverse all-to-all) must run on every rank."""
        return (self.token,)

    @property
    def statistics_projections(self) -> list[StatisticsProjection]:
        """The shard's projection calls as ``(positions, means2d, radii)``: after backward their
        ``means2d`` hold the whole batch's gradients and absgrads of this rank's Gaussians."""
        return [(positions, proj.means2d, proj.radii) for positions, proj in self.route.calls]

    def projection(self, position: int) -> Projection:
        """The received Gaussians of ``position`` as a one-camera projection for
        ``rendering.rasterize_rows`` (its ``means2d.absgrad`` collects absgrad). The first call
        unpacks every position's (:meth:`_unpack`) into ``route.rendered_from``.

        **Differentiable:** with respect to ``leaf`` (means2d, conics, colours, opacities).
        """
        if not self.route.rendered_from:
            self.route.rendered_from.update(self._unpack())
        return self.route.rendered_from[position]

    def _unpack(self) -> dict[int, Projection]:
        """Every received position's rows as a projection: one index of the leaf (positions
        ascending, each one's rows in ascending global id) and one copy per field, split into a
        view per position, so that neither the forward's operators nor their backward's grow
        with the positions this rank renders."""
        positions = sorted(self.route.rows_of_position)
        parts = [self.route.rows_of_position[p] for p in positions]
        sizes = [int(part.shape[0]) for part in parts]
        means2d, conics, colors, opacities, depths, radii = _ReceivedFields.apply(self.leaf, _joined(parts), self.route)
        fields = {
            "means2d": means2d,
            "conics": conics,
            "depths": depths,
            "radii": radii,
            "opacities": opacities,
            "colors": colors,
        }
        split = {name: _parts(values, sizes, dim=1) for name, values in fields.items()}
        return {
            position: Projection(
                **{name: split[name][i] for name in fields},
                width=self.sizes_px[position][0],
                height=self.sizes_px[position][1],
                backend=self.backend,
                render_mode="RGB",
                num_cameras=1,
                num_gaussians=sizes[i],
            )
            for i, position in enumerate(positions)
        }

    def render_groups(
        self,
        model: Projector,
        positions: Sequence[int],
        bands: Sequence[Band],
        cameras: BatchCameras[Cameras],
        downscale: int,
        step: int,
    ) -> Iterator[RenderGroup]:
        """Per position this rank renders, the received Gaussians and one raster call per band
        (already projected by their owners: the cameras' poses are not read)."""
        for i, position in enumerate(positions):
            own = [[band] for band in bands if band.position == position]
            if own:
                yield i, self.projection(position), own


def render_tile_rows(band: Band, height_px: int) -> tuple[int, int]:
    """The rasterizer's tile rows (``TILE_SIZE``, the whole image's grid) a band renders: its own
    rows and the SSIM halo below them."""
    end_px = halo_end_row(band.end_row_px(height_px), height_px)
    return band.first_row_px // TILE_SIZE, -(-end_px // TILE_SIZE)


def _pair_masks(
    calls: Sequence[ProjectionCall],
    sizes_px: dict[int, tuple[int, int]],
    camera_of: dict[int, int],
    bands_of_rank: Sequence[Sequence[Band]],
) -> tuple[list[tuple[int, int]], Tensor | None]:
    """Which of the shard's Gaussians each (destination, position) pair needs: the union over
    the destination's bands of the position. Pairs destination-major, positions ascending; the
    masks `[P, N]` bool (None without pairs). Each call's footprints and every band's test are
    one batch of operations, whatever W and B."""
    keyed = sorted(
        ((dest, band.position, band) for dest, bands in enumerate(bands_of_rank) for band in bands), key=lambda t: t[:2]
    )
    if not keyed:
        return [], None
    pairs = sorted({(dest, position) for dest, position, _ in keyed})
    pair_index = {pair: i for i, pair in enumerate(pairs)}
    footprints = [footprint_reach_px(proj.means2d, proj.radii) for _, proj in calls]
    y = _joined([f for f, _ in footprints])  # [cameras of all calls, N], px
    reach = _joined([r for _, r in footprints])
    table = []  # per band: its pair, its camera among all calls', its middle row and widened half height (px)
    for dest, position, band in keyed:
        table.append(
            [
                pair_index[(dest, position)],
                camera_of[position],
                *band_extent_px(*render_tile_rows(band, sizes_px[position][1])),
            ]
        )
    # Column-major `[4, bands, 1]`: each column a `[bands, 1]` bound against its cameras' `[bands, N]`, one unbind.
    pair_of_band, camera, middle, half = host_tensor(
        [[[row[k]] for row in table] for k in range(4)], torch.int64, y.device
    ).unbind(0)
    if [row[1] for row in table] != list(range(y.shape[0])):  # else one band per camera, in order (B = W): no gather
        y, reach = y[camera[:, 0]], reach[camera[:, 0]]
    touches = footprint_touches_px(y, reach, middle, half)  # [bands, N]
    if len(pairs) == len(keyed):
        return pairs, touches
    # Several bands of one pair: a Gaussian is needed if any of them touches it.
    hits = torch.zeros(len(pairs), touches.shape[1], dtype=torch.int32, device=touches.device)
    return pairs, hits.index_add_(0, pair_of_band[:, 0], touches.to(torch.int32)) > 0


def exchange_screen_terms(
    ctx: DistContext,
    calls: Sequence[ProjectionCall],
    ids: Tensor,
    bands_of_rank: Sequence[Sequence[Band]],
    batch_size: int,
    timer: Timer = contextlib.nullcontext,
) -> ReceivedProjections:
    """Send every band's rank the screen-space terms of this shard's Gaussians it needs.

    Args:
        ctx: The process context.
        calls: This shard projected into every camera of the batch, each position once.
        ids: Global id of each Gaussian of the shard. `[N]`, int64.
        bands_of_rank: The step's plan: every rank's bands.
        batch_size: B.
        timer: Counts the reverse all-to-all (in backward) as communication.

    Returns:
        What was received, to render from; its backward returns the gradients to their owners.

    **Collective:** world group: every (destination, position) pair's row count (one all-gather),
    then the rows with their ids (one all-to-all; at one rank, neither); in backward, the
    gradients (one all-to-all).
    **Host sync:** one, whatever W: this rank's row counts and the received ones, read together
    (the selection is then sized without one where torch has ``nonzero_static``; else one more).
    **Differentiable:** the received rows are a function of the sent terms (``_ScreenTermExchange``).
    """
    if not calls:
        raise ValueError("exchange_screen_terms: no projection call (the batch has at least one camera)")
    world = ctx.world_size
    device = ids.device
    sizes_px = {position: (proj.width, proj.height) for positions, proj in calls for position in positions}
    # Each position's camera among all calls' cameras laid end to end (the fields' first axis).
    camera_of = {position: camera for camera, position in enumerate(p for positions, _ in calls for p in positions)}
    pairs, stacked = _pair_masks(calls, sizes_px, camera_of, bands_of_rank)
    # Rows per (destination, position) pair, on the device. Every rank knows the plan, so every
    # rank has the same pairs: one all-gather of every rank's sizes, before anything is read,
    # brings this rank's sizes and the ones it receives in one host read.
    pair_sizes = stacked.sum(dim=1) if stacked is not None else torch.zeros(0, dtype=torch.int64, device=device)
    read = all_gather_stacked(ctx, pair_sizes).tolist()  # host sync: [source][pair] row counts
    sizes = read[ctx.rank]
    recv_by_source = [[0] * batch_size for _ in range(world)]  # rows from rank s for position p
    for s, source_row in enumerate(recv_by_source):
        for (dest, position), n in zip(pairs, read[s], strict=True):
            if dest == ctx.rank:
                source_row[position] = n
    if stacked is not None:
        # One selection for every pair (row-major: each pair's Gaussians ascending, as its own nonzero),
        # of a size now known: no host sync where torch has nonzero_static (torch_compat).
        pair_of_row, gaussian_of_row = nonzero_of_size(stacked, sum(sizes)).unbind(1)
    else:
        pair_of_row = gaussian_of_row = torch.zeros(0, dtype=torch.int64, device=device)
    camera_of_pair = [camera_of[p] for _, p in pairs]  # among all calls' cameras
    if camera_of_pair == list(range(len(pairs))):  # one pair per camera, in order (B = W): the pair is the camera
        camera_of_row = pair_of_row
    else:
        camera_of_row = host_tensor(camera_of_pair, torch.int64, device)[pair_of_row]
    # Every call's cameras end to end: one field each, indexed inside the exchange. The fields
    # keep the exchange in the projection's graph even when no row is sent (its backward is a
    # collective: it runs on every rank).
    fields = [
        _joined([getattr(proj, name) for _, proj in calls])  # one shard: one N
        for name in ("means2d", "conics", "colors", "opacities", "depths", "radii")
    ]
    send_counts = [0] * world  # the all-to-all's split sizes, from the host sizes above
    for (dest, _), n in zip(pairs, sizes, strict=True):
        send_counts[dest] += n
    route = Route(
        ctx=ctx,
        camera_of_row=camera_of_row,
        gaussian_of_row=gaussian_of_row,
        send_counts=send_counts,
        recv_counts=[sum(row) for row in recv_by_source],
        calls=list(calls),
        rows_of_position={},  # from the received ids, below (before any backward reads it)
        timer=timer,
    )
    leaf, recv_ids, token = _ScreenTermExchange.apply(*fields, ids, route)
    route.rows_of_position = _rows_by_position(
        recv_by_source, recv_ids, {band.position for band in bands_of_rank[ctx.rank]}
    )
    return ReceivedProjections(
        leaf=leaf,
        token=token,
        ids=recv_ids,
        route=route,
        sizes_px=sizes_px,
        backend=calls[0][1].backend,
    )


def _joined(parts: Sequence[Tensor], dim: int = 0) -> Tensor:
    """``torch.cat(parts, dim)``; the one part itself when there is one (no operator, no copy)."""
    return parts[0] if len(parts) == 1 else torch.cat(list(parts), dim)


def _parts(tensor: Tensor, sizes: Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    """``tensor.split(sizes, dim)``; the tensor itself when there is one part (no operator)."""
    return (tensor,) if len(sizes) == 1 else tensor.split(list(sizes), dim)


def _rows_by_position(recv_by_source: list[list[int]], recv_ids: Tensor, rendered: set[int]) -> dict[int, Tensor]:
    """Per batch position, the received rows (source-major, then position-major, as sent)
    reordered by ascending global id. ``recv_by_source[s][p]``: rows from rank ``s`` for position
    ``p``. Every position in ``rendered`` (this rank's bands') has an entry, empty where no
    Gaussian reaches its bands: the band is still rendered (background) and differentiated.
    One rendered position (B = W: the common plan) holds every received row, so one sort, the
    same whatever W; several take one range per (source, position) block."""
    if len(rendered) == 1:
        return {next(iter(rendered)): torch.argsort(recv_ids, stable=True)}
    offsets: dict[int, list[Tensor]] = {position: [] for position in rendered}  # rows come only for these
    start = 0
    for source_counts in recv_by_source:
        for position, n in enumerate(source_counts):
            if n:
                offsets[position].append(torch.arange(start, start + n, device=recv_ids.device))
                start += n
    out = {}
    for position, parts in offsets.items():
        if not parts:
            out[position] = recv_ids.new_zeros(0)
            continue
        rows = _joined(parts)
        out[position] = rows[torch.argsort(recv_ids[rows], stable=True)]
    return out
