"""The sharded exchange's routing in one batch of operations (``parallel/exchange.py:_pair_masks``:
``balance/routing.py:footprint_touches_px`` over several cameras, in the centres' float32) against the
test written one camera and one band at a time in float64 tile rows (``footprint_tile_rows``): the
same Gaussians for every (destination, position) pair."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from distsplat_ns.balance.bands import TILE_SIZE, Band, num_tile_rows
from distsplat_ns.balance.routing import (
    MARGIN_PX,
    band_extent_px,
    footprint_reach_px,
    footprint_tile_rows,
    footprint_touches_px,
    touches_rows,
)
from distsplat_ns.parallel.exchange import _pair_masks, render_tile_rows

N = 200


def _projection(num_cameras: int, width: int, height: int, seed: int, radius_xy: bool = False) -> SimpleNamespace:
    gen = torch.Generator().manual_seed(seed)
    means2d = torch.rand(num_cameras, N, 2, generator=gen) * torch.tensor([width * 1.4, height * 1.4]) - torch.tensor(
        [width * 0.2, height * 0.2]
    )
    shape = (num_cameras, N, 2) if radius_xy else (num_cameras, N)
    radii = torch.randint(0, 40, shape, generator=gen, dtype=torch.int32)
    return SimpleNamespace(means2d=means2d, radii=radii, width=width, height=height)


@pytest.mark.parametrize("radius_xy", [False, True])
def test_footprints_of_several_cameras_equal_each_camera_alone(radius_xy: bool) -> None:
    proj = _projection(3, 96, 80, 1, radius_xy)
    first, end = footprint_tile_rows(proj.means2d, proj.radii, proj.height)
    y, reach = footprint_reach_px(proj.means2d, proj.radii)
    for k in range(3):
        f, e = footprint_tile_rows(proj.means2d[k], proj.radii[k], proj.height)
        y_k, reach_k = footprint_reach_px(proj.means2d[k], proj.radii[k])
        assert torch.equal(first[k], f) and torch.equal(end[k], e)
        assert torch.equal(y[k], y_k) and torch.equal(reach[k], reach_k)


def _expected(calls, bands_of_rank):
    """Band by band, camera by camera: the union per (destination, position)."""
    where = {p: (c, k) for c, (positions, _) in enumerate(calls) for k, p in enumerate(positions)}
    masks: dict[tuple[int, int], torch.Tensor] = {}
    for dest, bands in enumerate(bands_of_rank):
        for band in bands:
            c, k = where[band.position]
            proj = calls[c][1]
            first, end = footprint_tile_rows(proj.means2d[k], proj.radii[k], proj.height)
            touch = touches_rows(first, end, *render_tile_rows(band, proj.height))
            key = (dest, band.position)
            masks[key] = masks[key] | touch if key in masks else touch
    return sorted(masks), masks


def _check(calls, bands_of_rank) -> None:
    sizes_px = {p: (proj.width, proj.height) for positions, proj in calls for p in positions}
    camera_of = {p: i for i, p in enumerate(p for positions, _ in calls for p in positions)}
    pairs, stacked = _pair_masks(calls, sizes_px, camera_of, bands_of_rank)
    want_pairs, want = _expected(calls, bands_of_rank)
    assert pairs == want_pairs
    assert stacked.shape == (len(pairs), N)
    for i, pair in enumerate(pairs):
        assert torch.equal(stacked[i], want[pair]), pair
    assert stacked.any()  # the scene reaches the bands: the comparison is not of empty masks


def test_one_call_bands_cut_across_ranks() -> None:
    # Three ranks, batch of three 80-px images (5 tile rows): rank 1 holds the end of image 0 and
    # the start of image 1, rank 2 the rest; rank 0's bands are listed out of position order.
    calls = [([0, 1, 2], _projection(3, 96, 80, 2))]
    bands = [[Band(2, 0, 5), Band(0, 0, 3)], [Band(0, 3, 5), Band(1, 0, 2)], [Band(1, 2, 5)]]
    _check(calls, bands)


def test_one_band_per_camera_in_camera_order() -> None:
    # B = W with whole images: band k is camera k, and the footprints are tested without a gather.
    calls = [([0, 1, 2], _projection(3, 96, 80, 10))]
    _check(calls, [[Band(0, 0, 5)], [Band(1, 0, 5)], [Band(2, 0, 5)]])


def test_two_bands_of_one_pair_are_united() -> None:
    calls = [([0, 1], _projection(2, 96, 80, 3))]
    bands = [[Band(0, 0, 1), Band(0, 4, 5)], [Band(0, 1, 4), Band(1, 0, 5)]]
    _check(calls, bands)


def test_calls_of_two_sizes() -> None:
    # Cameras of two sizes projected in two calls; positions interleave across the calls.
    calls = [([0, 2], _projection(2, 96, 80, 4)), ([1], _projection(1, 64, 48, 5))]
    bands = [[Band(0, 0, 5), Band(1, 0, 1)], [Band(1, 1, 3), Band(2, 0, 5)]]
    _check(calls, bands)


def test_no_bands_no_pairs() -> None:
    calls = [([0], _projection(1, 96, 80, 6))]
    assert _pair_masks(calls, {0: (0, 0)}, {0: 0}, [[], []]) == ([], None)


def _touch_tile_rows(proj, band_first: int, band_end: int) -> torch.Tensor:
    first, end = footprint_tile_rows(proj.means2d[0], proj.radii[0], proj.height)
    return touches_rows(first, end, torch.tensor(band_first), torch.tensor(band_end))


def _touch_px(proj, band_first: int, band_end: int) -> torch.Tensor:
    y, reach = footprint_reach_px(proj.means2d[0], proj.radii[0])
    middle, half = band_extent_px(band_first, band_end)
    return footprint_touches_px(y, reach, torch.tensor(middle), torch.tensor(half))


@pytest.mark.parametrize("touch", [_touch_tile_rows, _touch_px])
@pytest.mark.parametrize("radius_xy", [False, True])
def test_routing_equals_the_footprint_square_tile_by_tile(radius_xy: bool, touch) -> None:
    """The tile-row test (float64) and the exchange's pixel-row test (float32) against the
    footprint's definition, Gaussian by Gaussian in Python floats: visible, and its rows
    ``y +- (radius + MARGIN_PX)`` span tile rows ``[floor, ceil)`` that meet the band's. The x axis
    is not tested (the projections cull a Gaussian whose square misses the image). The projection
    puts Gaussians culled, left, right, above and below the image, and on its edges; the bands
    include the first and the last tile row."""
    width, height, tile = 96, 80, 16  # 6 x 5 tiles
    proj = _projection(1, width, height, 9, radius_xy)
    edges = torch.tensor(
        [[-40.0, 40.0], [140.0, 40.0], [48.0, -40.0], [48.0, 130.0], [0.0, 0.0], [96.0, 80.0], [-17.0, -17.0]]
    )
    proj.means2d[0, : len(edges)] = edges
    proj.radii[0, : len(edges)] = 8
    proj.radii[0, len(edges)] = 0  # culled, inside the image
    radii_y = (proj.radii[0][:, 1] if radius_xy else proj.radii[0]).tolist()
    for band_first, band_end in [(0, 1), (0, 5), (1, 3), (4, 5)]:
        got = touch(proj, band_first, band_end)
        for n in range(N):
            my, ry = float(proj.means2d[0, n, 1]), radii_y[n]
            y0, y1 = math.floor((my - ry - MARGIN_PX) / tile), math.ceil((my + ry + MARGIN_PX) / tile)
            want = ry > 0 and max(y0, band_first) < min(y1, band_end)
            assert bool(got[n]) == want, (n, band_first, band_end)
        assert got.any() and not got.all()  # the comparison is of mixed masks


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("radius_kind", ["int", "float", "xy"])
def test_footprint_rows_equal_each_edge_rounded_on_its_own(dtype: torch.dtype, radius_kind: str) -> None:
    """``footprint_tile_rows`` (its float64 edges from ``footprint_reach_px``) against each edge
    rounded on its own here: the same non-empty rows and the same empty ones, on random grids with
    centres on whole and half tiles."""
    gen = torch.Generator().manual_seed(11)
    for _ in range(20):
        width, height = (int(v) for v in torch.randint(1, 300, (2,), generator=gen))
        means2d = (torch.rand(2, N, 2, generator=gen, dtype=torch.float64) * 1.6 - 0.3) * torch.tensor([width, height])
        means2d[:, : N // 2] = (means2d[:, : N // 2] / 8).round() * 8  # on tile edges and tile middles
        means2d = means2d.to(dtype)
        shape = (2, N, 2) if radius_kind == "xy" else (2, N)
        radii = torch.randint(0, 50, shape, generator=gen, dtype=torch.int32)
        if radius_kind == "float":
            radii = radii.to(dtype) * 1.37
        first, end = footprint_tile_rows(means2d, radii, height, dtype=torch.int16)

        m, r = means2d.double(), radii.double() if radius_kind == "xy" else radii.double()[..., None].expand(2, N, 2)
        low, high = torch.floor((m - r - MARGIN_PX) / TILE_SIZE), torch.ceil((m + r + MARGIN_PX) / TILE_SIZE)
        tiles_high = num_tile_rows(height)
        want_first, want_end = low[..., 1].clamp(0, tiles_high), high[..., 1].clamp(0, tiles_high)
        shown = (r[..., 1] > 0) & (want_end > want_first)
        assert torch.equal(end > first, shown)
        assert torch.equal(first[shown].double(), want_first[shown]) and torch.equal(
            end[shown].double(), want_end[shown]
        )
        empty = ~shown
        assert bool((end[empty] <= first[empty]).all())
