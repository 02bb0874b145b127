"""DistSplatTrainer: nerfstudio's trainer with a process lifecycle of its own.

What it changes against nerfstudio's ``Trainer`` (docs/distributed.md says why):

* it creates or adopts the process group (torchrun, nerfstudio's launcher, or none), binds each
  process to its device (``set_device``), and makes all ranks agree on one run timestamp and seed;
* rank 0 alone runs the viewer, writers, progress display, and evaluation where the parallel mode
  renders views on rank 0 alone (sharded: every rank renders each eval image); checkpoints are
  rank 0's single file (replicated) or every rank's shard (sharded, ``step-N.dcp``, consolidated
  params-only into ``step-N.ckpt`` at the end for nerfstudio's tools), written and loaded by the
  trainer's ``TrainerCheckpoints`` (``trainer/checkpoints.py``, ``checkpoint.py``);
* a step is one call, ``DistSplatPipeline.train_step`` (forward of this rank's bands, backward,
  the parallel mode's reduction, optimizer step, densification: ``pipeline/distsplat_pipeline.py``); what the
  parallel mode changes around the loop -- which ranks render eval images and viewer frames, what a
  checkpoint holds and what a rank loads of one -- is asked of the pipeline, which answers with its
  parallel mode's (``parallel/``); what it logs of a step comes in the step's ``StepReport``;
* ``max_num_iterations`` counts training images; the number of steps is that over the batch size;
* checkpoints are written atomically (temporary file or folder, then rename) and load under torch >= 2.6's
  ``weights_only`` default; optimizers are built after the checkpoint's Gaussians are loaded, so
  a resumed run optimises the parameters it loaded -- on any number of processes;
* the lifecycle never loses work: the output folder is probed before the first step, a resume
  with nothing left to train exits 0 without writing, SIGINT/SIGTERM stop every rank after the
  same step and save it, a failed save fails every rank with rank 0's reason, and start-up phases
  are named barriers (``distributed/lifecycle.py``);
* on CPU, freed host memory is kept for the next steps instead of being page-faulted in anew each
  step (glibc malloc's thresholds: ``utils/host_allocator.py``);
* bad input (:class:`~distsplat_ns.utils.errors.UserError`) and run failures are reported as their
  whole message, once when every rank fails alike; internal errors keep their traceback.
"""

from __future__ import annotations

import dataclasses
import functools
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from nerfstudio.engine.callbacks import TrainingCallbackAttributes, TrainingCallbackLocation
from nerfstudio.engine.optimizers import Optimizers
from nerfstudio.engine.trainer import Trainer, TrainerConfig
from nerfstudio.utils import profiler, writer
from nerfstudio.utils.decorators import check_eval_enabled
from nerfstudio.utils.misc import step_check
from nerfstudio.utils.rich_utils import CONSOLE
from nerfstudio.utils.writer import EventName, TimeWriter

from distsplat_ns.checkpoint import probe_writable
from distsplat_ns.distributed.collectives import broadcast_object
from distsplat_ns.distributed.context import DistBackend, DistContext, init_distributed, shutdown_distributed
from distsplat_ns.distributed.lifecycle import (
    agree_outcome,
    any_rank_true,
    enter_phase,
    finish_phase,
    rank0_work,
    startup_phase,
)
from distsplat_ns.distributed.reporting import remove_unused_run_dir, report_user_errors
from distsplat_ns.distributed.restart import AttemptLog, elastic_run_id, previous_timestamp, restart_count
from distsplat_ns.model.camera_adjust import camera_optimizer_metrics
from distsplat_ns.pipeline.distsplat_pipeline import DistSplatPipeline
from distsplat_ns.rendering import resolve_backend
from distsplat_ns.trainer.checkpoints import TrainerCheckpoints
from distsplat_ns.trainer.optimizer_rules import float64_optimizer_configs, scaled_optimizer_configs
from distsplat_ns.trainer.optimizer_step import FusedAdamOptimizers
from distsplat_ns.trainer.run_record import (
    STATS_FILENAME,
    RunRecord,
    optimizer_state_bytes,
    peak_memory_bytes,
    reduce_log_figures,
    write_run_summary,
)
from distsplat_ns.utils.errors import UserError
from distsplat_ns.utils.host_allocator import keep_freed_host_memory
from distsplat_ns.utils.logging import get_logger
from distsplat_ns.utils.signals import StopSignals
from distsplat_ns.utils.steps import steps_to_cover

LOGGER = get_logger(__name__)


@dataclass
class DistSplatTrainerConfig(TrainerConfig):
    """nerfstudio's trainer configuration plus the distributed lifecycle's settings."""

    _target: type = field(default_factory=lambda: DistSplatTrainer)
    collective_timeout_s: float = 600.0
    """Seconds a collective may wait for a rank before the run fails on every rank (a dead rank ends the run instead of hanging it)."""
    dist_backend: DistBackend = "auto"
    """torch.distributed backend under torchrun: "auto" is NCCL on GPUs and gloo on CPUs; gloo on GPUs lets several ranks share one GPU."""
    rank0_work_timeout_s: float = 3600.0
    """Seconds the other ranks wait for rank 0's own work (evaluation, checkpoint writing, viewer pause) while its heartbeat says it is alive; that work never counts against --collective-timeout-s, and a dead rank 0 is still found within it."""
    existing_checkpoints: Literal["resume", "refuse"] = "resume"
    """A fresh launch (no --load-dir/--load-checkpoint) into a run folder that already holds checkpoints (same --output-dir, --experiment-name, --timestamp): "resume" continues from the latest, "refuse" stops with an error. A torchrun restart always resumes: starting over would write over the run's checkpoints."""

    def __post_init__(self) -> None:
        if self.collective_timeout_s <= 0:
            raise ValueError(f"--collective-timeout-s must be > 0, got {self.collective_timeout_s}")
        if self.rank0_work_timeout_s <= 0:
            raise ValueError(f"--rank0-work-timeout-s must be > 0, got {self.rank0_work_timeout_s}")


class DistSplatTrainer(Trainer):
    """See the module docstring. Checkpoints are loaded and written by its ``checkpoints``, a
    ``trainer/checkpoints.py:TrainerCheckpoints`` built in :meth:`setup`."""

    config: DistSplatTrainerConfig
    pipeline: DistSplatPipeline

    @report_user_errors
    def __init__(self, config: DistSplatTrainerConfig, local_rank: int = 0, world_size: int = 1) -> None:
        if config.mixed_precision:
            raise UserError("distsplat does not support --mixed-precision True")
        self.ctx: DistContext = init_distributed(
            config.machine.device_type,
            timeout_s=config.collective_timeout_s,
            local_rank_hint=local_rank,
            backend=config.dist_backend,
            rank0_work_timeout_s=config.rank0_work_timeout_s,
        )
        # On CPU the step's tensors are host memory: reuse it rather than fault it in anew each step.
        if self.ctx.device.type == "cpu" and not keep_freed_host_memory():
            LOGGER.info("the C library is not glibc: freed host memory is left to its allocator's defaults")
        self.seed, self.timestamp = self._agree_run_identity(config)
        super().__init__(config, local_rank=self.ctx.local_rank, world_size=self.ctx.world_size)
        # The agreed run folder (rank 0's timestamp); the config keeps what this rank was given.
        self.base_dir = config.get_base_dir().parent / self.timestamp
        self.checkpoint_dir = self.base_dir / config.relative_model_dir
        self.device = str(self.ctx.device)
        self._nothing_to_train = False
        self.record = RunRecord()
        self.attempts = AttemptLog(self.base_dir, enabled=self.ctx.is_main)
        # The last step every image was evaluated at (on every rank that evaluates: the final eval's test).
        self._last_eval_all_step: int | None = None

    # ------------------------------------------------------------------ lifecycle
    def _agree_run_identity(self, config: DistSplatTrainerConfig) -> tuple:
        """One seed and one timestamp for every rank (rank 0's), and one global RNG state.

        nerfstudio seeds each process with ``seed + rank`` and stamps each with its own clock;
        under torchrun that means one output folder per rank. Rank 0's values win; the config is
        left as it was built (the trainer keeps the agreed values: ``self.seed``, ``self.timestamp``).

        Returns:
            ``(seed, timestamp)``.
        """
        timestamp = config.timestamp
        if self.ctx.is_main and restart_count() > 0:
            # A torchrun restart re-runs ns-train, which stamps a new timestamp: continue the folder
            # of this job's earlier attempt (found by torchrun's run id), as --timestamp would.
            timestamp = previous_timestamp(config.get_base_dir().parent, elastic_run_id()) or timestamp
        agreed = broadcast_object(self.ctx, {"timestamp": timestamp, "seed": config.machine.seed})
        if agreed["timestamp"] != config.timestamp:
            # ns-train already wrote this rank's config.yml under its own timestamp: remove that
            # folder if it holds nothing else (it was created by this same command moments ago).
            remove_unused_run_dir(config.get_base_dir())
        torch.manual_seed(agreed["seed"])
        np.random.seed(agreed["seed"] % (2**32))
        return agreed["seed"], agreed["timestamp"]

    @report_user_errors
    def setup(self, test_mode: Literal["test", "val", "inference"] = "val") -> None:
        """Build the run; every check that can fail comes before the first step.

        Start-up phases are named barriers (``distributed/lifecycle.py``): a rank that does not
        finish one within ``--collective-timeout-s`` is reported by rank and phase.
        """
        with startup_phase(self.ctx, "output folder check"):
            agree_outcome(
                self.ctx,
                f"creating and writing the checkpoint folder {self.checkpoint_dir}",
                functools.partial(probe_writable, self.checkpoint_dir),
            )
        enter_phase(self.ctx, "pipeline setup")
        self.pipeline = self.config.pipeline.setup(
            device=self.device,
            test_mode=test_mode,
            world_size=self.ctx.world_size,
            local_rank=self.ctx.local_rank,
            grad_scaler=self.grad_scaler,
            dist_ctx=self.ctx,
            seed=self.seed,
        )
        finish_phase(self.ctx, "pipeline setup")
        self.checkpoints = TrainerCheckpoints(
            self.ctx,
            self.checkpoint_dir,
            self.pipeline,
            self.record,
            self.attempts,
            keep_only_latest=self.config.save_only_latest_checkpoint,
        )
        with startup_phase(self.ctx, "checkpoint load"):
            loaded = self.checkpoints.load(self.config)
        if loaded is not None:
            self._start_step = int(loaded["step"]) + 1
        if self._start_step >= self.num_steps:
            # Nothing to write: saving here would store the loaded model under step 0 and, with
            # --save-only-latest-checkpoint, delete the checkpoint just loaded.
            self._nothing_to_train = True
            return
        self.optimizers = self.setup_optimizers()
        if loaded is not None:
            self.optimizers.load_optimizers(loaded["optimizers"])
            if "schedulers" in loaded and self.config.load_scheduler:
                self.optimizers.load_schedulers(loaded["schedulers"])
        enter_phase(self.ctx, "writers ready")
        banner_messages = None
        self.viewer_state = None
        if self.ctx.is_main and self.config.is_viewer_enabled():
            from nerfstudio.viewer.viewer import Viewer as ViewerState

            datapath = self.config.data if self.config.data is not None else self.base_dir
            self.viewer_state = ViewerState(
                self.config.viewer,
                log_filename=self.base_dir / self.config.viewer.relative_log_filename,
                datapath=datapath,
                pipeline=self.pipeline,
                trainer=self,
                train_lock=self.pipeline.viewer_lock(self.train_lock),
                share=self.config.viewer.make_share_url,
            )
            banner_messages = self.viewer_state.viewer_info
        if self.config.is_viewer_legacy_enabled():
            raise UserError("distsplat does not support --vis viewer_legacy; use --vis viewer")
        self.callbacks = self.pipeline.get_training_callbacks(
            TrainingCallbackAttributes(
                optimizers=self.optimizers, grad_scaler=self.grad_scaler, pipeline=self.pipeline, trainer=self
            )
        )
        writer_log_path = self.base_dir / self.config.logging.relative_log_dir
        logging_config = self.config.logging
        if self.ctx.is_main:
            writer.setup_event_writer(
                self.config.is_wandb_enabled(),
                self.config.is_tensorboard_enabled(),
                self.config.is_comet_enabled(),
                log_dir=writer_log_path,
                experiment_name=self.config.experiment_name,
                project_name=self.config.project_name,
            )
        else:
            # Other ranks keep nerfstudio's buffers (timers write into them) but show nothing.
            logging_config = dataclasses.replace(
                logging_config, local_writer=dataclasses.replace(logging_config.local_writer, enable=False)
            )
        writer.setup_local_writer(logging_config, max_iter=self.num_steps, banner_messages=banner_messages)
        if self.ctx.is_main:
            writer.put_config(name="config", config_dict=dataclasses.asdict(self.config), step=0)
        profiler.setup_profiler(self.config.logging, writer_log_path)
        finish_phase(self.ctx, "writers ready")

    @property
    def num_steps(self) -> int:
        """Optimizer steps in this run: ``max_num_iterations`` images over the batch size."""
        return steps_to_cover(self.config.max_num_iterations, self.pipeline.config.batch_size)

    def setup_optimizers(self) -> Optimizers:
        configs = self.config.optimizers
        if self.pipeline.config.model.param_dtype == "float64":
            configs = float64_optimizer_configs(configs)
        configs = scaled_optimizer_configs(configs, self.pipeline.config.batch_size)
        # One multi-tensor Adam step over every group (trainer/optimizer_step.py); state and schedulers as nerfstudio's.
        return FusedAdamOptimizers(configs, self.pipeline.get_param_groups())

    # ------------------------------------------------------------------ training loop
    @report_user_errors
    def train(self) -> None:
        """Train from the loaded step to ``num_steps``; see :meth:`_train_steps` for stopping.

        Raises:
            SystemExit: ``128 + signal`` after a SIGINT/SIGTERM stop (its checkpoint written).
        """
        if self._nothing_to_train:
            if self.ctx.is_main:
                CONSOLE.print(
                    f"Nothing left to train: the checkpoint's step {self._start_step - 1} is the last of "
                    f"--max-num-iterations {self.config.max_num_iterations} ({self.num_steps} steps); nothing written."
                )
            if self.ctx.is_main:
                remove_unused_run_dir(self.base_dir)  # a resume into a new folder leaves none behind
            shutdown_distributed()
            return
        dm = self.pipeline.datamanager
        if self.ctx.is_main and hasattr(dm, "train_dataparser_outputs"):
            dm.train_dataparser_outputs.save_dataparser_transform(self.base_dir / "dataparser_transforms.json")
        self._init_viewer_state()
        self.attempts.begin(self._start_step, self.ctx.world_size)
        self.pipeline.configure_training(start_step=self._start_step)
        enter_phase(self.ctx, "first step")  # watched like start-up: the first batch, the first collectives
        t_start = time.perf_counter()
        self.stop_training = False
        try:
            with StopSignals() as signals, TimeWriter(writer, EventName.TOTAL_TRAIN_TIME):
                last_step = self._train_steps(signals)
        finally:
            self.record.train_wall_s += time.perf_counter() - t_start
        if signals.requested or last_step < self.num_steps - 1:
            self._after_stop(last_step, signals.signum)
            return
        self._after_train()

    def _train_steps(self, signals: StopSignals) -> int:
        """Run steps until the last one or an agreed stop; returns the last step completed
        (``self._start_step - 1`` when none was).

        A stop -- SIGINT/SIGTERM on any rank, or the viewer's stop on rank 0 -- is agreed by all
        ranks after every step (:func:`any_rank_true`, one int over gloo: no GPU sync), so every
        rank leaves after the same step. Eval runs on the ranks ``pipeline.evaluates_here`` names (all
        of them where a view is a collective), at the same steps.
        """
        last_step = self._start_step - 1
        for step in range(self._start_step, self.num_steps):
            self.step = step
            with rank0_work(
                self.ctx, f"paused in the viewer before step {step}", active=self.config.is_viewer_enabled()
            ):
                while self.training_state == "paused" and not self.stop_training and not signals.requested:
                    time.sleep(0.01)
            with self.train_lock, TimeWriter(writer, EventName.ITER_TRAIN_TIME, step=step) as train_t:
                self.pipeline.train()
                for callback in self.callbacks:
                    callback.run_callback_at_location(step, location=TrainingCallbackLocation.BEFORE_TRAIN_ITERATION)
                loss, loss_dict, metrics_dict = self.train_iteration(step)
                for callback in self.callbacks:
                    callback.run_callback_at_location(step, location=TrainingCallbackLocation.AFTER_TRAIN_ITERATION)
            last_step = step
            if step == self._start_step:
                enter_phase(self.ctx, "training", watch=False)
            self.record.step_times.append(train_t.duration)
            if step > 1:
                writer.put_time(
                    name=EventName.TRAIN_RAYS_PER_SEC,
                    duration=self.pipeline.datamanager.get_train_rays_per_batch()
                    * self.pipeline.config.batch_size
                    / max(0.001, train_t.duration),
                    step=step,
                    avg_over_steps=True,
                )
            with rank0_work(self.ctx, f"updating the viewer after step {step}", active=self.config.is_viewer_enabled()):
                self._update_viewer_state(step)
            if step_check(step, self.config.logging.steps_per_log, run_at_zero=True) and self.ctx.is_main:
                writer.put_scalar(name="Train Loss", scalar=loss, step=step)
                writer.put_dict(name="Train Loss Dict", scalar_dict=loss_dict, step=step)
                writer.put_dict(name="Train Metrics Dict", scalar_dict=metrics_dict, step=step)
            # Replicated, rank 0 evaluates alone and the others wait in a rank-0 window (not in a
            # collective whose timeout the eval would exhaust); where views are collective, every rank renders.
            eval_window = self._evaluates_at(step) and not self.pipeline.views_are_collective
            with rank0_work(self.ctx, f"evaluating after step {step}", active=eval_window):
                if self.pipeline.evaluates_here and self.pipeline.datamanager.eval_dataset:
                    with self.train_lock, self.record.timing_eval():
                        self.eval_iteration(step)
            if step_check(step, self.config.steps_per_save):
                self.save_checkpoint(step)
            writer.write_out_storage()
            if any_rank_true(self.ctx, signals.requested or self.stop_training):
                break
        return last_step

    def _evaluates_at(self, step: int) -> bool:
        """Whether eval images are rendered after ``step`` (:meth:`eval_iteration`'s conditions:
        config and step only, so every rank computes the same answer)."""
        config = self.config
        if not (config.is_wandb_enabled() or config.is_tensorboard_enabled() or config.is_comet_enabled()):
            return False  # eval_iteration's @check_eval_enabled
        if not self.pipeline.datamanager.eval_dataset:
            return False
        return step_check(step, config.steps_per_eval_image) or step_check(
            step, config.steps_per_eval_all_images, run_at_zero=True
        )

    def train_iteration(self, step: int):  # type: ignore[override]
        """One step (``DistSplatPipeline.train_step``), then what nerfstudio's loop logs.

        Returns:
            ``(loss, loss_dict, metrics_dict)``; on logging steps the losses are the whole batch's
            (the ranks' shares summed: every rank logs on the same steps, so the all-reduce lines up).
        """
        report = self.pipeline.train_step(step, self.optimizers)
        self.record.add_step(report, self.pipeline.config.batch_size)
        loss_dict = {"main_loss": report.loss}
        metrics_dict: dict[str, Any] = {"gaussian_count": report.num_gaussians}
        if step_check(step, self.config.logging.steps_per_log, run_at_zero=True):
            # One all-reduce carries the losses and every rank's figures (trainer/run_record.py).
            # The named terms (e.g. MCMC's regularizers) have the same keys on every rank: summed, the whole model's.
            names = ("main_loss", "l1", "dssim", *report.loss_terms)
            losses, per_rank = reduce_log_figures(
                self.ctx,
                [report.loss, report.l1, report.dssim, *report.loss_terms.values()],
                report,
                self.pipeline.model.num_points,
            )
            loss_dict = dict(zip(names, losses, strict=True))
            for key, value in report.timings.as_dict().items():
                metrics_dict[f"time_{key}_s"] = value
            if self.ctx.is_main and self.ctx.is_distributed:
                writer.put_dict(
                    name="Per-rank",
                    scalar_dict={f"rank{r}/{k}": v for r, figures in enumerate(per_rank) for k, v in figures.items()},
                    step=step,
                )
            metrics_dict["bytes_communicated"] = report.bytes_communicated
            metrics_dict["balance_measured_imbalance"] = report.measured_imbalance
            metrics_dict["balance_predicted_imbalance"] = report.predicted_imbalance
            metrics_dict["balance_time_imbalance"] = report.time_imbalance
            # Splatfacto's camera_opt_* metrics (replicated adjustments: the same on every rank).
            metrics_dict.update(camera_optimizer_metrics(self.pipeline.model.camera_optimizer))
        return loss_dict["main_loss"], loss_dict, metrics_dict

    @check_eval_enabled
    def eval_iteration(self, step: int) -> None:
        """One eval image every ``steps_per_eval_image``, all of them every
        ``steps_per_eval_all_images`` (recorded in the run summary), on the ranks
        ``pipeline.evaluates_here`` names; rank 0 writes what it measured.

        **Collective:** where the mode's views are (sharded: every rank, at the same steps).
        """
        if not self.pipeline.evaluates_here:
            return
        if step_check(step, self.config.steps_per_eval_image):
            with TimeWriter(writer, EventName.TEST_RAYS_PER_SEC, write=False) as test_t:
                metrics_dict, images_dict = self.pipeline.get_eval_image_metrics_and_images(step=step)
        if step_check(step, self.config.steps_per_eval_image) and self.ctx.is_main:
            writer.put_time(
                name=EventName.TEST_RAYS_PER_SEC,
                duration=metrics_dict["num_rays"] / max(test_t.duration, 1e-9),
                step=step,
                avg_over_steps=True,
            )
            writer.put_dict(name="Eval Images Metrics", scalar_dict=metrics_dict, step=step)
            for image_name, image in images_dict.items():
                writer.put_image(name="Eval Images/" + image_name, image=image, step=step)
        # Also at step 0: the initial model's PSNR is the baseline the summary's history starts from.
        if step_check(step, self.config.steps_per_eval_all_images, run_at_zero=True):
            self._eval_all(step)

    def _eval_all(self, step: int) -> float | None:
        metrics = self.pipeline.get_average_eval_image_metrics(step=step)
        self._last_eval_all_step = step
        if not self.ctx.is_main:
            return None
        writer.put_dict(name="Eval Images Metrics Dict (all images)", scalar_dict=metrics, step=step)
        psnr = float(metrics["psnr"]) if "psnr" in metrics else None
        if psnr is not None:
            self.record.add_eval(step, psnr)
        return psnr

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, step: int) -> None:
        """Write checkpoint ``step`` (``TrainerCheckpoints.save``: every rank's shard, or rank 0's
        single file); every rank learns whether it worked.

        **Collective:** world group (``TrainerCheckpoints.save``).
        """
        self.checkpoints.save(step, self.optimizers, self.grad_scaler)

    def _save_unless_saved(self, step: int) -> None:
        """Save ``step`` unless it was just saved or no step ran in this process; then, where
        ranks write shards, give nerfstudio's tools the last checkpoint as their single file."""
        if step >= self._start_step and self.checkpoints.last_saved_step != step:
            self.save_checkpoint(step)
        self.checkpoints.consolidate_last()

    # ------------------------------------------------------------------ end
    def _after_stop(self, last_step: int, signum: int | None) -> None:
        """End a run stopped early on every rank: checkpoint of the last completed step, summary,
        then exit ``128 + signal`` (a stop from the viewer ends normally)."""
        self._save_unless_saved(last_step)
        self.attempts.end(last_step, "stopped by " + ("the viewer" if signum is None else signal.Signals(signum).name))
        self._write_stats()
        writer.write_out_storage()
        if self.ctx.is_main:
            saved = (
                f"checkpoint step-{last_step:09d}.ckpt in {self.checkpoint_dir}"
                if last_step >= self._start_step
                else "no step ran; nothing saved"
            )
            CONSOLE.print(
                f"[bold yellow]distsplat stopped after step {last_step}[/bold yellow]: {saved}", soft_wrap=True
            )
        shutdown_distributed()
        if signum is not None:
            raise SystemExit(128 + signum)

    def _after_train(self) -> None:
        self.training_state = "completed"
        self._save_unless_saved(self.step)
        self.attempts.end(self.step, "completed")
        final_eval = bool(self.pipeline.datamanager.eval_dataset) and self._last_eval_all_step != self.step
        with rank0_work(
            self.ctx, f"evaluating after the last step {self.step}", active=not self.pipeline.views_are_collective
        ):
            if self.pipeline.evaluates_here and final_eval:
                with self.record.timing_eval():
                    self._eval_all(self.step)
        self._write_stats()
        writer.write_out_storage()
        if self.ctx.is_main:
            CONSOLE.print(
                f"[bold green]distsplat training finished[/bold green]: config {self.base_dir / 'config.yml'}",
                soft_wrap=True,
            )
            CONSOLE.print(
                f"checkpoints in {self.checkpoint_dir}; run summary in {self.base_dir / STATS_FILENAME}", soft_wrap=True
            )
        for callback in self.callbacks:
            callback.run_callback_at_location(step=self.step, location=TrainingCallbackLocation.AFTER_TRAIN)
        self.pipeline.close_views()  # no more step boundaries to render viewer frames at
        if self.ctx.is_main and not self.config.viewer.quit_on_train_completion:
            self._train_complete_viewer()
        shutdown_distributed()

    def collect_stats(self) -> dict[str, Any]:
        """The run summary written to ``distsplat_stats.json`` (machine-readable)."""
        record = self.record
        budget = self.pipeline.memory_budget_summary()
        # The budget resets the allocator's peak at each event (gaussians/budget_measured.py): its figure covers the run.
        peak = max(peak_memory_bytes(self.ctx.device), budget["peak_device_bytes"] if budget else 0)
        return {
            **record.summary(),
            "attempts": self.attempts.attempts,
            "batch_size": self.pipeline.config.batch_size,
            "world_size": self.ctx.world_size,
            "parallel": self.pipeline.config.parallel,
            "final_gaussian_count": int(
                record.gaussian_count if record.gaussian_count is not None else self.pipeline.model.num_points
            ),
            "backend": resolve_backend(self.pipeline.model.config.rendering_backend, self.ctx.device),
            "device": str(self.ctx.device),
            "parameter_bytes": sum(p.numel() * p.element_size() for p in self.pipeline.trainable_parameters()),
            "optimizer_state_bytes": optimizer_state_bytes(getattr(self, "optimizers", None)),
            "local_gaussian_count": int(self.pipeline.model.num_points),
            "peak_memory_bytes": peak,
            "datamanager": self.pipeline.datamanager.stats() if hasattr(self.pipeline.datamanager, "stats") else {},
            "balance": self.pipeline.balance_summary(),
            "memory_budget": budget,
        }

    def _write_stats(self) -> None:
        write_run_summary(self.ctx, self.collect_stats(), self.base_dir / STATS_FILENAME)
