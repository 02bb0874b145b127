"""A rank's memory budget during a run: the caps it gives densification at each event, measured on
the run's own steps where the device can say (docs/densification.md, "What the budget counts").

``gaussians/budget_caps.py`` holds the pure arithmetic; this object adds what only a run has: on CUDA the
peak the allocator saw since the last event, from which the bytes the rank uses besides its
Gaussians (``fixed``) are measured, the largest over ranks; the caps set on the densifier at each
event; the figures for the run summary.
"""

from __future__ import annotations

from typing import Any

import torch

from distsplat_ns.distributed.collectives import all_gather_counts, all_reduce_max_
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.gaussians.budget_caps import (
    GaussianBytes,
    GaussianCaps,
    MemoryBudget,
    caps_from_budget,
    check_initial_fit,
    gaussian_bytes,
    projection_budget_bytes,
    resolve_memory_budget,
)
from distsplat_ns.gaussians.densifier import Densifier
from distsplat_ns.gaussians.growth_cap import RefusedCounts
from distsplat_ns.gaussians.rows import GaussianRows
from distsplat_ns.utils.units import format_bytes


class RankBudget:
    """The budget of this rank and the caps it implies, kept up to date at densification events.

    Args:
        ctx: The run's context (its device says whether the allocator can be measured).
        budget: The rank's budget (``budget.bytes`` is not None: a run without one builds no RankBudget).
        per_gaussian: Bytes one Gaussian held costs (``gaussian_bytes``).
        sharded: Whether each rank holds a shard.
        headroom: The shard imbalance the total cap leaves room for (``SHARD_BOUND``).
    """

    def __init__(
        self, ctx: DistContext, budget: MemoryBudget, per_gaussian: GaussianBytes, *, sharded: bool, headroom: float
    ) -> None:
        if budget.bytes is None:
            raise ValueError("RankBudget needs a budget in bytes")
        self.ctx = ctx
        self.budget = budget
        self.per_gaussian = per_gaussian
        self.sharded = sharded
        self.headroom = headroom
        self.fixed_bytes = 0
        """What the rank uses besides its Gaussians: on CUDA measured at each event (the largest
        over ranks), on the CPU 0 (the budget there counts only what grows with the Gaussians)."""
        self.peak_device_bytes = 0
        """The largest allocation the device's allocator reported at any event (CUDA; 0 on the CPU).
        Each event resets the allocator's peak: :meth:`run_peak_device_bytes` adds the interval since."""
        self.peak_counted_bytes = 0
        """The largest ``fixed + held x bytes per Gaussian`` at any event: what the budget was held to."""

    @classmethod
    def for_run(
        cls,
        ctx: DistContext,
        setting: str,
        rows: GaussianRows,
        item_bytes: int,
        reads_statistics: bool,
        *,
        batch_size: int,
        sharded: bool,
        headroom: float,
    ) -> RankBudget | None:
        """This rank's budget from ``--pipeline.memory-budget`` (``setting``), or None without one.

        Args:
            ctx: The run's context.
            setting: The flag's value.
            rows: This rank's Gaussians as built (their schema and number).
            item_bytes: Bytes of one parameter item (4 in float32).
            reads_statistics: Whether the strategy accumulates screen statistics.
            batch_size: Images per step over all ranks.
            sharded: Whether each rank holds a shard.
            headroom: The shard imbalance the sharded total leaves room for (``SHARD_BOUND``).

        Raises:
            UserError: The initial Gaussians alone pass the budget (``check_initial_fit``: the
                bytes, the budget and the smallest number of sharded ranks that holds them).

        **Collective:** sharded with a budget, one all-gather of the shards' sizes.
        """
        budget = resolve_memory_budget(setting, ctx.device)
        if budget.bytes is None:
            return None

        def bytes_when(is_sharded: bool) -> GaussianBytes:
            return gaussian_bytes(
                rows.schema,
                item_bytes,
                sharded=is_sharded,
                batch_size=batch_size,
                world_size=ctx.world_size,
                reads_statistics=reads_statistics,
            )

        num_initial = sum(all_gather_counts(ctx, len(rows))) if sharded else len(rows)
        check_initial_fit(
            num_initial,
            budget,
            0,
            bytes_when(sharded),
            bytes_when(True),
            world_size=ctx.world_size,
            sharded=sharded,
            headroom=headroom,
        )
        return cls(ctx, budget, bytes_when(sharded), sharded=sharded, headroom=headroom)

    def caps(self, num_held: int) -> GaussianCaps:
        """The caps for the event about to run on this rank's ``num_held`` Gaussians.

        On CUDA the peak allocation since the previous event, less what its Gaussians count, is what
        the rank uses besides them; the largest over ranks is kept, and the allocator's peak is reset
        so the next event measures its own interval.

        **Collective:** on CUDA, world group, one all-reduce of one int (every rank, every event;
        none at one rank); on the CPU none (nothing is measured there: every rank's device is of
        one type, so all agree). **Host sync:** that value (event steps only).
        """
        if self.ctx.device.type == "cuda":
            peak = int(torch.cuda.max_memory_allocated(self.ctx.device))
            torch.cuda.reset_peak_memory_stats(self.ctx.device)
            self.peak_device_bytes = max(self.peak_device_bytes, peak)
            fixed = torch.tensor(
                [max(0, peak - num_held * self.per_gaussian.total)], dtype=torch.int64, device=self.ctx.device
            )
            self.fixed_bytes = max(
                self.fixed_bytes, int(all_reduce_max_(self.ctx, fixed).item())
            )  # host sync: event step
        self.peak_counted_bytes = max(self.peak_counted_bytes, self.fixed_bytes + num_held * self.per_gaussian.total)
        return caps_from_budget(
            self.budget.bytes,
            self.fixed_bytes,
            self.per_gaussian.total,
            world_size=self.ctx.world_size,
            sharded=self.sharded,
            headroom=self.headroom,
        )

    def projection_budget_bytes(self, num_held: int) -> int:
        """What the budget leaves a sharded rank's live projections (``budget.projection_budget_bytes``)."""
        return projection_budget_bytes(self.budget.bytes, self.fixed_bytes, num_held, self.per_gaussian)

    def apply_caps(self, densifier: Densifier, num_held: int) -> GaussianCaps:
        """Set ``densifier``'s caps for the event about to run (``caps``): the total over all
        ranks, and in sharded mode each rank's where the strategy can cap it. The first event they
        limit logs one line naming this budget (``Densifier.set_cap``'s reason).

        **Collective:** as :meth:`caps`.
        """
        caps = self.caps(num_held)
        reason = f"the memory budget of {format_bytes(self.budget.bytes)} per rank, {self.budget.source}"
        densifier.set_cap(caps.total, reason)
        if self.sharded and densifier.caps_each_rank:
            densifier.set_max_held(caps.held, reason)
        return caps

    def run_peak_device_bytes(self) -> int:
        """The allocator's peak over the whole run (CUDA; 0 on the CPU): the events' peaks and the
        one since the last event, which ``torch.cuda.max_memory_allocated`` alone reports after a reset."""
        if self.ctx.device.type != "cuda":
            return 0
        return max(self.peak_device_bytes, int(torch.cuda.max_memory_allocated(self.ctx.device)))

    def summary(self, refused: RefusedCounts) -> dict[str, Any]:
        """The run summary's ``memory_budget``, with the densifier's ``refused_total``."""
        return {
            "budget_bytes": self.budget.bytes,
            "source": self.budget.source,
            "bytes_per_gaussian": {"held": self.per_gaussian.held, "working": self.per_gaussian.working},
            "fixed_bytes_measured": self.fixed_bytes,
            "peak_counted_bytes": self.peak_counted_bytes,
            "peak_device_bytes": self.run_peak_device_bytes(),
            "gaussians_refused": refused.global_cap + refused.shard_cap,
            "gaussians_refused_by_shard_cap": refused.shard_cap,
        }
