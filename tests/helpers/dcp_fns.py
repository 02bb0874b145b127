"""Rank functions for the sharded checkpoint's commit protocol (tests/multiproc/test_dcp_commit.py):
tiny row sets written through ``checkpoint.save_sharded_checkpoint_atomic``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from distsplat_ns.checkpoint import save_sharded_checkpoint_atomic
from distsplat_ns.distributed.dcp_rows import save_rows


def rows_of(rank: int, step: int) -> dict:
    """Rank ``rank``'s rows at ``step``: ``rank + 2`` rows holding ``step``, ids by rank."""
    n = rank + 2
    return {"param.means": torch.full((n, 3), float(step)), "state.gauss_ids": torch.arange(n) + 10 * rank}


def save_step(ctx: Any, checkpoint_dir: str, step: int, die_on_rank: int = -1) -> str:
    """Save ``step`` (rows :func:`rows_of`) with latest-only pruning; rank ``die_on_rank`` exits
    hard (as a SIGKILL would: no exception, no cleanup) when its DCP write starts."""

    def write(folder: Path) -> int:
        if ctx.rank == die_on_rank:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"__{ctx.rank}_0.distcp").write_bytes(b"half a shard")
            os._exit(9)
        return save_rows(ctx, folder, rows_of(ctx.rank, step), torch.tensor([step]).numpy().tobytes())

    return str(save_sharded_checkpoint_atomic(ctx, Path(checkpoint_dir), step, write, keep_only_latest=True))


def log_figures(ctx: Any) -> Any:
    """``run_record.reduce_log_figures`` of a made-up step: rank r's forward took r + 1 s."""
    from distsplat_ns.pipeline.step_report import StepReport, StepTimings
    from distsplat_ns.trainer.run_record import reduce_log_figures

    timings = StepTimings(
        data_wait=0.0, forward=ctx.rank + 1.0, backward=0.5, all_reduce=0.0, optimizer=0.0, densify=0.0
    )
    report = StepReport(
        loss=torch.tensor(1.0),
        l1=torch.tensor(0.5),
        dssim=torch.tensor(0.25),
        loss_terms={},
        num_gaussians=10,
        timings=timings,
        bytes_communicated=1000 * (ctx.rank + 1),
        measured_imbalance=1.0,
        predicted_imbalance=1.0,
        time_imbalance=1.0,
    )
    return reduce_log_figures(ctx, [report.loss, report.l1, report.dssim], report, 3 + ctx.rank)
