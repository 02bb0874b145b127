"""DistSplatPipeline: one training step over bands of a global batch, on every rank.

How the Gaussians are held -- every rank all of them (replicated) or a shard each (sharded) -- is
one ``ParallelMode`` built at set-up from ``--pipeline.parallel`` (``parallel/``); the step calls
it and never tests which it is. ``DistSplatPipeline.train_step`` is the whole step, in order, each
phase in one place: the data (``datamanager.step_batch``) -> the balance's plan
(``pipeline/step_balance.py``) -> the render phase's forward and backward, with the SSIM-halo exchange
(``pipeline/band_pass.py``) -> the gradient sum, statistics and finite verdict (the mode) -> the
balance's measurement (cost gather with the finite check, viewer frame) -> optimizer -> densify
(``gaussians/``) and after-refine -> replica check; docs/architecture.md walks through it. Rank 0
alone owns viewer, writers and checkpoints (trainer/distsplat_trainer.py). Eval images and viewer frames are
rendered as the mode says: by rank 0 alone from the whole model (replicated), or by every rank
from its shard (sharded: eval is then called on every rank, and a viewer frame rank 0's viewer
thread posted is flagged in the step's cost all-gather, then broadcast and rendered by all ranks
right after it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from nerfstudio.data.datamanagers.base_datamanager import DataManagerConfig
from nerfstudio.engine.optimizers import Optimizers
from nerfstudio.pipelines.base_pipeline import VanillaPipeline, VanillaPipelineConfig
from nerfstudio.utils.misc import step_check
from torch.cuda.amp.grad_scaler import GradScaler

from distsplat_ns.balance.planner import PARTITION_MODES, BandPlanner, ExpectedImagesAssigner, PartitionMode
from distsplat_ns.data.datamanager import ParallelFullImageDatamanagerConfig
from distsplat_ns.distributed.collectives import broadcast_object, broadcast_tensors_, raise_if_nonfinite
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.gaussians.budget_caps import parse_memory_budget
from distsplat_ns.gaussians.budget_measured import RankBudget
from distsplat_ns.model.camera_adjust import with_train_camera_ids
from distsplat_ns.model.distsplat_model import DistSplatModel, DistSplatModelConfig
from distsplat_ns.parallel import PARALLEL_MODES, ParallelModeName, parallel_mode_class
from distsplat_ns.parallel.full_state import GatheredState
from distsplat_ns.parallel.shard_moves import SHARD_BOUND
from distsplat_ns.pipeline.band_pass import BandPass
from distsplat_ns.pipeline.evaluation import PipelineEval, eval_mode
from distsplat_ns.pipeline.step_balance import StepBalance
from distsplat_ns.pipeline.step_report import StepReport, StepTimings
from distsplat_ns.pipeline.viewer_start import StartAtTrainingView
from distsplat_ns.rendering.api import BAND_COST_FRACTIONS, WORK_UNITS, resolve_backend
from distsplat_ns.utils.cameras import BatchCameras
from distsplat_ns.utils.errors import UserError
from distsplat_ns.utils.logging import get_logger
from distsplat_ns.utils.steps import steps_to_cover
from distsplat_ns.utils.timing import PhaseClock
from distsplat_ns.utils.validation import one_of

LOGGER = get_logger(__name__)

#: Test hook (None in real runs): called as ``hook(step, rank, model)`` after backward, before the
#: gradient sum; tests/helpers/ns_train_patched.py (its fault patch) sets it to write a NaN into one rank's gradient.
before_gradient_sum_hook: Callable[[int, int, DistSplatModel], None] | None = None


@dataclass
class DistSplatPipelineConfig(VanillaPipelineConfig):
    """The distsplat pipeline: batch size, how a batch is split over ranks, and the run's checks."""

    _target: type = field(default_factory=lambda: DistSplatPipeline)
    datamanager: DataManagerConfig = field(default_factory=ParallelFullImageDatamanagerConfig)
    model: DistSplatModelConfig = field(default_factory=DistSplatModelConfig)
    batch_size: int = 1
    """Images per optimizer step, summed over all ranks (independent of the number of processes). Schedules are counted in images, and lr x sqrt(B), Adam eps / sqrt(B), betas^B (Grendel-GS's rule) keep the optimisation comparable across B."""
    partition: PartitionMode = "balanced"
    """How each batch is split across ranks: "balanced" cuts the batch's 16-px tile rows into parts of near-equal measured cost (the renderer's work: Gaussian-tile intersections on gsplat, composited pixel-Gaussian pairs on the reference); "whole-images" hands each rank whole images (gsplat's multi-GPU split); "equal-rows" gives each rank the same number of rows (Grendel-GS's cold start)."""
    parallel: ParallelModeName = "replicated"
    """How the Gaussians are held: "replicated" (every rank holds all of them and gradients are all-reduced: best while the model fits one device and the batch is small) or "sharded" (each rank owns 1/W of them with their optimizer state; screen-space terms go to the ranks rendering each band: for scenes that outgrow one device, or many ranks). See docs/sharded.md."""
    replica_check_every: int = 100
    """Compare a bitwise digest of every rank's parameters every this many steps (0 = never). The check copies parameters to host memory, hence not every step."""
    check_finite_every: int = 1
    """Stop on NaN/Inf in the summed gradient, checked every this many steps (0 = never). The verdict is a device-side flag read with the step's measured costs, a host copy made anyway: no extra sync."""
    memory_budget: str = "auto"
    """Memory each rank may use, in GiB (e.g. 12), "auto" or "off". Densification grows the Gaussians only up to the cap this implies (replicated: what one rank holds; sharded: about W ranks' worth), and a run whose initial Gaussians already pass it stops at set-up naming the smallest W that fits. "auto" is 90% of the device's total memory on CUDA and no budget on the CPU. What it counts: docs/densification.md."""

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise UserError(f"--pipeline.batch-size must be >= 1, got {self.batch_size}")
        if self.partition not in PARTITION_MODES:
            raise UserError(f"--pipeline.partition must be {one_of(PARTITION_MODES)}, got {self.partition!r}")
        if self.parallel not in PARALLEL_MODES:
            raise UserError(f"--pipeline.parallel must be {one_of(PARALLEL_MODES)}, got {self.parallel!r}")
        if self.replica_check_every < 0:
            raise UserError(f"--pipeline.replica-check-every must be >= 0, got {self.replica_check_every}")
        if self.check_finite_every < 0:
            raise UserError(f"--pipeline.check-finite-every must be >= 0, got {self.check_finite_every}")
        parse_memory_budget(self.memory_budget)


class DistSplatPipeline(VanillaPipeline):
    """Data-parallel splatting pipeline; see the module docstring (eval: its ``evaluation``,
    ``pipeline/evaluation.py:PipelineEval``).

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
    **Collective** (construction): the datamanager's host exchange (two or three all-gathers: the
    host keys, then the host store's leader's answer for the images and the masks), then two
    broadcasts from rank 0 (generator state, whole-held parameters).
    """

    config: DistSplatPipelineConfig

    def __init__(
        self,
        config: DistSplatPipelineConfig,
        device: str,
        test_mode: Literal["test", "val", "inference"] = "val",
        world_size: int = 1,
        local_rank: int = 0,
        grad_scaler: GradScaler | None = None,
        dist_ctx: DistContext | None = None,
        seed: int = 42,
    ):
        torch.nn.Module.__init__(self)
        self.config = config
        self.test_mode = test_mode
        self.ctx = dist_ctx if dist_ctx is not None else DistContext(device=torch.device(device))
        self.datamanager = config.datamanager.setup(
            device=device,
            test_mode=test_mode,
            world_size=self.ctx.world_size,
            local_rank=self.ctx.local_rank,
            seed=seed,
            dist_ctx=self.ctx,  # the local ranks of a host share one store of the training files
        )
        seed_pts = None
        outputs = getattr(self.datamanager, "train_dataparser_outputs", None)
        if outputs is not None and "points3D_xyz" in outputs.metadata:
            seed_pts = (outputs.metadata["points3D_xyz"], outputs.metadata["points3D_rgb"])
        if self.datamanager.train_dataset is None:
            raise UserError("the datamanager produced no training dataset; check --data")
        mode_class = parallel_mode_class(config.parallel)
        shard = mode_class.initial_shard(self.ctx)
        # Every rank draws the initial Gaussians (or its block of them) from rank 0's generator state.
        torch.set_rng_state(broadcast_object(self.ctx, torch.get_rng_state()))
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
            gaussian_shard=shard,
        )
        # A run whose initial Gaussians pass the memory budget stops here, before any training.
        model = self.model
        budget = RankBudget.for_run(
            self.ctx, config.memory_budget, model.rows, model.means.element_size(), bool(model.densifier.statistics),
            batch_size=config.batch_size, sharded=shard is not None, headroom=SHARD_BOUND,
        )  # fmt: skip
        self.model.to(device)
        self.world_size = self.ctx.world_size
        # What every rank holds whole (Gaussians unless sharded, camera adjustments, grids) is rank 0's.
        broadcast_tensors_(
            self.ctx,
            [p.data for n, p in self.model.named_parameters() if shard is None or not n.startswith("gauss_params.")],
        )
        # The parallel mode, once: the step calls it and never asks which it is (parallel/).
        self.mode = mode_class(self.ctx, self.model, budget)
        #: The rank's memory budget (``--pipeline.memory-budget``; None without one): the caps it
        #: sets on the densifier at each event (``gaussians/budget_measured.py``).
        self.budget = budget
        self.evaluation = PipelineEval(self.datamanager, self.model)
        self._training_configured = False
        train_cameras = self.datamanager.train_dataset.cameras
        heights = [int(h) for h in train_cameras.height.reshape(-1).tolist()]
        self._image_sizes = list(zip([int(w) for w in train_cameras.width.reshape(-1).tolist()], heights, strict=False))
        # Costs in the unit of the renderer this rank uses, and its fixed cost per band (the same on
        # every rank: one device type).
        backend = resolve_backend(self.model.config.rendering_backend, self.ctx.device)
        planner = BandPlanner(
            config.partition, heights, cost_unit=WORK_UNITS[backend], band_cost_fraction=BAND_COST_FRACTIONS[backend]
        )
        # The step's phases, each an object of its own: the balance (plan, measure) and the render
        # (forward, backward); the data is the datamanager's ``step_batch``.
        self.balance = StepBalance(self.ctx, planner, self.mode, self.model, self._host_cameras)
        self.band_pass = BandPass(self.ctx, self.mode, self.model)
        self.images_fetched_on_demand = 0
        # Found by nerfstudio's viewer on the pipeline: new browser clients open at a training view.
        self.viewer_start_view = StartAtTrainingView(
            self.datamanager.train_dataset.cameras.camera_to_worlds[0].numpy(force=True)
        )

    # ------------------------------------------------------------------ checkpoint state
    def get_extra_state(self) -> dict[str, Any]:
        """The balancer's cost history travels with checkpoints (a resumed run balances at once)."""
        return {"planner": self.balance.planner.state_dict()}

    def set_extra_state(self, state: Any) -> None:
        if isinstance(state, dict) and "planner" in state and hasattr(self, "balance"):
            self.balance.planner.load_state_dict(state["planner"])

    @property
    def model(self) -> DistSplatModel:
        return self._model  # type: ignore[return-value]

    # ------------------------------------------------------------------ eval (nerfstudio's)
    def get_eval_image_metrics_and_images(self, step: int) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """One eval image's metrics and images, in eval mode (``PipelineEval.one_image``).

        **Collective:** where the mode's views are (``PipelineEval.one_image``).
        """
        with eval_mode(self):
            return self.evaluation.one_image(step)

    def get_average_eval_image_metrics(
        self, step: int | None = None, output_path: Path | None = None, get_std: bool = False
    ) -> dict[str, float]:
        """Every eval image's metrics averaged, in eval mode (``PipelineEval.average``).

        **Collective:** where the mode's views are (``PipelineEval.average``).
        """
        del step  # nerfstudio's signature: the images and the model say everything
        with eval_mode(self):
            return self.evaluation.average(output_path, get_std)

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

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """Every parameter the optimizers update, in the same order on every rank."""
        return [p for _, p in self._named_trainable_parameters()]

    def _named_trainable_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(name.removeprefix("gauss_params."), p) for name, p in self.model.named_parameters() if p.requires_grad]

    # ------------------------------------------------------------------ around the loop (the mode's answers)
    @property
    def evaluates_here(self) -> bool:
        """Whether this rank renders eval images (``ParallelMode.evaluates_here``: rank 0 alone, or
        every rank where views are collective); the same at every step."""
        return self.mode.evaluates_here

    @property
    def views_are_collective(self) -> bool:
        """Whether every rank renders each eval image and viewer frame (``ParallelMode.views_are_collective``)."""
        return self.mode.views_are_collective

    def viewer_lock(self, train_lock: Any) -> Any:
        """The lock the viewer thread holds while it renders (``ParallelMode.viewer_lock``)."""
        return self.mode.viewer_lock(train_lock)

    def close_views(self) -> None:
        """Training is over on every rank (``ParallelMode.close_views``). Local."""
        self.mode.close_views()

    @property
    def writes_shards(self) -> bool:
        """Whether every rank writes its shard of a checkpoint (``ParallelMode.writes_shards``)."""
        return self.mode.writes_shards

    def write_shards(
        self, folder: Path, optimizers: Mapping[str, torch.optim.Optimizer], payload: dict[str, Any]
    ) -> int:
        """This rank's part of a ``step-N.dcp`` checkpoint written into ``folder``; returns its bytes
        (``ParallelMode.write_shards``). **Collective** as DCP's save."""
        return self.mode.write_shards(folder, optimizers, payload)

    def gather_full_state(self, optimizers: Mapping[str, torch.optim.Optimizer]) -> GatheredState | None:
        """The whole model and optimizer state to save, on rank 0 (``ParallelMode.gather_full_state``;
        None where this rank's ``state_dict()`` is the whole model, or on other ranks)."""
        return self.mode.gather_full_state(optimizers)

    def read_checkpoint(self, path: Path) -> dict[str, Any]:
        """A checkpoint as this rank loads it: the whole model or its block (``ParallelMode.read_checkpoint``;
        a collective for a ``step-N.dcp`` folder)."""
        return self.mode.read_checkpoint(path)

    # ------------------------------------------------------------------ the step
    def train_step(self, step: int, optimizers: Optimizers) -> StepReport:
        """One training step on this rank, every phase in order: the data, the balance's plan,
        the render phase's forward and backward, the gradient sum with the statistics and the
        finite verdict, the balance's measurement, the optimizer, densification, the replica check.

        Args:
            step: The step (the batch is ``step``'s on every rank).
            optimizers: nerfstudio's optimizers and schedulers of the trainable parameters.

        Returns:
            What the step did, for logging.

        Raises:
            NonFiniteGradientError: a gradient holds NaN/Inf (before the optimizer step).
            ReplicaDriftError: the ranks' replicated parameters differ after the step.

        **Collective:** world group, in this order on every rank: the mode's Gaussian count (sharded:
        on the first step and the first after one that may change shards), the footprint priors'
        reduction (cold cameras only), per camera group the projections (an exchange where each
        rank holds a shard), the SSIM-halo all-gather (where the plan cuts an image) and the mode's
        backward (the reverse exchange), the mode's gradient reduction (replicated: its buckets
        started during the last backward, the rest right after it), with
        ``output_depth_during_training`` the depth fill's max all-reduce, statistics (while
        densification runs) and finite verdict, the cost all-gather (with the verdict) and a
        viewer frame's broadcast and render (only when rank 0 took one), the refine's id gather
        and after-refine and, every ``replica_check_every`` steps, the replica digest.
        **Host sync:** the gathered tile costs with the finite verdict (one copy, every step: the
        next cut needs them), refine steps, the replica digest.
        """
        if not self._training_configured:
            self.configure_training(start_step=step)
        optimizers.zero_grad_all()
        clock = PhaseClock()
        data = self.datamanager.step_batch(step)  # the step's one call into the data
        batch = data.camera_ids
        cameras = BatchCameras(batch, self._host_cameras, [self._image_sizes[c] for c in batch])
        num_gaussians = self.mode.num_gaussians_total()
        plan = self.balance.plan(step, batch)
        images = data.on_device(plan.positions(self.ctx.rank))
        clock.add("data_wait", images.wait_s)
        self.images_fetched_on_demand += images.num_fetched_on_demand
        named = self._named_trainable_parameters()
        # Buckets start during the last backward, unless a test reads the gradients before the sum.
        gradient_sum = self.mode.gradient_sum(named, overlap=before_gradient_sum_hook is None)
        result, sources, moved = self.band_pass.run(step, cameras, plan, images, clock, gradient_sum)
        densifier = self.model.densifier
        with clock.phase("all_reduce"):
            if before_gradient_sum_hook is not None:
                before_gradient_sum_hook(step, self.ctx.rank, self.model)
            moved += gradient_sum.finish()  # before any other collective: the rest of the buckets
            clock.add("exposed_comm", gradient_sum.exposed_s)
            info, statistics_bytes = None, 0
            if densifier.needs_statistics(step):  # None after the stop, and always under MCMC
                with clock.communicating():
                    info, statistics_bytes = self.mode.statistics(
                        sources, self.config.batch_size, cameras.sizes_px(range(len(batch)), plan.downscale)
                    )
            verdict = (
                self.mode.finite_verdict(named)
                if step_check(step, self.config.check_finite_every, run_at_zero=True)
                else None
            )
        self.band_pass.fill_depths(result, len(batch))
        # The costs' gather carries the verdict: the check costs no extra sync.
        measured = self.balance.measure(plan, batch, result, verdict, clock)
        raise_if_nonfinite(measured.nonfinite, named, step)
        with clock.phase("optimizer"):
            optimizers.optimizer_step_all()
            optimizers.scheduler_step_all(step)
        with clock.phase("densify"):
            # The strategy (default or MCMC) decides what this step does; the mode how it is gathered;
            # the memory budget how far it may grow.
            if self.budget is not None and densifier.changes_shards_at(step):
                self.budget.apply_caps(densifier, len(self.model.rows))
            densifier.after_optimizer(self.model.rows.bound(optimizers.optimizers), step, info, self.mode.gather_ids)
            moved += self.mode.after_refine(step, optimizers.optimizers)
        if step_check(step, self.config.replica_check_every, run_at_zero=True):
            self.mode.check_replicas(named, step)
        return StepReport(
            loss=result.loss.detach(),
            l1=result.l1,
            dssim=result.dssim,
            loss_terms=result.loss_terms,
            num_gaussians=num_gaussians,
            timings=StepTimings.from_clock(clock),
            bytes_communicated=moved + statistics_bytes,
            measured_imbalance=measured.measured_imbalance,
            predicted_imbalance=plan.predicted_imbalance,
            time_imbalance=measured.time_imbalance,
            band_depths=result.band_depths,
        )

    def _host_cameras(self, camera_ids: Sequence[int]) -> Any:
        """The training cameras ``camera_ids``, host-side, each carrying its id (the camera
        optimizer adjusts each by its own: ``model/camera_adjust.py``)."""
        cameras = self.datamanager.train_dataset.cameras[torch.tensor(list(camera_ids), dtype=torch.long)]
        return with_train_camera_ids(cameras, camera_ids)

    def memory_budget_summary(self) -> dict[str, Any] | None:
        """The run summary's ``memory_budget`` (``RankBudget.summary``), None without a budget."""
        return None if self.budget is None else self.budget.summary(self.model.densifier.refused_total)

    def balance_summary(self) -> dict[str, Any]:
        """Balance figures for the run summary (measured after the first epoch: before it, most
        cameras have only a footprint prior)."""
        warmup = steps_to_cover(len(self.datamanager.train_dataset), self.config.batch_size)
        return {
            "partition": self.config.partition,
            **self.balance.summary(warmup_steps=warmup),
            "images_fetched_on_demand": self.images_fetched_on_demand,
        }
