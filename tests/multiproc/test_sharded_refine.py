"""Densification on W gloo ranks, each holding a shard, with the real id gather (all_gather_rows):
the union of the shards equals one process holding every Gaussian, bit for bit."""

from __future__ import annotations

import pytest
import torch

from distsplat_ns.gaussians.densifier import gather_local
from tests.helpers.multiproc import run_ranks
from tests.helpers.rows_by_id import gaussians_by_id, joined_by_id
from tests.helpers.strategy_shards import STEPS, IdCounter, N, make_gaussians, refine_event, refine_rank_shard


@pytest.mark.parametrize(
    ("world_size", "partition", "dtype_name"), [(2, "blocks2", "float64"), (3, "interleaved3", "float32")]
)
def test_sharded_ranks_refine_as_one_process(world_size: int, partition: str, dtype_name: str) -> None:
    dtype = getattr(torch, dtype_name)
    full = make_gaussians(dtype)
    one = IdCounter(3 * N, gather_local)
    for step in STEPS:
        refine_event(full, step, dtype, one)
    expected = gaussians_by_id([full])
    ranks = run_ranks(refine_rank_shard, world_size, dtype_name, partition)
    assert [r["next_id"] for r in ranks] == [one.next_id] * world_size
    assert [r["gathers"] for r in ranks] == [len(STEPS)] * world_size
    got = joined_by_id([r["tensors"] for r in ranks], [r["tensors"]["gauss_ids"] for r in ranks])
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
