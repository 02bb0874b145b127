"""Caps on densification's growth (gaussians/growth_cap.py): which candidates an event keeps, and
the default densifier and MCMC under a cap. The W-independence over real ranks is
tests/multiproc/test_capped_refine.py."""

from __future__ import annotations

import pytest
import torch

from distsplat_ns.gaussians.densifier import gather_local
from distsplat_ns.gaussians.growth_cap import GrowthCaps, RefusedCounts, candidate_table, select_candidates
from distsplat_ns.gaussians.strategy import allocate_child_ids
from tests.helpers.strategy_shards import STEPS, IdCounter, N, make_gaussians, refine_event


def _table(held: int, dup: dict[int, float], split: dict[int, float]) -> torch.Tensor:
    """A rank's table from {id: score} of its duplicated and split parents."""

    def ids(d: dict[int, float]) -> torch.Tensor:
        return torch.tensor(list(d), dtype=torch.int64)

    def scores(d: dict[int, float]) -> torch.Tensor:
        return torch.tensor(list(d.values()), dtype=torch.float32)

    return candidate_table(ids(dup), ids(split), scores(dup), scores(split), held)


def _kept(tables: list[torch.Tensor], caps: GrowthCaps) -> tuple[list[tuple[int, int]], RefusedCounts]:
    selection = select_candidates(tables, caps)
    return sorted(map(tuple, selection.kept.tolist())), selection.refused


def test_the_best_scores_are_kept_ties_by_lower_id() -> None:
    # 100 Gaussians held; room for 2 under a cap of 102: id 5 (0.9), then 2 and 8 tie at 0.5 -> 2.
    tables = [_table(60, {5: 0.9, 8: 0.5}, {1: 0.1}), _table(40, {2: 0.5}, {3: 0.2})]
    kept, refused = _kept(tables, GrowthCaps(max_gaussians=102))
    assert kept == [(2, 0), (5, 0)]
    assert refused == RefusedCounts(global_cap=3)


def test_a_duplication_and_a_split_each_count_one() -> None:
    # Id 4 is both duplicated and split (2 candidates); id 6 split: 3 candidates, room for 2.
    tables = [_table(10, {4: 0.7}, {4: 0.7, 6: 0.3})]
    kept, refused = _kept(tables, GrowthCaps(max_gaussians=12))
    assert kept == [(4, 0), (4, 1)] and refused == RefusedCounts(global_cap=1)


def test_a_cap_exactly_reached_keeps_everything() -> None:
    tables = [_table(10, {1: 0.5}, {2: 0.4}), _table(5, {}, {3: 0.1})]
    kept, refused = _kept(tables, GrowthCaps(max_gaussians=18))
    assert len(kept) == 3 and refused == RefusedCounts()


@pytest.mark.parametrize("cap", [15, 9])
def test_a_cap_reached_or_passed_grows_nothing(cap: int) -> None:
    tables = [_table(10, {1: 0.5}, {2: 0.4}), _table(5, {}, {3: 0.1})]
    kept, refused = _kept(tables, GrowthCaps(max_gaussians=cap))
    assert kept == [] and refused == RefusedCounts(global_cap=3)


def test_nothing_is_refused_under_the_cap() -> None:
    tables = [_table(10, {1: 0.5}, {2: 0.4})]
    kept, refused = _kept(tables, GrowthCaps(max_gaussians=1000, max_held=1000))
    assert kept == [(1, 0), (2, 1)] and refused == RefusedCounts()


def test_a_rank_past_max_held_keeps_its_best_and_the_refusals_count_apart() -> None:
    # Global cap leaves 4 of 5; rank 0 (8 held, max_held 10) then keeps its 2 best of 3 selected.
    tables = [_table(8, {1: 0.9, 2: 0.8}, {3: 0.7}), _table(2, {4: 0.6}, {5: 0.1})]
    kept, refused = _kept(tables, GrowthCaps(max_gaussians=14, max_held=10))
    assert kept == [(1, 0), (2, 0), (4, 0)]
    assert refused == RefusedCounts(global_cap=1, shard_cap=1)


def test_uncapped_allocation_matches_capped_with_room() -> None:
    dup, split = torch.tensor([7, 3]), torch.tensor([9])
    plain = allocate_child_ids(100, dup, split, gather_local)
    capped = allocate_child_ids(
        100,
        dup,
        split,
        gather_local,
        caps=GrowthCaps(max_gaussians=10**6),
        dup_scores=torch.rand(2),
        split_scores=torch.rand(1),
        num_held=50,
    )
    assert torch.equal(plain.dup, capped.dup) and torch.equal(plain.split, capped.split)
    assert capped.dup_kept.all() and capped.split_kept.all() and capped.num_before == 50


def test_capped_event_grows_to_the_cap_and_numbers_kept_parents_only() -> None:
    free, capped = make_gaussians(torch.float64), make_gaussians(torch.float64)
    num_dup, num_split, _ = refine_event(free, STEPS[0], torch.float64, IdCounter(3 * N, gather_local))
    cap = N + (num_dup + num_split) // 2
    counter = IdCounter(3 * N, gather_local)
    counter.densifier.set_cap(cap)
    got_dup, got_split, _ = refine_event(capped, STEPS[0], torch.float64, counter)
    assert got_dup + got_split == cap - N
    assert counter.next_id == 3 * N + got_dup + 2 * got_split
    refused = counter.densifier.refused_total
    assert refused == RefusedCounts(global_cap=num_dup + num_split - (cap - N)) == counter.densifier.last_refused


def test_set_cap_refuses_a_negative_count() -> None:
    counter = IdCounter(3 * N, gather_local)
    with pytest.raises(ValueError, match="max_gaussians"):
        counter.densifier.set_cap(-1)


def test_mcmc_adds_up_to_max_gaussians_below_max_gs_num() -> None:
    from tests.helpers.model_factory import make_model

    model = make_model(
        1, num_points=60, strategy="mcmc", warmup_length=1, refine_every=2, stop_split_at=100, max_gs_num=1000
    )
    model.densifier.set_cap(61)  # 5% would add 3 (63), max_gs_num allows them: the cap keeps 1
    optimizers = {k: torch.optim.Adam([p], lr=1e-3) for k, p in model.gauss_params.items()}
    model.densifier.after_optimizer(model.rows.bound(optimizers), 2, None, gather_local)
    assert model.num_points == 61
    assert model.densifier.refused_total == RefusedCounts(global_cap=2)
    with pytest.raises(ValueError, match="max_held"):
        model.densifier.set_max_held(100)
