"""Module-level functions run on each rank by tests/multiproc (spawned processes pickle them)."""

from __future__ import annotations

import torch

from distsplat_ns.dist.collectives import (
    ReplicaDriftError,
    all_reduce_max_,
    broadcast_object,
    check_replicas,
    sum_gradients_,
)


def sum_gradients_of_rank_params(ctx, bucket_bytes: int) -> list[torch.Tensor]:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(s)) for s in [(7,), (3, 5), (1000,), (2, 2, 2)]]
    for i, p in enumerate(params):
        if ctx.rank == 1 and i == 1:
            continue  # this rank has no gradient for parameter 1: it must count as zeros
        p.grad = torch.full_like(p, float(ctx.rank + 1) * (i + 1))
    sum_gradients_(ctx, params, bucket_bytes=bucket_bytes)
    return [p.grad.clone() for p in params]


def max_reduce_rank(ctx) -> torch.Tensor:
    t = torch.tensor([ctx.rank, -ctx.rank, 5], dtype=torch.int32)
    return all_reduce_max_(ctx, t)


def broadcast_rank0_value(ctx) -> object:
    return broadcast_object(ctx, {"timestamp": f"ts-{ctx.rank}"})


def replica_check_outcome(ctx, drift_rank: int) -> str:
    t = torch.arange(10, dtype=torch.float32)
    if ctx.rank == drift_rank:
        t[3] = torch.nextafter(t[3], torch.tensor(100.0))  # one ulp: bitwise drift
    try:
        check_replicas(ctx, [t], step=7)
    except ReplicaDriftError as err:
        return str(err)
    return "identical"
