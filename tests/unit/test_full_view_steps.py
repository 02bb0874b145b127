"""Which ranks render eval images (ParallelMode.evaluates_here): rank 0 alone where it holds the
whole model, every rank where a view is rendered from every shard; and no mode gathers a full view."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from distsplat_ns.parallel import ReplicatedMode, ShardedMode
from distsplat_ns.parallel.mode import ParallelMode
from tests.helpers.model_factory import make_model


@pytest.mark.parametrize(
    ("mode", "rank", "expected"),
    [(ReplicatedMode, 0, True), (ReplicatedMode, 1, False), (ShardedMode, 0, True), (ShardedMode, 1, True)],
)
def test_eval_runs_on_rank0_replicated_and_on_every_rank_sharded(mode: type, rank: int, expected: bool) -> None:
    ctx = SimpleNamespace(rank=rank, is_main=rank == 0, world_size=2, is_distributed=True)
    assert mode(ctx, make_model(1, num_points=10)).evaluates_here is expected


def test_the_viewer_thread_holds_the_train_lock_only_where_it_renders_the_model_itself() -> None:
    ctx = SimpleNamespace(rank=0, is_main=True, world_size=2, is_distributed=True)
    lock = object()
    assert ReplicatedMode(ctx, make_model(1, num_points=10)).viewer_lock(lock) is lock
    assert ShardedMode(ctx, make_model(1, num_points=10)).viewer_lock(lock) is None


def test_no_mode_gathers_a_full_view() -> None:
    assert not hasattr(ParallelMode, "refresh_full_view")
