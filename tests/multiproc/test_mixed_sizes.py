"""A batch of two cameras of different sizes (a multi-camera capture) on 2 ranks, in each parallel
mode, gives one process's loss, gradients and densification statistics (float64)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import rank_fns
from tests.helpers.model_factory import MIXED_SIZES
from tests.helpers.multiproc import run_ranks
from tests.helpers.rows_by_id import grads_by_id, one_copy

(_, H0), (_, H1) = MIXED_SIZES
WHOLE = [[(0, 0, H0), (1, 0, H1)]]
SPLITS = {
    "whole-images-one-per-rank": [[(0, 0, H0)], [(1, 0, H1)]],
    "rows-split-across-ranks": [[(0, 0, H0), (1, 0, 16)], [(1, 16, H1)]],
    "unaligned-rows": [[(0, 0, 21)], [(0, 21, H0), (1, 0, H1)]],
}
NAMES = list(SPLITS)


def _assemble(rank_results: list, index: int) -> dict:
    """Every Gaussian's values in id order (a rank holding all of them gives them alone)."""
    parts = one_copy([r[index] for r in rank_results])
    return grads_by_id(parts) | {"loss": parts[0]["loss"]}


@pytest.fixture(scope="module")
def reference() -> dict:
    return _assemble(run_ranks(rank_fns.mixed_size_step, 1, "replicated", [WHOLE]), 0)


@pytest.fixture(scope="module", params=["replicated", "sharded"])
def two_ranks(request) -> tuple:
    return request.param, run_ranks(
        rank_fns.mixed_size_step, 2, request.param, [SPLITS[n] for n in NAMES], timeout_s=300.0
    )


@pytest.mark.parametrize("split", NAMES)
def test_two_sizes_on_two_ranks_equal_one_process(reference: dict, two_ranks: tuple, split: str) -> None:
    parallel, results = two_ranks
    got = _assemble(results, NAMES.index(split))
    for name, ref in reference.items():
        scale = ref.abs().max().clamp_min(1e-12)
        # float64, summation order differs (bands, ranks, owners): 1e-10 of the largest entry.
        assert ((got[name] - ref).abs().max() / scale) <= 1e-10, f"{parallel} {split}: {name}"
    assert reference["gauss_params.means"].abs().max() > 0 and reference["state.grad2d"].abs().max() > 0


def test_sharded_at_one_rank_is_one_replicated_process_bitwise(reference: dict) -> None:
    """At one rank the sharded mode has no exchange (``ShardedMode.projections``): its loss,
    gradients and densification statistics are the replicated process's, bit for bit (the same
    projections, the same sums in the same order)."""
    got = _assemble(run_ranks(rank_fns.mixed_size_step, 1, "sharded", [WHOLE]), 0)
    assert got.keys() == reference.keys()
    for name, ref in reference.items():
        assert torch.equal(got[name], ref), name


def test_some_gaussians_are_seen_by_both_cameras(reference: dict) -> None:
    # Their statistics sum the two cameras' gradients, each normalised by its own size.
    assert reference["state.count"].max() == 2


@pytest.mark.parametrize("parallel", ["replicated", "sharded"])
def test_no_projection_outlives_its_step(parallel: str) -> None:
    # The exchange's autograd node held its route, and the route the projections whose graph holds
    # the node: a cycle through autograd's C++ side, so every sharded step's projections leaked.
    split = SPLITS["rows-split-across-ranks"]
    assert run_ranks(rank_fns.projections_alive_after, 2, parallel, [split, split], timeout_s=300.0) == [0, 0]
