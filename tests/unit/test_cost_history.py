"""CostHistory (decay, priors, checkpoints, replica agreement) and footprint_row_costs."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
import torch

from distsplat_ns.balance.cost import CostHistory, footprint_row_costs
from tests.helpers.torch_ops import count_torch_ops


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


def _mixed_history():
    """Cameras with a prior and measured, with a prior and partly measured, without a prior and
    unmeasured (uniform fill), measured without a prior."""
    history = CostHistory([3, 4, 2, 5], decay=0.3)
    history.set_prior(0, [3.0, 1.0, 2.0])
    history.set_prior(1, [7.0, 0.5, 2.5, 1.0])
    history.update(0, 0, [0.7, 0.1, 0.3])
    history.update(1, 1, [0.2, 0.6])
    history.update(3, 0, [1.5, 0.25, 4.0, 0.0, 3.0])
    return history


def test_get_arrays_equals_get_bitwise_for_every_kind_of_camera():
    history = _mixed_history()
    arrays = history.get_arrays([2, 1, 0, 3, 1])
    assert all(a.dtype == np.float64 for a in arrays)
    assert all(torch.equal(torch.from_numpy(a), history.get(c)) for a, c in zip(arrays, [2, 1, 0, 3, 1], strict=True))


def test_get_arrays_returns_arrays_the_caller_may_modify():
    history = _mixed_history()
    first, second = history.get_arrays([1, 1])
    first[:] = 100.0
    assert torch.equal(torch.from_numpy(second), history.get(1))
    assert torch.equal(history.get(1), torch.from_numpy(history.get_arrays([1])[0]))


def test_measured_mask_equals_has_measurement_in_the_order_asked():
    history = _mixed_history()
    cameras = [3, 1, 2, 0, 3]
    mask = history.measured_mask(cameras)
    assert mask.dtype == np.bool_
    assert mask.tolist() == [history.has_measurement(c) for c in cameras] == [True, False, False, True, True]


def test_batched_queries_of_no_cameras_are_empty():
    history = _mixed_history()
    assert history.get_arrays([]) == [] and history.measured_mask([]).shape == (0,)


@pytest.mark.parametrize("query", ["get_arrays", "measured_mask", "get_batch"])
def test_batched_queries_reject_a_bad_camera_naming_its_position(query):
    with pytest.raises(ValueError, match=r"camera_indices\[1\]: expected an int in \[0, 4\), got 4"):
        getattr(_mixed_history(), query)([0, 4])


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


def _random_steps(row_counts, seed, num_steps=30):
    """Steps of bands as an all-gather delivers them: disjoint rows, some images whole, some cut
    into several bands, some rows of a camera left out; in a random (rank) order."""
    rng = random.Random(seed)
    steps = []
    for _ in range(num_steps):
        bands = []
        for camera in rng.sample(range(len(row_counts)), rng.randint(1, min(4, len(row_counts)))):
            rows = row_counts[camera]
            cuts = sorted(rng.sample(range(1, rows), rng.randint(0, rows - 1))) if rows > 1 else []
            for first, end in zip([0, *cuts], [*cuts, rows], strict=True):
                if rng.random() < 0.85:
                    bands.append((camera, first, [rng.choice([0.0, rng.uniform(0, 100)]) for _ in range(end - first)]))
        rng.shuffle(bands)
        steps.append(bands)
    return steps


def _with_priors(history, seed):
    generator = torch.Generator().manual_seed(seed)
    for camera, rows in enumerate(history.row_counts):
        if camera % 3 != 2:
            history.set_prior(camera, torch.rand(rows, generator=generator, dtype=torch.float64) * 100)
    return history


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("decay", [0.0, 0.3])
def test_update_bands_equals_sequential_updates_bitwise(decay, seed):
    row_counts = [3, 7, 5, 2, 1, 6]
    batched = _with_priors(CostHistory(row_counts, decay=decay), seed)
    sequential = _with_priors(CostHistory(row_counts, decay=decay), seed)
    for bands in _random_steps(row_counts, seed):
        batched.update_bands(bands)
        for band in bands:
            sequential.update(*band)
    a, b = batched.state_dict(), sequential.state_dict()
    for key in ("values", "measured", "prior", "has_prior"):
        assert torch.equal(a[key], b[key]), key
    # One fsum per call vs one per band: equal up to the last bits (docstring of update_bands).
    assert a["first_measured_sum"] == pytest.approx(b["first_measured_sum"], rel=1e-14, abs=0)
    assert a["first_prior_sum"] == pytest.approx(b["first_prior_sum"], rel=1e-14, abs=0)


def test_update_bands_applies_overlapping_bands_in_order():
    # Camera 0's rows 0-1 are measured twice in one call, its row 2 three times: the second
    # measurement must blend into the first, not replace it or be lost.
    bands = [(0, 0, [4.0, 10.0, 1.0]), (1, 0, [2.0, 2.0]), (0, 0, [8.0, 2.0]), (0, 2, [5.0]), (0, 1, [3.0, 7.0])]
    batched = _with_priors(CostHistory([3, 2], decay=0.3), seed=4)
    sequential = _with_priors(CostHistory([3, 2], decay=0.3), seed=4)
    batched.update_bands(bands)
    for band in bands:
        sequential.update(*band)
    _assert_states_equal(batched.state_dict(), sequential.state_dict())
    assert batched.get(0)[0].item() == 0.3 * 4.0 + 0.7 * 8.0


def test_update_bands_accepts_tensors_and_arrays():
    bands_as_lists = [(0, 0, [1.0, 2.0]), (1, 1, [3.0])]
    from_lists, mixed = CostHistory([2, 2], decay=0.3), CostHistory([2, 2], decay=0.3)
    from_lists.update_bands(bands_as_lists)
    mixed.update_bands([(0, 0, torch.tensor([1.0, 2.0], dtype=torch.float32)), (1, 1, np.array([3.0]))])
    _assert_states_equal(from_lists.state_dict(), mixed.state_dict())


def test_update_bands_of_no_bands_changes_nothing():
    history = _mixed_history()
    before = history.state_dict()
    history.update_bands([])
    _assert_states_equal(history.state_dict(), before)


def test_update_bands_leaves_the_callers_costs_unchanged():
    costs = np.array([4.0, 10.0])
    history = CostHistory([2], decay=0.5)
    history.update_bands([(0, 0, costs)])
    history.update_bands([(0, 0, costs * 2)])
    assert costs.tolist() == [4.0, 10.0]


def test_update_bands_dispatches_no_torch_operator_for_lists():
    history = _mixed_history()
    with count_torch_ops() as ops:
        history.update_bands([(0, 0, [1.0, 2.0, 3.0]), (2, 0, [1.0, 2.0]), (1, 0, [1.0])])
        history.measured_mask([0, 1, 2])
        history.get_arrays([0, 1, 2])
    assert not ops


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


def test_state_dict_holds_cpu_torch_tensors():
    state = _mixed_history().state_dict()
    assert {
        key: (value.dtype, value.device.type) for key, value in state.items() if isinstance(value, torch.Tensor)
    } == {
        "row_counts": (torch.int64, "cpu"),
        "values": (torch.float64, "cpu"),
        "measured": (torch.bool, "cpu"),
        "prior": (torch.float64, "cpu"),
        "has_prior": (torch.bool, "cpu"),
    }


def test_state_dict_is_a_copy():
    history = _mixed_history()
    state = history.state_dict()
    state["values"].fill_(-1.0)
    state["measured"].fill_(False)
    assert history.measured_mask([0, 3]).tolist() == [True, True] and float(history.get(0).min()) >= 0.0


def _state_of_the_torch_history():
    """A state as the torch-tensor ``CostHistory`` (before numpy) saved it for ``_mixed_history``:
    row counts [3, 4, 2, 5]; camera 0 (prior) measured, camera 1 (prior) rows 1-2, camera 3 all."""
    values = [0.7, 0.1, 0.3, 0.0, 0.2, 0.6, 0.0, 0.0, 0.0, 1.5, 0.25, 4.0, 0.0, 3.0]
    measured = [True] * 3 + [False, True, True, False] + [False] * 2 + [True] * 5
    prior = [3.0, 1.0, 2.0, 7.0, 0.5, 2.5, 1.0] + [0.0] * 7
    return {
        "version": 1,
        "row_counts": torch.tensor([3, 4, 2, 5], dtype=torch.int64),
        "values": torch.tensor(values, dtype=torch.float64),
        "measured": torch.tensor(measured, dtype=torch.bool),
        "prior": torch.tensor(prior, dtype=torch.float64),
        "has_prior": torch.tensor([True, True, False, False]),
        "first_measured_sum": 0.7 + 0.1 + 0.3 + 0.2 + 0.6,
        "first_prior_sum": 3.0 + 1.0 + 2.0 + 0.5 + 2.5,
    }


def test_loads_a_state_saved_by_the_torch_tensor_history():
    buffer = io.BytesIO()
    torch.save(_state_of_the_torch_history(), buffer)
    buffer.seek(0)
    restored = CostHistory([3, 4, 2, 5], decay=0.3)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    _assert_states_equal(restored.state_dict(), _state_of_the_torch_history())
    expected = _mixed_history()
    assert all(torch.equal(restored.get(c), expected.get(c)) for c in range(4))


def test_load_state_dict_accepts_numpy_arrays():
    saved = _state_of_the_torch_history()
    as_arrays = {key: value.numpy() if isinstance(value, torch.Tensor) else value for key, value in saved.items()}
    restored = CostHistory([3, 4, 2, 5])
    restored.load_state_dict(as_arrays)
    _assert_states_equal(restored.state_dict(), saved)


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


@pytest.mark.parametrize(
    "band, error, match",
    [
        ((2, 0, [1.0]), ValueError, r"measurements\[1\]: camera_index: expected an int in \[0, 2\), got 2"),
        ((0.0, 0, [1.0]), TypeError, r"measurements\[1\]: camera_index: expected an int"),
        ((0, -1, [1.0]), ValueError, r"measurements\[1\]: first_row: expected an int >= 0"),
        ((0, 2, [1.0, 1.0]), ValueError, r"measurements\[1\]: first_row \+ len\(row_costs\): expected <= 3"),
        ((0, 0, [1.0, -1.0]), ValueError, r"measurements\[1\]: row_costs: expected non-negative costs, got min -1.0"),
        ((0, 0, [float("inf")]), ValueError, r"measurements\[1\]: row_costs: expected finite"),
        ((0, 0, []), ValueError, r"measurements\[1\]: row_costs: expected at least one tile row"),
        ((0, 0, [[1.0]]), ValueError, r"measurements\[1\]: row_costs: expected a 1-D array"),
        ((0, [1.0]), TypeError, r"measurements\[1\]: expected a \(camera_index, first_row, row_costs\) triple"),
    ],
)
def test_update_bands_rejects_a_bad_band_naming_it(band, error, match):
    with pytest.raises(error, match=match):
        CostHistory([3, 3]).update_bands([(1, 0, [1.0, 2.0, 3.0]), band, (0, 0, [2.0])])


def test_rejected_update_bands_changes_nothing():
    history = _mixed_history()
    before = history.state_dict()
    with pytest.raises(ValueError, match=r"measurements\[2\]"):
        history.update_bands([(2, 0, [1.0, 2.0]), (0, 0, [5.0]), (1, 0, [float("nan")])])
    _assert_states_equal(history.state_dict(), before)


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
    assert torch.equal(
        footprint_row_costs(torch.zeros(0, 2), torch.zeros(0), 64, 64), torch.zeros(4, dtype=torch.float64)
    )


@pytest.mark.parametrize(
    "means2d, radii, match",
    [(torch.zeros(3, 3), torch.ones(3), "means2d"), (torch.zeros(3, 2), torch.ones(4), "radii")],
)
def test_footprint_row_costs_rejects_bad_shapes(means2d, radii, match):
    with pytest.raises(ValueError, match=match):
        footprint_row_costs(means2d, radii, 32, 32)
