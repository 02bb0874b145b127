"""Densification under a cap on W gloo ranks, each holding a shard, with the real gather
(gaussians/growth_cap.py): the same global cap gives the same Gaussians on 1, 2 and 3 ranks, bit
for bit in float64, and a rank past its per-rank cap keeps only what fits. Replicated mode is the
one-process case on every rank (``gather_local``)."""

from __future__ import annotations

import pytest
import torch

from distsplat_ns.gaussians.densifier import gather_local
from distsplat_ns.gaussians.growth_cap import RefusedCounts
from tests.helpers.multiproc import run_ranks
from tests.helpers.rows_by_id import gaussians_by_id, joined_by_id
from tests.helpers.strategy_shards import STEPS, IdCounter, N, make_gaussians, refine_event, refine_rank_shard

CAP = N + 40
"""Below what either event of STEPS would grow to uncapped (checked below)."""


def _one_process(max_gaussians: int | None) -> tuple[dict[str, torch.Tensor], IdCounter, list[RefusedCounts]]:
    full = make_gaussians(torch.float64)
    one = IdCounter(3 * N, gather_local)
    one.densifier.set_cap(max_gaussians)
    refused = []
    for step in STEPS:
        refine_event(full, step, torch.float64, one)
        refused.append(one.densifier.last_refused)
    return gaussians_by_id([full]), one, refused


@pytest.mark.parametrize(("world_size", "partition"), [(2, "blocks2"), (3, "interleaved3")])
def test_a_global_cap_gives_the_same_gaussians_on_any_number_of_ranks(world_size: int, partition: str) -> None:
    expected, one, refused = _one_process(CAP)
    assert all(r.global_cap > 0 and r.shard_cap == 0 for r in refused), refused  # the cap limits both events
    ranks = run_ranks(refine_rank_shard, world_size, "float64", partition, CAP)
    assert [r["next_id"] for r in ranks] == [one.next_id] * world_size
    assert [r["gathers"] for r in ranks] == [len(STEPS)] * world_size  # no collective of its own
    assert [r["refused"] for r in ranks] == [refused] * world_size
    got = joined_by_id([r["tensors"] for r in ranks], [r["tensors"]["gauss_ids"] for r in ranks])
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key


def test_a_rank_past_max_held_keeps_what_fits_and_counts_it_apart() -> None:
    max_held = N // 2 + 10  # blocks2: 200 held each; the global cap would let 40 grow
    ranks = run_ranks(refine_rank_shard, 2, "float64", "blocks2", CAP, max_held)
    assert ranks[0]["refused"] == ranks[1]["refused"] and ranks[0]["next_id"] == ranks[1]["next_id"]
    assert any(r.shard_cap > 0 for r in ranks[0]["refused"])
    assert all(g <= max_held for r in ranks for g in r["grown"]), [r["grown"] for r in ranks]
    ids = torch.cat([r["tensors"]["gauss_ids"] for r in ranks])
    assert ids.unique().numel() == ids.numel() and int(ids.max()) < ranks[0]["next_id"]
