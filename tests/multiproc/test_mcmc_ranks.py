"""MCMC events on W gloo ranks, each holding a shard, with the real gather (``all_gather_rows``):
the union of the shards equals one process holding every Gaussian, bit for bit."""

from __future__ import annotations

import pytest
import torch

from distsplat_ns.gaussians.densifier import gather_local
from tests.helpers.mcmc_shards import gaussians_by_id, mcmc_gaussians, mcmc_rank_shard, mcmc_sequence
from tests.helpers.multiproc import run_ranks
from tests.helpers.rows_by_id import joined_by_id


@pytest.mark.parametrize(
    ("world_size", "partition", "dtype_name"), [(2, "blocks2", "float64"), (3, "empty_rank3", "float32")]
)
def test_mcmc_on_ranks_equals_one_process(world_size: int, partition: str, dtype_name: str) -> None:
    full = mcmc_gaussians(getattr(torch, dtype_name))
    events = [tuple(e) for e in mcmc_sequence(full, gather_local)]
    expected = gaussians_by_id([full])
    ranks = run_ranks(mcmc_rank_shard, world_size, dtype_name, partition)
    assert all(r["events"] == events for r in ranks)
    assert len({r["gathers"] for r in ranks}) == 1
    got = joined_by_id([r["tensors"] for r in ranks], [r["tensors"]["gauss_ids"] for r in ranks])
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
