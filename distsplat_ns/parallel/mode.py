"""The parallel mode: everything that differs between holding every Gaussian on every rank
(``parallel/replicated.py``) and holding a shard of them (``parallel/sharded.py``).

``DistSplatPipeline`` builds one mode at set-up (``parallel_mode_class``, from
``--pipeline.parallel``) and its step calls the mode at fixed points, never asking which mode it is
(torchtitan applies its parallelism once, when the model is built; gsplat keeps its exchange behind
the render call). Every method that communicates says so in its **Collective** paragraph; every
rank calls the same methods in the same order. Methods that move payload return the bytes this
rank sent or reduced (counts and other control messages are not counted).

Shape letters: N Gaussians on this rank, B images in the global batch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

import torch

from distsplat_ns.distributed.collectives import check_replicas, nonfinite_verdict
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.distributed.gradient_sum import GradientSum
from distsplat_ns.gaussians.densifier import IdGather
from distsplat_ns.gaussians.strategy import batch_info
from distsplat_ns.model.band_render import ProjectionSource, RegularizerShare, StatisticsProjection
from distsplat_ns.parallel.exchange import Timer
from distsplat_ns.parallel.full_state import GatheredState
from distsplat_ns.utils.host_to_device import host_tensor

if TYPE_CHECKING:
    from nerfstudio.cameras.cameras import Cameras

    from distsplat_ns.balance.planner import StepPlan
    from distsplat_ns.gaussians.budget_measured import RankBudget
    from distsplat_ns.model.distsplat_model import DistSplatModel
    from distsplat_ns.utils.cameras import BatchCameras

NamedParameters = Sequence[tuple[str, torch.nn.Parameter]]

ParallelModeName = Literal["replicated", "sharded"]
"""``--pipeline.parallel``: the name of each mode (``ParallelMode.name``; the classes: ``parallel/__init__.py:MODES``)."""
PARALLEL_MODES: tuple[ParallelModeName, ...] = get_args(ParallelModeName)
Optimizers = Mapping[str, torch.optim.Optimizer]


class ParallelMode(ABC):
    """How the Gaussians are held and what that changes in a step (see the module docstring).

    Args:
        ctx: The process context.
        model: This rank's model: all Gaussians, or the shard it was built with (:meth:`initial_shard`).
    """

    #: ``--pipeline.parallel``'s value for this mode.
    name: ParallelModeName

    def __init__(self, ctx: DistContext, model: DistSplatModel, budget: RankBudget | None = None) -> None:
        self.ctx = ctx
        self.model = model
        #: The rank's memory budget (``--pipeline.memory-budget``), None without one.
        self.budget = budget

    # ------------------------------------------------------------------ set-up and the model's size
    @classmethod
    @abstractmethod
    def initial_shard(cls, ctx: DistContext) -> tuple[int, int] | None:
        """``(rank, world)`` when each rank builds only its block of the initial Gaussians
        (``gaussians/initial.py``), None when every rank builds them all. Local; asked before the
        model (and so the mode) exists."""

    @abstractmethod
    def num_gaussians_total(self) -> int:
        """Gaussians over all ranks (the scale regulariser's mean, the logged count)."""

    @abstractmethod
    def regularizer_share(self, num_gaussians_total: int) -> RegularizerShare:
        """Which batch-independent loss terms this rank adds. Local."""

    # ------------------------------------------------------------------ the step
    @abstractmethod
    def reduce_footprint_costs(self, costs: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Cold-start row costs of every Gaussian from this rank's projections of its Gaussians
        (``balance/cost.py:footprint_row_costs``, concatenated over cameras); and the bytes moved."""

    def camera_groups(self, batch_size: int, num_gaussians_total: int) -> list[list[int]]:
        """The batch positions projected, exchanged, rendered and back-propagated together, in
        order (every rank the same groups): the whole batch, unless the mode bounds its live
        projections (sharded: ``parallel/camera_groups.py``)."""
        return [list(range(batch_size))]

    @abstractmethod
    def projections(
        self,
        cameras: BatchCameras[Cameras],
        plan: StepPlan,
        step: int,
        timer: Timer,
        positions: Sequence[int] | None = None,
    ) -> tuple[ProjectionSource, int]:
        """What this rank's bands are rasterized from, and the bytes moved to get there (both ways).

        Args:
            cameras: Host-side cameras of the whole batch by position, indexed on demand (a mode
                that does not read them costs no index).
            plan: The step's plan (every rank's bands).
            step: The step.
            timer: Counts communication time (also the time spent in backward by the source).
            positions: The camera group (:meth:`camera_groups`) whose bands the source renders;
                the whole batch when None.
        """

    @abstractmethod
    def reduce_gradients(self, named: NamedParameters) -> int:
        """Make every trainable parameter's ``.grad`` the whole batch's; returns the bytes reduced."""

    def gradient_sum(self, named: NamedParameters, overlap: bool) -> GradientSum:
        """The step's :meth:`reduce_gradients` as an object the backward may start early
        (``distributed/gradient_sum.py``); by default all of it runs in ``finish``, after the backward.

        Args:
            named: The trainable parameters, as :meth:`reduce_gradients` takes them.
            overlap: Whether the reduction may start during the backward (False where a test reads
                the gradients between the backward and the sum).
        """
        del overlap
        return GradientSum(lambda: self.reduce_gradients(named))

    @abstractmethod
    def statistics(
        self, sources: Sequence[ProjectionSource], batch_size: int, sizes_px: Sequence[tuple[int, int]]
    ) -> tuple[dict[str, Any], int]:
        """DefaultStrategy's ``info`` for this rank's Gaussians from the whole batch (``batch_info``),
        and the bytes moved. ``sources``: one per camera group, after its backward; ``sizes_px``:
        each batch position's rendered ``(width, height)``."""

    def finite_verdict(self, named: NamedParameters) -> torch.Tensor:
        """This rank's device-side flag `[1]` int32: 1 when one of its gradients holds NaN/Inf
        (``distributed/collectives.py:nonfinite_verdict``). Replicated, every rank holds the same
        summed gradient and so the same flag; sharded, each its own Gaussians'. Either way the
        step's cost all-gather carries every rank's flag and any one stops every rank
        (``parallel/halo_cost_gathers.py:gather_step_costs``). Local; no host sync by itself."""
        return nonfinite_verdict(named)

    @property
    @abstractmethod
    def gather_ids(self) -> IdGather:
        """Every rank's rows of the parents' ids at a grow event (``gaussians/strategy.py:allocate_child_ids``)."""

    @abstractmethod
    def after_refine(self, step: int, optimizers: Optimizers) -> int:
        """What follows a refine (a shard rebalance, or nothing); returns the bytes moved."""

    @abstractmethod
    def replicated_parameters(self, named: NamedParameters) -> list[torch.Tensor]:
        """The parameters every rank holds identically (for the replica check)."""

    def check_replicas(self, named: NamedParameters, step: int) -> None:
        """Prove the parameters every rank holds (:meth:`replicated_parameters`) bitwise identical.

        Raises:
            ReplicaDriftError: on every rank, naming the drifting ranks and ``step``.

        **Collective:** world group, one digest all-gather, where there is more than one rank and
        the mode replicates some parameter (the same answer on every rank).
        """
        replicated = self.replicated_parameters(named)
        if self.ctx.is_distributed and replicated:
            check_replicas(self.ctx, replicated, step)

    # ------------------------------------------------------------------ views: eval and the viewer
    @property
    @abstractmethod
    def evaluates_here(self) -> bool:
        """Whether this rank runs the eval renders (every rank where a view is a collective, rank 0
        alone where it holds the whole model). The same answer at every step: the trainer calls
        eval on exactly these ranks, at the same steps."""

    @property
    @abstractmethod
    def views_are_collective(self) -> bool:
        """Whether every rank takes part in rendering an eval image or viewer frame (the same
        answer on every rank): then eval is no rank-0-only work (``distributed/rank0_work.py``)."""

    def viewer_lock(self, train_lock: Any) -> Any:
        """The lock nerfstudio's viewer thread holds while it renders a frame: the trainer's
        ``train_lock`` where the viewer thread renders the model itself (so never mid-step), or
        None where frames are rendered by the training thread at step boundaries (holding the lock
        while waiting for one would deadlock the step)."""
        return train_lock

    def close_views(self) -> None:  # noqa: B027 -- a default: nothing to close where rank 0 renders views alone
        """Training is over on every rank (called before the viewer is kept open). Local."""

    def pending_view(self) -> Any | None:
        """Rank 0's viewer request to render in this step (None: none, or not rank 0). Flagged in
        the step's cost all-gather, then broadcast from rank 0 (``pipeline/step_balance.py:StepBalance.measure``).
        Local."""
        return None

    def serve_view(self, request: Any) -> None:  # noqa: B027 -- a default: no request is ever shared where rank 0 renders alone
        """Render the viewer request rank 0 shared at this step boundary and hand it to rank 0's
        viewer thread. **Collective** where views are (every rank calls it with the same request)."""

    #: Whether checkpoints are written by every rank (``step-N.dcp``, :meth:`write_shards`) rather
    #: than by rank 0 alone as nerfstudio's single file.
    writes_shards: bool = False

    def write_shards(self, folder: Path, optimizers: Optimizers, payload: dict[str, Any]) -> int:
        """Write this rank's part of a ``step-N.dcp`` checkpoint into ``folder``; returns its bytes.
        Only where :attr:`writes_shards`."""
        raise NotImplementedError(f"the {self.name} mode writes nerfstudio's single file")

    @abstractmethod
    def gather_full_state(self, optimizers: Optimizers) -> GatheredState | None:
        """The whole model and optimizer state to save, on rank 0 (None where this rank's own
        ``state_dict()`` is the whole model, or on other ranks)."""

    @abstractmethod
    def read_checkpoint(self, path: Path) -> dict[str, Any]:
        """A checkpoint of either format as this rank loads it (``checkpoint.py:load_checkpoint_file``'s
        dictionary): the whole model, or this rank's block of it. Local for a single file; a
        collective for a ``step-N.dcp`` folder (``parallel/shard_checkpoint.py``), every rank."""


def batch_statistics(
    model: DistSplatModel, projections: Sequence[StatisticsProjection], batch_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's screen-space gradients, absgrads `[B, N, 2]` and radii `[B, N]` (int32) of the
    batch from ``(positions, means2d, radii)`` per projection call (zeros where it projected none).
    Local."""
    n = model.num_points
    device = model.means.device
    dtype = model.compute_dtype
    if len(projections) == 1 and projections[0][0] == list(range(batch_size)):
        # One call projected the whole batch (one process, a band of every image, or a shard):
        # its statistics are already batch-shaped.
        _, means2d, proj_radii = projections[0]
        grads = (
            means2d.grad.detach()
            if means2d.grad is not None
            else torch.zeros(batch_size, n, 2, device=device, dtype=dtype)
        )
        absgrad = getattr(means2d, "absgrad", None)
        absgrads = absgrad.detach() if absgrad is not None else torch.zeros_like(grads)
        return grads, absgrads, proj_radii.detach().to(torch.int32)
    positions = [p for call_positions, _, _ in projections for p in call_positions]
    if len(set(positions)) == len(positions):
        return _stacked_statistics(projections, batch_size, n, device, dtype)
    # A position projected by more than one call: sum the gradients, maximise the radii.
    grads = torch.zeros(batch_size, n, 2, device=device, dtype=dtype)
    absgrads = torch.zeros(batch_size, n, 2, device=device, dtype=dtype)
    radii = torch.zeros(batch_size, n, dtype=torch.int32, device=device)
    for positions, means2d, proj_radii in projections:
        idx = host_tensor(positions, torch.int64, device)
        if means2d.grad is not None:
            grads[idx] += means2d.grad.detach()
        absgrad = getattr(means2d, "absgrad", None)
        if absgrad is not None:
            absgrads[idx] += absgrad.detach()
        radii[idx] = torch.maximum(radii[idx], proj_radii.detach().to(torch.int32))
    return grads, absgrads, radii


def _stacked_statistics(
    projections: Sequence[StatisticsProjection], batch_size: int, n: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``batch_statistics`` where every position is projected at most once: each position's rows
    are a view of its call's tensors (or of one zeros row), stacked in batch order -- three
    stacks, whatever the number of calls, instead of an indexed add per call and tensor."""
    grads: list[torch.Tensor | None] = [None] * batch_size
    absgrads: list[torch.Tensor | None] = [None] * batch_size
    radii: list[torch.Tensor | None] = [None] * batch_size
    for positions, means2d, proj_radii in projections:
        grad = means2d.grad
        absgrad = getattr(means2d, "absgrad", None)
        for j, position in enumerate(positions):
            grads[position] = None if grad is None else grad[j].detach()
            absgrads[position] = None if absgrad is None else absgrad[j].detach()
            radii[position] = proj_radii[j].detach().to(torch.int32)
    zero_xy = torch.zeros(n, 2, device=device, dtype=dtype) if any(g is None for g in grads + absgrads) else None
    zero_radii = torch.zeros(n, dtype=torch.int32, device=device) if any(r is None for r in radii) else None
    grads = [zero_xy if g is None else g for g in grads]
    absgrads = [zero_xy if g is None else g for g in absgrads]
    stacked_radii = torch.stack([zero_radii if r is None else r for r in radii])
    return torch.stack(grads), torch.stack(absgrads), stacked_radii


def info_for(
    grads: torch.Tensor, absgrads: torch.Tensor, radii: torch.Tensor, sizes_px: Sequence[tuple[int, int]]
) -> dict[str, Any]:
    """``batch_info`` at each batch position's rendered ``(width, height)``: plain ints where the
    batch has one size (gsplat's form), per-camera `[B, 1]` tensors where it has several."""
    if len(set(sizes_px)) == 1:
        return batch_info(grads, absgrads, radii, sizes_px[0][0], sizes_px[0][1])
    widths = host_tensor([w for w, _ in sizes_px], grads.dtype, grads.device)[:, None]
    heights = host_tensor([h for _, h in sizes_px], grads.dtype, grads.device)[:, None]
    return batch_info(grads, absgrads, radii, widths, heights)
