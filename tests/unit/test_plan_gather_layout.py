"""The plan-sized all-gathers (``parallel/halo_cost_gathers.py``) on one process: their layout from the
plan, and the one-line errors when a rank's render does not match its plan."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from distsplat_ns.balance.bands import Band
from distsplat_ns.distributed.collectives import all_gather_rows
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.parallel.halo_cost_gathers import HaloSlot, exchange_halo_rows, gather_step_costs, halo_slots


def test_halo_slots_follow_the_bands_and_the_ssim_window() -> None:
    bands = [
        Band(1, 6, 12, tile_size=1),
        Band(0, 0, 8, tile_size=1),
        Band(0, 25, 30, tile_size=1),
        Band(2, 0, 4, tile_size=1),
    ]
    # image 0: 30 px high (halo 10, cut at the bottom); image 1: 12 px (6 rows to its bottom); image 2: 10 px, under the window
    sizes_px = [(5, 30), (4, 12), (3, 10)]
    assert halo_slots(bands, sizes_px) == [HaloSlot(0, 8, 10, 5)]
    assert halo_slots([Band(1, 0, 6, tile_size=1)], sizes_px) == [HaloSlot(1, 6, 6, 4)]


def test_one_rank_gets_its_own_halo_rows_back_in_slot_order() -> None:
    slots = [[HaloSlot(0, 8, 2, 1), HaloSlot(1, 4, 1, 2)]]
    a, b = torch.arange(6.0).reshape(2, 1, 3), torch.arange(6.0, 12.0).reshape(1, 2, 3)
    (got,) = exchange_halo_rows(DistContext(), [(1, 4, b), (0, 8, a)], slots, torch.float64)
    assert [(p, s) for p, s, _ in got] == [(0, 8), (1, 4)]
    assert torch.equal(got[0][2], a.double()) and torch.equal(got[1][2], b.double())


def test_halo_rows_that_the_plan_does_not_give_are_refused() -> None:
    with pytest.raises(RuntimeError, match="rank 0: the bands rendered halo rows .* the step's plan gives"):
        exchange_halo_rows(DistContext(), [(0, 8, torch.zeros(3, 1, 3))], [[HaloSlot(0, 8, 2, 1)]], torch.float32)


def test_one_rank_reads_its_costs_with_one_host_copy() -> None:
    plan = SimpleNamespace(bands=[[Band(0, 0, 2), Band(1, 1, 2)]], heights_px=[40, 20])
    counts = [(Band(1, 1, 2), torch.tensor([[7, 1]])), (Band(0, 0, 2), torch.tensor([[1, 2], [3, 4]]))]
    costs = gather_step_costs(DistContext(), plan, counts, torch.tensor([0], dtype=torch.int32), 0.5, True)
    assert costs.measured == [[(0, 0, [3.0, 7.0]), (1, 1, [8.0])]]  # image 1's second tile row is 4 px
    assert costs.render_s == [0.5] and not costs.nonfinite and costs.view_posted


def test_costs_of_bands_the_plan_does_not_give_are_refused() -> None:
    plan = SimpleNamespace(bands=[[Band(0, 0, 2)]], heights_px=[40])
    with pytest.raises(
        RuntimeError, match=r"rank 0: the step measured bands \[\(0, 0, 1\)\].*its plan gives \[\(0, 0, 2\)\]"
    ):
        gather_step_costs(DistContext(), plan, [(Band(0, 0, 2), torch.ones(1, 3))], None, 0.1, False)


def test_all_gather_rows_refuses_counts_that_do_not_match_the_rows() -> None:
    with pytest.raises(ValueError, match="rank 0 holds 3 rows, the counts given say \\[2\\]"):
        all_gather_rows(DistContext(), torch.zeros(3), [2])
