"""``ShardedMode.num_gaussians_total``: the shards' sizes are gathered at the first step and again
only after a step that may change shards; a shard that changes size in between is refused, not
counted with a stale total."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from distsplat_ns.parallel import ShardedMode, sharded
from tests.helpers.model_factory import make_model


def test_the_total_is_gathered_once_and_again_after_a_step_that_may_change_shards(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gathered: list[int] = []

    def all_gather_counts(ctx, count: int) -> list[int]:  # rank 1 holds 1000 Gaussians
        gathered.append(count)
        return [count, 1000]

    monkeypatch.setattr(sharded, "all_gather_counts", all_gather_counts)
    monkeypatch.setattr(sharded, "rebalance_shards_", lambda ctx, rows: 0)
    ctx = SimpleNamespace(rank=0, is_main=True, world_size=2, is_distributed=True)
    model = make_model(1, num_points=10)
    mode = ShardedMode(ctx, model)
    changes = {5: False, 6: True}
    monkeypatch.setattr(model.densifier, "changes_shards_at", lambda step: changes[step])

    assert [mode.num_gaussians_total() for _ in range(3)] == [1010] * 3 and gathered == [10]
    assert mode.after_refine(5, {}) == 0 and mode.num_gaussians_total() == 1010 and gathered == [10]
    model.rows.select_(slice(0, 7))  # outside a step that may change shards
    with pytest.raises(RuntimeError, match="rank 0's shard holds 7 Gaussians, 10 when the ranks last agreed"):
        mode.num_gaussians_total()
    mode.after_refine(6, {})
    assert mode.num_gaussians_total() == 1007 and gathered == [10, 7]
