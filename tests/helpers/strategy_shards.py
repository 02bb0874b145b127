"""Gaussians with Adam moments and statistics keyed by global id, cut into shards: the inputs of the
W-independence tests of densification (tests/unit/test_keyed_strategy.py, tests/multiproc/test_sharded_refine.py)."""

from __future__ import annotations

import dataclasses
import functools

import torch

from distsplat_ns.gaussians.rows import DEFAULT_STATISTICS, GaussianRows, RowField, gaussian_schema
from distsplat_ns.gaussians.strategy import DefaultDensifier, DefaultThresholds
from distsplat_ns.gaussians.strategy_schedule import StrategySchedule
from distsplat_ns.utils.keyed_random import keyed_normal
from tests.helpers.rows_by_id import gaussians_by_id

N = 400
SEED = 42
STEPS = (3300, 3400)  # two refine events, both after the first opacity reset (size pruning on)
SCHEDULE = StrategySchedule(
    refine_start_iter=500,
    refine_stop_iter=15000,
    reset_every=3000,
    refine_every=100,
    pause_refine_after_reset=108,
    refine_scale2d_stop_iter=4000,
)
THRESHOLDS = {
    "prune_opa": 0.005,
    "grow_grad2d": 0.0002,
    "grow_scale3d": 0.01,
    "grow_scale2d": 0.12,
    "prune_scale3d": 0.1,
    "prune_scale2d": 0.15,
}
PARTITIONS = {
    "blocks2": lambda n: [torch.arange(0, n // 2), torch.arange(n // 2, n)],
    "blocks3": lambda n: [torch.arange(0, 101), torch.arange(101, 250), torch.arange(250, n)],
    "interleaved3": lambda n: [torch.arange(r, n, 3) for r in range(3)],
}


def make_densifier(next_id: int, **thresholds: float) -> DefaultDensifier:
    """The default densifier on SCHEDULE and THRESHOLDS (``thresholds`` replacing some)."""
    settings = dataclasses.replace(DefaultThresholds(**THRESHOLDS, absgrad=True), **thresholds)
    return DefaultDensifier(SCHEDULE, settings, seed=SEED, next_id=next_id, log_events=False)


def as_rows(
    params: dict, optimizers: dict, state: dict, statistics: tuple[RowField, ...] = DEFAULT_STATISTICS
) -> GaussianRows:
    """The rows over plain dicts of parameters, optimizers and strategy state."""
    return GaussianRows(gaussian_schema(list(params), statistics), params, state, optimizers)


def make_gaussians(dtype: torch.dtype) -> tuple[dict, dict, dict]:
    """N Gaussians with Adam moments, sparse shuffled global ids, sizes around every threshold."""
    gen = torch.Generator().manual_seed(0)
    size = 10.0 ** (-2.7 + 1.8 * torch.rand(N, 1, generator=gen))  # 0.002..0.13: crosses 0.01 and 0.1
    scales = torch.log(size * (0.3 + 0.7 * torch.rand(N, 3, generator=gen)))  # anisotropic
    values = {
        "means": torch.randn(N, 3, generator=gen),
        "scales": scales,
        "quats": torch.randn(N, 4, generator=gen),
        "features_dc": torch.randn(N, 3, generator=gen),
        "features_rest": torch.randn(N, 3, 3, generator=gen),
        "opacities": 3.0 * torch.randn(N, 1, generator=gen) - 1.0,  # a few below logit(0.005)
    }
    params = {k: torch.nn.Parameter(v.to(dtype)) for k, v in values.items()}
    optimizers = {}
    for k, p in params.items():
        optimizers[k] = torch.optim.Adam([p], lr=1e-3)
        p.grad = torch.randn(p.shape, generator=gen).to(dtype)
        optimizers[k].step()
        p.grad = None
    state = {"grad2d": None, "count": None, "radii": None, "scene_scale": 1.0}
    state["gauss_ids"] = torch.randperm(3 * N, generator=gen)[:N]  # not in position order
    return params, optimizers, state


def set_statistics(state: dict, step: int, dtype: torch.dtype) -> None:
    """Running statistics as a function of each Gaussian's global id (so shards agree)."""
    z = keyed_normal(7, step, state["gauss_ids"], 3)
    count = torch.floor(6.0 * torch.special.ndtr(z[:, 0]))  # 0..5 views
    state["grad2d"] = (count * 0.0004 * torch.special.ndtr(z[:, 1])).to(dtype)  # mean grad in [0, 4e-4]
    state["count"] = count.float()
    state["radii"] = (0.16 * torch.special.ndtr(z[:, 2])).to(dtype)  # crosses 0.12 (split) and 0.15 (prune)


def take_shard(params: dict, optimizers: dict, state: dict, idx: torch.Tensor) -> tuple[dict, dict, dict]:
    """The Gaussians at positions ``idx`` with their optimizer moments and statistics."""
    sub_params, sub_opts = {}, {}
    for k, p in params.items():
        q = torch.nn.Parameter(p.detach()[idx].clone())
        old = optimizers[k].state[p]
        sub_opts[k] = torch.optim.Adam([q], lr=1e-3)
        sub_opts[k].state[q] = {
            "step": old["step"].clone(),
            "exp_avg": old["exp_avg"][idx].clone(),
            "exp_avg_sq": old["exp_avg_sq"][idx].clone(),
        }
        sub_params[k] = q
    sub_state = {k: (v[idx].clone() if isinstance(v, torch.Tensor) else v) for k, v in state.items()}
    return sub_params, sub_opts, sub_state


class IdCounter:
    """A default densifier (its ``next_id``) with a gather that counts its calls."""

    def __init__(self, next_id: int, gather, **thresholds: float) -> None:
        self.densifier, self.gather, self.calls = make_densifier(next_id, **thresholds), gather, 0

    @property
    def next_id(self) -> int:
        return self.densifier.next_id

    def counted_gather(self, rows: torch.Tensor) -> list[torch.Tensor]:
        self.calls += 1
        return self.gather(rows)


def refine_event(
    gaussians: tuple[dict, dict, dict], step: int, dtype: torch.dtype, ids: IdCounter
) -> tuple[int, int, int]:
    """Statistics for ``step`` (keyed by id), then one grow-and-prune event; returns its
    duplicated and split counts (all ranks) and pruned count (here)."""
    params, optimizers, state = gaussians
    set_statistics(state, step, dtype)
    event = ids.densifier.grow_and_prune(as_rows(params, optimizers, state), step, ids.counted_gather)
    return event.num_dup, event.num_split, event.num_pruned


def refine_rank_shard(
    ctx, dtype_name: str, partition: str, max_gaussians: int | None = None, max_held: int | None = None
) -> dict:
    """Rank ``ctx.rank``'s shard of ``make_gaussians`` refined at every step of STEPS with the real
    gather (``all_gather_rows``) under the caps given; returns its tensors by global id, its
    ``next_gauss_id``, its gather count, the refusals of each event and its held count after each
    event's growth (before pruning)."""
    from distsplat_ns.distributed.collectives import all_gather_rows

    dtype = getattr(torch, dtype_name)
    shard = take_shard(*make_gaussians(dtype), PARTITIONS[partition](N)[ctx.rank])
    ids = IdCounter(3 * N, functools.partial(all_gather_rows, ctx))
    ids.densifier.set_cap(max_gaussians)
    ids.densifier.set_max_held(max_held)
    refused, grown = [], []
    for step in STEPS:
        _, _, num_pruned = refine_event(shard, step, dtype, ids)
        refused.append(ids.densifier.last_refused)
        grown.append(len(shard[2]["gauss_ids"]) + num_pruned)
    return {
        "tensors": gaussians_by_id([shard]),
        "next_id": ids.next_id,
        "gathers": ids.calls,
        "refused": refused,
        "grown": grown,
    }
