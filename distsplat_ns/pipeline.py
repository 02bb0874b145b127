"""DistSplatPipeline: one data-parallel training step over bands of a global batch.

Every rank holds the same Gaussians (the DDP pattern, without DDP's one-time registration). A step:

1. the global batch of B camera ids for the step (identical on every rank: ``data/order.py``);
2. the plan: each rank's bands ``(image, first_row, end_row)`` (whole images split contiguously
   over ranks, or the load balancer's cut);
3. this rank's images from the datamanager, its bands rendered, its exact share of the loss;
4. backward (trainer), then gradients summed over ranks in buckets rebuilt every step, and the
   densification statistics (screen-space gradients, absgrads, radii) reduced over ranks;
5. the identical optimizer step everywhere, then densification on identical inputs.

Rank 0 alone owns viewer, writers and checkpoints (trainer.py); the eval and viewer paths of the
model never enter a collective.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple, Type

import torch
from nerfstudio.data.datamanagers.base_datamanager import DataManagerConfig
from nerfstudio.pipelines.base_pipeline import VanillaPipeline, VanillaPipelineConfig
from torch.cuda.amp.grad_scaler import GradScaler

from distsplat_ns.balance.cost import footprint_row_costs
from distsplat_ns.balance.planner import BandPlanner, ExpectedImagesAssigner, StepPlan
from distsplat_ns.data.datamanager import ParallelFullImageDatamanagerConfig
from distsplat_ns.distributed.collectives import (
    DEFAULT_BUCKET_BYTES,
    all_gather_object,
    all_reduce_max_,
    all_reduce_sum_,
    broadcast_tensors_,
    check_finite_gradients,
    check_replicas,
    sum_gradients_,
)
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.model.distsplat_model import BandRenderResult, DistSplatModel, DistSplatModelConfig, backward_bands
from distsplat_ns.model.strategy import batch_info
from distsplat_ns.utils.cameras import ResolutionSchedule, downscaled_px
from distsplat_ns.utils.logging import get_logger
from distsplat_ns.viewer_start import StartAtTrainingView

LOGGER = get_logger(__name__)


@dataclass
class DistSplatPipelineConfig(VanillaPipelineConfig):
    """The distsplat pipeline: batch size, synchronisation and checks."""

    _target: Type = field(default_factory=lambda: DistSplatPipeline)
    datamanager: DataManagerConfig = field(default_factory=ParallelFullImageDatamanagerConfig)
    model: DistSplatModelConfig = field(default_factory=DistSplatModelConfig)
    batch_size: int = 1
    """Images per optimizer step, summed over all ranks (independent of the number of processes). Schedules are counted in images, and lr x sqrt(B), Adam eps / sqrt(B), betas^B (Grendel-GS's rule) keep the optimisation comparable across B."""
    partition: Literal["balanced", "whole-images", "equal-rows"] = "balanced"
    """How each batch is split across ranks: "balanced" cuts the batch's 16-px tile rows into parts of near-equal measured cost (Gaussian-tile intersections); "whole-images" hands each rank whole images (gsplat's multi-GPU split); "equal-rows" gives each rank the same number of rows (Grendel-GS's cold start)."""
    balance_decay: float = 0.0
    """Weight of the old per-row cost when a camera is measured again (0 = replace, as Grendel-GS: a camera's cost changes little between its visits one epoch apart, and densification makes old estimates stale)."""
    min_band_rows: int = 1
    """Thinnest band a rank renders, in 16-px tile rows."""
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    """Gradient all-reduce bucket size in bytes (torch DDP's default of 25 MiB)."""
    replica_check_every: int = 100
    """Compare a bitwise digest of every rank's parameters every this many steps (0 = never). The check copies parameters to host memory, hence not every step."""
    check_finite_every: int = 1
    """Stop on NaN/Inf in the summed gradient, checked every this many steps (0 = never). Each check is one host sync."""
    inject_nonfinite_at_step: int = -1
    """Fault injection for tests: at this step, rank ``inject_nonfinite_rank`` writes a NaN into its local gradient before the reduction (-1 = never)."""
    inject_nonfinite_rank: int = 0
    """The rank that injects the NaN (see ``inject_nonfinite_at_step``)."""

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"--pipeline.batch-size must be >= 1, got {self.batch_size}")
        if self.bucket_bytes < 1024:
            raise ValueError(f"--pipeline.bucket-bytes must be >= 1024, got {self.bucket_bytes}")
        if self.partition not in ("balanced", "whole-images", "equal-rows"):
            raise ValueError(f"--pipeline.partition must be balanced, whole-images or equal-rows, got {self.partition!r}")
        if not 0.0 <= self.balance_decay < 1.0:
            raise ValueError(f"--pipeline.balance-decay must be in [0, 1), got {self.balance_decay}")
        if self.min_band_rows < 1:
            raise ValueError(f"--pipeline.min-band-rows must be >= 1, got {self.min_band_rows}")
        if self.replica_check_every < 0 or self.check_finite_every < 0:
            raise ValueError("--pipeline.replica-check-every and --pipeline.check-finite-every must be >= 0")


@dataclass
class StepTimings:
    """Seconds spent in each phase of one step on this rank."""

    data_wait: float = 0.0
    forward: float = 0.0
    backward: float = 0.0
    all_reduce: float = 0.0
    optimizer: float = 0.0
    densify: float = 0.0

    def as_dict(self) -> Dict[str, float]:
        return dict(self.__dict__)


@dataclass
class StepState:
    """What flows from the forward to the reduction and densification of one step."""

    step: int
    result: BandRenderResult
    timings: StepTimings
    plan: Optional[StepPlan] = None
    batch: List[int] = field(default_factory=list)
    downscale: int = 1
    bytes_communicated: int = 0
    info: Optional[Dict[str, Any]] = None
    measured_imbalance: Optional[float] = None
    time_imbalance: Optional[float] = None


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
    ):
        torch.nn.Module.__init__(self)
        self.config = config
        self.test_mode = test_mode
        self.ctx = dist_ctx if dist_ctx is not None else DistContext(device=torch.device(device))
        self.datamanager = config.datamanager.setup(
            device=device, test_mode=test_mode, world_size=self.ctx.world_size, local_rank=self.ctx.local_rank
        )
        seed_pts = None
        outputs = getattr(self.datamanager, "train_dataparser_outputs", None)
        if outputs is not None and "points3D_xyz" in outputs.metadata:
            seed_pts = (outputs.metadata["points3D_xyz"], outputs.metadata["points3D_rgb"])
        if self.datamanager.train_dataset is None:
            raise ValueError("the datamanager produced no training dataset; check --data")
        self._model = config.model.setup(
            scene_box=self.datamanager.train_dataset.scene_box,
            num_train_data=len(self.datamanager.train_dataset),
            metadata=self.datamanager.train_dataset.metadata,
            device=device,
            grad_scaler=grad_scaler,
            seed_points=seed_pts,
            batch_size=config.batch_size,
            is_main_rank=self.ctx.is_main,
        )
        self.model.to(device)
        self.world_size = self.ctx.world_size
        # Every rank builds the same initial Gaussians from the same seed; broadcasting rank 0's
        # copy makes that a guarantee rather than an assumption.
        broadcast_tensors_(self.ctx, [p.data for p in self.model.parameters()])
        self._training_configured = False
        train_cameras = self.datamanager.train_dataset.cameras
        heights = [int(h) for h in train_cameras.height.reshape(-1).tolist()]
        self._image_sizes = list(zip([int(w) for w in train_cameras.width.reshape(-1).tolist()], heights))
        self.planner = BandPlanner(
            config.partition, heights, decay=config.balance_decay, min_band_rows=config.min_band_rows
        )
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
            downscale_at=ResolutionSchedule(
                self.model.config.num_downscales, self.model.config.resolution_schedule, self.model.batch_size
            ),
        )
        self._training_configured = True

    def trainable_parameters(self) -> List[torch.nn.Parameter]:
        """Every parameter the optimizers update, in the same order on every rank."""
        return [p for p in self.model.parameters() if p.requires_grad]

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

        cameras = self.datamanager.train_dataset.cameras[torch.tensor(list(camera_indices))]
        downscale = self.model.downscale_factor_at(step)
        viewmats, Ks, width, height = self.model._cameras_to_render_inputs(cameras, downscale)
        params = self.model._activated()
        proj = project(
            **params, viewmats=viewmats, Ks=Ks, width=width, height=height, sh_degree=self.model.sh_degree_at(step),
            rasterize_mode=self.model.config.rasterize_mode, backend=self.model.config.rendering_backend,
        )
        return [
            footprint_row_costs(proj.means2d[i].detach(), proj.radii[i], height, width).cpu()
            for i in range(len(camera_indices))
        ]

    # ------------------------------------------------------------------ the step
    def get_train_loss_dict(self, step: int) -> Tuple[StepState, Dict[str, torch.Tensor], Dict[str, Any]]:
        """Forward of this rank's share of the step's batch.

        Returns:
            ``(state, loss_dict, metrics_dict)``: ``state`` goes to :meth:`after_backward`; the
            sum of ``loss_dict``'s values is this rank's loss share (sum over ranks = batch loss).
        """
        if not self._training_configured:
            self.configure_training(start_step=step)
        timings = StepTimings()
        batch_ids = self.datamanager.batch_camera_ids(step)
        plan = self.plan(step, batch_ids)
        my_bands = plan.bands[self.ctx.rank]
        needed = sorted({b.position for b in my_bands})
        t0 = time.perf_counter()
        train_batch = self.datamanager.next_train_batch(step)
        images_by_pos = dict(zip(train_batch.positions, train_batch.images))
        masks_by_pos = dict(zip(train_batch.positions, train_batch.masks))
        missing = [p for p in needed if p not in images_by_pos]
        if missing:
            self.images_fetched_on_demand += len(missing)
            fetched = self.datamanager.get_images([batch_ids[p] for p in missing], step=step)
            for p, img in zip(missing, fetched):
                images_by_pos[p] = img
                masks_by_pos.setdefault(p, None)
        timings.data_wait = train_batch.wait_s + (time.perf_counter() - t0 if missing else 0.0)
        t1 = time.perf_counter()
        if needed:
            camera_indices = torch.tensor([batch_ids[p] for p in needed])
            # Host-side cameras: the model reads their sizes without a device sync, then moves them.
            cameras = self.datamanager.train_dataset.cameras[camera_indices]
            result = self.model.forward_bands(
                cameras,
                needed,
                [images_by_pos[p] for p in needed],
                [masks_by_pos.get(p) for p in needed],
                my_bands,
                step,
                add_regularizers=self.ctx.is_main,
            )
        else:
            # B < W whole images: this rank renders nothing but still joins every collective.
            result = self._empty_result(step)
        timings.forward = time.perf_counter() - t1
        loss_dict = {"main_loss": result.loss}
        metrics = {"gaussian_count": self.model.num_points}
        state = StepState(
            step=step, result=result, timings=timings, plan=plan, batch=list(batch_ids),
            downscale=self.model.downscale_factor_at(step),
        )
        return state, loss_dict, metrics

    def _empty_result(self, step: int) -> BandRenderResult:
        zero = self.model.means.new_zeros(())
        loss = self.model._regularizers(step) if self.ctx.is_main else zero
        return BandRenderResult(
            loss=loss, l1=zero, dssim=zero, projections=[], band_tile_counts=[], width=0, height=0, num_pixels=0
        )

    def backward(self, state: StepState) -> None:
        """Backpropagate this rank's loss share with exact per-pixel gradients (``backward_bands``).

        **Collective:** one all-gather of the SSIM halo rows' pixel gradients per step.
        """
        waited = [0.0]

        def exchange(msgs):  # noqa: ANN001, ANN202
            t0 = time.perf_counter()
            gathered = all_gather_object(self.ctx, msgs)
            waited[0] += time.perf_counter() - t0
            return gathered

        t_start = time.perf_counter()
        backward_bands(state.result, exchange)
        # The exchange waits for the slowest rank: count it as communication, not as render time,
        # or the per-rank render times (the balancer's wall-clock figure) look more equal than
        # they are.
        state.timings.backward = time.perf_counter() - t_start - waited[0]
        state.timings.all_reduce += waited[0]

    def after_backward(self, state: StepState) -> None:
        """Sum gradients over ranks and reduce the densification statistics.

        **Collective:** world group, same order on every rank: the gradient buckets, then (while
        densification is active) the statistics. At ``world_size == 1`` only local work remains.
        """
        t0 = time.perf_counter()
        params = self.trainable_parameters()
        if state.step == self.config.inject_nonfinite_at_step and self.ctx.rank == self.config.inject_nonfinite_rank:
            LOGGER.warning("fault injection: NaN written into the local gradient at step %d", state.step)
            grad = self.model.means.grad
            if grad is None:
                self.model.means.grad = torch.zeros_like(self.model.means)
                grad = self.model.means.grad
            grad.view(-1)[0] = float("nan")
        sync = sum_gradients_(self.ctx, params, self.config.bucket_bytes)
        state.bytes_communicated = sync.bytes_reduced
        every = self.config.check_finite_every
        if every and state.step % every == 0:
            check_finite_gradients(self.ctx, params, state.step)
        if state.step < self.model.schedule.refine_stop_iter:
            state.info = self._reduce_statistics(state)
            if self.ctx.is_distributed:
                # grads2d + absgrads2d (float32 [B, N, 2] each) and radii (int32 [B, N])
                state.bytes_communicated += self.config.batch_size * self.model.num_points * (2 * 2 * 4 + 4)
        state.timings.all_reduce += time.perf_counter() - t0
        self._observe_costs(state)

    def _observe_costs(self, state: StepState) -> None:
        """All-gather every rank's measured per-row costs (and render time) into the history.

        **Collective:** one all-gather of small Python lists per step, the same on every rank.
        **Host sync:** the tile counts come to the host: the next step's cut needs them.
        """
        if state.plan is None:
            return
        bands = state.result.band_tile_counts
        mine = []
        if bands:
            # One device-to-host copy for all bands (one sync, not one per band).
            row_costs = torch.cat([counts.sum(dim=-1) for _, counts in bands]).to(torch.float64).cpu().tolist()
            start = 0
            for band, counts in bands:
                rows = counts.shape[0]
                mine.append((band.position, band.first_row // 16, row_costs[start : start + rows]))
                start += rows
        render_s = state.timings.forward + state.timings.backward
        gathered = all_gather_object(self.ctx, (mine, render_s))
        state.measured_imbalance = self.planner.observe(state.plan, state.batch, state.downscale, [g[0] for g in gathered])
        times = [g[1] for g in gathered]
        mean_t = sum(times) / len(times)
        state.time_imbalance = max(times) / mean_t if mean_t > 0 else 1.0
        self.time_imbalance.append(state.time_imbalance)

    def balance_summary(self) -> Dict[str, Any]:
        """Balance figures for the run summary (measured after the first epoch: before it, most
        cameras have only a footprint prior)."""
        num_train = len(self.datamanager.train_dataset)
        warmup = -(-num_train // self.config.batch_size)
        summary: Dict[str, Any] = {"partition": self.config.partition, **self.planner.log.summary(warmup_steps=warmup)}
        tail = self.time_imbalance[warmup:] if len(self.time_imbalance) > warmup else self.time_imbalance
        if tail:
            ordered = sorted(tail)
            summary["time_imbalance_mean"] = sum(tail) / len(tail)
            summary["time_imbalance_p95"] = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        summary["images_fetched_on_demand"] = self.images_fetched_on_demand
        return summary

    def _reduce_statistics(self, state: StepState) -> Dict[str, Any]:
        result = state.result
        batch = self.config.batch_size
        n = self.model.num_points
        device = self.model.means.device
        dtype = self.model.compute_dtype
        if len(result.projections) == 1 and result.projections[0][0] == list(range(batch)):
            # This rank projected the whole batch in one call (one process, or a band of every
            # image): its statistics are already batch-shaped, no gather into zeros needed.
            _, means2d, proj_radii = result.projections[0]
            grads = means2d.grad.detach() if means2d.grad is not None else torch.zeros(batch, n, 2, device=device, dtype=dtype)
            absgrad = getattr(means2d, "absgrad", None)
            absgrads = absgrad.detach() if absgrad is not None else torch.zeros_like(grads)
            radii = proj_radii.detach().to(torch.int32)
        else:
            grads = torch.zeros(batch, n, 2, device=device, dtype=dtype)
            absgrads = torch.zeros(batch, n, 2, device=device, dtype=dtype)
            radii = torch.zeros(batch, n, dtype=torch.int32, device=device)
            for positions, means2d, proj_radii in result.projections:
                idx = torch.tensor(positions, device=device)
                if means2d.grad is not None:
                    grads[idx] += means2d.grad.detach()
                absgrad = getattr(means2d, "absgrad", None)
                if absgrad is not None:
                    absgrads[idx] += absgrad.detach()
                radii[idx] = torch.maximum(radii[idx], proj_radii.detach().to(torch.int32))
        all_reduce_sum_(self.ctx, grads)
        all_reduce_sum_(self.ctx, absgrads)
        all_reduce_max_(self.ctx, radii)
        width, height = self._rendered_size(state.step, state.batch)
        return batch_info(grads, absgrads, radii, width, height)

    def _rendered_size(self, step: int, batch: Sequence[int]) -> Tuple[int, int]:
        """Rendered (width, height) of the batch's images at this step (the model renders a batch's
        cameras in one call only when their sizes agree)."""
        width, height = self._image_sizes[batch[0]]
        d = self.model.downscale_factor_at(step)
        return downscaled_px(width, d), downscaled_px(height, d)

    def after_optimizer_step(self, state: StepState, optimizers: Dict[str, torch.optim.Optimizer]) -> None:
        """Densify on the reduced statistics, then (every K steps) prove the replicas identical.

        **Collective:** the replica check all-gathers a digest every ``replica_check_every`` steps.
        """
        t0 = time.perf_counter()
        if state.info is not None:
            self.model.refine(state.step, optimizers, state.info)
        state.timings.densify = time.perf_counter() - t0
        every = self.config.replica_check_every
        if self.ctx.is_distributed and every and state.step % every == 0:
            check_replicas(self.ctx, [p.data for p in self.trainable_parameters()], state.step)
