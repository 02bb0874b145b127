"""The sharded mode: each rank owns a block of the Gaussians with their optimizer state
(docs/sharded.md).

Each rank projects its shard into every camera of the batch and the exchange
(``parallel/exchange.py``) sends each band's rank the screen-space terms it needs; the exchange's
backward returns their gradients, so each owner ends the backward with its Gaussians' complete
gradients and densification statistics: nothing but the parameters every rank holds (camera
adjustments) is reduced. After a refine the shards are rebalanced when they drift; eval, the
viewer gather the whole model's parameters to rank 0 (``parallel/full_state.py``); checkpoints are
written by every rank (``parallel/shard_checkpoint.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from distsplat_ns.checkpoint import load_checkpoint_file
from distsplat_ns.distributed.collectives import (
    all_gather_counts,
    all_gather_rows,
    all_reduce_sum_,
    nonfinite_verdict,
    sum_gradients_,
)
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.model.band_render import ProjectionSource, RegularizerShare
from distsplat_ns.model.strategy import IdGather, grows_at
from distsplat_ns.parallel.exchange import ProjectionCall, ReceivedProjections, Timer, exchange_screen_terms
from distsplat_ns.parallel.full_state import GatheredState, gather_full_params, gather_full_state, shard_loaded_checkpoint_
from distsplat_ns.parallel.mode import NamedParameters, Optimizers, ParallelMode, batch_statistics, info_for
from distsplat_ns.parallel.shard_checkpoint import read_shard_checkpoint, write_shard_checkpoint
from distsplat_ns.parallel.shard_rows import rebalance_shards_, take_initial_shard_

if TYPE_CHECKING:
    from nerfstudio.cameras.cameras import Cameras

    from distsplat_ns.balance.planner import StepPlan
    from distsplat_ns.model.distsplat_model import DistSplatModel


class ShardedMode(ParallelMode):
    """Each rank owns a shard of the Gaussians; see the module docstring."""

    name = "sharded"

    def __init__(self, ctx: DistContext, model: DistSplatModel) -> None:
        super().__init__(ctx, model)
        self._full_view_step: int | None = None

    def take_initial_gaussians_(self) -> None:
        """Keep this rank's ``owned_block`` of the (identical) initial Gaussians."""
        take_initial_shard_(self.model, self.ctx.rank, self.ctx.world_size)

    def num_gaussians_total(self) -> int:
        """Every shard's size, summed. **Collective:** world group, one all-gather of an int."""
        return sum(all_gather_counts(self.ctx, self.model.num_points))

    def regularizer_share(self, num_gaussians_total: int) -> RegularizerShare:
        """Every rank adds its shard's part of the scale term; rank 0 the camera penalty."""
        return RegularizerShare(camera_penalty=self.ctx.is_main, scale_term=True, num_gaussians_total=num_gaussians_total)

    def reduce_footprint_costs(self, costs: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Each rank projected its own Gaussians: the footprints of all of them are the sum.

        **Collective:** world group, one all-reduce of the row costs (none at one rank).
        """
        moved = costs.numel() * costs.element_size() if self.ctx.is_distributed else 0
        return all_reduce_sum_(self.ctx, costs), moved

    def projections(self, cameras: Cameras, plan: StepPlan, step: int, timer: Timer) -> tuple[ProjectionSource, int]:
        """The terms every rank sent for this rank's bands (``exchange_screen_terms``); the bytes
        count both directions (the gradients return in backward).

        **Collective:** world group: the exchange's three all-to-alls now, one in backward.
        """
        calls: list[ProjectionCall] = self.model.project_cameras(cameras, step)  # the shard into every camera
        with timer():
            received = exchange_screen_terms(self.ctx, calls, self.model.gauss_ids, plan.bands, len(cameras), timer)
        return received, received.route.payload_bytes(calls[0][1].means2d.element_size())

    def reduce_gradients(self, named: NamedParameters) -> int:
        """Sum only the parameters every rank holds (camera adjustments); the Gaussians'
        gradients are complete at their owner after the exchange's backward.

        **Collective:** world group, the buckets of the replicated parameters (none when there are none).
        """
        for _, p in named:
            if p.grad is None:
                # As in one process, a Gaussian no band saw has a zero gradient, not none (Adam
                # would skip it, and this rank's Adam step count would drift from the others').
                p.grad = torch.zeros_like(p)
        return sum_gradients_(self.ctx, self.replicated_parameters(named)).bytes_reduced

    def statistics(self, source: ProjectionSource, batch_size: int, sizes_px: Sequence[tuple[int, int]]) -> tuple[dict[str, Any], int]:
        """Complete at each owner: its projections received every band's gradients. Local."""
        assert isinstance(source, ReceivedProjections), "the sharded mode renders from the exchange"
        grads, absgrads, radii = batch_statistics(self.model, source.shard_projections, batch_size)
        return info_for(grads, absgrads, radii, sizes_px), 0

    def finite_verdict(self, named: NamedParameters) -> torch.Tensor:
        """Each rank holds its own Gaussians' gradients: the ranks agree on the verdict.

        **Collective:** world group, one max-reduce of an int.
        """
        return nonfinite_verdict(self.ctx, named, agree=True)

    @property
    def gather_ids(self) -> IdGather:
        """New Gaussians are numbered over every rank's parents. **Collective:** one all-gather."""
        return functools.partial(all_gather_rows, self.ctx)

    def after_refine(self, step: int, optimizers: Optimizers) -> int:
        """Growth and pruning make shards drift: where densification grew or pruned
        (``model/strategy.py:grows_at``), move rows (with their Adam and strategy state) when the
        largest exceeds 1.10 x the mean.

        **Collective:** world group, on those steps: ``rebalance_shards_``'s.
        """
        if not grows_at(self.model.schedule, step):
            return 0
        return rebalance_shards_(self.ctx, self.model, optimizers)

    def replicated_parameters(self, named: NamedParameters) -> list[torch.Tensor]:
        return [p for n, p in named if n not in self.model.gauss_params]

    def refresh_full_view(self, step: int) -> None:
        """Gather the whole model's parameters (no optimizer state) to rank 0, where eval and the
        viewer render from them; rank 0 then holds one extra copy. A second call at the same step
        gathers nothing.

        **Collective:** world group, on every rank at the same steps: one ``gather_rows`` of the
        ids, then one per parameter. Nothing at ``world_size == 1`` (the model is whole). Rank 0
        holding ids ``[0, 2]`` and rank 1 ``[1]``: rank 0 renders rows ``[0, 1, 2]``; rank 1 keeps
        nothing. **Host sync:** the parameters pass through rank 0's host memory.
        """
        if not self.ctx.is_distributed or self._full_view_step == step:
            return
        self.model.set_full_view(gather_full_params(self.ctx, self.model))
        self._full_view_step = step

    def drop_full_view(self) -> None:
        super().drop_full_view()
        self._full_view_step = None

    def gather_full_state(self, optimizers: Optimizers) -> GatheredState | None:
        """The shards in id order on rank 0 (``full_state.gather_full_state``).

        **Collective:** world group, one tensor at a time.
        """
        return gather_full_state(self.ctx, self.model, optimizers)

    writes_shards = True

    def write_shards(self, folder: Path, optimizers: Optimizers, payload: dict[str, Any]) -> int:
        """This rank's rows, and rank 0's rest (``shard_checkpoint.write_shard_checkpoint``): the
        whole model is never gathered.

        **Collective:** world group: the layout all-gather and DCP's save.
        """
        return write_shard_checkpoint(self.ctx, folder, self.model, optimizers, payload)

    def read_checkpoint(self, path: Path) -> dict[str, Any]:
        """This rank's block: of a ``step-N.dcp`` folder, one row range per key read by DCP
        (**Collective**, world group); of a single file, memory-mapped and cut, so only the rows
        it owns are read into memory (local)."""
        if Path(path).is_dir():
            return read_shard_checkpoint(self.ctx, Path(path), self.ctx.rank, self.ctx.world_size, sharded=True)
        loaded = load_checkpoint_file(path, mmap=True)
        shard_loaded_checkpoint_(loaded, self.ctx.rank, self.ctx.world_size)
        return loaded
