"""Densification independent of the number of processes (model/strategy.py: refine_keyed).

Shards are simulated in one process: the strategy runs on disjoint subsets of one set of
Gaussians, one after the other, with a gather that returns every subset's parent-id rows,
recorded beforehand by a dry run. The union of the shards' results, ordered by global id, must
equal the result on all Gaussians bit for bit.
"""

from __future__ import annotations

import copy

import pytest
import torch

from distsplat_ns.model.strategy import (
    ChildIds,
    StrategySchedule,
    allocate_child_ids,
    build_default_strategy,
    gather_local,
    grow_masks,
    prune_mask,
    refine_keyed,
)
from distsplat_ns.utils.keyed_random import keyed_normal

N = 400
SEED = 42
STEPS = (3300, 3400)  # two refine events, both after the first opacity reset (size pruning on)
SCHEDULE = StrategySchedule(
    refine_start_iter=500, refine_stop_iter=15000, reset_every=3000, refine_every=100,
    pause_refine_after_reset=108, refine_scale2d_stop_iter=4000,
)
THRESHOLDS = dict(prune_opa=0.005, grow_grad2d=0.0002, grow_scale3d=0.01, grow_scale2d=0.12, prune_scale3d=0.1, prune_scale2d=0.15)
PARTITIONS = {
    "blocks2": lambda n: [torch.arange(0, n // 2), torch.arange(n // 2, n)],
    "blocks3": lambda n: [torch.arange(0, 101), torch.arange(101, 250), torch.arange(250, n)],
    "interleaved3": lambda n: [torch.arange(r, n, 3) for r in range(3)],
}


def _strategy():  # noqa: ANN202
    return build_default_strategy(SCHEDULE, **THRESHOLDS, absgrad=True, verbose=False)


def _gaussians(dtype: torch.dtype) -> tuple[dict, dict, dict]:
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


def _set_statistics(state: dict, step: int, dtype: torch.dtype) -> None:
    """Running statistics as a function of each Gaussian's global id (so shards agree)."""
    z = keyed_normal(7, step, state["gauss_ids"], 3)
    count = torch.floor(6.0 * torch.special.ndtr(z[:, 0]))  # 0..5 views
    state["grad2d"] = (count * 0.0004 * torch.special.ndtr(z[:, 1])).to(dtype)  # mean grad in [0, 4e-4]
    state["count"] = count.float()
    state["radii"] = (0.16 * torch.special.ndtr(z[:, 2])).to(dtype)  # crosses 0.12 (split) and 0.15 (prune)


def _shard(params: dict, optimizers: dict, state: dict, idx: torch.Tensor) -> tuple[dict, dict, dict]:
    """The Gaussians at positions ``idx`` with their optimizer moments and statistics."""
    sub_params, sub_opts = {}, {}
    for k, p in params.items():
        q = torch.nn.Parameter(p.detach()[idx].clone())
        old = optimizers[k].state[p]
        sub_opts[k] = torch.optim.Adam([q], lr=1e-3)
        sub_opts[k].state[q] = {"step": old["step"].clone(), "exp_avg": old["exp_avg"][idx].clone(), "exp_avg_sq": old["exp_avg_sq"][idx].clone()}
        sub_params[k] = q
    sub_state = {k: (v[idx].clone() if isinstance(v, torch.Tensor) else v) for k, v in state.items()}
    return sub_params, sub_opts, sub_state


class _Ids:
    """``next_gauss_id`` and the allocator bound to a gather, as DistSplatModel.allocate_gauss_ids."""

    def __init__(self, next_id: int, gather) -> None:  # noqa: ANN001
        self.next_id, self.gather, self.calls = next_id, gather, 0

    def allocate(self, dup: torch.Tensor, split: torch.Tensor) -> ChildIds:
        self.calls += 1
        new = allocate_child_ids(self.next_id, dup, split, self.gather)
        self.next_id += new.num_dup_total + 2 * new.num_split_total
        return new


def _refine(gaussians: tuple[dict, dict, dict], step: int, dtype: torch.dtype, ids: _Ids) -> tuple[int, int, int]:
    params, optimizers, state = gaussians
    _set_statistics(state, step, dtype)
    return refine_keyed(_strategy(), params, optimizers, state, step, SEED, ids.allocate)


def _sharded_refine(shards: list, step: int, dtype: torch.dtype, next_ids: list[int]) -> list[_Ids]:
    """One refine event on every shard, each seeing the others' parent rows as a real gather would."""
    recorded = []
    for shard, next_id in zip(shards, next_ids):  # dry run: what each rank contributes to the gather
        def record(rows: torch.Tensor) -> list[torch.Tensor]:
            recorded.append(rows.clone())
            return [rows]

        _refine(copy.deepcopy(shard), step, dtype, _Ids(next_id, record))
    counters = []
    for rank, (shard, next_id) in enumerate(zip(shards, next_ids)):
        def gather(rows: torch.Tensor, rank: int = rank) -> list[torch.Tensor]:
            assert torch.equal(rows, recorded[rank])
            return recorded

        counters.append(_Ids(next_id, gather))
        _refine(shard, step, dtype, counters[-1])
    return counters


def _by_id(parts: list[tuple[dict, dict, dict]]) -> dict[str, torch.Tensor]:
    """Every parameter, Adam moment and state tensor of the union of ``parts``, ordered by global id."""
    ids = torch.cat([s["gauss_ids"] for _, _, s in parts])
    order = torch.argsort(ids)
    out = {"gauss_ids": ids[order]}
    for k in parts[0][0]:
        out[k] = torch.cat([p[k].detach() for p, _, _ in parts])[order]
        for m in ("exp_avg", "exp_avg_sq"):
            out[f"{k}.{m}"] = torch.cat([o[k].state[p[k]][m] for p, o, _ in parts])[order]
        steps = {float(o[k].state[p[k]]["step"]) for p, o, _ in parts}
        assert len(steps) == 1, k
    for key in ("grad2d", "count", "radii"):
        out[key] = torch.cat([s[key] for _, _, s in parts])[order]
    return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("partition", sorted(PARTITIONS))
def test_sharded_refine_equals_one_process_bitwise(dtype: torch.dtype, partition: str) -> None:
    full = _gaussians(dtype)
    shards = [_shard(*full, idx) for idx in PARTITIONS[partition](N)]
    one = _Ids(3 * N, gather_local)
    next_ids = [3 * N] * len(shards)
    for step in STEPS:
        num_dup, num_split, num_pruned = _refine(full, step, dtype, one)
        assert num_dup > 0 and num_split > 0 and num_pruned > 0, "the event must duplicate, split and prune"
        counters = _sharded_refine(shards, step, dtype, next_ids)
        next_ids = [c.next_id for c in counters]
        assert next_ids == [one.next_id] * len(shards)
        assert all(c.calls == 1 for c in counters)
        expected, got = _by_id([full]), _by_id(shards)
        assert expected.keys() == got.keys()
        for key in expected:
            assert expected[key].dtype == got[key].dtype and torch.equal(expected[key], got[key]), (step, key)


def test_every_rank_gathers_once_even_with_nothing_to_grow() -> None:
    params, optimizers, state = _gaussians(torch.float64)
    idle = _shard(params, optimizers, state, torch.arange(0, 0))  # an empty shard
    ids = _Ids(3 * N, gather_local)
    assert _refine(idle, STEPS[0], torch.float64, ids) == (0, 0, 0)
    assert ids.calls == 1 and ids.next_id == 3 * N


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_global_ids_stay_unique_over_refines(dtype: torch.dtype) -> None:
    gaussians = _gaussians(dtype)
    ids = _Ids(3 * N, gather_local)
    for step in STEPS:
        before = set(gaussians[2]["gauss_ids"].tolist())
        _refine(gaussians, step, dtype, ids)
        after = gaussians[2]["gauss_ids"]
        assert len(set(after.tolist())) == len(after)
        assert all(i in before or i >= 3 * N for i in after.tolist())
        assert int(after.max()) < ids.next_id


def test_allocation_numbers_sorted_parents_of_all_ranks() -> None:
    # rank 0 duplicates id 7 and splits 9; rank 1 duplicates 3 and splits 1 and 20
    rows = [torch.tensor([[7, 0], [9, 1]]), torch.tensor([[3, 0], [1, 1], [20, 1]])]
    rank0 = allocate_child_ids(100, torch.tensor([7]), torch.tensor([9]), lambda t: rows)
    rank1 = allocate_child_ids(100, torch.tensor([3]), torch.tensor([1, 20]), lambda t: rows)
    assert rank0.dup.tolist() == [101] and rank1.dup.tolist() == [100]
    assert rank1.split.tolist() == [[102, 106], [103, 107]] and rank0.split.tolist() == [[104], [105]]
    assert (rank0.num_dup_total, rank0.num_split_total, rank0.num_ranks) == (2, 3, 2)


def test_allocation_rejects_overlapping_shards() -> None:
    rows = [torch.tensor([[7, 0]]), torch.tensor([[7, 0]])]
    with pytest.raises(RuntimeError, match="overlap"):
        allocate_child_ids(100, torch.tensor([7]), torch.tensor([], dtype=torch.int64), lambda t: rows)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_decisions_equal_gsplats_default_strategy(dtype: torch.dtype) -> None:
    """Same Gaussians duplicated, split and pruned, and every value but the split children's
    means bitwise gsplat's; gsplat's own ops carry ``gauss_ids`` as the parents' ids."""
    from gsplat.strategy import DefaultStrategy

    ours = _gaussians(dtype)
    theirs = copy.deepcopy(ours)
    step = STEPS[0]
    _set_statistics(theirs[2], step, dtype)
    strategy = _strategy()
    is_dupli, is_split = grow_masks(strategy, theirs[0], theirs[2], step)
    assert bool((is_dupli & is_split).any()), "a Gaussian both duplicated and split (2D size) must be covered"
    reference = DefaultStrategy(**THRESHOLDS, refine_scale2d_stop_iter=SCHEDULE.refine_scale2d_stop_iter, reset_every=SCHEDULE.reset_every)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # as DistSplatModel.refine: gsplat's ops build tensors in it
    try:
        n_dup, n_split = reference._grow_gs(*theirs, step)
        n_prune = reference._prune_gs(*theirs, step)
    finally:
        torch.set_default_dtype(previous)
    ids = _Ids(3 * N, gather_local)
    assert _refine(ours, step, dtype, ids) == (n_dup, n_split, n_prune)
    params, optimizers, state = ours
    ref_params, ref_optimizers, ref_state = theirs
    # Same row layout as gsplat's; new ids: copies from 3N, split children from 3N + n_dup on.
    new = state["gauss_ids"] >= 3 * N
    is_child = state["gauss_ids"] >= 3 * N + n_dup
    assert torch.equal(state["gauss_ids"][~new], ref_state["gauss_ids"][~new])
    for k in params:
        same = ~is_child if k == "means" else torch.ones_like(new)
        assert torch.equal(params[k].detach()[same], ref_params[k].detach()[same]), k
        for m in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(optimizers[k].state[params[k]][m], ref_optimizers[k].state[ref_params[k]][m]), (k, m)
    assert not torch.equal(params["means"].detach(), ref_params["means"].detach())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_split_children_sit_at_the_keyed_offsets(dtype: torch.dtype) -> None:
    params, optimizers, state = _gaussians(dtype)
    _set_statistics(state, STEPS[0], dtype)
    _, is_split = grow_masks(_strategy(), params, state, STEPS[0])
    parents = {k: v.detach()[is_split].clone() for k, v in params.items()}
    parent_ids = state["gauss_ids"][is_split].clone()
    ids = _Ids(3 * N, gather_local)
    # Prune nothing, so the children are the last 2 n_split rows.
    strategy = _strategy()
    strategy.prune_opa, strategy.prune_scale3d, strategy.prune_scale2d = 0.0, 1e9, 1e9
    num_dup, _, _ = refine_keyed(strategy, params, optimizers, state, STEPS[0], SEED, ids.allocate)
    n = len(parent_ids)
    children = params["means"].detach()[-2 * n :].reshape(2, n, 3)
    z = keyed_normal(SEED, STEPS[0], parent_ids, 6).reshape(n, 2, 3).transpose(0, 1)
    q = torch.nn.functional.normalize(parents["quats"].double(), dim=-1)
    from gsplat.utils import normalized_quat_to_rotmat

    expected = parents["means"].double() + torch.einsum("nij,nj,bnj->bni", normalized_quat_to_rotmat(q), parents["scales"].double().exp(), z)
    # float32: rounding of s, R and the sum (a few ulp of |mean| ~ 1, i.e. ~1e-6); float64: ~1e-15.
    atol = 1e-5 if dtype == torch.float32 else 1e-12
    assert torch.allclose(children.double(), expected, atol=atol, rtol=0)
    # The k-th parent in ascending id order has children 3N + n_dup + 2k and + 2k + 1.
    first = 3 * N + num_dup + 2 * torch.argsort(torch.argsort(parent_ids))
    assert torch.equal(state["gauss_ids"][-2 * n :], torch.cat([first, first + 1]))


def _first_refine_step(schedule: StrategySchedule) -> int:
    step = schedule.refine_start_iter + 1
    while step % schedule.refine_every or step % schedule.reset_every < schedule.pause_refine_after_reset:
        step += 1
    return step


@pytest.mark.parametrize("param_dtype", ["float32", "float64"])
def test_model_refine_numbers_new_gaussians_over_all_ranks(param_dtype: str) -> None:
    """DistSplatModel.refine wiring: one gather per event, ids from next_gauss_id counting the
    other ranks' parents (a simulated rank 1 duplicating 3 and splitting 2 Gaussians)."""
    from distsplat_ns.model.strategy import batch_info
    from tests.helpers.model_factory import HEIGHT, WIDTH, make_model

    model = make_model(batch_size=1, num_points=200, param_dtype=param_dtype)
    with torch.no_grad():
        model.gauss_params["scales"][:60] = -6.0  # exp(-6) = 0.0025 < densify_size_thresh: duplicated, not split
    optimizers = {k: torch.optim.Adam([p], lr=1e-3) for k, p in model.gauss_params.items()}
    for k, p in model.gauss_params.items():  # Adam moments to carry
        p.grad = -torch.ones_like(p)  # raises the opacities: nothing falls under cull_alpha_thresh (0.1)
        optimizers[k].step()
        p.grad = None
    n, first_new = model.gauss_ids.numel(), model.next_gauss_id
    gen = torch.Generator().manual_seed(3)
    grads = 2e-4 * torch.randn(1, n, 2, generator=gen, dtype=model.compute_dtype)
    radii = torch.randint(0, 4, (1, n), generator=gen, dtype=torch.int32)
    other = torch.tensor([[10**6, 0], [10**6 + 1, 0], [10**6 + 2, 0], [10**6, 1], [10**6 + 5, 1]])
    gathered = []

    def gather(rows: torch.Tensor) -> list[torch.Tensor]:
        gathered.append(rows)
        return [rows, other]

    model.refine(_first_refine_step(model.schedule), optimizers, batch_info(grads, grads.abs(), radii, WIDTH, HEIGHT), gather_ids=gather)
    assert len(gathered) == 1
    num_dup, num_split = int((gathered[0][:, 1] == 0).sum()), int((gathered[0][:, 1] == 1).sum())
    assert num_dup > 0 and num_split > 0
    assert model.next_gauss_id == first_new + (num_dup + 3) + 2 * (num_split + 2)
    ids = model.gauss_ids
    assert ids.numel() == model.means.shape[0] and ids.unique().numel() == ids.numel()
    assert int(ids.max()) < model.next_gauss_id
    assert model.means.dtype == getattr(torch, param_dtype)
    assert all(optimizers[k].state[p]["exp_avg"].dtype == p.dtype for k, p in model.gauss_params.items())
