"""The step's balance phase: cut the batch's image rows across ranks, then learn from what they cost.

``StepBalance`` is an object the pipeline (``pipeline/distsplat_pipeline.py``) builds at set-up and calls twice a
step: ``plan`` before the data is fetched (every rank's bands, from the cost history and, for a
camera seen for the first time at a resolution, its footprint prior) and ``measure`` after the
backward (every rank's measured row costs, render time and finite verdict gathered in one
all-gather, folded into the history; a viewer frame rank 0 posted is rendered then). The planner
itself is pure (``balance/planner.py``); this object adds what needs the model and the ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from distsplat_ns.balance.cost import footprint_row_costs
from distsplat_ns.balance.planner import BandPlanner, StepPlan
from distsplat_ns.distributed.collectives import broadcast_object
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.model.band_render import BandRenderResult
from distsplat_ns.model.distsplat_model import DistSplatModel
from distsplat_ns.parallel.halo_cost_gathers import gather_step_costs
from distsplat_ns.parallel.mode import ParallelMode
from distsplat_ns.utils.stats import max_over_mean, mean_and_p95
from distsplat_ns.utils.timing import PhaseClock

#: The training cameras of the given dataset indices, on the host (``DistSplatPipeline._host_cameras``).
HostCameras = Callable[[Sequence[int]], Any]


@dataclass(frozen=True)
class Measured:
    """What ``StepBalance.measure`` learnt from one step.

    Attributes:
        nonfinite: Whether some rank's gradients hold NaN/Inf (the finite verdict, gathered;
            False on steps without a check).
        measured_imbalance: The step's measured cost, max over mean across ranks.
        time_imbalance: The ranks' render seconds, max over mean.
    """

    nonfinite: bool
    measured_imbalance: float
    time_imbalance: float


class StepBalance:
    """Plans each step's bands and learns their costs (see the module docstring).

    Args:
        ctx: The process context.
        planner: The pure planner and its cost history (checkpointed with the pipeline).
        mode: The parallel mode: footprint-cost reduction and viewer frames.
        model: Projects cameras for footprint priors; gives the resolution of a step.
        host_cameras: The training cameras of dataset indices, on the host.
    """

    def __init__(
        self,
        ctx: DistContext,
        planner: BandPlanner,
        mode: ParallelMode,
        model: DistSplatModel,
        host_cameras: HostCameras,
    ) -> None:
        self.ctx = ctx
        self.planner = planner
        self.mode = mode
        self.model = model
        self.host_cameras = host_cameras
        #: Each step's render-time imbalance (``Measured.time_imbalance``), for the run summary.
        self.time_imbalance: list[float] = []

    def plan(self, step: int, batch: Sequence[int]) -> StepPlan:
        """Every rank's bands for ``step``: a pure function of values every rank has (the batch,
        the resolution, and the cost history, which every rank updates with the same all-gathered
        measurements); cameras not yet measured at the step's resolution first get a footprint prior.

        **Collective:** only when some camera needs a prior: the mode's ``reduce_footprint_costs``
        (sharded: one all-reduce). **Host sync:** the same steps (the priors).
        """
        downscale = self.model.downscale_factor_at(step)
        need_prior = self.planner.cameras_needing_prior(downscale, batch)
        if need_prior:
            for camera_index, costs in zip(need_prior, self._footprint_priors(need_prior, step), strict=True):
                self.planner.set_prior(downscale, camera_index, costs)
        return self.planner.plan(batch, self.ctx.world_size, downscale)

    @torch.no_grad()
    def _footprint_priors(self, camera_indices: Sequence[int], step: int) -> list[torch.Tensor]:
        """Cold-start costs: how many tiles each projected Gaussian's 3-sigma footprint covers, per
        tile row (projection only, no rasterization; identical on every rank).

        **Collective:** the mode's ``reduce_footprint_costs`` (sharded: one all-reduce).
        """
        costs: list[torch.Tensor] = [torch.empty(0)] * len(camera_indices)
        for group, proj in self.model.project_cameras(self.host_cameras(camera_indices), step):
            for k, i in enumerate(group):
                costs[i] = footprint_row_costs(proj.means2d[k].detach(), proj.radii[k], proj.height, proj.width)
        flat, _ = self.mode.reduce_footprint_costs(torch.cat(costs))
        return [c.cpu() for c in torch.split(flat, [len(c) for c in costs])]  # host sync: cold cameras only

    def measure(
        self,
        plan: StepPlan,
        batch: Sequence[int],
        result: BandRenderResult,
        verdict: torch.Tensor | None,
        clock: PhaseClock,
    ) -> Measured:
        """Gather every rank's measured per-row costs, render time (``forward`` + ``backward``)
        and the finite verdict, and fold the costs into the history; when rank 0's viewer thread
        posted a frame (``mode.pending_view``, flagged in the same gather), every rank renders it
        now (``mode.serve_view``): at most one frame per step.

        **Collective:** one all-gather sized by the plan (``parallel/halo_cost_gathers.py``); on steps
        with a viewer frame, the request's broadcast from rank 0 then, in a mode whose views are
        collectives, the view's.
        **Host sync:** one copy: the next step's cut needs the costs.
        """
        view = self.mode.pending_view()
        render_s = clock["forward"] + clock["backward"]
        with clock.communicating(
            phase=None
        ):  # exposed, but kept out of the all_reduce phase (its meaning before docs/overlap.md's overlap)
            costs = gather_step_costs(self.ctx, plan, result.band_tile_work, verdict, render_s, view is not None)
        measured_imbalance = self.planner.observe(plan, batch, plan.downscale, costs.measured)
        time_imbalance = max_over_mean(costs.render_s)
        self.time_imbalance.append(time_imbalance)
        if costs.view_posted:
            with clock.communicating(phase=None):
                request = broadcast_object(self.ctx, view)
            self.mode.serve_view(request)
        return Measured(costs.nonfinite, measured_imbalance, time_imbalance)

    def summary(self, warmup_steps: int) -> dict[str, Any]:
        """Balance figures for the run summary, over the steps after ``warmup_steps`` (before
        them, most cameras have only a footprint prior)."""
        summary: dict[str, Any] = {
            "band_cost_fraction": self.planner.band_cost_fraction,
            **self.planner.log.summary(warmup_steps=warmup_steps),
        }
        tail = self.time_imbalance[warmup_steps:] if len(self.time_imbalance) > warmup_steps else self.time_imbalance
        if tail:
            summary["time_imbalance_mean"], summary["time_imbalance_p95"] = mean_and_p95(tail)
        return summary
