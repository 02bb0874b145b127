"""BandPlanner: plans every rank agrees on, costs learned from measurements."""

from __future__ import annotations

import itertools
import logging
import random

import pytest
import torch

from distsplat_ns.balance.cost import CostHistory
from distsplat_ns.balance.partition import partition_rows
from distsplat_ns.balance.planner import INTERSECTIONS, BandPlanner, ExpectedImagesAssigner
from distsplat_ns.rendering.api import WORK_UNITS
from tests.helpers.torch_ops import count_torch_ops


def _measure(plan, costs_by_camera, batch):
    """Per rank, (position, first tile row, measured row costs) of each of its bands."""
    out = []
    for rank_bands in plan.bands:
        out.append(
            [(b.position, b.first_row, costs_by_camera[batch[b.position]][b.first_row : b.end_row]) for b in rank_bands]
        )
    return out


@pytest.mark.parametrize("mode", ["balanced", "whole-images", "equal-rows"])
def test_plan_covers_every_row_of_every_image_once(mode: str) -> None:
    planner = BandPlanner(mode, [64, 48, 80])
    plan = planner.plan([2, 0, 1], world_size=2, downscale=1)
    covered = {}
    for rank_bands in plan.bands:
        for band in rank_bands:
            height_px = plan.heights_px[band.position]
            covered.setdefault(band.position, []).append((band.first_row_px, band.end_row_px(height_px)))
    for position, height in enumerate(plan.heights_px):
        spans = sorted(covered[position])
        assert spans[0][0] == 0 and spans[-1][1] == height
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))


def test_measured_costs_balance_the_next_plan() -> None:
    planner = BandPlanner("balanced", [64, 64])
    costs = {0: [10.0, 10.0, 10.0, 10.0], 1: [1.0, 1.0, 1.0, 1.0]}
    batch = [0, 1]
    plan = planner.plan(batch, 2, 1)
    planner.observe(plan, batch, 1, _measure(plan, costs, batch))
    plan = planner.plan(batch, 2, 1)
    assert max(plan.predicted_costs) / (sum(plan.predicted_costs) / 2) <= 1.1


def test_the_plans_predicted_imbalance_is_what_the_log_records() -> None:
    planner = BandPlanner("balanced", [64, 64])
    costs = {0: [10.0, 10.0, 10.0, 10.0], 1: [1.0, 1.0, 1.0, 1.0]}
    batch = [0, 1]
    planner.observe(planner.plan(batch, 2, 1), batch, 1, _measure(planner.plan(batch, 2, 1), costs, batch))
    plan = planner.plan(batch, 2, 1)  # a measured history: an imbalance other than 1.0
    planner.observe(plan, batch, 1, _measure(plan, costs, batch))
    assert (
        plan.predicted_imbalance
        == planner.log.predicted_imbalance[-1]
        == max(plan.predicted_costs) / (sum(plan.predicted_costs) / 2)
    )


def test_a_plans_positions_are_each_ranks_images_in_batch_order() -> None:
    plan = BandPlanner("whole-images", [64, 64, 64]).plan([2, 0, 1], 2, 1)
    assert [plan.positions(rank) for rank in range(2)] == [sorted({b.position for b in bands}) for bands in plan.bands]
    assert sorted(plan.positions(0) + plan.positions(1)) == [0, 1, 2]


def _four_rank_step(planner: BandPlanner, batch: list[int], costs: dict[int, list[float]]):
    """Plan a W = 4 step (priors for new cameras first, as the pipeline does) and its measurements."""
    for camera in planner.cameras_needing_prior(1, batch):
        planner.set_prior(1, camera, _prior(camera, planner.history(1).row_counts[camera]))
    plan = planner.plan(batch, 4, 1)
    return plan, _measure(plan, costs, batch)


def _prior(camera: int, rows: int) -> list[float]:
    return [float(1 + (camera + row) % 3) for row in range(rows)]


def _step_costs(seed: int, num_cameras: int, rows: int) -> dict[int, list[float]]:
    rng = random.Random(seed)
    return {c: [rng.uniform(0.0, 50.0) for _ in range(rows)] for c in range(num_cameras)}


def test_observe_folds_every_ranks_bands_as_per_band_updates_in_rank_order() -> None:
    planner = BandPlanner("balanced", [96] * 6, decay=0.3)
    reference = CostHistory([6] * 6, decay=0.3)
    for step, batch in enumerate(([0, 1, 2, 3], [4, 1, 5, 0], [2, 3, 4, 5])):
        costs = _step_costs(step, 6, 6)
        plan, measurements = _four_rank_step(planner, batch, costs)
        for camera in {0: range(4), 1: (4, 5)}.get(step, ()):
            reference.set_prior(camera, _prior(camera, 6))
        planner.observe(plan, batch, 1, measurements)
        for rank_bands in measurements:
            for position, first_row, row_costs in rank_bands:
                reference.update(batch[position], first_row, row_costs)
    got, expected = planner.history(1).state_dict(), reference.state_dict()
    for key in ("values", "measured", "prior", "has_prior"):
        assert torch.equal(got[key], expected[key]), key


@pytest.mark.parametrize("band_cost_fraction", [0.0, 0.05])
def test_a_four_rank_step_dispatches_no_torch_operator(band_cost_fraction: float) -> None:
    # The history's per-step work is numpy: torch operators here were host time on every step and
    # grew the step's operator count with the number of ranks (docs/host_cost.md).
    planner = BandPlanner("balanced", [80] * 6 + [160], decay=0.3, band_cost_fraction=band_cost_fraction)
    batch = [0, 6, 3, 5]  # 5 + 10 + 5 + 5 tile rows: W = 4 cuts an image, 5 or more bands
    plan, measurements = _four_rank_step(planner, batch, _step_costs(0, 7, 10))
    assert sum(len(bands) for bands in plan.bands) >= 5
    with count_torch_ops() as observe_ops:
        planner.observe(plan, batch, 1, measurements)
    with count_torch_ops() as plan_ops:
        need_prior = planner.cameras_needing_prior(1, batch)
        planner.plan(batch, 4, 1)
    assert need_prior == []
    assert (dict(observe_ops), dict(plan_ops)) == ({}, {})


def test_costs_of_cameras_measured_earlier_follow_the_scene_cost_level() -> None:
    # Camera 0 is measured when the scene costs 1 per row, camera 1 after it grew to 3 per row;
    # both images look alike, so the plan must weigh them equally, not 1 : 3.
    planner = BandPlanner("balanced", [64, 64], level_smoothing=1.0)
    for camera, level in ((0, 1.0), (1, 3.0)):
        plan = planner.plan([camera], 1, 1)
        planner.observe(plan, [camera], 1, [[(0, 0, [level] * 4)]])
    assert planner.level_factor(1, 0) == pytest.approx(3.0)
    plan = planner.plan([0, 1], 2, 1)
    assert plan.predicted_costs[0] == pytest.approx(plan.predicted_costs[1])


def test_planner_state_round_trips() -> None:
    planner = BandPlanner("balanced", [64, 64])
    plan = planner.plan([0, 1], 2, 1)
    planner.observe(plan, [0, 1], 1, _measure(plan, {0: [1.0, 2.0, 3.0, 4.0], 1: [4.0, 3.0, 2.0, 1.0]}, [0, 1]))
    restored = BandPlanner("balanced", [64, 64])
    restored.load_state_dict(planner.state_dict())
    assert restored.plan([1, 0], 2, 1).bands == planner.plan([1, 0], 2, 1).bands


def test_a_history_in_another_cost_unit_is_measured_again_not_loaded(caplog: pytest.LogCaptureFixture) -> None:
    # A checkpoint of the gsplat backend (intersections) resumed on the reference (composited
    # pairs): ~40x apart, the old costs would mis-weigh every camera measured before the resume.
    planner = BandPlanner("balanced", [64, 64], cost_unit=INTERSECTIONS)
    plan = planner.plan([0, 1], 2, 1)
    planner.observe(plan, [0, 1], 1, _measure(plan, {0: [1.0, 2.0, 3.0, 4.0], 1: [4.0, 3.0, 2.0, 1.0]}, [0, 1]))
    state = planner.state_dict()
    assert state["cost_unit"] == INTERSECTIONS
    pairs = BandPlanner("balanced", [64, 64], cost_unit=WORK_UNITS["reference"])
    with caplog.at_level(logging.WARNING):
        pairs.load_state_dict(state)
    assert "measured again" in caplog.text
    assert pairs.state_dict() == BandPlanner("balanced", [64, 64], cost_unit=WORK_UNITS["reference"]).state_dict()
    same = BandPlanner("balanced", [64, 64])
    legacy = {k: v for k, v in state.items() if k != "cost_unit"}  # saved before the unit was recorded: intersections
    same.load_state_dict(legacy)
    assert same.plan([1, 0], 2, 1).bands == planner.plan([1, 0], 2, 1).bands


def test_the_planners_default_unit_is_the_gsplat_backends() -> None:
    assert WORK_UNITS["gsplat"] == INTERSECTIONS


@pytest.mark.parametrize("batch_size, world_size", [(1, 2), (2, 2), (3, 2), (8, 4), (1, 4)])
def test_expected_images_cover_each_ranks_equal_share(batch_size: int, world_size: int) -> None:
    assigner = ExpectedImagesAssigner("balanced")
    batch = list(range(batch_size))
    union = set()
    for rank in range(world_size):
        positions = assigner.positions_for_rank(0, batch, rank, world_size)
        assert positions == sorted(positions) and all(0 <= p < batch_size for p in positions)
        union.update(positions)
    assert union == set(range(batch_size))


def test_the_halo_exchange_is_empty_exactly_where_a_plan_cuts_no_image() -> None:
    """The pipeline's SSIM-halo all-gather moves nothing where no image is cut
    (``parallel/halo_cost_gathers.py:halo_slots``): whole images never cut, equal rows of fewer images
    than ranks always do."""
    from distsplat_ns.parallel.halo_cost_gathers import halo_slots

    whole = BandPlanner("whole-images", [64, 48]).plan([0, 1], world_size=2, downscale=1)
    assert not any(halo_slots(bands, [(40, 64), (40, 48)]) for bands in whole.bands)
    cut = BandPlanner("equal-rows", [64, 48]).plan([0], world_size=2, downscale=1)
    assert any(band.first_row > 0 for bands in cut.bands for band in bands)
    assert any(halo_slots(bands, [(40, 64)]) for bands in cut.bands)


def test_the_fixed_cost_per_band_is_a_fraction_of_the_batchs_mean_image_cost() -> None:
    # Two images of 16 tile rows, measured at 100 and 150: the row balance cuts the second after
    # 3 of its rows (150 > 1.05 x 125, the snap limit). A band's fixed cost, 0.08 x 125 = 10, moves
    # the cut a row up: rank 0 renders two bands, so it gets fewer rows (max 141.25 against 148.1).
    batch, fraction = [0, 1], 0.08
    costs = {0: [100.0 / 16] * 16, 1: [150.0 / 16] * 16}
    planners = {f: BandPlanner("balanced", [256, 256], band_cost_fraction=f) for f in (0.0, fraction)}
    for planner in planners.values():
        first = planner.plan(batch, 2, 1)
        planner.observe(first, batch, 1, _measure(first, costs, batch))
    arrays = planners[fraction].history(1).get_arrays(batch)
    with_cost = planners[fraction].plan(batch, 2, 1)
    assert with_cost.bands == partition_rows(arrays, 2, band_cost=fraction * 125.0)
    assert [b.end_row for b in with_cost.bands[0]] == [16, 2]
    assert with_cost.bands != planners[0.0].plan(batch, 2, 1).bands
    assert planners[0.0].plan(batch, 2, 1).bands == partition_rows(arrays, 2)


@pytest.mark.parametrize("fraction", [-0.1, 1.0])
def test_a_band_cost_fraction_outside_0_1_is_refused(fraction: float) -> None:
    with pytest.raises(ValueError, match="band_cost_fraction"):
        BandPlanner("balanced", [64], band_cost_fraction=fraction)
