"""Sharded rendering (each rank owns some Gaussians, model/exchange.py) gives the single-process
loss and per-Gaussian gradients of the whole batch, at W = 1, 2 and 3."""

from __future__ import annotations

import itertools
import random

import pytest

from tests.helpers import rank_fns
from tests.helpers.model_factory import HEIGHT
from tests.helpers.multiproc import run_ranks
from tests.helpers.rows_by_id import grads_by_id

WHOLE = [[(0, 0, HEIGHT), (1, 0, HEIGHT)]]
SPLITS = {
    2: {
        "whole-images-one-per-rank": [[(0, 0, HEIGHT)], [(1, 0, HEIGHT)]],
        "rows-split-across-ranks": [[(0, 0, HEIGHT), (1, 0, 16)], [(1, 16, HEIGHT)]],
        "unaligned-rows": [[(0, 0, 21)], [(0, 21, HEIGHT), (1, 0, HEIGHT)]],
        "one-rank-idle": [[(0, 0, HEIGHT), (1, 0, HEIGHT)], []],
    },
    3: {
        "three-bands-of-one-image": [[(0, 0, 10), (1, 0, HEIGHT)], [(0, 10, 30)], [(0, 30, HEIGHT)]],
        "unaligned-mixed": [[(1, 5, 40)], [(0, 0, HEIGHT)], [(1, 0, 5), (1, 40, HEIGHT)]],
    },
}
CASES = [(w, name) for w, splits in SPLITS.items() for name in splits]
# With the Gaussians kept to rows [0, 32) (model_factory.keep_to_top_rows_): bands of rows
# [32, HEIGHT) receive no Gaussian. Rank 1 of W = 2 renders only such a band; rank 1 of W = 3 one
# such position beside one with Gaussians, rank 2 only such a band.
EMPTY_BAND_SPLITS = {
    2: [[(0, 0, 32), (1, 0, HEIGHT)], [(0, 32, HEIGHT)]],
    3: [[(0, 0, 32)], [(0, 32, HEIGHT), (1, 0, 32)], [(1, 32, HEIGHT)]],
}


@pytest.fixture(scope="module", params=["float64", "float32"])
def dtype(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def reference(dtype: str) -> dict:
    """One process, replicated: the whole batch's loss and gradients."""
    grads = run_ranks(rank_fns.band_gradients_dtype, 1, [WHOLE], 2, 5, dtype)[0][0]
    return grads


@pytest.fixture(scope="module")
def sharded(dtype: str) -> dict:
    results = {1: run_ranks(rank_fns.sharded_band_gradients, 1, [WHOLE], 2, 5, dtype)}
    for world, splits in SPLITS.items():
        results[world] = run_ranks(rank_fns.sharded_band_gradients, world, list(splits.values()), 2, 5, dtype)
    return results


@pytest.fixture(scope="module")
def top_rows_reference(dtype: str) -> dict:
    return run_ranks(rank_fns.band_gradients_dtype, 1, [WHOLE], 2, 5, dtype, True)[0][0]


def _assemble(rank_results: list, index: int) -> dict:
    """Per-Gaussian values of every rank, ordered by global id, and the summed loss."""
    out = grads_by_id([r[index] for r in rank_results])
    out["loss"] = sum(r[index]["loss"] for r in rank_results)
    return out


@pytest.mark.parametrize("world,split", [(1, "whole")] + CASES)
def test_sharded_equals_one_process(reference: dict, sharded: dict, dtype: str, world: int, split: str) -> None:
    index = 0 if world == 1 else list(SPLITS[world]).index(split)
    _assert_equal_to_one_process(_assemble(sharded[world], index), reference, dtype, f"W={world} {split}")


def _assert_equal_to_one_process(got: dict, reference: dict, dtype: str, case: str) -> None:
    # Summation order differs (bands, then owners); float32: 1e-5 of the largest entry, as the
    # replicated band test; float64 has 2^29 times less rounding: 1e-12.
    tol = 1e-12 if dtype == "float64" else 1e-5
    for name, ref in reference.items():
        if ref.numel() == 0:
            continue
        scale = ref.abs().max().clamp_min(1e-12)
        assert ((got[name] - ref).abs().max() / scale) <= tol, f"{case}: {name}"
    assert got["means2d.absgrad"].abs().max() > 0 and got["gauss_params.means"].abs().max() > 0


@pytest.mark.parametrize("world", sorted(EMPTY_BAND_SPLITS))
def test_bands_no_gaussian_reaches_render_their_background(top_rows_reference: dict, dtype: str, world: int) -> None:
    """A rank whose bands of a position receive no Gaussian renders them (background, zero
    gradient) and still joins the exchange's reverse pass; the batch equals one process."""
    ranks = run_ranks(
        rank_fns.sharded_band_gradients, world, [EMPTY_BAND_SPLITS[world]], 2, 5, dtype, "reference", True
    )
    assert ranks[-1][0]["received"] == 0  # the case holds: the last rank's only band is empty
    _assert_equal_to_one_process(_assemble(ranks, 0), top_rows_reference, dtype, f"W={world} empty bands")


def test_a_rank_that_owns_no_gaussian_renders_what_it_receives(reference: dict, dtype: str) -> None:
    """Rank 1 of 3 owns nothing (all pruned, say): it sends no row, renders its band from the
    rows the others send, and the batch still equals one process."""
    split = SPLITS[3]["unaligned-mixed"]
    ranks = run_ranks(rank_fns.sharded_band_gradients, 3, [split], 2, 5, dtype, "reference", False, 1)
    assert ranks[1][0]["shard"] == 0 and ranks[1][0]["sent"] == 0 and ranks[1][0]["received"] > 0
    _assert_equal_to_one_process(_assemble(ranks, 0), reference, dtype, "W=3 rank 1 empty")


def _random_plan(rng: random.Random, world: int, batch_size: int) -> list:
    """Each image cut at up to 3 random pixel rows, each band to a random rank (ranks may get
    nothing, several bands of one image, or bands no Gaussian reaches)."""
    plan: list = [[] for _ in range(world)]
    for position in range(batch_size):
        edges = [0, *sorted(rng.sample(range(1, HEIGHT), rng.randint(0, 3))), HEIGHT]
        for first, end in itertools.pairwise(edges):
            plan[rng.randrange(world)].append((position, first, end))
    return plan


def test_random_plans_equal_one_process(top_rows_reference: dict, dtype: str) -> None:
    """Seeded random plans at W = 3 over the top-rows scene, rank 1 owning nothing: whatever the
    cut, the batch equals one process."""
    plans = [_random_plan(random.Random(seed), 3, 2) for seed in range(4)]
    ranks = run_ranks(rank_fns.sharded_band_gradients, 3, plans, 2, 5, dtype, "reference", True, 1)
    for i, plan in enumerate(plans):
        _assert_equal_to_one_process(_assemble(ranks, i), top_rows_reference, dtype, f"plan {plan}")


def test_gaussians_travel_only_where_needed(sharded: dict) -> None:
    """Whole images, one per rank: each rank keeps what its own image needs and sends the other
    rank at most its whole shard once (one camera), not once per camera."""
    for rank_results in sharded[2]:
        whole_images = rank_results[0]
        assert whole_images["sent"] > whole_images["sent_to_others"] > 0
        assert whole_images["sent_to_others"] <= whole_images["shard"]
