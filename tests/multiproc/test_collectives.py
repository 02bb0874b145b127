"""Collectives on 2-3 gloo ranks."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import rank_fns
from tests.helpers.multiproc import run_ranks


@pytest.mark.parametrize("bucket_bytes", [1024, 25 * 1024 * 1024])
def test_sum_gradients_sums_every_parameter_and_treats_missing_as_zero(bucket_bytes: int) -> None:
    results = run_ranks(rank_fns.sum_gradients_of_rank_params, 2, bucket_bytes)
    for grads in results:
        for i, g in enumerate(grads):
            expected = (1 + (0 if i == 1 else 2)) * (i + 1)
            assert torch.equal(g, torch.full_like(g, float(expected)))


def test_overlapped_gradient_sum_equals_the_sum_after_the_backward_bitwise() -> None:
    """Buckets started from the last backward's hooks (fired in another order on each rank, one
    parameter also accumulated by an earlier backward, one reached by no backward on rank 1) sum
    exactly what the reduction after the backward sums, and every rank holds the same result."""
    overlapped = run_ranks(rank_fns.overlapped_gradient_sum, 2, True)
    after = run_ranks(rank_fns.overlapped_gradient_sum, 2, False)
    assert [started for _, started in overlapped] == [1, 0]  # rank 0 started bucket [4, 3] in the backward
    assert [started for _, started in after] == [0, 0]
    for (grads_overlapped, _), (grads_after, _) in zip(overlapped, after, strict=True):
        for g, h in zip(grads_overlapped, grads_after, strict=True):
            assert torch.equal(g, h)
    for g, h in zip(overlapped[0][0], overlapped[1][0], strict=True):
        assert torch.equal(g, h)
    # parameter 1 (value 2): rank 0's 0.5 (first backward) + 2 * 2 * 1 * 1 (last); parameter 2 (value 3): 2*3*2 * (1 + 2).
    assert torch.equal(overlapped[0][0][1], torch.full((7,), 4.5, dtype=torch.float64))
    assert torch.equal(overlapped[0][0][2], torch.full((3, 5), 36.0, dtype=torch.float64))


@pytest.mark.parametrize("counts", [[2, 2, 2], [2, 0, 3]])
@pytest.mark.parametrize("given", [True, False])
def test_all_gather_rows_gives_every_rank_every_ranks_rows_unpadded(counts: list[int], given: bool) -> None:
    """Equal counts (no padding: each part is the whole gathered row block) and unequal ones
    (padded to the longest, each part cut to its count); counts given or gathered."""
    results = run_ranks(rank_fns.gather_rank_rows, 3, counts, given)
    for parts in results:
        assert [tuple(p.shape) for p in parts] == [(n, 2) for n in counts]
        for r, p in enumerate(parts):
            assert torch.equal(p, (r * 100 + torch.arange(counts[r], dtype=torch.float32))[:, None].expand(-1, 2))


def test_all_reduce_max_agrees_on_every_rank() -> None:
    results = run_ranks(rank_fns.max_reduce_rank, 3)
    for r in results:
        assert r.tolist() == [2, 0, 5]


def test_broadcast_object_gives_rank0_value_everywhere() -> None:
    assert run_ranks(rank_fns.broadcast_rank0_value, 2) == [{"timestamp": "ts-0"}] * 2


def test_all_gather_object_gives_every_rank_every_object_of_any_size() -> None:
    results = run_ranks(rank_fns.gather_rank_objects, 3)
    for gathered in results:
        assert [g["rank"] for g in gathered] == [0, 1, 2]
        assert [g["rows"] for g in gathered] == [list(range(r * 50)) for r in range(3)]
        assert all(torch.equal(g["t"], torch.arange(r + 1.0)) for r, g in enumerate(gathered))


@pytest.mark.parametrize("through_mode", [False, True])
def test_replica_check_names_the_drifting_rank_on_every_rank(through_mode: bool) -> None:
    results = run_ranks(rank_fns.replica_check_outcome, 3, 2, through_mode)
    assert all("ranks [2]" in r and "step 7" in r for r in results)


@pytest.mark.parametrize("through_mode", [False, True])
def test_replica_check_passes_identical_replicas(through_mode: bool) -> None:
    assert run_ranks(rank_fns.replica_check_outcome, 2, -1, through_mode) == ["identical", "identical"]
