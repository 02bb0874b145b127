"""The step's plan-sized all-gathers (``parallel/halo_cost_gathers.py``) on 3 gloo ranks: what every
rank receives equals what the pickled all-gather they replace delivers."""

from __future__ import annotations

import torch

from tests.helpers import rank_fns
from tests.helpers.multiproc import run_ranks

# Pixel-row bands (position, first row, end row) of two images 30 and 12 px high: rank 0's first
# band and rank 1's second have SSIM-halo rows (10, and 6 to the image's bottom); rank 2 renders nothing.
CUT = [[(0, 0, 8), (1, 6, 12)], [(0, 8, 30), (1, 0, 6)], []]
SIZES_PX = [(5, 30), (4, 12)]


def test_halo_rows_reach_every_rank_as_the_pickled_all_gather_delivers_them() -> None:
    for exchanged, pickled in run_ranks(rank_fns.plan_sized_halo_exchange, 3, CUT, SIZES_PX):
        assert [[(p, s, tuple(r.shape)) for p, s, r in msgs] for msgs in exchanged] == [
            [(0, 8, (10, 5, 3))],
            [(1, 6, (6, 4, 3))],
            [],
        ]
        for got, sent in zip(exchanged, pickled, strict=True):
            sent = sorted(sent, key=lambda m: (m[0], m[1]))
            assert all(torch.equal(a[2], b[2]) for a, b in zip(got, sent, strict=True))


def test_no_halo_rows_when_the_plan_cuts_no_image() -> None:
    whole = [[(0, 0, 30)], [(1, 0, 12)], []]
    for exchanged, pickled in run_ranks(rank_fns.plan_sized_halo_exchange, 3, whole, SIZES_PX):
        assert exchanged == [[], [], []] and pickled == [[], [], []]


def test_step_costs_reach_every_rank_in_plan_order() -> None:
    # Tile-row bands: image 0 is 40 px high (3 tile rows, the last partial), image 1 is 16 px.
    bands = [[(0, 0, 2), (1, 0, 1)], [(0, 2, 3)], []]
    results = run_ranks(rank_fns.plan_sized_step_costs, 3, bands, [40, 16], 2, [0, 1])
    expected = [
        [(0, 0, [1.0, 5.0]), (1, 0, [201.0])],  # rows [0 + 1, 2 + 3]; position 1: 100 + (0 + 1)
        [(0, 2, [2001.0])],  # 1000 + (0 + 1); the band's 8 px are one tile row
        [],
    ]
    for costs in results:
        assert costs.measured == expected
        assert costs.render_s == [0.25, 0.5, 0.75]
        assert costs.nonfinite  # rank 2's verdict stops every rank
        assert costs.view_posted  # rank 0's flag; rank 1's is not read


def test_step_costs_without_a_verdict_or_a_view_from_rank_0() -> None:
    results = run_ranks(rank_fns.plan_sized_step_costs, 2, [[(0, 0, 1)], [(0, 1, 3)]], [40], None, [1])
    for costs in results:
        assert not costs.nonfinite and not costs.view_posted
        assert costs.measured == [[(0, 0, [1.0])], [(0, 1, [2001.0, 2005.0])]]
