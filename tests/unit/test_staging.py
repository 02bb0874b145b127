"""Where the variable-length collectives put a tensor before communicating
(``distributed/collectives.py``: ``_staged``). "meta" stands in for a rank's GPU."""

from __future__ import annotations

import torch

from distsplat_ns.distributed.collectives import _staged
from distsplat_ns.distributed.context import DistContext


def test_rows_on_the_host_are_sent_from_the_ranks_device_under_nccl() -> None:
    # A sharded resume under NCCL gathers rows read from a checkpoint into host memory
    # (parallel/shard_checkpoint.py); NCCL cannot send host memory, so they go to the device first.
    ctx = DistContext(rank=0, world_size=2, device=torch.device("meta"), backend="nccl")
    assert _staged(ctx, torch.zeros(3)).device.type == "meta"
    on_device = torch.zeros(3, device="meta")
    assert _staged(ctx, on_device) is on_device


def test_rows_are_sent_from_host_memory_under_gloo() -> None:
    ctx = DistContext(rank=0, world_size=2, device=torch.device("meta"), backend="gloo")
    on_host = torch.zeros(3)
    assert _staged(ctx, on_host) is on_host
