"""DistSplatPipeline: one data-parallel training step over bands of a global batch.

Every rank holds the same Gaussians (the DDP pattern, without DDP's one-time registration).
``DistSplatPipeline.train_step`` is the whole step, in order: plan -> data -> forward -> backward
(with the SSIM-halo exchange) -> reduce -> finite check -> optimizer -> refine -> observe costs ->
replica check; docs/architecture.md walks through it. Rank 0 alone owns viewer, writers and
checkpoints (trainer.py); the eval and viewer paths of the model never enter a collective.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Literal, Optional, Sequence, Tuple, Type

import torch
from nerfstudio.data.datamanagers.base_datamanager import DataManagerConfig
from nerfstudio.engine.optimizers import Optimizers
from nerfstudio.pipelines.base_pipeline import VanillaPipeline, VanillaPipelineConfig
from torch.cuda.amp.grad_scaler import GradScaler

from distsplat_ns.balance.bands import Band
from distsplat_ns.balance.cost import footprint_row_costs
from distsplat_ns.balance.planner import BandPlanner, ExpectedImagesAssigner, StepPlan
from distsplat_ns.data.datamanager import ParallelFullImageDatamanagerConfig
from distsplat_ns.distributed.collectives import (
    all_gather_counts,
    all_gather_object,
    all_gather_rows,
    all_reduce_max_,
    all_reduce_sum_,
    broadcast_tensors_,
    check_finite_gradients,
    check_replicas,
    sum_gradients_,
)
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.model.band_backward import backward_bands
from distsplat_ns.model.distsplat_model import BandRenderResult, DistSplatModel, DistSplatModelConfig
from distsplat_ns.model.exchange import exchange_grad_bytes, exchange_row_bytes, return_gradients, send_screen_terms
from distsplat_ns.model.shard_state import gather_full_params, rebalance_due, rebalance_shards_, take_initial_shard_
from distsplat_ns.model.strategy import batch_info
from distsplat_ns.utils.cameras import downscaled_px
from distsplat_ns.utils.errors import UserError
from distsplat_ns.utils.logging import get_logger
from distsplat_ns.utils.stats import max_over_mean, mean_and_p95
from distsplat_ns.utils.steps import steps_to_cover
from distsplat_ns.viewer_start import StartAtTrainingView

LOGGER = get_logger(__name__)

#: Test hook (None in real runs): called as ``hook(step, rank, model)`` after backward, before the
#: gradient sum; tests/helpers/ns_train_with_fault.py sets it to write a NaN into one rank's gradient.
before_gradient_sum_hook: Optional[Callable[[int, int, DistSplatModel], None]] = None


@dataclass
class DistSplatPipelineConfig(VanillaPipelineConfig):
    """The distsplat pipeline: batch size, how a batch is split over ranks, and the run's checks."""

    _target: Type = field(default_factory=lambda: DistSplatPipeline)
    datamanager: DataManagerConfig = field(default_factory=ParallelFullImageDatamanagerConfig)
    model: DistSplatModelConfig = field(default_factory=DistSplatModelConfig)
    batch_size: int = 1
    """Images per optimizer step, summed over all ranks (independent of the number of processes). Schedules are counted in images, and lr x sqrt(B), Adam eps / sqrt(B), betas^B (Grendel-GS's rule) keep the optimisation comparable across B."""
    partition: Literal["balanced", "whole-images", "equal-rows"] = "balanced"
    """How each batch is split across ranks: "balanced" cuts the batch's 16-px tile rows into parts of near-equal measured cost (Gaussian-tile intersections); "whole-images" hands each rank whole images (gsplat's multi-GPU split); "equal-rows" gives each rank the same number of rows (Grendel-GS's cold start)."""
    parallel: Literal["replicated", "sharded"] = "replicated"
    """How the Gaussians are held: "replicated" (every rank holds all of them and gradients are all-reduced: best while the model fits one device and the batch is small) or "sharded" (each rank owns 1/W of them with their optimizer state; screen-space terms go to the ranks rendering each band: for scenes that outgrow one device, or many ranks). See docs/sharded.md."""
    replica_check_every: int = 100
    """Compare a bitwise digest of every rank's parameters every this many steps (0 = never). The check copies parameters to host memory, hence not every step."""
    check_finite_every: int = 1
    """Stop on NaN/Inf in the summed gradient, checked every this many steps (0 = never). Each check is one host sync."""

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise UserError(f"--pipeline.batch-size must be >= 1, got {self.batch_size}")
        if self.partition not in ("balanced", "whole-images", "equal-rows"):
            raise UserError(f"--pipeline.partition must be balanced, whole-images or equal-rows, got {self.partition!r}")
        if self.parallel not in ("replicated", "sharded"):
            raise UserError(f"--pipeline.parallel must be replicated or sharded, got {self.parallel!r}")
        if self.replica_check_every < 0:
            raise UserError(f"--pipeline.replica-check-every must be >= 0, got {self.replica_check_every}")
        if self.check_finite_every < 0:
            raise UserError(f"--pipeline.check-finite-every must be >= 0, got {self.check_finite_every}")


@dataclass(frozen=True)
class StepTimings:
    """Seconds spent in each phase of one step on this rank."""

    data_wait: float
    forward: float
    backward: float
    all_reduce: float
    optimizer: float
    densify: float

    def as_dict(self) -> Dict[str, float]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class StepReport:
    """What one training step did on this rank (for logging and the run summary).

    Attributes:
        loss: This rank's share of the batch loss (sum over ranks = batch loss), detached. 0-d.
        l1: This rank's share of the batch's mean L1, detached. 0-d.
        dssim: This rank's share of the batch's mean ``1 - SSIM``, detached. 0-d.
        num_gaussians: Gaussians rendered this step (before densification).
        timings: Seconds per phase.
        bytes_communicated: Payload bytes this rank sent or reduced: gradients and statistics;
            sharded, the exchange's rows and gradients and the rows a shard rebalance moved.
        measured_imbalance: Max over mean of the ranks' measured tile costs.
        time_imbalance: Max over mean of the ranks' render times (forward + backward).
    """

    loss: torch.Tensor
    l1: torch.Tensor
    dssim: torch.Tensor
    num_gaussians: int
    timings: StepTimings
    bytes_communicated: int
    measured_imbalance: float
    time_imbalance: float


class DistSplatPipeline(VanillaPipeline):
    """Data-parallel splatting pipeline; see the module docstring.

    Args:
        config: The pipeline configuration.
        device: Device of this rank.
        test_mode: nerfstudio's data split mode.
        world_size: Number of processes (taken from ``dist_ctx`` when given).
        local_rank: Device index on this host.
        grad_scaler: Unused (mixed precision is not supported); kept for nerfstudio's signature.
        dist_ctx: The process context; a single-process context when None (ns-export, ns-eval).
        seed: Seed of the data order, training backgrounds and densification samples, the same on
            every rank: the trainer passes ``--machine.seed``; 42 (nerfstudio's default) otherwise.
    """

    config: DistSplatPipelineConfig

    def __init__(
        self,
        config: DistSplatPipelineConfig,
        device: str,
        test_mode: Literal["test", "val", "inference"] = "val",
        world_size: int = 1,
        local_rank: int = 0,
        grad_scaler: Optional[GradScaler] = None,
        dist_ctx: Optional[DistContext] = None,
        seed: int = 42,
    ):
        torch.nn.Module.__init__(self)
        self.config = config
        self.test_mode = test_mode
        self.ctx = dist_ctx if dist_ctx is not None else DistContext(device=torch.device(device))
        self.datamanager = config.datamanager.setup(
            device=device, test_mode=test_mode, world_size=self.ctx.world_size, local_rank=self.ctx.local_rank, seed=seed
        )
        seed_pts = None
        outputs = getattr(self.datamanager, "train_dataparser_outputs", None)
        if outputs is not None and "points3D_xyz" in outputs.metadata:
            seed_pts = (outputs.metadata["points3D_xyz"], outputs.metadata["points3D_rgb"])
        if self.datamanager.train_dataset is None:
            raise UserError("the datamanager produced no training dataset; check --data")
        self._model = config.model.setup(
            scene_box=self.datamanager.train_dataset.scene_box,
            num_train_data=len(self.datamanager.train_dataset),
            metadata=self.datamanager.train_dataset.metadata,
            device=device,
            grad_scaler=grad_scaler,
            seed_points=seed_pts,
            batch_size=config.batch_size,
            is_main_rank=self.ctx.is_main,
            seed=seed,
        )
        self.model.to(device)
        self.world_size = self.ctx.world_size
        # Every rank builds the same initial Gaussians from the same seed; broadcasting rank 0's
        # copy makes that a guarantee rather than an assumption.
        broadcast_tensors_(self.ctx, [p.data for p in self.model.parameters()])
        if config.parallel == "sharded":
            # Each rank keeps its block of those (identical) initial Gaussians (model/shard_state.py).
            take_initial_shard_(self.model, self.ctx.rank, self.ctx.world_size)
        self._full_view_step: Optional[int] = None
        self._training_configured = False
        train_cameras = self.datamanager.train_dataset.cameras
        heights = [int(h) for h in train_cameras.height.reshape(-1).tolist()]
        self._image_sizes = list(zip([int(w) for w in train_cameras.width.reshape(-1).tolist()], heights))
        self.planner = BandPlanner(config.partition, heights)
        self.time_imbalance: List[float] = []
        self.images_fetched_on_demand = 0
        # Found by nerfstudio's viewer on the pipeline: new browser clients open at a training view.
        self.viewer_start_view = StartAtTrainingView(
            self.datamanager.train_dataset.cameras.camera_to_worlds[0].numpy(force=True)
        )

    # ------------------------------------------------------------------ checkpoint state
    def get_extra_state(self) -> Dict[str, Any]:
        """The balancer's cost history travels with checkpoints (a resumed run balances at once)."""
        return {"planner": self.planner.state_dict()}

    def set_extra_state(self, state: Any) -> None:
        if isinstance(state, dict) and "planner" in state and hasattr(self, "planner"):
            self.planner.load_state_dict(state["planner"])

    @property
    def model(self) -> DistSplatModel:
        return self._model  # type: ignore[return-value]

    def refresh_full_view(self, step: int) -> None:
        """Sharded mode: gather the whole model's parameters (no optimizer state) to rank 0, where
        eval and the viewer render from them (``DistSplatModel.set_full_view``); rank 0 then holds
        one extra copy of the parameters. A second call at the same step gathers nothing.

        **Collective:** world group, in sharded mode on every rank at the same steps (the trainer
        calls it at the steps rank 0 evaluates, and every few steps with the viewer): one
        ``gather_rows`` of the ids, then one per parameter. Nothing in replicated mode or at
        ``world_size == 1`` (the model is whole). Rank 0 holding ids ``[0, 2]`` and rank 1 ``[1]``:
        rank 0 renders rows ``[0, 1, 2]``; rank 1 keeps nothing.
        **Host sync:** the parameters pass through rank 0's host memory.
        """
        if self.config.parallel != "sharded" or not self.ctx.is_distributed or self._full_view_step == step:
            return
        self.model.set_full_view(gather_full_params(self.ctx, self.model))
        self._full_view_step = step

    def drop_full_view(self) -> None:
        """Free the full view (rank 0's copy of the whole model) until the next refresh; eval and
        the viewer then render this rank's own Gaussians. Local: no collective."""
        self.model.set_full_view(None)
        self._full_view_step = None

    # ------------------------------------------------------------------ training set-up
    def configure_training(self, start_step: int) -> None:
        """Start this rank's data stream at ``start_step`` (after a resume, at the next step)."""
        self.datamanager.configure_training(
            batch_size=self.config.batch_size,
            rank=self.ctx.rank,
            world_size=self.ctx.world_size,
            start_step=start_step,
            assigner=ExpectedImagesAssigner(self.config.partition),
            # Images are decoded at the size the step renders (docs/data.md, decode at the training scale).
            downscale_at=self.model.resolution_schedule,
        )
        self._training_configured = True

    def trainable_parameters(self) -> List[torch.nn.Parameter]:
        """Every parameter the optimizers update, in the same order on every rank."""
        return [p for _, p in self._named_trainable_parameters()]

    def _named_trainable_parameters(self) -> List[Tuple[str, torch.nn.Parameter]]:
        return [
            (name.removeprefix("gauss_params."), p) for name, p in self.model.named_parameters() if p.requires_grad
        ]

    # ------------------------------------------------------------------ the step
    def train_step(self, step: int, optimizers: Optimizers) -> StepReport:
        """One training step on this rank, every phase in order.

        Args:
            step: The step (the batch is ``step``'s on every rank).
            optimizers: nerfstudio's optimizers and schedulers of the trainable parameters.

        Returns:
            What the step did, for logging.

        Raises:
            NonFiniteGradientError: the summed gradient holds NaN/Inf (before the optimizer step).
            ReplicaDriftError: the ranks' parameters differ after the step.

        **Collective:** world group, in this order on every rank: the SSIM-halo all-gather, the
        gradient buckets, the densification statistics (while densification runs), the cost
        all-gather and, every ``replica_check_every`` steps, the replica digest.
        **Host sync:** the halo rows and the measured tile costs (every step: the next cut needs
        them), the finite check (every ``check_finite_every`` steps), the replica digest.
        """
        if not self._training_configured:
            self.configure_training(start_step=step)
        optimizers.zero_grad_all()
        sharded = self.config.parallel == "sharded"
        batch = self.datamanager.batch_camera_ids(step)
        # Sharded mode: every shard's size (the scale term's mean, the logged count).
        num_gaussians = sum(all_gather_counts(self.ctx, self.model.num_points)) if sharded else self.model.num_points
        # 1. plan: every rank's bands, computed identically on every rank.
        plan = self.plan(step, batch)
        bands = plan.bands[self.ctx.rank]
        # 2. data: this rank's images of the batch.
        positions, images, masks, data_wait_s = self._fetch_images(step, batch, bands)
        # 3. forward: render the bands, this rank's exact share of the batch loss.
        t0 = time.perf_counter()
        exchange_s = 0.0
        sent = received = None
        if sharded:
            # Sharded: project this rank's Gaussians into every camera of the batch and send each
            # band's rank the screen-space terms it needs (model/exchange.py).
            projections = self.model.project_shard(self._host_cameras(batch), step)
            t1 = time.perf_counter()
            sent, received = send_screen_terms(self.ctx, projections, self.model.gauss_ids, plan.bands, len(batch))
            exchange_s += time.perf_counter() - t1
        # Host-side cameras: the model reads their sizes without a device sync, then moves them.
        cameras = self._host_cameras([batch[p] for p in positions])
        result = self.model.forward_bands(
            cameras, positions, images, masks, bands, step, add_regularizers=self.ctx.is_main, received=received,
            num_gaussians_total=num_gaussians if sharded else None,
        )
        forward_s = time.perf_counter() - t0 - exchange_s
        # 4. backward, with the halo rows' pixel gradients exchanged between the two phases;
        # sharded: then the received rows' gradients back to their owners, through their projection.
        backward_s, halo_wait_s = self._backward(result)
        if sent is not None and received is not None:
            t1 = time.perf_counter()
            return_gradients(self.ctx, sent, received, result.received_projections)
            exchange_s += time.perf_counter() - t1
        # 5. reduce: gradients summed over ranks (sharded: only the parameters every rank holds,
        # e.g. camera adjustments), densification statistics of the whole batch.
        t0 = time.perf_counter()
        named = self._named_trainable_parameters()
        if before_gradient_sum_hook is not None:
            before_gradient_sum_hook(step, self.ctx.rank, self.model)
        replicated = [(n, p) for n, p in named if not (sharded and n in self.model.gauss_params)]
        if sharded:
            # As in one process, a Gaussian no band saw has a zero gradient, not none (Adam would
            # skip it, and this rank's Adam step count would drift from the others').
            for _, p in named:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        bytes_communicated = sum_gradients_(self.ctx, [p for _, p in replicated]).bytes_reduced
        if sent is not None and self.ctx.is_distributed:
            item, rank = sent.rows.element_size(), self.ctx.rank
            # terms + int64 id out, gradients + absgrad back: the rows that leave this rank.
            rows_out = sent.num_rows - sent.send_counts[rank]
            grads_out = sum(sent.recv_counts) - sent.recv_counts[rank]
            bytes_communicated += rows_out * (exchange_row_bytes(item) + 8) + grads_out * exchange_grad_bytes(item)
        info = None
        if step < self.model.schedule.refine_stop_iter:
            if sent is not None:
                # Complete at each owner: its projections received every band's gradients.
                info = self._batch_statistics(step, batch, [(p, proj.means2d, proj.radii) for p, proj in sent.calls], reduce=False)
            else:
                info = self._batch_statistics(step, batch, result.projections, reduce=True)
                if self.ctx.is_distributed:
                    # grads2d + absgrads2d (float32 [B, N, 2] each) and radii (int32 [B, N])
                    bytes_communicated += self.config.batch_size * self.model.num_points * (2 * 2 * 4 + 4)
        # 6. finite check: replicated, every rank sees the same summed gradient, so all stop
        # together; sharded, the ranks agree on the verdict.
        every = self.config.check_finite_every
        if every and step % every == 0:
            check_finite_gradients(self.ctx, named, step, agree=sharded)
        all_reduce_s = halo_wait_s + exchange_s + time.perf_counter() - t0
        # 7. the optimizer step and learning-rate schedules (replicated: identical on every rank).
        t0 = time.perf_counter()
        optimizers.optimizer_step_all()
        optimizers.scheduler_step_all(step)
        optimizer_s = time.perf_counter() - t0
        # 8. refine: densification on the batch's statistics (replicated: identical inputs
        # everywhere; sharded: each rank its own Gaussians, then shards rebalanced).
        t0 = time.perf_counter()
        if info is not None and sharded:
            # New Gaussians are numbered over every rank's parents (one gather per grow event).
            self.model.refine(step, optimizers.optimizers, info, gather_ids=functools.partial(all_gather_rows, self.ctx))
            if rebalance_due(self.model.schedule, step):
                # Growth and pruning make shards drift: move rows (with their Adam and strategy
                # state) when the largest exceeds 1.10 x the mean.
                bytes_communicated += rebalance_shards_(self.ctx, self.model, optimizers.optimizers)
        elif info is not None:
            self.model.refine(step, optimizers.optimizers, info)
        densify_s = time.perf_counter() - t0
        # 9. observe costs: every rank's measured tile costs into the planner's history.
        measured_imbalance, time_imbalance = self._observe_costs(plan, batch, result, forward_s + backward_s)
        # 10. replica check: every K steps, prove the replicated parameters bitwise identical.
        every = self.config.replica_check_every
        if self.ctx.is_distributed and every and step % every == 0 and replicated:
            check_replicas(self.ctx, [p.data for _, p in replicated], step)
        timings = StepTimings(
            data_wait=data_wait_s, forward=forward_s, backward=backward_s, all_reduce=all_reduce_s,
            optimizer=optimizer_s, densify=densify_s,
        )
        return StepReport(
            loss=result.loss.detach(), l1=result.l1, dssim=result.dssim, num_gaussians=num_gaussians, timings=timings,
            bytes_communicated=bytes_communicated, measured_imbalance=measured_imbalance, time_imbalance=time_imbalance,
        )

    def plan(self, step: int, batch: Sequence[int]) -> StepPlan:
        """Every rank's bands for the step: a pure function of values every rank has (the batch,
        the resolution, and the cost history, which every rank updates with the same all-gathered
        measurements)."""
        downscale = self.model.downscale_factor_at(step)
        need_prior = self.planner.cameras_needing_prior(downscale, batch)
        if need_prior:
            for camera_index, costs in zip(need_prior, self._footprint_priors(need_prior, step)):
                self.planner.set_prior(downscale, camera_index, costs)
        return self.planner.plan(batch, self.ctx.world_size, downscale)

    @torch.no_grad()
    def _footprint_priors(self, camera_indices: Sequence[int], step: int) -> List[torch.Tensor]:
        """Cold-start costs: how many tiles each projected Gaussian's 3-sigma footprint covers, per
        tile row (projection only, no rasterization; identical on every rank)."""
        from distsplat_ns.rendering import project

        cameras = self._host_cameras(camera_indices)
        downscale = self.model.downscale_factor_at(step)
        viewmats, Ks, width, height = self.model._cameras_to_render_inputs(cameras, downscale)
        params = self.model._activated()
        proj = project(
            **params, viewmats=viewmats, Ks=Ks, width=width, height=height, sh_degree=self.model.sh_degree_at(step),
            rasterize_mode=self.model.config.rasterize_mode, backend=self.model.config.rendering_backend,
        )
        costs = [footprint_row_costs(proj.means2d[i].detach(), proj.radii[i], height, width) for i in range(len(camera_indices))]
        if self.config.parallel == "sharded":
            # Each rank projected its own Gaussians: the footprints of all of them are the sum.
            flat = all_reduce_sum_(self.ctx, torch.cat(costs))
            costs = list(torch.split(flat, [len(c) for c in costs]))
        return [c.cpu() for c in costs]

    def _fetch_images(
        self, step: int, batch: Sequence[int], bands: Sequence[Band]
    ) -> Tuple[List[int], List[torch.Tensor], List[Optional[torch.Tensor]], float]:
        """This rank's images of the step: ``(positions, images, masks, wait_s)``, in batch order.

        The data stream decoded the images this rank was expected to need; one the balanced cut
        gave it beyond those is decoded here, on demand, and counted.
        """
        needed = sorted({b.position for b in bands})
        t0 = time.perf_counter()
        train_batch = self.datamanager.next_train_batch(step)
        images = dict(zip(train_batch.positions, train_batch.images))
        masks = dict(zip(train_batch.positions, train_batch.masks))
        missing = [p for p in needed if p not in images]
        if missing:
            self.images_fetched_on_demand += len(missing)
            images.update(zip(missing, self.datamanager.get_images([batch[p] for p in missing], step=step)))
        wait_s = train_batch.wait_s + (time.perf_counter() - t0 if missing else 0.0)
        return needed, [images[p] for p in needed], [masks.get(p) for p in needed], wait_s

    def _backward(self, result: BandRenderResult) -> Tuple[float, float]:
        """Backpropagate this rank's loss share with exact per-pixel gradients
        (``model/band_backward.py``); returns ``(render_s, halo_wait_s)``.

        The exchange waits for the slowest rank: it counts as communication, not render time, or
        the per-rank render times (the balancer's wall-clock figure) would look more equal than
        they are.

        **Collective:** one all-gather of the SSIM halo rows' pixel gradients.
        """
        waited = [0.0]

        def exchange(msgs):  # noqa: ANN001, ANN202
            t0 = time.perf_counter()
            gathered = all_gather_object(self.ctx, msgs)
            waited[0] += time.perf_counter() - t0
            return gathered

        t0 = time.perf_counter()
        backward_bands(result.loss, result.pixel_links, exchange)
        return time.perf_counter() - t0 - waited[0], waited[0]

    def _host_cameras(self, camera_ids: Sequence[int]) -> Any:
        return self.datamanager.train_dataset.cameras[torch.tensor(list(camera_ids), dtype=torch.long)]

    def _batch_statistics(
        self, step: int, batch: Sequence[int], projections: Sequence[Tuple[List[int], torch.Tensor, torch.Tensor]], reduce: bool
    ) -> Dict[str, Any]:
        """DefaultStrategy's ``info`` for the whole batch from ``(positions, means2d, radii)``
        per projection call: screen-space gradients and absgrads summed, radii maximised over
        ranks when ``reduce`` (replicated mode); as they are otherwise (sharded mode: complete at
        each owner).

        **Collective:** with ``reduce``, three all-reduces (sum, sum, max) of `[B, N, 2]`,
        `[B, N, 2]`, `[B, N]`.
        """
        num = self.config.batch_size
        n = self.model.num_points
        device = self.model.means.device
        dtype = self.model.compute_dtype
        if len(projections) == 1 and projections[0][0] == list(range(num)):
            # This rank projected the whole batch in one call (one process, or a band of every
            # image, or sharded mode): its statistics are already batch-shaped.
            _, means2d, proj_radii = projections[0]
            grads = means2d.grad.detach() if means2d.grad is not None else torch.zeros(num, n, 2, device=device, dtype=dtype)
            absgrad = getattr(means2d, "absgrad", None)
            absgrads = absgrad.detach() if absgrad is not None else torch.zeros_like(grads)
            radii = proj_radii.detach().to(torch.int32)
        else:
            grads = torch.zeros(num, n, 2, device=device, dtype=dtype)
            absgrads = torch.zeros(num, n, 2, device=device, dtype=dtype)
            radii = torch.zeros(num, n, dtype=torch.int32, device=device)
            for positions, means2d, proj_radii in projections:
                idx = torch.tensor(positions, device=device)
                if means2d.grad is not None:
                    grads[idx] += means2d.grad.detach()
                absgrad = getattr(means2d, "absgrad", None)
                if absgrad is not None:
                    absgrads[idx] += absgrad.detach()
                radii[idx] = torch.maximum(radii[idx], proj_radii.detach().to(torch.int32))
        if reduce:
            all_reduce_sum_(self.ctx, grads)
            all_reduce_sum_(self.ctx, absgrads)
            all_reduce_max_(self.ctx, radii)
        # The model renders a batch's cameras in one call only when their sizes agree.
        width, height = self._image_sizes[batch[0]]
        downscale = self.model.downscale_factor_at(step)
        return batch_info(grads, absgrads, radii, downscaled_px(width, downscale), downscaled_px(height, downscale))

    def _observe_costs(
        self, plan: StepPlan, batch: Sequence[int], result: BandRenderResult, render_s: float
    ) -> Tuple[float, float]:
        """All-gather every rank's measured per-row costs (and render time) into the history;
        returns ``(measured_imbalance, time_imbalance)``.

        **Collective:** one all-gather of small Python lists per step, the same on every rank.
        **Host sync:** the tile counts come to the host: the next step's cut needs them.
        """
        mine = []
        if result.band_tile_counts:
            # One device-to-host copy for all bands (one sync, not one per band).
            row_costs = torch.cat([c.sum(dim=-1) for _, c in result.band_tile_counts]).to(torch.float64).cpu().tolist()
            start = 0
            for band, counts in result.band_tile_counts:
                rows = counts.shape[0]
                mine.append((band.position, band.first_row, row_costs[start : start + rows]))
                start += rows
        gathered = all_gather_object(self.ctx, (mine, render_s))
        measured_imbalance = self.planner.observe(plan, batch, plan.downscale, [g[0] for g in gathered])
        time_imbalance = max_over_mean([g[1] for g in gathered])
        self.time_imbalance.append(time_imbalance)
        return measured_imbalance, time_imbalance

    def balance_summary(self) -> Dict[str, Any]:
        """Balance figures for the run summary (measured after the first epoch: before it, most
        cameras have only a footprint prior)."""
        warmup = steps_to_cover(len(self.datamanager.train_dataset), self.config.batch_size)
        summary: Dict[str, Any] = {"partition": self.config.partition, **self.planner.log.summary(warmup_steps=warmup)}
        tail = self.time_imbalance[warmup:] if len(self.time_imbalance) > warmup else self.time_imbalance
        if tail:
            summary["time_imbalance_mean"], summary["time_imbalance_p95"] = mean_and_p95(tail)
        summary["images_fetched_on_demand"] = self.images_fetched_on_demand
        return summary
