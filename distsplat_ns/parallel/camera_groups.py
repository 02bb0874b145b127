"""How many of the batch's cameras a sharded rank projects and exchanges at once (docs/sharded.md,
"Bounded projection memory").

A sharded rank projects its shard into every camera it exchanges, and the projection's
screen-space rows with their autograd intermediates live until that camera's backward: O(N/W x B)
for one exchange of the whole batch. The step instead runs forward and backward per group of
cameras (``DistSplatPipeline.train_step``), so what is live is O(N/W x group). The group size comes
from a budget -- a quarter of the memory free at the first step, the smallest over ranks -- and the
shard's size, so it shrinks as densification grows the model; it needs no flag.

Shape letters: B images in the batch, N Gaussians (all ranks').
"""

from __future__ import annotations

import os

import torch

from distsplat_ns.gaussians.budget_caps import LIVE_ITEMS_PER_CAMERA_GAUSSIAN

#: Share of the memory free at the first step the live projections may take: the rest holds the
#: parameters, Adam state, the received rows, the rasterizer's buffers and densification growth.
BUDGET_FRACTION = 0.25


def free_memory_bytes(device: torch.device) -> int:
    """Memory free for this rank now: device memory on CUDA, available host memory otherwise.

    **Host sync:** ``cudaMemGetInfo`` on CUDA.
    """
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # no sysconf (not Linux): no bound from memory
        return 1 << 62


def group_size(budget_bytes: int, num_gaussians_total: int, world_size: int, item_bytes: int, batch_size: int) -> int:
    """Cameras per group: as many as the budget holds for a shard of ``ceil(N / W)``, in
    ``[1, B]``. A pure function of values every rank has, so the ranks agree."""
    per_camera = -(-max(num_gaussians_total, 1) // world_size) * LIVE_ITEMS_PER_CAMERA_GAUSSIAN * item_bytes
    return max(1, min(batch_size, budget_bytes // per_camera))


def split_positions(batch_size: int, size: int) -> list[list[int]]:
    """Batch positions ``0 .. B-1`` in consecutive groups of ``size`` (the last may be smaller)."""
    return [list(range(start, min(start + size, batch_size))) for start in range(0, batch_size, size)]
