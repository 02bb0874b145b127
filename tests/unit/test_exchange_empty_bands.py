"""A rank's band that no Gaussian reaches (parallel/exchange.py): it keeps an empty entry, is
rendered as background, and a view's band of it is the background (parallel/view_render.py)."""

from __future__ import annotations

import dataclasses

import torch

from distsplat_ns.balance.bands import Band
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.parallel.exchange import exchange_screen_terms
from distsplat_ns.parallel.view_render import NUM_PIXEL_CHANNELS, _render_band
from distsplat_ns.rendering import rasterize_rows
from tests.helpers.exchange_fns import WIDTH, projection_near_row

ONE_RANK = DistContext()


def test_a_band_no_gaussian_reaches_has_an_empty_entry_and_renders_background():
    proj = projection_near_row(88.0)  # tile row 5
    assert (proj.radii > 0).all() and ((proj.means2d[..., 1] - 88).abs() < 2).all()
    bands = [[Band(0, 0, 1)]]  # tile row 0: rows [0, 16)
    received = exchange_screen_terms(ONE_RANK, [([0], proj)], torch.arange(5), bands, 1)
    assert received.route.rows_of_position[0].shape == (0,)
    ((index, empty, own),) = list(received.render_groups(None, [0], bands[0], None, 1, 0))
    assert (index, empty.num_gaussians, own) == (0, 0, [bands[0]])
    out = rasterize_rows(empty, [0], 16, absgrad=True)
    assert not out.colors.any() and not out.alphas.any()
    background = torch.tensor([0.2, 0.4, 0.6])
    pixels = _render_band(received, 0, 16, WIDTH, background)
    assert pixels.shape == (16, WIDTH, NUM_PIXEL_CHANNELS)
    assert torch.equal(pixels[..., :3], background.expand(16, WIDTH, 3)) and not pixels[..., 3:].any()


def test_positions_with_and_without_gaussians_each_get_their_rows():
    """Two positions of one call, only the second reached: the first is empty, the second holds
    every Gaussian in ascending id (the unpack's split with a zero size)."""
    proj = projection_near_row(88.0)
    fields = ("means2d", "conics", "depths", "radii", "opacities", "colors")
    two = dataclasses.replace(proj, **{n: torch.cat([getattr(proj, n)] * 2) for n in fields}, num_cameras=2)
    bands = [[Band(0, 0, 1), Band(1, 5, 6)]]
    received = exchange_screen_terms(ONE_RANK, [([0, 1], two)], torch.arange(5), bands, 2)
    rows = received.route.rows_of_position
    assert rows[0].shape == (0,) and torch.equal(received.ids[rows[1]], torch.arange(5))
    groups = {i: p.num_gaussians for i, p, _ in received.render_groups(None, [0, 1], bands[0], None, 1, 0)}
    assert groups == {0: 0, 1: 5}
