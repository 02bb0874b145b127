"""Splatfacto options distsplat used to refuse, through both parallel modes on 2 gloo ranks
(docs/parity.md): depth during training (``--pipeline.model.output-depth-during-training``)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import option_fns
from tests.helpers.model_factory import HEIGHT
from tests.helpers.multiproc import run_ranks
from tests.helpers.rows_by_id import grads_by_id, one_copy

# Rows cut across ranks mid-image and off the 16-px tile grid; image 1 whole on rank 1.
SPLIT = [[(0, 0, 21)], [(0, 21, HEIGHT), (1, 0, HEIGHT)]]


@pytest.mark.parametrize("parallel", ["replicated", "sharded"])
def test_band_depth_rows_stitch_to_one_process_whole_image_depth(parallel: str) -> None:
    """Every rank's band rows of the training depth, stitched in row order, equal one process's
    whole-image depth from splatfacto's training path (``get_outputs`` with the flag), including
    the fill of uncovered pixels with the image's largest depth (a maximum over both ranks' bands)."""
    ranks = run_ranks(option_fns.training_depth, 2, parallel, SPLIT, timeout_s=300.0)
    whole = ranks[0][0]["whole"]
    rows = [r for rank in ranks for r in rank[0]["rows"]]
    assert sorted((r["position"], r["first_row"]) for r in rows) == [(0, 0), (0, 21), (1, 0)]
    for position in (0, 1):
        parts = sorted((r for r in rows if r["position"] == position), key=lambda r: r["first_row"])
        stitched = torch.cat([r["depth"] for r in parts])
        want = whole[position]
        assert stitched.shape == want.shape == (HEIGHT, want.shape[1], 1)
        # The test only means something if some pixels are empty (filled) and some covered.
        covered = want < want.max()
        assert covered.any() and (~covered).any()
        # Rendered in float64; get_outputs returns float32 (its outputs always are): float32
        # rounding, 6e-8 of the largest depth measured. A fill with one band's own maximum, or
        # a band's rows taken from the wrong place, is off by whole depth units.
        assert ((stitched - want.double()).abs().max() / want.abs().max()).item() <= 1e-6, position


@pytest.mark.parametrize(
    ("parallel", "mode_name"), [("replicated", "SO3xR3"), ("sharded", "SO3xR3"), ("sharded", "SE3")]
)
def test_pose_adjustment_gradient_on_two_ranks_equals_one_process(parallel: str, mode_name: str) -> None:
    """Camera optimisation (refused before issue 29): each band renders a crop of its camera's
    adjusted pose, so the adjustments' gradient summed over ranks (sharded: what each owner's
    projection of its shard received through the exchange) is one process's whole-image gradient,
    as are the loss and the Gaussians' gradients; the regulariser is added and logged once."""
    ref = run_ranks(option_fns.pose_step, 1, "replicated", [[(0, 0, HEIGHT), (1, 0, HEIGHT)]], mode_name)[0]
    ranks = run_ranks(option_fns.pose_step, 2, parallel, SPLIT, mode_name, timeout_s=300.0)
    assert torch.equal(ranks[0]["pose_grad"], ranks[1]["pose_grad"])  # summed: every rank holds the same
    grad = ref["pose_grad"]
    seen = grad.abs().amax(dim=1) > 0
    # Only the batch's cameras (5, 2) get a data gradient; the regulariser touches every row.
    assert seen.all() and (grad[[5, 2]].abs().amax(dim=1) > 10 * grad[[0, 1]].abs().amax(dim=1)).all()
    # float64; band and rank sums in another order: 1e-10 of the largest entry.
    assert ((ranks[0]["pose_grad"] - grad).abs().max() / grad.abs().max()).item() <= 1e-10
    assert ((ranks[0]["loss"] - ref["loss"]).abs() / ref["loss"].abs()).item() <= 1e-10
    assert ref["regularizer"] > 0 and ranks[0]["regularizer"] == ref["regularizer"] and ranks[1]["regularizer"] == 0
    want, got = grads_by_id([ref]), grads_by_id(one_copy(ranks))
    for name, value in want.items():
        assert ((got[name] - value).abs().max() / value.abs().max().clamp_min(1e-12)).item() <= 1e-10, name
