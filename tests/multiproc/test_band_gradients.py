"""Distributed band rendering gives the single-process gradients of the whole batch."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import rank_fns
from tests.helpers.model_factory import HEIGHT
from tests.helpers.multiproc import run_ranks

# One process rendering both whole images: the reference.
WHOLE = [[(0, 0, HEIGHT), (1, 0, HEIGHT)]]
SPLITS = {
    "whole-images-one-per-rank": [[(0, 0, HEIGHT)], [(1, 0, HEIGHT)]],
    "rows-split-across-ranks": [[(0, 0, HEIGHT), (1, 0, 16)], [(1, 16, HEIGHT)]],
    "unaligned-rows": [[(0, 0, 21)], [(0, 21, HEIGHT), (1, 0, HEIGHT)]],
    "one-rank-idle": [[(0, 0, HEIGHT), (1, 0, HEIGHT)], []],
}
NAMES = list(SPLITS)


@pytest.fixture(scope="module")
def reference() -> dict:
    return run_ranks(rank_fns.band_gradients, 1, [WHOLE], 2, 5)[0][0]


@pytest.fixture(scope="module")
def two_rank_results() -> list:
    # One spawn for every split: importing nerfstudio dominates the cost of a rank.
    return run_ranks(rank_fns.band_gradients, 2, [SPLITS[n] for n in NAMES], 2, 5)


@pytest.mark.parametrize("split", NAMES)
def test_two_ranks_equal_one_process_gradients(reference: dict, two_rank_results: list, split: str) -> None:
    for rank_results in two_rank_results:
        got_all = rank_results[NAMES.index(split)]
        for name, ref in reference.items():
            if ref.numel() == 0:
                continue
            got = got_all[name]
            # float32, summation order differs (bands, then ranks): 1e-5 relative of the largest entry.
            scale = ref.abs().max().clamp_min(1e-12)
            assert ((got - ref).abs().max() / scale) <= 1e-5, f"{split}: {name}"


def test_reference_gradients_are_not_trivially_zero(reference: dict) -> None:
    assert reference["gauss_params.means"].abs().max() > 0
    assert reference["gauss_params.features_dc"].abs().max() > 0


@pytest.mark.parametrize("split", NAMES)
def test_ranks_hold_identical_summed_gradients(two_rank_results: list, split: str) -> None:
    a, b = (r[NAMES.index(split)] for r in two_rank_results)
    for name in a:
        assert torch.equal(a[name], b[name]), name
