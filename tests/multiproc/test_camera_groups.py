"""A sharded step run in groups of cameras (pipeline/band_pass.py:BandPass.run, one exchange,
forward and backward per group so only a group's projections are live) gives the loss, gradients
and densification statistics of one group of the whole batch."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import view_fns
from tests.helpers.multiproc import run_ranks


@pytest.fixture(scope="module")
def one_group() -> list:
    return run_ranks(view_fns.grouped_step, 2, 3, "float64")


@pytest.mark.parametrize("group_cameras", [1, 2])
def test_camera_groups_give_the_loss_and_gradients_of_one_group(one_group: list, group_cameras: int) -> None:
    grouped = run_ranks(view_fns.grouped_step, 2, group_cameras, "float64")
    for got, want in zip(grouped, one_group, strict=False):
        assert got["num_groups"] == -(-3 // group_cameras) and want["num_groups"] == 1
        assert torch.equal(got["ids"], want["ids"]) and got["num_tile_work"] == want["num_tile_work"]
        # float64; the groups' gradients are summed into .grad one group after the other instead
        # of by one backward: rounding only, 1e-12 of the largest entry.
        for name in want["grads"]:
            scale = want["grads"][name].abs().max().clamp_min(1e-30)
            assert (got["grads"][name] - want["grads"][name]).abs().max() / scale <= 1e-12, name
        for name in ("means2d_grad", "absgrad"):
            scale = want[name].abs().max().clamp_min(1e-30)
            assert (got[name] - want[name]).abs().max() / scale <= 1e-12, name
        assert torch.equal(got["radii"], want["radii"])
        assert abs(float(got["loss"] - want["loss"])) <= 1e-12 * abs(float(want["loss"]))
    assert any(r["grads"]["means"].abs().max() > 0 for r in one_group)
