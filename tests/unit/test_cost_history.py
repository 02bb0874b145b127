"""CostHistory (decay, priors, checkpoints, replica agreement) and footprint_row_costs."""

from __future__ import annotations

import io

import pytest
import torch

from distsplat_ns.balance.cost import CostHistory, footprint_row_costs


def _f64(values):
    return torch.tensor(values, dtype=torch.float64)


# ---- estimates -------------------------------------------------------------------------------


def test_camera_with_no_information_is_uniform_ones():
    history = CostHistory([3, 5])
    assert torch.equal(history.get(1), torch.ones(5, dtype=torch.float64))


def test_cameras_may_differ_in_height():
    history = CostHistory([3, 5, 1])
    assert [history.get(c).numel() for c in range(3)] == [3, 5, 1]


def test_prior_is_used_before_any_measurement():
    history = CostHistory([3])
    history.set_prior(0, [1.0, 2.0, 3.0])
    assert torch.equal(history.get(0), _f64([1.0, 2.0, 3.0]))


def test_first_measurement_replaces_the_prior():
    history = CostHistory([3], decay=0.5)
    history.set_prior(0, [1.0, 2.0, 3.0])
    history.update(0, 0, [7.0, 8.0, 9.0])
    assert torch.equal(history.get(0), _f64([7.0, 8.0, 9.0]))


@pytest.mark.parametrize("decay", [0.0, 0.25, 0.5, 0.9])
def test_later_measurement_blends_with_decay(decay):
    history = CostHistory([2], decay=decay)
    history.update(0, 0, [4.0, 10.0])
    history.update(0, 0, [8.0, 2.0])
    expected = _f64([decay * 4.0 + (1 - decay) * 8.0, decay * 10.0 + (1 - decay) * 2.0])
    assert torch.allclose(history.get(0), expected, rtol=0, atol=1e-12)


def test_zero_decay_replaces_exactly():
    history = CostHistory([2], decay=0.0)
    history.update(0, 0, [4.0, 10.0])
    history.update(0, 0, [0.1, 0.3])
    assert torch.equal(history.get(0), _f64([0.1, 0.3]))


def test_update_changes_only_the_rendered_rows():
    history = CostHistory([5])
    history.update(0, 0, [2.0] * 5)
    history.update(0, 1, [9.0, 9.0])
    assert torch.equal(history.get(0), _f64([2.0, 9.0, 9.0, 2.0, 2.0]))


@pytest.mark.parametrize("bands, expected", [([], False), ([(0, 2)], False), ([(0, 2), (2, 4)], True)])
def test_has_measurement_needs_every_row_measured(bands, expected):
    history = CostHistory([4])
    for first, end in bands:
        history.update(0, first, [1.0] * (end - first))
    assert history.has_measurement(0) is expected


def test_prior_is_scaled_into_measured_units():
    # Camera 0's prior said 10 per row, measurement says 2: camera 1's prior is scaled by 0.2.
    history = CostHistory([2, 2])
    history.set_prior(0, [10.0, 10.0])
    history.set_prior(1, [5.0, 15.0])
    history.update(0, 0, [2.0, 2.0])
    assert torch.allclose(history.get(1), _f64([1.0, 3.0]), rtol=0, atol=1e-12)


def test_camera_without_prior_uses_the_mean_measured_row_cost():
    history = CostHistory([2, 3])
    history.update(0, 0, [4.0, 8.0])
    assert torch.equal(history.get(1), torch.full((3,), 6.0, dtype=torch.float64))


def test_camera_without_prior_uses_the_mean_prior_row_cost_before_measurements():
    history = CostHistory([2, 3])
    history.set_prior(0, [4.0, 8.0])
    assert torch.equal(history.get(1), torch.full((3,), 6.0, dtype=torch.float64))


def test_get_returns_a_copy():
    history = CostHistory([2])
    history.get(0)[0] = 100.0
    assert torch.equal(history.get(0), torch.ones(2, dtype=torch.float64))


def test_get_batch_follows_the_requested_order():
    history = CostHistory([1, 2])
    history.update(1, 0, [3.0, 4.0])
    history.update(0, 0, [5.0])
    assert [t.tolist() for t in history.get_batch([1, 0, 1])] == [[3.0, 4.0], [5.0], [3.0, 4.0]]


# ---- replicas and checkpoints ----------------------------------------------------------------


def _replay(history, seed):
    """Apply one fixed sequence of priors and band measurements (as an all-gather would deliver)."""
    generator = torch.Generator().manual_seed(seed)
    for camera, rows in enumerate(history.row_counts):
        if camera % 2 == 0:
            history.set_prior(camera, torch.rand(rows, generator=generator, dtype=torch.float64) * 100)
    for _ in range(40):
        camera = int(torch.randint(history.num_cameras, (1,), generator=generator))
        rows = history.row_counts[camera]
        first = int(torch.randint(rows, (1,), generator=generator))
        end = int(torch.randint(first + 1, rows + 1, (1,), generator=generator))
        history.update(camera, first, torch.rand(end - first, generator=generator, dtype=torch.float64))


def _assert_states_equal(a, b):
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def test_identical_updates_give_identical_state():
    first, second = CostHistory([3, 7, 5, 2], decay=0.3), CostHistory([3, 7, 5, 2], decay=0.3)
    _replay(first, seed=0)
    _replay(second, seed=0)
    _assert_states_equal(first.state_dict(), second.state_dict())


def test_state_dict_round_trip_restores_every_estimate():
    source = CostHistory([3, 7, 5, 2], decay=0.3)
    _replay(source, seed=1)
    buffer = io.BytesIO()
    torch.save(source.state_dict(), buffer)
    buffer.seek(0)
    restored = CostHistory([3, 7, 5, 2], decay=0.3)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert all(torch.equal(source.get(c), restored.get(c)) for c in range(4))


def test_state_dict_round_trip_restores_measured_flags():
    source = CostHistory([3, 7, 5, 2])
    _replay(source, seed=2)
    restored = CostHistory([3, 7, 5, 2])
    restored.load_state_dict(source.state_dict())
    assert [restored.has_measurement(c) for c in range(4)] == [source.has_measurement(c) for c in range(4)]


def test_loading_a_different_camera_count_raises_naming_it():
    saved = CostHistory([3, 3]).state_dict()
    with pytest.raises(ValueError, match=r"camera count: expected 3 .*got 2"):
        CostHistory([3, 3, 3]).load_state_dict(saved)


def test_loading_different_row_counts_raises_naming_the_camera():
    saved = CostHistory([3, 4]).state_dict()
    with pytest.raises(ValueError, match=r"row_counts\[1\]: expected 5 .*got 4"):
        CostHistory([3, 5]).load_state_dict(saved)


def test_failed_load_leaves_the_history_unchanged():
    history = CostHistory([2, 2])
    history.update(0, 0, [3.0, 4.0])
    bad = history.state_dict()
    bad["values"] = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="values"):
        history.load_state_dict(bad)
    assert torch.equal(history.get(0), _f64([3.0, 4.0]))


# ---- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "row_counts, decay, match",
    [([], 0.0, "row_counts"), ([3, 0], 0.0, r"row_counts\[1\]"), ([3], 1.0, "decay"), ([3], -0.1, "decay")],
)
def test_constructor_rejects_bad_config(row_counts, decay, match):
    with pytest.raises(ValueError, match=match):
        CostHistory(row_counts, decay=decay)


@pytest.mark.parametrize(
    "args, match",
    [
        ((2, 0, [1.0]), "camera_index"),
        ((0, 2, [1.0, 1.0]), r"first_row \+ len\(row_costs\)"),
        ((0, 0, [1.0, -1.0]), "non-negative"),
        ((0, 0, [float("nan")]), "finite"),
        ((0, 0, []), "at least one"),
    ],
)
def test_update_rejects_bad_measurements(args, match):
    with pytest.raises(ValueError, match=match):
        CostHistory([3, 3]).update(*args)


def test_set_prior_rejects_the_wrong_row_count():
    with pytest.raises(ValueError, match=r"expected 3 rows for camera 0, got 2"):
        CostHistory([3]).set_prior(0, [1.0, 2.0])


# ---- footprint_row_costs ---------------------------------------------------------------------


def _brute_force_footprint(means2d, radii_xy, height, width, tile_size):
    """Loop over Gaussians and tiles, the way gsplat's isect_tiles counts overlaps."""
    import math

    tiles_high, tiles_wide = -(-height // tile_size), -(-width // tile_size)
    rows = [0] * tiles_high
    for (x, y), (rx, ry) in zip(means2d.tolist(), radii_xy.tolist(), strict=False):
        if rx <= 0 or ry <= 0:
            continue
        x0 = min(max(0, math.floor(x / tile_size - rx / tile_size)), tiles_wide)
        x1 = min(max(0, math.ceil(x / tile_size + rx / tile_size)), tiles_wide)
        y0 = min(max(0, math.floor(y / tile_size - ry / tile_size)), tiles_high)
        y1 = min(max(0, math.ceil(y / tile_size + ry / tile_size)), tiles_high)
        for row in range(y0, y1):
            for _ in range(x0, x1):
                rows[row] += 1
    return torch.tensor(rows, dtype=torch.float64)


def _random_gaussians(num, height, width, seed, anisotropic):
    generator = torch.Generator().manual_seed(seed)
    means2d = torch.rand(num, 2, generator=generator) * torch.tensor([width * 1.4, height * 1.4]) - torch.tensor(
        [width * 0.2, height * 0.2]
    )
    shape = (num, 2) if anisotropic else (num,)
    radii = torch.randint(-2, 40, shape, generator=generator)  # <= 0: culled
    return means2d, radii


@pytest.mark.parametrize("tile_size", [16, 8])
@pytest.mark.parametrize("anisotropic", [False, True])
def test_footprint_row_costs_match_a_brute_force_loop(tile_size, anisotropic):
    height, width = 75, 90  # partial last tile row and column
    means2d, radii = _random_gaussians(200, height, width, seed=3, anisotropic=anisotropic)
    radii_xy = radii if anisotropic else radii.unsqueeze(-1).expand(-1, 2)
    expected = _brute_force_footprint(means2d, radii_xy, height, width, tile_size)
    assert torch.equal(footprint_row_costs(means2d, radii, height, width, tile_size), expected)


def test_footprint_row_costs_has_one_entry_per_tile_row():
    costs = footprint_row_costs(torch.zeros(0, 2), torch.zeros(0), 545, 100)
    assert costs.shape == (35,) and costs.dtype == torch.float64


def test_footprint_row_costs_of_no_gaussians_are_zero():
    assert torch.equal(footprint_row_costs(torch.zeros(0, 2), torch.zeros(0), 64, 64), torch.zeros(4, dtype=torch.float64))


@pytest.mark.parametrize(
    "means2d, radii, match",
    [(torch.zeros(3, 3), torch.ones(3), "means2d"), (torch.zeros(3, 2), torch.ones(4), "radii")],
)
def test_footprint_row_costs_rejects_bad_shapes(means2d, radii, match):
    with pytest.raises(ValueError, match=match):
        footprint_row_costs(means2d, radii, 32, 32)
