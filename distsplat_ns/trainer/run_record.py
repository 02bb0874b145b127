"""The run summary, ``distsplat_stats.json``: what a rank counts while it trains, and the file.

The trainer adds each step's report and each full evaluation to a :class:`RunRecord`; at the end
:func:`write_run_summary` gathers the per-rank figures to rank 0, which writes the file atomically.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from nerfstudio.engine.optimizers import Optimizers

from distsplat_ns.distributed.collectives import all_gather_object, all_reduce_sum_
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.pipeline.step_report import StepReport

STATS_FILENAME = "distsplat_stats.json"

#: Figures that differ between ranks; the summary lists them per rank. ``peak_memory_bytes`` is
#: the device's peak allocation on CUDA and the peak RSS on CPU; ``local_gaussian_count`` is the
#: shard's size (every Gaussian where replicated); ``eval_render_s`` the seconds this rank spent
#: in eval renders; ``checkpoint_bytes_written`` its shard's checkpoint rows;
#: ``exposed_comm_mean_per_step_s`` the seconds per step it waited on collectives the backward did
#: not hide (``StepTimings.exposed_comm``).
PER_RANK_KEYS = (
    "exposed_comm_mean_per_step_s",
    "bytes_communicated_mean_per_step",
    "bytes_communicated_total",
    "parameter_bytes",
    "optimizer_state_bytes",
    "local_gaussian_count",
    "peak_rss_bytes",
    "peak_memory_bytes",
    "eval_render_s",
    "checkpoint_bytes_written",
)
#: What each rank adds to the loss all-reduce of a log step (:func:`reduce_log_figures`), after its phase timings.
LOG_FIGURES = ("bytes_communicated", "local_gaussian_count", "peak_memory_bytes")


@dataclass
class RunRecord:
    """This rank's counters over the run (the steps it trained in this process, not a resumed run's)."""

    step_times: list[float] = field(default_factory=list)
    timing_totals: dict[str, float] = field(default_factory=dict)
    bytes_per_step: int = 0
    bytes_total: int = 0
    #: Every shard's Gaussians in sharded mode (as of the last step's start); None before a step.
    gaussian_count: int | None = None
    images_trained: int = 0
    steps_trained: int = 0
    last_eval_psnr: float | None = None
    eval_psnr_history: list[tuple[int, float]] = field(default_factory=list)
    train_wall_s: float = 0.0
    #: Bytes of checkpoint rows this rank wrote (sharded mode: its own shard's files).
    checkpoint_bytes_written: int = 0
    #: Seconds this rank spent rendering and scoring eval images.
    eval_render_s: float = 0.0

    @contextmanager
    def timing_eval(self) -> Iterator[None]:
        """Count the enclosed eval work in :attr:`eval_render_s`."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.eval_render_s += time.perf_counter() - start

    def add_step(self, report: StepReport, batch_size: int) -> None:
        self.steps_trained += 1
        self.images_trained += batch_size
        for key, value in report.timings.as_dict().items():
            self.timing_totals[key] = self.timing_totals.get(key, 0.0) + value
        self.bytes_per_step = report.bytes_communicated
        self.bytes_total += report.bytes_communicated
        self.gaussian_count = report.num_gaussians

    def add_eval(self, step: int, psnr: float) -> None:
        self.last_eval_psnr = psnr
        self.eval_psnr_history.append((int(step), psnr))

    def summary(self) -> dict[str, Any]:
        """The record's part of the run summary (the trainer adds the model's and the data's)."""
        step_total = sum(self.step_times) or 1e-9
        return {
            "images_trained": self.images_trained,
            "steps": self.steps_trained,
            "wall_time_s": self.train_wall_s,
            "images_per_s": self.images_trained / max(self.train_wall_s, 1e-9),
            "data_wait_fraction": self.timing_totals.get("data_wait", 0.0) / step_total,
            "final_eval_psnr": self.last_eval_psnr,
            "eval_psnr_history": self.eval_psnr_history,
            "time_breakdown_s": dict(self.timing_totals),
            "exposed_comm_mean_per_step_s": self.timing_totals.get("exposed_comm", 0.0) / max(self.steps_trained, 1),
            "bytes_communicated_per_step": self.bytes_per_step,
            "bytes_communicated_mean_per_step": self.bytes_total / max(self.steps_trained, 1),
            "bytes_communicated_total": self.bytes_total,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux: KiB
            "eval_render_s": self.eval_render_s,
            "checkpoint_bytes_written": self.checkpoint_bytes_written,
        }


def peak_memory_bytes(device: torch.device) -> int:
    """This process's peak memory: the device's peak allocation on CUDA, the peak RSS on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def reduce_log_figures(
    ctx: DistContext, losses: Sequence[torch.Tensor], report: StepReport, local_gaussian_count: int
) -> tuple[list[float], list[dict[str, float]]]:
    """The batch's losses (the ranks' shares summed) and every rank's figures of this step, in
    one all-reduce: each rank fills its own row of a `[R, K]` block after the losses, zeros
    elsewhere, so the sum is every rank's row (the README's run summary: which rank waits).

    Args:
        ctx: The process context.
        losses: This rank's shares of the logged losses, 0-d each (on the training device).
        report: This rank's step report (its phase timings and bytes).
        local_gaussian_count: Gaussians this rank holds.

    Returns:
        ``(losses, per_rank)``: the summed losses, and per rank ``time_<phase>_s`` for each phase
        of ``StepTimings`` plus :data:`LOG_FIGURES`.

    **Collective:** world group, one all-reduce of ``len(losses) + R * K`` float64 values; it
    replaces the losses' own all-reduces, so a log step makes no extra collective. At
    ``world_size == 1`` nothing is sent. Rank 0 with ``forward`` 0.2 s and rank 1 with 0.5 s:
    both get ``[{"time_forward_s": 0.2, ...}, {"time_forward_s": 0.5, ...}]``.
    **Host sync:** one, on log steps only, to read the figures.
    """
    timings = report.timings.as_dict()
    names = [f"time_{k}_s" for k in timings] + list(LOG_FIGURES)
    mine = list(timings.values()) + [report.bytes_communicated, local_gaussian_count, peak_memory_bytes(ctx.device)]
    device = losses[0].device if losses else ctx.device
    packed = torch.zeros(len(losses) + ctx.world_size * len(names), dtype=torch.float64, device=device)
    for i, loss in enumerate(losses):
        packed[i] = loss.detach().to(torch.float64)
    start = len(losses) + ctx.rank * len(names)
    packed[start : start + len(names)] = torch.tensor(mine, dtype=torch.float64, device=device)
    all_reduce_sum_(ctx, packed)
    values = packed.tolist()  # host sync: log steps only, to write the figures
    per_rank = [
        dict(zip(names, values[len(losses) + r * len(names) : len(losses) + (r + 1) * len(names)], strict=False))
        for r in range(ctx.world_size)
    ]
    return values[: len(losses)], per_rank


def optimizer_state_bytes(optimizers: Optimizers | None) -> int:
    """Bytes of every tensor in the optimizers' state (Adam's two moments per parameter)."""
    if optimizers is None:
        return 0
    return sum(
        v.numel() * v.element_size()
        for opt in optimizers.optimizers.values()
        for state in opt.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    )


def write_run_summary(ctx: DistContext, stats: dict[str, Any], path: Path) -> None:
    """Add every rank's time breakdown and :data:`PER_RANK_KEYS` to ``stats``; rank 0 writes it to
    ``path`` (temporary file, then rename).

    **Collective:** one ``all_gather_object``; every rank calls it.
    """
    gathered = all_gather_object(
        ctx, {"rank": ctx.rank, "time_breakdown_s": stats["time_breakdown_s"], **{k: stats[k] for k in PER_RANK_KEYS}}
    )
    stats["per_rank_time_breakdown_s"] = [{k: g[k] for k in ("rank", "time_breakdown_s")} for g in gathered]
    stats["per_rank"] = [{k: g[k] for k in ("rank", *PER_RANK_KEYS)} for g in gathered]
    if ctx.is_main:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(stats, indent=2, default=_json_default))
        os.replace(tmp, path)


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.generic,)):
        return value.item()
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
