"""Gaussians cut into shards that run MCMC events side by side in one process (tests/unit/test_mcmc.py).

Each shard runs in its own thread; their gathers meet at a barrier, as ranks meet in a real
all-gather, so a function may gather any number of times. Everything per Gaussian (moments,
kills) is a function of its global id, so the shards and one process see the same inputs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from distsplat_ns.gaussians.mcmc import MCMCEvent, inject_keyed_position_noise, mcmc_event
from distsplat_ns.utils.keyed_random import keyed_normal
from tests.helpers.rows_by_id import gaussians_by_id
from tests.helpers.strategy_shards import SEED, N, as_rows, make_gaussians, take_shard

__all__ = [
    "FIRST_ID",
    "PARTITIONS",
    "BarrierGather",
    "gaussians_by_id",
    "kill_by_id",
    "mcmc_gaussians",
    "mcmc_rank_shard",
    "mcmc_sequence",
    "run_ranks",
    "set_moments_by_id",
    "shards_of",
]

PARTITIONS = {
    "one": lambda n: [torch.arange(n)],
    "blocks2": lambda n: [torch.arange(0, n // 2), torch.arange(n // 2, n)],
    "interleaved3": lambda n: [torch.arange(r, n, 3) for r in range(3)],
    "empty_rank3": lambda n: [torch.arange(0, 150), torch.arange(0, 0), torch.arange(150, n)],
    "random3": lambda n: [
        torch.nonzero(torch.randint(0, 3, (n,), generator=torch.Generator().manual_seed(5)) == r).flatten()
        for r in range(3)
    ],
}


def mcmc_gaussians(dtype: torch.dtype) -> tuple[dict, dict, dict]:
    """``strategy_shards.make_gaussians`` (sparse shuffled ids, ~8% dead) with only ``gauss_ids`` as state."""
    params, optimizers, state = make_gaussians(dtype)
    return params, optimizers, {"gauss_ids": state["gauss_ids"]}


def shards_of(gaussians: tuple[dict, dict, dict], partition: str) -> list[tuple[dict, dict, dict]]:
    return [take_shard(*gaussians, idx) for idx in PARTITIONS[partition](N)]


def set_moments_by_id(gaussians: tuple[dict, dict, dict], key: int) -> None:
    """Adam moments of every row as a function of its id (nonzero: the zeroing rules show)."""
    params, optimizers, state = gaussians
    ids = state["gauss_ids"]
    for name, p in params.items():
        width = p[0].numel() if p.shape[0] else 1
        z = keyed_normal(key, sum(map(ord, name)), ids, width).reshape(p.shape).to(p.dtype)
        st = optimizers[name].state[p]
        st["exp_avg"], st["exp_avg_sq"] = z.clone(), (z * z).clone()


def kill_by_id(gaussians: tuple[dict, dict, dict], key: int, fraction: float) -> None:
    """Opacity 0.0009 (dead) for the ids whose keyed draw falls under ``fraction``."""
    params, _, state = gaussians
    u = torch.special.ndtr(keyed_normal(key, 0, state["gauss_ids"], 1)[:, 0])
    with torch.no_grad():
        params["opacities"][u < fraction] = -7.0


class BarrierGather:
    """The ``IdGather`` of ``world`` ranks run as threads: every call returns every rank's tensor."""

    def __init__(self, world: int) -> None:
        self.barrier = threading.Barrier(world)
        self.slots: list[Any] = [None] * world
        self.calls = [0] * world

    def for_rank(self, rank: int) -> Callable[[torch.Tensor], list[torch.Tensor]]:
        def gather(t: torch.Tensor) -> list[torch.Tensor]:
            self.calls[rank] += 1
            self.slots[rank] = t.clone()
            self.barrier.wait(timeout=60)
            out = list(self.slots)
            self.barrier.wait(timeout=60)
            return out

        return gather


def run_ranks(world: int, fn: Callable[[int, Callable], Any]) -> tuple[list[Any], list[int]]:
    """``fn(rank, gather)`` on ``world`` threads; returns their results and gather counts."""
    gather = BarrierGather(world)
    results: list[Any] = [None] * world
    errors: list[BaseException] = []

    def body(rank: int) -> None:
        try:
            results[rank] = fn(rank, gather.for_rank(rank))
        except BaseException as e:  # noqa: BLE001 -- re-raised below, after the other threads stop
            errors.append(e)
            gather.barrier.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results, gather.calls


FIRST_ID = 3 * N  # make_gaussians' ids lie in [0, 3N)
EVENTS = ((600, 10_000), (700, 430), (800, 430))
"""(step, cap): relocate + add 5% (400 -> 420); relocate + add up to the cap (430); relocate only."""


def mcmc_sequence(gaussians: tuple[dict, dict, dict], gather: Callable) -> list[MCMCEvent]:
    """EVENTS on ``gaussians`` with ``gather``; before each, keyed kills (not the first), keyed
    Adam moments and two steps of position noise."""
    next_id, events = FIRST_ID, []
    for k, (step, cap) in enumerate(EVENTS):
        if k:
            kill_by_id(gaussians, step, 0.05)
        set_moments_by_id(gaussians, step)
        for noise_step in (step - 1, step):
            inject_keyed_position_noise(
                gaussians[0], gaussians[2]["gauss_ids"], seed=SEED, step=noise_step, scaler=1.6e-4 * 5e5
            )
        event = mcmc_event(
            as_rows(*gaussians, ()),
            step=step,
            seed=SEED,
            next_id=next_id,
            cap_max=cap,
            min_opacity=0.005,
            gather=gather,
        )
        next_id = event.next_id
        events.append(event)
    return events


def mcmc_rank_shard(ctx: Any, dtype_name: str, partition: str) -> dict:
    """Rank ``ctx.rank``'s shard through ``mcmc_sequence`` with the real gather (``all_gather_rows``)."""
    from distsplat_ns.distributed.collectives import all_gather_rows

    shard = shards_of(mcmc_gaussians(getattr(torch, dtype_name)), partition)[ctx.rank]
    calls = []

    def gather(t: torch.Tensor) -> list[torch.Tensor]:
        calls.append(t.numel())
        return all_gather_rows(ctx, t)

    events = mcmc_sequence(shard, gather)
    return {"tensors": gaussians_by_id([shard]), "events": [tuple(e) for e in events], "gathers": len(calls)}
