"""The step's render phase: forward and backward of this rank's bands, one camera group at a time.

``BandPass`` is an object the pipeline (``pipeline/distsplat_pipeline.py``) builds from its context, parallel mode and
model, and calls once per step between the plan and the gradient sum. It runs the mode's
projections of each camera group, the model's band forward (``DistSplatModel.forward_bands``), the
SSIM-halo exchange and the band backward (``model/band_backward.py``), and -- with splatfacto's
training depth -- the depth fill across every rank's bands. Everything the phase reads arrives as
an argument; nothing of the step is stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager

from distsplat_ns.balance.planner import StepPlan
from distsplat_ns.data.step_batch import StepImages
from distsplat_ns.distributed.collectives import all_reduce_max_
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.distributed.gradient_sum import GradientSum
from distsplat_ns.model.band_backward import backward_bands
from distsplat_ns.model.band_depth import fill_empty_depth_, image_depth_maxima
from distsplat_ns.model.band_render import BandRenderResult, ProjectionSource, RegularizerShare
from distsplat_ns.model.distsplat_model import DistSplatModel
from distsplat_ns.parallel.halo_cost_gathers import exchange_halo_rows, halo_slots
from distsplat_ns.parallel.mode import ParallelMode
from distsplat_ns.utils.cameras import BatchCameras
from distsplat_ns.utils.timing import PhaseClock


class BandPass:
    """Forward and backward of this rank's bands (see the module docstring).

    Args:
        ctx: The process context.
        mode: The parallel mode: camera groups, projections, the regulariser share.
        model: Renders the bands and holds the parameters the backward reaches.
    """

    def __init__(self, ctx: DistContext, mode: ParallelMode, model: DistSplatModel) -> None:
        self.ctx = ctx
        self.mode = mode
        self.model = model

    def run(
        self,
        step: int,
        cameras: BatchCameras,
        plan: StepPlan,
        images: StepImages,
        clock: PhaseClock,
        gradient_sum: GradientSum,
    ) -> tuple[BandRenderResult, list[ProjectionSource], int]:
        """Forward and backward of this rank's bands of ``step``, one camera group
        (``mode.camera_groups``) at a time, so that only one group's projections are live; the
        gradients accumulate. The batch-independent terms are added once (with the first group);
        the last group's rasterizer backward runs inside ``gradient_sum.during_last_backward()``.

        Args:
            step: The training step.
            cameras: The batch's cameras on the host, by batch position.
            plan: Every rank's bands.
            images: This rank's images and masks on the device, at ``plan.positions(rank)``.
            clock: The step's phase times (``forward``, ``backward``; exchanges in ``all_reduce``).
            gradient_sum: The mode's gradient reduction, started during the last backward.

        Returns:
            The whole batch's result (loss shares summed, every band's tile counts and depths),
            each group's projection source (for the statistics) and the bytes the projections
            moved.

        **Collective:** per group, in order on every rank: the mode's projections, the SSIM-halo
        all-gather (where some band has halo rows), the source's backward.
        """
        num_gaussians = self.mode.num_gaussians_total()
        share = self.mode.regularizer_share(num_gaussians)
        no_terms = RegularizerShare(camera_penalty=False, scale_term=False, num_gaussians_total=num_gaussians)
        sizes_px = cameras.sizes_px(range(len(cameras)), plan.downscale)
        total: BandRenderResult | None = None
        sources: list[ProjectionSource] = []
        moved = 0
        groups = self.mode.camera_groups(len(cameras), num_gaussians)
        for g, group in enumerate(groups):
            wanted = set(group)
            mine = [i for i, p in enumerate(images.positions) if p in wanted]
            positions = [images.positions[i] for i in mine]
            with clock.phase("forward"):
                source, sent = self.mode.projections(cameras, plan, step, clock.communicating, group)
                # Host-side cameras: indexed only where this rank projects them, then moved.
                result = self.model.forward_bands(
                    cameras,
                    positions,
                    [images.images[i] for i in mine],
                    [images.masks[i] for i in mine],
                    [b for b in plan.bands[self.ctx.rank] if b.position in wanted],
                    step,
                    share if g == 0 else no_terms,
                    source,
                    camera_ids=[cameras.camera_ids[p] for p in positions],
                )
            with clock.phase("backward"):
                halos = [halo_slots([b for b in bands if b.position in wanted], sizes_px) for bands in plan.bands]
                last_backward = gradient_sum.during_last_backward() if g == len(groups) - 1 else None
                self._backward(result, source, clock, last_backward, halos)
            sources.append(source)
            moved += sent
            total = result if total is None else _summed(total, result)
            total.pixel_links = []  # consumed by the backward
        assert total is not None, "a batch has at least one camera"
        return total, sources, moved

    def fill_depths(self, result: BandRenderResult, batch_size: int) -> None:
        """Splatfacto's training depth in this rank's bands (with ``output_depth_during_training``;
        nothing otherwise): uncovered pixels get their image's largest depth over every rank's
        bands (``model/band_depth.py``). Called after the gradient sum has finished: its buckets
        are the first collectives after the backward (``distributed/gradient_sum.py``).

        **Collective:** world group, one max all-reduce of `[B]` (none at one rank).
        """
        if self.model.config.output_depth_during_training:
            maxima = image_depth_maxima(result.band_depths, batch_size, self.model.means)
            fill_empty_depth_(result.band_depths, all_reduce_max_(self.ctx, maxima))

    def _backward(
        self,
        result: BandRenderResult,
        source: ProjectionSource,
        clock: PhaseClock,
        last_backward: AbstractContextManager | None,
        halos: Sequence,
    ) -> None:
        """Backpropagate one group's loss share with exact per-pixel gradients
        (``model/band_backward.py``); the source's terms are anchored, so that a backward that is
        a collective (the sharded exchange's) runs on every rank.

        The halo exchange waits for the slowest rank: it counts as communication
        (``clock.communicating``), not render time, or the per-rank render times (the balancer's
        wall-clock figure) would look more equal than they are. ``halos``: every rank's halo rows
        in this group (``parallel/halo_cost_gathers.py:halo_slots``); none where the plan cuts no image,
        and then no rank exchanges anything.

        **Collective:** where some band has halo rows, one all-gather of their pixel gradients;
        then the source's backward.
        """

        def exchange(msgs):
            with clock.communicating():
                return exchange_halo_rows(self.ctx, msgs, halos, self.model.compute_dtype)

        backward_bands(result.loss, result.pixel_links, exchange, anchors=source.anchors, last_backward=last_backward)


def _summed(total: BandRenderResult, result: BandRenderResult) -> BandRenderResult:
    """``total`` with one more group's ``result`` added: losses (detached), loss terms, tile work, depths."""
    total.loss = total.loss.detach() + result.loss.detach()
    total.l1, total.dssim = total.l1 + result.l1, total.dssim + result.dssim
    total.loss_terms = {k: v + result.loss_terms[k] for k, v in total.loss_terms.items()}
    total.band_tile_work.extend(result.band_tile_work)
    total.band_depths.extend(result.band_depths)
    return total
