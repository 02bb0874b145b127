"""The sharded mode: each rank owns a block of the Gaussians with their optimizer state
(docs/sharded.md).

Each rank projects its shard into every camera of the batch and the exchange
(``parallel/exchange.py``) sends each band's rank the screen-space terms it needs; the exchange's
backward returns their gradients, so each owner ends the backward with its Gaussians' complete
gradients and densification statistics: nothing but the parameters every rank holds (camera
adjustments) is reduced. After a refine the shards are rebalanced when they drift. Eval images and
viewer frames are rendered by every rank from its shard (``parallel/view_render.py``; frames are
posted by rank 0's viewer thread, ``parallel/view_requests.py``); checkpoints are written by every
rank (``parallel/shard_checkpoint.py``).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from distsplat_ns.checkpoint import load_checkpoint_file
from distsplat_ns.distributed.collectives import (
    all_gather_counts,
    all_gather_rows,
    all_reduce_sum_,
    sum_gradients_,
)
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.gaussians.densifier import IdGather
from distsplat_ns.model.band_render import OwnProjections, ProjectionSource, RegularizerShare
from distsplat_ns.parallel.camera_groups import BUDGET_FRACTION, free_memory_bytes, group_size, split_positions
from distsplat_ns.parallel.exchange import ProjectionCall, Timer, exchange_screen_terms
from distsplat_ns.parallel.full_state import GatheredState, gather_full_state, shard_loaded_checkpoint_
from distsplat_ns.parallel.mode import NamedParameters, Optimizers, ParallelMode, batch_statistics, info_for
from distsplat_ns.parallel.shard_checkpoint import read_shard_checkpoint, write_shard_checkpoint
from distsplat_ns.parallel.shard_moves import rebalance_shards_
from distsplat_ns.parallel.view_render import render_view_collectively
from distsplat_ns.parallel.view_requests import ViewRequests
from distsplat_ns.utils.cameras import BatchCameras

if TYPE_CHECKING:
    from nerfstudio.cameras.cameras import Cameras

    from distsplat_ns.balance.planner import StepPlan
    from distsplat_ns.gaussians.budget_measured import RankBudget
    from distsplat_ns.model.distsplat_model import DistSplatModel


class ShardedMode(ParallelMode):
    """Each rank owns a shard of the Gaussians; see the module docstring."""

    name = "sharded"

    def __init__(self, ctx: DistContext, model: DistSplatModel, budget: RankBudget | None = None) -> None:
        super().__init__(ctx, model, budget)
        # The thread that trains (and so makes the collectives); any other thread that asks for a
        # view is the viewer's, and posts it instead (parallel/view_requests.py).
        self._training_thread = threading.get_ident()
        self.view_requests = ViewRequests()
        #: Cameras per group when set (tests); otherwise from the memory budget (camera_groups).
        self.group_cameras: int | None = None
        self._budget_bytes: int | None = None
        #: (this shard's size, every shard's) when the ranks last agreed them. Shards change only on
        #: the steps ``after_refine`` handles and on a load (``read_checkpoint``): both forget it.
        self._agreed_total: tuple[int, int] | None = None
        # At one rank the model is whole and renders views itself (ns-eval, ns-viewer, W = 1).
        model.view_renderer = self._render_view if ctx.is_distributed else None

    @classmethod
    def initial_shard(cls, ctx: DistContext) -> tuple[int, int]:
        """Each rank builds its ``owned_block`` of the initial Gaussians, ids in rank order."""
        return ctx.rank, ctx.world_size

    def num_gaussians_total(self) -> int:
        """Every shard's size, summed: gathered at the first step and at the first after a step
        that may change shards or a load; the steps between reuse it (docs/host_cost.md).

        **Collective:** world group, one all-gather of an int, on the steps that gather.
        **Host sync:** on the same steps.

        Raises:
            RuntimeError: This shard's size changed since the ranks agreed the total, outside those
                steps (a bug: the total every rank uses would be stale).
        """
        mine = self.model.num_points
        if self._agreed_total is None:
            self._agreed_total = (mine, sum(all_gather_counts(self.ctx, mine)))
        elif self._agreed_total[0] != mine:
            raise RuntimeError(
                f"rank {self.ctx.rank}'s shard holds {mine} Gaussians, {self._agreed_total[0]} when the ranks last agreed their "
                "total: it changed on a step that is neither one the strategy may change shards at (Densifier.changes_shards_at) nor a load"
            )
        return self._agreed_total[1]

    def regularizer_share(self, num_gaussians_total: int) -> RegularizerShare:
        """Every rank adds its shard's part of the scale term; rank 0 the camera penalty."""
        return RegularizerShare(
            camera_penalty=self.ctx.is_main, scale_term=True, num_gaussians_total=num_gaussians_total
        )

    def reduce_footprint_costs(self, costs: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Each rank projected its own Gaussians: the footprints of all of them are the sum.

        **Collective:** world group, one all-reduce of the row costs (none at one rank).
        """
        moved = costs.numel() * costs.element_size() if self.ctx.is_distributed else 0
        return all_reduce_sum_(self.ctx, costs), moved

    def camera_groups(self, batch_size: int, num_gaussians_total: int) -> list[list[int]]:
        """Consecutive groups of as many cameras as the memory budget holds for a shard
        (``parallel/camera_groups.py``): a rank's live projections are O(N/W x group), not
        O(N/W x B). With ``--pipeline.memory-budget``, what it leaves beside the shard's rows
        bounds the groups too. ``group_cameras``, when set, fixes the size instead (tests).

        **Collective:** world group, at the first call only: the budget's minimum over ranks (one
        all-gather of an int). **Host sync:** then (free memory).
        """
        if self.group_cameras is not None:
            size = self.group_cameras
        else:
            if self._budget_bytes is None:
                mine = int(BUDGET_FRACTION * free_memory_bytes(self.ctx.device))
                self._budget_bytes = min(all_gather_counts(self.ctx, mine))
            budget = self._budget_bytes
            if self.budget is not None:  # what the memory budget leaves beside the rows, the same on every rank
                budget = min(
                    budget, self.budget.projection_budget_bytes(-(-num_gaussians_total // self.ctx.world_size))
                )
            size = group_size(
                budget, num_gaussians_total, self.ctx.world_size, self.model.means.element_size(), batch_size
            )
        return split_positions(batch_size, size)

    def projections(
        self,
        cameras: BatchCameras[Cameras],
        plan: StepPlan,
        step: int,
        timer: Timer,
        positions: Sequence[int] | None = None,
    ) -> tuple[ProjectionSource, int]:
        """The terms every rank sent for this rank's bands of the cameras at ``positions`` (the
        whole batch when None; ``exchange_screen_terms``); the bytes count both directions (the
        gradients return in backward).

        At one rank the shard is the whole scene and every term would be routed to itself: the
        rank projects its Gaussians as its bands are rendered, as the replicated mode does
        (no exchange, none of its routing; docs/host_cost.md).

        **Collective:** world group: the exchange's all-gather of the row counts and all-to-all of
        the rows now, one all-to-all in backward (none at one rank).
        """
        if not self.ctx.is_distributed:
            return OwnProjections(), 0
        positions = list(range(len(cameras))) if positions is None else list(positions)
        group = cameras.at(positions)
        # The shard into every camera of the group, each call's cameras named by batch position.
        calls: list[ProjectionCall] = [
            ([positions[i] for i in idx], proj) for idx, proj in self.model.project_cameras(group, step)
        ]
        wanted = set(positions)
        bands = [[b for b in rank_bands if b.position in wanted] for rank_bands in plan.bands]
        with timer():
            received = exchange_screen_terms(self.ctx, calls, self.model.gauss_ids, bands, len(cameras), timer)
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

    def statistics(
        self, sources: Sequence[ProjectionSource], batch_size: int, sizes_px: Sequence[tuple[int, int]]
    ) -> tuple[dict[str, Any], int]:
        """Complete at each owner: its projections received every band's gradients (at one rank,
        its own projections: :meth:`projections`). Local."""
        projections = [p for source in sources for p in source.statistics_projections]
        grads, absgrads, radii = batch_statistics(self.model, projections, batch_size)
        return info_for(grads, absgrads, radii, sizes_px), 0

    @property
    def gather_ids(self) -> IdGather:
        """New Gaussians are numbered over every rank's parents. **Collective:** one all-gather."""
        return functools.partial(all_gather_rows, self.ctx)

    def after_refine(self, step: int, optimizers: Optimizers) -> int:
        """Growth, pruning and MCMC's relocations and additions make shards drift: on the steps
        the strategy may change them (``Densifier.changes_shards_at``), move rows (with their Adam
        and strategy state) when the largest exceeds ``SHARD_BOUND`` x the mean.

        **Collective:** world group, on those steps: ``rebalance_shards_``'s.
        """
        if not self.model.densifier.changes_shards_at(step):
            return 0
        self._agreed_total = None  # the next step gathers the shards' sizes again
        return rebalance_shards_(self.ctx, self.model.rows.bound(optimizers))

    def replicated_parameters(self, named: NamedParameters) -> list[torch.Tensor]:
        return [p for n, p in named if n not in self.model.gauss_params]

    @property
    def evaluates_here(self) -> bool:
        """Every rank: an eval image is rendered by all of them (``render_view_collectively``)."""
        return True

    @property
    def views_are_collective(self) -> bool:
        """True on more than one rank: a view is rendered from every rank's shard."""
        return self.ctx.is_distributed

    def viewer_lock(self, train_lock: Any) -> Any:
        """None on more than one rank: frames are rendered by the training thread at step
        boundaries, so the viewer thread never touches the model (and must not hold the lock the
        step takes while it waits). At one rank the viewer renders the whole model itself."""
        return None if self.ctx.is_distributed else train_lock

    def close_views(self) -> None:
        """Training is over: the other ranks leave, so no frame will be rendered; the viewer's
        requests return at once (it shows the background). Local."""
        self.view_requests.close()

    def _render_view(self, camera: Cameras) -> dict[str, Any] | None:
        """``DistSplatModel.get_outputs`` in sharded mode: from the training thread, the view
        rendered by every rank (the image on rank 0, None elsewhere); from any other thread
        (nerfstudio's viewer, rank 0 only), the camera is posted and the frame rendered at the next
        step boundary (:meth:`serve_view`); the background alone if none comes in time.

        **Collective** from the training thread: ``render_view_collectively``'s, on every rank
        with the same camera. None from another thread.
        """
        if threading.get_ident() == self._training_thread:
            return render_view_collectively(self.ctx, self.model, camera)
        background = self.model.background_color.detach().cpu()  # the viewer's choice, set on rank 0's model only
        outputs = self.view_requests.post_and_wait(camera.to("cpu"), self.model.crop_box, background)
        if outputs is not None:
            return outputs
        width, height = int(camera.width.reshape(-1)[0]), int(camera.height.reshape(-1)[0])
        return self.model.get_empty_outputs(width, height, self.model._get_background_color())

    def pending_view(self) -> Any | None:
        """Rank 0: the viewer's pending ``(camera, crop box)``, taken (it is answered by
        :meth:`serve_view` at this boundary). Local."""
        return self.view_requests.take() if self.ctx.is_main else None

    def serve_view(self, request: Any) -> None:
        """Render ``request`` (``(camera, crop box, background)``, rank 0's) as eval renders a
        camera, every rank's shard at once, and hand the frame to rank 0's viewer thread. Every
        rank composites its bands over rank 0's viewer background.

        **Collective:** world group: ``render_view_collectively``'s, on every rank with the same
        request (it came from the all-gather every rank makes at the step boundary).
        """
        camera, crop_box, background = request
        model = self.model
        was_training, own_crop, own_background = model.training, model.crop_box, model.background_color
        model.eval()
        model.crop_box = crop_box
        if background is not None:
            model.background_color = background
        try:
            outputs = render_view_collectively(self.ctx, model, camera.to(model.device))
        finally:
            model.train(was_training)
            model.crop_box, model.background_color = own_crop, own_background
        if self.ctx.is_main:
            self.view_requests.answer(outputs)

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
        self._agreed_total = None  # the loaded shard's size is agreed again at the next step
        if Path(path).is_dir():
            return read_shard_checkpoint(self.ctx, Path(path), self.ctx.rank, self.ctx.world_size, sharded=True)
        loaded = load_checkpoint_file(path, mmap=True)
        shard_loaded_checkpoint_(loaded, self.ctx.rank, self.ctx.world_size)
        return loaded
