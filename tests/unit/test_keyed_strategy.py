"""Densification independent of the number of processes (gaussians/strategy.py: grow_and_prune).

Shards are simulated in one process: the strategy runs on disjoint subsets of one set of
Gaussians, one after the other, with a gather that returns every subset's parent-id rows,
recorded beforehand by a dry run. The union of the shards' results, ordered by global id, must
equal the result on all Gaussians bit for bit.
"""

from __future__ import annotations

import copy

import pytest
import torch

from distsplat_ns.gaussians.densifier import gather_local
from distsplat_ns.gaussians.strategy import allocate_child_ids, grow_masks
from distsplat_ns.gaussians.strategy_schedule import StrategySchedule
from distsplat_ns.utils.keyed_random import keyed_normal
from tests.helpers.rows_by_id import gaussians_by_id
from tests.helpers.strategy_shards import (
    PARTITIONS,
    SCHEDULE,
    SEED,
    STEPS,
    THRESHOLDS,
    IdCounter,
    N,
    as_rows,
    make_densifier,
    make_gaussians,
    refine_event,
    set_statistics,
    take_shard,
)


def _sharded_refine(shards: list, step: int, dtype: torch.dtype, next_ids: list[int]) -> list[IdCounter]:
    """One refine event on every shard, each seeing the others' parent rows as a real gather would."""
    recorded = []
    for shard, next_id in zip(shards, next_ids, strict=False):  # dry run: what each rank contributes to the gather

        def record(rows: torch.Tensor) -> list[torch.Tensor]:
            recorded.append(rows.clone())
            return [rows]

        refine_event(copy.deepcopy(shard), step, dtype, IdCounter(next_id, record))
    counters = []
    for rank, (shard, next_id) in enumerate(zip(shards, next_ids, strict=False)):

        def gather(rows: torch.Tensor, rank: int = rank) -> list[torch.Tensor]:
            assert torch.equal(rows, recorded[rank])
            return recorded

        counters.append(IdCounter(next_id, gather))
        refine_event(shard, step, dtype, counters[-1])
    return counters


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("partition", sorted(PARTITIONS))
def test_sharded_refine_equals_one_process_bitwise(dtype: torch.dtype, partition: str) -> None:
    full = make_gaussians(dtype)
    shards = [take_shard(*full, idx) for idx in PARTITIONS[partition](N)]
    one = IdCounter(3 * N, gather_local)
    next_ids = [3 * N] * len(shards)
    for step in STEPS:
        num_dup, num_split, num_pruned = refine_event(full, step, dtype, one)
        assert num_dup > 0 and num_split > 0 and num_pruned > 0, "the event must duplicate, split and prune"
        counters = _sharded_refine(shards, step, dtype, next_ids)
        next_ids = [c.next_id for c in counters]
        assert next_ids == [one.next_id] * len(shards)
        assert all(c.calls == 1 for c in counters)
        expected, got = gaussians_by_id([full]), gaussians_by_id(shards)
        assert expected.keys() == got.keys()
        for key in expected:
            assert expected[key].dtype == got[key].dtype and torch.equal(expected[key], got[key]), (step, key)


def test_every_rank_gathers_once_even_with_nothing_to_grow() -> None:
    params, optimizers, state = make_gaussians(torch.float64)
    idle = take_shard(params, optimizers, state, torch.arange(0, 0))  # an empty shard
    ids = IdCounter(3 * N, gather_local)
    assert refine_event(idle, STEPS[0], torch.float64, ids) == (0, 0, 0)
    assert ids.calls == 1 and ids.next_id == 3 * N


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_global_ids_stay_unique_over_refines(dtype: torch.dtype) -> None:
    gaussians = make_gaussians(dtype)
    ids = IdCounter(3 * N, gather_local)
    for step in STEPS:
        before = set(gaussians[2]["gauss_ids"].tolist())
        refine_event(gaussians, step, dtype, ids)
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

    ours = make_gaussians(dtype)
    theirs = copy.deepcopy(ours)
    step = STEPS[0]
    set_statistics(theirs[2], step, dtype)
    densifier = make_densifier(3 * N)
    is_dupli, is_split = grow_masks(densifier.thresholds, densifier.schedule, theirs[0], theirs[2], step)
    assert bool((is_dupli & is_split).any()), "a Gaussian both duplicated and split (2D size) must be covered"
    reference = DefaultStrategy(
        **THRESHOLDS, refine_scale2d_stop_iter=SCHEDULE.refine_scale2d_stop_iter, reset_every=SCHEDULE.reset_every
    )
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # as DefaultDensifier.after_optimizer: gsplat's ops build tensors in it
    try:
        n_dup, n_split = reference._grow_gs(*theirs, step)
        n_prune = reference._prune_gs(*theirs, step)
    finally:
        torch.set_default_dtype(previous)
    ids = IdCounter(3 * N, gather_local)
    assert refine_event(ours, step, dtype, ids) == (n_dup, n_split, n_prune)
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
    params, optimizers, state = make_gaussians(dtype)
    set_statistics(state, STEPS[0], dtype)
    densifier = make_densifier(3 * N)
    _, is_split = grow_masks(densifier.thresholds, densifier.schedule, params, state, STEPS[0])
    parents = {k: v.detach()[is_split].clone() for k, v in params.items()}
    parent_ids = state["gauss_ids"][is_split].clone()
    # Prune nothing, so the children are the last 2 n_split rows.
    ids = IdCounter(3 * N, gather_local, prune_opa=0.0, prune_scale3d=1e9, prune_scale2d=1e9)
    num_dup = ids.densifier.grow_and_prune(as_rows(params, optimizers, state), STEPS[0], ids.counted_gather).num_dup
    n = len(parent_ids)
    children = params["means"].detach()[-2 * n :].reshape(2, n, 3)
    z = keyed_normal(SEED, STEPS[0], parent_ids, 6).reshape(n, 2, 3).transpose(0, 1)
    q = torch.nn.functional.normalize(parents["quats"].double(), dim=-1)
    from gsplat.utils import normalized_quat_to_rotmat

    expected = parents["means"].double() + torch.einsum(
        "nij,nj,bnj->bni", normalized_quat_to_rotmat(q), parents["scales"].double().exp(), z
    )
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
    """The model's densifier wiring: one gather per event, ids from its next_id counting the
    other ranks' parents (a simulated rank 1 duplicating 3 and splitting 2 Gaussians)."""
    from distsplat_ns.gaussians.strategy import batch_info
    from tests.helpers.model_factory import HEIGHT, WIDTH, make_model

    model = make_model(batch_size=1, num_points=200, param_dtype=param_dtype)
    with torch.no_grad():
        model.gauss_params["scales"][:60] = -6.0  # exp(-6) = 0.0025 < densify_size_thresh: duplicated, not split
    optimizers = {k: torch.optim.Adam([p], lr=1e-3) for k, p in model.gauss_params.items()}
    for k, p in model.gauss_params.items():  # Adam moments to carry
        p.grad = -torch.ones_like(p)  # raises the opacities: nothing falls under cull_alpha_thresh (0.1)
        optimizers[k].step()
        p.grad = None
    n, first_new = model.gauss_ids.numel(), model.densifier.next_id
    gen = torch.Generator().manual_seed(3)
    grads = 2e-4 * torch.randn(1, n, 2, generator=gen, dtype=model.compute_dtype)
    radii = torch.randint(0, 4, (1, n), generator=gen, dtype=torch.int32)
    other = torch.tensor([[10**6, 0], [10**6 + 1, 0], [10**6 + 2, 0], [10**6, 1], [10**6 + 5, 1]])
    gathered = []

    def gather(rows: torch.Tensor) -> list[torch.Tensor]:
        gathered.append(rows)
        return [rows, other]

    info = batch_info(grads, grads.abs(), radii, WIDTH, HEIGHT)
    model.densifier.after_optimizer(
        model.rows.bound(optimizers), _first_refine_step(model.densifier.schedule), info, gather
    )
    assert len(gathered) == 1
    num_dup, num_split = int((gathered[0][:, 1] == 0).sum()), int((gathered[0][:, 1] == 1).sum())
    assert num_dup > 0 and num_split > 0
    assert model.densifier.next_id == first_new + (num_dup + 3) + 2 * (num_split + 2)
    ids = model.gauss_ids
    assert ids.numel() == model.means.shape[0] and ids.unique().numel() == ids.numel()
    assert int(ids.max()) < model.densifier.next_id
    assert model.means.dtype == getattr(torch, param_dtype)
    assert all(optimizers[k].state[p]["exp_avg"].dtype == p.dtype for k, p in model.gauss_params.items())
