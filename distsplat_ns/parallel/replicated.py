"""The replicated mode: every rank holds every Gaussian (the DDP pattern).

Each rank renders its bands from its own projections, gradients and densification statistics are
summed over ranks, and every rank then takes the identical optimizer step and refine.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from distsplat_ns.checkpoint import load_checkpoint_file
from distsplat_ns.distributed.collectives import all_reduce_max_, all_reduce_sum_
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.distributed.gradient_sum import BucketedGradientSum
from distsplat_ns.gaussians.densifier import IdGather, gather_local
from distsplat_ns.model.band_render import OwnProjections, ProjectionSource, RegularizerShare
from distsplat_ns.parallel.exchange import Timer
from distsplat_ns.parallel.full_state import GatheredState
from distsplat_ns.parallel.mode import NamedParameters, Optimizers, ParallelMode, batch_statistics, info_for
from distsplat_ns.parallel.shard_checkpoint import read_shard_checkpoint


class ReplicatedMode(ParallelMode):
    """Every rank holds every Gaussian; see the module docstring."""

    name = "replicated"

    @classmethod
    def initial_shard(cls, ctx: DistContext) -> None:
        """Every rank builds them all."""

    def num_gaussians_total(self) -> int:
        """This rank's count (every rank holds all). Local."""
        return self.model.num_points

    def regularizer_share(self, num_gaussians_total: int) -> RegularizerShare:
        """Rank 0 adds every term, for every Gaussian."""
        return RegularizerShare(
            camera_penalty=self.ctx.is_main, scale_term=self.ctx.is_main, num_gaussians_total=num_gaussians_total
        )

    def reduce_footprint_costs(self, costs: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Already every Gaussian's (every rank projected all of them). Local."""
        return costs, 0

    def projections(
        self, cameras: Any, plan: Any, step: int, timer: Timer, positions: Sequence[int] | None = None
    ) -> tuple[ProjectionSource, int]:
        """This rank's own Gaussians, projected as its bands are rendered. Local."""
        return OwnProjections(), 0

    def reduce_gradients(self, named: NamedParameters) -> int:
        """Sum every gradient over ranks, all buckets after the backward (the step overlaps them:
        :meth:`gradient_sum`).

        **Collective:** world group, one all-reduce per bucket (none at one rank).
        """
        return BucketedGradientSum(self.ctx, [p for _, p in named], overlap=False).finish()

    def gradient_sum(self, named: NamedParameters, overlap: bool) -> BucketedGradientSum:
        """Every gradient summed in buckets, each started during the step's last backward as soon
        as its gradients are final (``distributed/gradient_sum.py``).

        **Collective:** world group, one all-reduce per bucket, in bucket order (none at one rank).
        """
        return BucketedGradientSum(self.ctx, [p for _, p in named], overlap=overlap)

    def statistics(
        self, sources: Sequence[ProjectionSource], batch_size: int, sizes_px: Sequence[tuple[int, int]]
    ) -> tuple[dict[str, Any], int]:
        """Each rank saw only its bands: screen-space gradients and absgrads summed, radii
        maximised over ranks.

        **Collective:** world group, two all-reduces: the sum of the gradients and absgrads stacked,
        `[2, B, N, 2]` (one call, not two: docs/host_cost.md), then the max of the radii, `[B, N]` (none at one rank).
        """
        grads, absgrads, radii = batch_statistics(
            self.model, [c for source in sources for c in source.statistics_projections], batch_size
        )
        if self.ctx.is_distributed:
            grads, absgrads = all_reduce_sum_(self.ctx, torch.stack([grads, absgrads])).unbind(0)
        all_reduce_max_(self.ctx, radii)
        moved = batch_size * self.model.num_points * (2 * 2 * 4 + 4) if self.ctx.is_distributed else 0
        return info_for(grads, absgrads, radii, sizes_px), moved

    @property
    def gather_ids(self) -> IdGather:
        """Every rank holds every parent: no communication."""
        return gather_local

    def after_refine(self, step: int, optimizers: Optimizers) -> int:
        """Nothing: every rank made the same decisions on the same Gaussians."""
        return 0

    def replicated_parameters(self, named: NamedParameters) -> list[torch.Tensor]:
        return [p for _, p in named]

    @property
    def evaluates_here(self) -> bool:
        """Rank 0 alone: it holds the whole model and renders eval and viewer images by itself."""
        return self.ctx.is_main

    @property
    def views_are_collective(self) -> bool:
        """False: rank 0 renders views from its whole copy while the others wait."""
        return False

    def gather_full_state(self, optimizers: Optimizers) -> GatheredState | None:
        """None: rank 0's own state is the whole model's."""
        return None

    def read_checkpoint(self, path: Path) -> dict[str, Any]:
        """The whole checkpoint; a sharded run's ``step-N.dcp`` folder read whole by every rank
        (**Collective**, world group: DCP's load)."""
        if Path(path).is_dir():
            return read_shard_checkpoint(self.ctx, Path(path), self.ctx.rank, self.ctx.world_size, sharded=False)
        return load_checkpoint_file(path)
