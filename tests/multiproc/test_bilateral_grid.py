"""The bilateral grid (--pipeline.model.use-bilateral-grid True) on 2 gloo ranks rendering bands:
loss and every gradient (Gaussians and grids) equal one process rendering whole images (float64).

A band applies its image's grid (by training-camera id, not batch position) at the whole image's
pixel coordinates, and the grids' total variation is added once (not per band or rank). The grids
start perturbed from identity, so a band using its own row coordinates changes the forward, a
wrong grid index moves the gradient to another grid, and a total variation added per band or per
rank changes the loss.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import rank_fns
from tests.helpers.model_factory import HEIGHT
from tests.helpers.multiproc import run_ranks
from tests.helpers.rows_by_id import grads_by_id, one_copy

WHOLE = [[(0, 0, HEIGHT), (1, 0, HEIGHT)]]
SPLITS = {
    "whole-images-one-per-rank": [[(0, 0, HEIGHT)], [(1, 0, HEIGHT)]],
    "rows-split-across-ranks": [[(0, 0, HEIGHT), (1, 0, 16)], [(1, 16, HEIGHT)]],
    "unaligned-rows": [[(0, 0, 21)], [(0, 21, HEIGHT), (1, 0, HEIGHT)]],
}
NAMES = list(SPLITS)
CAMERA_IDS = [5, 2]  # batch position -> training camera (of make_model's 8)
GRID = {"use_bilateral_grid": True, "grid_shape": (4, 4, 2)}


@pytest.fixture(scope="module")
def reference() -> dict:
    return run_ranks(rank_fns.band_gradients, 1, [WHOLE], 2, 5, "float64", CAMERA_IDS, GRID)[0][0]


@pytest.fixture(scope="module")
def two_rank_results() -> list:
    return run_ranks(
        rank_fns.band_gradients, 2, [SPLITS[n] for n in NAMES], 2, 5, "float64", CAMERA_IDS, GRID, timeout_s=300.0
    )


@pytest.mark.parametrize("split", NAMES)
def test_banded_grid_equals_one_process(reference: dict, two_rank_results: list, split: str) -> None:
    got_all = two_rank_results[0][NAMES.index(split)]
    for name, ref in reference.items():
        if ref.numel() == 0:
            continue
        scale = ref.abs().max().clamp_min(1e-12)
        # float64, summation order differs (bands, ranks): 1e-10 of the largest entry.
        assert ((got_all[name] - ref).abs().max() / scale) <= 1e-10, f"{split}: {name}"


def test_the_batch_grids_learn(reference: dict) -> None:
    per_grid = reference["bil_grids.grids"].flatten(1).abs().amax(dim=1)
    assert per_grid[5] > 0 and per_grid[2] > 0 and reference["gauss_params.means"].abs().max() > 0


# Through the parallel modes (replicated and sharded: the sharded exchange, its reverse in backward,
# the grids among the replicated parameters summed by mode.reduce_gradients), two camera sizes.
from tests.helpers.model_factory import MIXED_SIZES

(_, H0), (_, H1) = MIXED_SIZES
MODE_WHOLE = [[(0, 0, H0), (1, 0, H1)]]
MODE_SPLIT = [[(0, 0, 21)], [(0, 21, H0), (1, 0, H1)]]


def _gauss_by_id(parts: list) -> dict:
    rows = grads_by_id(one_copy(parts))
    return {name: value for name, value in rows.items() if name.startswith("gauss_params.")}


@pytest.mark.parametrize("parallel", ["replicated", "sharded"])
def test_grid_through_each_mode_equals_one_process(parallel: str) -> None:
    ref = run_ranks(rank_fns.mixed_size_step, 1, "replicated", [MODE_WHOLE], 5, True)[0][0]
    ranks = run_ranks(rank_fns.mixed_size_step, 2, parallel, [MODE_SPLIT], 5, True, timeout_s=300.0)
    parts = [r[0] for r in ranks]
    assert torch.equal(parts[0]["grid_grad"], parts[1]["grid_grad"])  # summed: every rank holds the same
    for got, want in [(parts[0]["grid_grad"], ref["grid_grad"]), (parts[0]["loss"], ref["loss"])]:
        assert ((got - want).abs().max() / want.abs().max()) <= 1e-10
    want, got = _gauss_by_id([ref]), _gauss_by_id(parts)
    for name, value in want.items():
        if value.numel():
            assert ((got[name] - value).abs().max() / value.abs().max().clamp_min(1e-12)) <= 1e-10, name
