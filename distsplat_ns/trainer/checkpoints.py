"""Checkpoints of a ``DistSplatTrainer`` run: which one it resumes from, writing one (rank 0's single
file or every rank's shard), and the params-only file nerfstudio's tools load after a sharded run.

``TrainerCheckpoints`` is an object the trainer (``trainer/distsplat_trainer.py``) builds once its pipeline exists
and calls with what each call needs (the optimizers, the scaler, the steps); it keeps the last
step it saved.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from nerfstudio.engine.optimizers import Optimizers
from nerfstudio.engine.trainer import TrainerConfig
from nerfstudio.utils.rich_utils import CONSOLE
from torch.cuda.amp.grad_scaler import GradScaler

from distsplat_ns.checkpoint import (
    SHARDED_SUFFIX,
    checkpoint_payload,
    is_complete,
    save_checkpoint_atomic,
    save_sharded_checkpoint_atomic,
)
from distsplat_ns.distributed.collectives import all_gather_object, broadcast_object
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.distributed.lifecycle import agree_outcome
from distsplat_ns.distributed.restart import AttemptLog, choose_checkpoint, restart_count
from distsplat_ns.parallel.shard_checkpoint import consolidate_params
from distsplat_ns.pipeline.distsplat_pipeline import DistSplatPipeline
from distsplat_ns.trainer.run_record import RunRecord
from distsplat_ns.utils.errors import UserError


@dataclass(eq=False)
class TrainerCheckpoints:
    """Loading, saving and consolidating the checkpoints of one run (see the module docstring).

    Args:
        ctx: The process context.
        checkpoint_dir: The run's checkpoint folder (the agreed run folder's, on every rank).
        pipeline: The run's pipeline: its state, and how its parallel mode writes and reads a
            checkpoint (``writes_shards``, ``write_shards``, ``gather_full_state``, ``read_checkpoint``).
        record: The run record; a sharded save adds the bytes this rank wrote.
        attempts: Rank 0's attempt log; a replicated save records its step.
        keep_only_latest: ``--save-only-latest-checkpoint``.

    Attributes:
        last_saved_step: The step of the last checkpoint this process wrote; None before one.
    """

    ctx: DistContext
    checkpoint_dir: Path
    pipeline: DistSplatPipeline
    record: RunRecord
    attempts: AttemptLog
    keep_only_latest: bool
    last_saved_step: int | None = None

    def load(self, config: TrainerConfig) -> dict[str, Any] | None:
        """Load the checkpoint :meth:`checkpoint_to_load` chooses into the pipeline and restore
        the global RNG state it holds.

        Returns:
            The loaded checkpoint (its ``step`` is the last step it trained; its ``optimizers``
            and ``schedulers`` are the caller's to load), or None when the run starts fresh.
        """
        path = self.checkpoint_to_load(config)
        if path is None:
            return None
        # The whole model, or (sharded) this rank's rows of it, memory-mapped (parallel/).
        loaded = self.pipeline.read_checkpoint(path)
        try:
            self.pipeline.load_pipeline(loaded["pipeline"], int(loaded["step"]))
        except UserError as err:
            raise UserError(f"{path}: {err}") from None
        rng = loaded.get("distsplat", {}).get("torch_rng_state")
        if isinstance(rng, torch.Tensor):
            torch.set_rng_state(rng)
        if self.ctx.is_main:
            CONSOLE.print(
                f"Resumed from {path} at step {int(loaded['step']) + 1} on {self.ctx.world_size} process(es)",
                soft_wrap=True,
            )
        return loaded

    def checkpoint_to_load(self, config: TrainerConfig) -> Path | None:
        """Rank 0 decides (``distributed/restart.py:choose_checkpoint``: the run's latest checkpoint
        on a restart or a re-launch, else the --load-* flags of ``config``, a
        ``DistSplatTrainerConfig``) and every rank learns it; every rank must see the file (a
        shared output folder), or all fail naming it."""
        decision: dict[str, Any] = {}
        if self.ctx.is_main:
            try:
                choice = choose_checkpoint(
                    self.checkpoint_dir,
                    config.load_dir,
                    config.load_step,
                    config.load_checkpoint,
                    config.existing_checkpoints,
                    restart_count(),
                )
                decision = {"path": None if choice.path is None else str(choice.path), "reason": choice.reason}
            except UserError as err:
                decision = {"error": str(err)}
        decision = broadcast_object(self.ctx, decision)
        if "error" in decision:
            raise UserError(decision["error"])
        if self.ctx.is_main:
            CONSOLE.print(
                decision["reason"][0].upper() + decision["reason"][1:] + ".", soft_wrap=True
            )  # paths stay whole (copyable)
        if decision["path"] is None:
            return None
        path = Path(decision["path"])
        missing = [r for r, seen in enumerate(all_gather_object(self.ctx, is_complete(path))) if not seen]
        if missing:
            raise UserError(
                f"checkpoint {path} (rank 0's choice) is not readable on rank(s) {missing}: "
                "a resume needs the output folder shared by every host (--output-dir)"
            )
        return path

    def save(self, step: int, optimizers: Optimizers, grad_scaler: GradScaler) -> None:
        """Write checkpoint ``step`` atomically; every rank learns whether it worked.

        Sharded (``pipeline.writes_shards``): every rank writes its own rows into ``step-XXXXXXXXX.dcp``
        (``checkpoint.py:save_sharded_checkpoint_atomic``, ``parallel/shard_checkpoint.py``); the
        whole model is never gathered. Replicated: rank 0 writes nerfstudio's ``step-XXXXXXXXX.ckpt``.

        Raises:
            RunFailure: on every rank when a rank could not write (full or read-only disk, a
                failed rank's DCP write); the previous checkpoint is kept.

        **Collective:** world group: sharded, the DCP save and two outcome broadcasts; replicated,
        the outcome broadcast (it replaces a barrier).
        """
        extra = {
            "torch_rng_state": torch.get_rng_state(),
            "world_size": self.ctx.world_size,
            "parallel": self.pipeline.config.parallel,
        }
        if self.pipeline.writes_shards:
            payload = (
                checkpoint_payload(step, self.pipeline.state_dict(), optimizers, grad_scaler.state_dict(), extra)
                if self.ctx.is_main
                else {}
            )

            def write_shard(folder: Path) -> int:
                written = self.pipeline.write_shards(folder, optimizers.optimizers, payload)
                self.record.checkpoint_bytes_written += written
                return written

            save_sharded_checkpoint_atomic(self.ctx, self.checkpoint_dir, step, write_shard, self.keep_only_latest)
            self.last_saved_step = step
            return
        gathered = self.pipeline.gather_full_state(optimizers.optimizers)

        def write() -> Path:
            pipeline_state = self.pipeline.state_dict()
            if gathered is not None:
                pipeline_state = gathered.merged_into(pipeline_state)
            return save_checkpoint_atomic(
                checkpoint_dir=self.checkpoint_dir,
                step=step,
                pipeline_state=pipeline_state,
                optimizers=optimizers,
                scalers=grad_scaler.state_dict(),
                extra=extra,
                keep_only_latest=self.keep_only_latest,
                optimizer_states=None if gathered is None else gathered.optimizers,
            )

        agree_outcome(
            self.ctx,
            f"writing checkpoint step-{step:09d}.ckpt to {self.checkpoint_dir} (the previous checkpoint is kept)",
            write,
        )
        self.last_saved_step = step
        self.attempts.saved(step)

    def consolidate_last(self) -> None:
        """Sharded: rank 0 writes the params-only ``step-N.ckpt`` of this launch's last
        ``step-N.dcp`` (``shard_checkpoint.consolidate_params``: parameters streamed from the
        shards' files, no Adam state), which ``ns-export``/``ns-eval``/``ns-render``/``ns-viewer`` load.

        **Collective:** world group, one outcome broadcast (rank 0 reads and writes alone).
        """
        step = self.last_saved_step
        if not self.pipeline.writes_shards or step is None:
            return
        # Nothing after the last save reads the last step's gradients (n x 236 B at SH degree 3):
        # freed, rank 0 reads the whole model's parameters in their place.
        self.pipeline.model.zero_grad(set_to_none=True)
        folder = self.checkpoint_dir / f"step-{step:09d}{SHARDED_SUFFIX}"
        agree_outcome(
            self.ctx,
            f"writing the params-only step-{step:09d}.ckpt from {folder}",
            functools.partial(consolidate_params, folder, self.checkpoint_dir, step),
        )
