"""Shard state in one process: owned blocks, move plans, row export/keep/append, checkpoint slicing."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from distsplat_ns.distributed.context import DistContext
from distsplat_ns.gaussians.checkpoint_keys import MODEL_EXTRA_KEY
from distsplat_ns.gaussians.ownership import owned_block
from distsplat_ns.parallel.full_state import gather_full_state, shard_loaded_checkpoint_
from distsplat_ns.parallel.shard_moves import plan_moves
from tests.helpers.shard_fns import (
    NUM_POINTS,
    adam_step,
    assert_same,
    make_state_model,
    single_process_state,
)


# ---------------------------------------------------------------------- owned_block
@pytest.mark.parametrize("num", [0, 1, 7, 10, 401])
@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_owned_blocks_tile_the_list_in_rank_order_with_sizes_within_one(num: int, world: int) -> None:
    blocks = [owned_block(num, r, world) for r in range(world)]
    assert blocks[0][0] == 0 and blocks[-1][1] == num
    assert all(a[1] == b[0] for a, b in itertools.pairwise(blocks))
    sizes = [hi - lo for lo, hi in blocks]
    assert min(sizes) >= 0 and max(sizes) - min(sizes) <= 1


def test_owned_block_rejects_a_rank_outside_the_world() -> None:
    with pytest.raises(ValueError, match="rank"):
        owned_block(10, 2, 2)


# ---------------------------------------------------------------------- plan_moves
def _apply(sizes: list, moves: list) -> list:
    out = list(sizes)
    for src, dst, count in moves:
        assert count > 0
        out[src] -= count
        out[dst] += count
    return out


def _random_sizes(seed: int) -> list:
    rng = random.Random(seed)
    world = rng.randint(1, 9)
    return [rng.choice([0, rng.randint(0, 50), rng.randint(0, 5000)]) for _ in range(world)]


def test_plan_past_the_bound_ends_every_rank_within_floor_and_ceil_of_the_mean() -> None:
    checked = 0
    for seed in range(40):
        sizes = _random_sizes(seed)
        total, world = sum(sizes), len(sizes)
        if total == 0 or max(sizes) * world <= 1.10 * total:
            continue  # within the bound: test_plan_within_the_bound_moves_nothing
        after = _apply(sizes, plan_moves(sizes, 1.10))
        assert sum(after) == total
        assert all(total // world <= s <= -(-total // world) for s in after), sizes
        checked += 1
    assert checked >= 20, "the random sizes stopped exercising the bound"


def test_plan_moves_the_fewest_rows_and_no_rank_both_sends_and_receives() -> None:
    checked = 0
    for seed in range(40):
        sizes = _random_sizes(seed)
        moves = plan_moves(sizes, 1.10)
        if not moves:
            continue
        senders, receivers = {m[0] for m in moves}, {m[1] for m in moves}
        assert not senders & receivers
        # Fewest: at least ceil(mean) stays on every rank above it, and only the excess over that
        # moves (plus what must leave for the ranks that get floor(mean) when ceilings run out).
        total, world = sum(sizes), len(sizes)
        base, extra = divmod(total, world)
        ceil_holders = sorted(range(world), key=lambda r: (-sizes[r], r))[:extra]
        target = [base + (r in ceil_holders) for r in range(world)]
        assert sum(m[2] for m in moves) == sum(max(0, s - t) for s, t in zip(sizes, target, strict=False)), sizes
        assert plan_moves(sizes, 1.10) == moves  # deterministic
        checked += 1
    assert checked >= 20, "the random sizes stopped needing moves"


@pytest.mark.parametrize("sizes", [[100, 100], [105, 95], [110, 100, 90], [0, 0, 0], [7], [11, 9, 10]])
def test_plan_within_the_bound_moves_nothing(sizes: list) -> None:
    assert plan_moves(sizes, 1.10) == []


def test_plan_of_two_uneven_shards_moves_the_difference_halved() -> None:
    assert plan_moves([300, 100]) == [(0, 1, 100)]
    assert plan_moves([0, 5, 10], bound=1.0) == [(2, 0, 5)]


# ---------------------------------------------------------------------- export / keep / append
def _rows(model, optimizers) -> dict:
    return model.rows.bound(optimizers).export(slice(None))


def export_rows(model, optimizers, index) -> dict:
    return model.rows.bound(optimizers).export(index)


def keep_rows_(model, optimizers, index) -> None:
    model.rows.bound(optimizers).select_(index)


def append_rows_(model, optimizers, rows) -> None:
    model.rows.bound(optimizers).append_(rows)


def test_keep_then_append_moves_every_row_with_its_state_aligned() -> None:
    model, optimizers = make_state_model()
    before = _rows(model, optimizers)
    leaving = torch.tensor([3, 0, 17, 30])
    staying = torch.tensor([i for i in range(NUM_POINTS) if i not in set(leaving.tolist())])
    moved = export_rows(model, optimizers, leaving)
    keep_rows_(model, optimizers, staying)
    append_rows_(model, optimizers, moved)
    order = torch.cat([staying, leaving])
    after = _rows(model, optimizers)
    assert set(after) == set(before) and any(k.startswith("opt.") for k in after) and "state.gauss_ids" in after
    for key, value in before.items():
        assert torch.equal(after[key], value[order]), key


def test_moved_parameters_are_the_optimizers_parameters_and_keep_adams_step() -> None:
    model, optimizers = make_state_model()
    steps = {n: o.state[model.gauss_params[n]]["step"].clone() for n, o in optimizers.items()}
    moved = export_rows(model, optimizers, slice(20, None))
    keep_rows_(model, optimizers, slice(0, 20))
    append_rows_(model, optimizers, moved)
    for name, opt in optimizers.items():
        param = model.gauss_params[name]
        assert opt.param_groups[0]["params"] == [param] and list(opt.state) == [param]
        assert torch.equal(opt.state[param]["step"], steps[name])


def test_adam_step_after_a_move_equals_the_step_without_it() -> None:
    reference, ref_opts = make_state_model()
    model, optimizers = make_state_model()
    order = torch.randperm(NUM_POINTS, generator=torch.Generator().manual_seed(5))
    moved = export_rows(model, optimizers, order[:10])
    keep_rows_(model, optimizers, order[10:])
    append_rows_(model, optimizers, moved)
    adam_step(reference, ref_opts, NUM_POINTS, 5)
    adam_step(model, optimizers, NUM_POINTS, 5)  # gradients drawn by global id: the same per Gaussian
    want, got = _rows(reference, ref_opts), _rows(model, optimizers)
    perm = torch.cat([order[10:], order[:10]])
    for key in want:
        # Adam is element-wise: the same inputs per element give the same bits wherever the row sits.
        assert torch.equal(got[key], want[key][perm]), key


def test_none_strategy_entries_stay_none_through_a_move() -> None:
    model, optimizers = make_state_model()
    model.strategy_state["grad2d"] = None
    moved = export_rows(model, optimizers, slice(25, None))
    assert moved["state.grad2d"] is None
    keep_rows_(model, optimizers, slice(0, 25))
    append_rows_(model, optimizers, moved)
    assert model.strategy_state["grad2d"] is None and model.gauss_ids.shape[0] == NUM_POINTS


def test_rows_arriving_with_state_a_rank_lacks_count_its_own_as_zeros() -> None:
    model, optimizers = make_state_model()
    moved = export_rows(model, optimizers, slice(25, None))
    keep_rows_(model, optimizers, slice(0, 25))
    model.strategy_state["count"] = None
    append_rows_(model, optimizers, moved)
    assert torch.equal(model.strategy_state["count"][:25], torch.zeros(25))
    assert torch.equal(model.strategy_state["count"][25:], moved["state.count"])


# ---------------------------------------------------------------------- gather at one process
def test_gather_at_one_process_is_the_single_process_state() -> None:
    model, optimizers = make_state_model()
    gathered = gather_full_state(DistContext(), model, optimizers)
    assert gathered is not None
    assert_same(
        {"pipeline": gathered.pipeline_entries, "optimizers": gathered.optimizers},
        single_process_state(model, optimizers),
    )


# ---------------------------------------------------------------------- checkpoint slicing
def _checkpoint(shuffle: bool, with_ids: bool = True) -> dict:
    model, optimizers = make_state_model()
    if shuffle:
        keep_rows_(model, optimizers, torch.randperm(NUM_POINTS, generator=torch.Generator().manual_seed(2)))
    loaded = single_process_state(model, optimizers)
    if not with_ids:
        del loaded["pipeline"][MODEL_EXTRA_KEY]["strategy_state"]["gauss_ids"]
    return loaded


def _shard_of(loaded: dict, rank: int, world: int) -> dict:
    import copy

    shard = copy.deepcopy(loaded)
    shard_loaded_checkpoint_(shard, rank, world)
    return shard


@pytest.mark.parametrize("world", [1, 2, 3])
def test_checkpoint_shards_are_the_owned_blocks_of_the_id_ordered_rows(world: int) -> None:
    want = _checkpoint(shuffle=False)
    loaded = _checkpoint(shuffle=True)
    shards = [_shard_of(loaded, r, world) for r in range(world)]
    for rank, shard in enumerate(shards):
        lo, hi = owned_block(NUM_POINTS, rank, world)
        ids = shard["pipeline"][MODEL_EXTRA_KEY]["strategy_state"]["gauss_ids"]
        assert ids.tolist() == list(range(lo, hi))
    for key, value in want["pipeline"].items():
        if key != MODEL_EXTRA_KEY:
            assert torch.equal(torch.cat([s["pipeline"][key] for s in shards]), value), key
    for key, value in want["pipeline"][MODEL_EXTRA_KEY]["strategy_state"].items():
        assert torch.equal(torch.cat([s["pipeline"][MODEL_EXTRA_KEY]["strategy_state"][key] for s in shards]), value), (
            key
        )
    for name, opt in want["optimizers"].items():
        for key, value in opt["state"][0].items():
            parts = [s["optimizers"][name]["state"][0][key] for s in shards]
            if key == "step":
                assert all(torch.equal(p, value) for p in parts)
            else:
                assert torch.equal(torch.cat(parts), value), (name, key)


def test_checkpoint_without_ids_counts_as_ids_in_row_order() -> None:
    loaded = _checkpoint(shuffle=False, with_ids=False)
    shard = _shard_of(loaded, 1, 2)
    lo, hi = owned_block(NUM_POINTS, 1, 2)
    assert shard["pipeline"][MODEL_EXTRA_KEY]["strategy_state"]["gauss_ids"].tolist() == list(range(lo, hi))
    assert torch.equal(
        shard["pipeline"]["_model.gauss_params.means"], loaded["pipeline"]["_model.gauss_params.means"][lo:hi]
    )


# ---------------------------------------------------------------------- when to rebalance
def test_rebalance_is_due_exactly_where_gsplat_grows_and_prunes() -> None:
    from distsplat_ns.gaussians.strategy_schedule import grows_at as rebalance_due

    model, _ = make_state_model(with_optimizers=False)
    schedule = model.densifier.schedule
    strategy = schedule  # gsplat 1.4.0's DefaultStrategy fields of the same names
    for step in range(schedule.refine_stop_iter + 2 * schedule.refine_every):
        grows = (
            step < strategy.refine_stop_iter
            and step > strategy.refine_start_iter
            and step % strategy.refine_every == 0
            and step % strategy.reset_every >= strategy.pause_refine_after_reset
        )  # gsplat 1.4.0 DefaultStrategy.step_post_backward
        assert rebalance_due(schedule, step) == grows, step
    assert any(rebalance_due(schedule, s) for s in range(schedule.refine_stop_iter))
