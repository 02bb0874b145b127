"""BandPlanner: plans every rank agrees on, costs learned from measurements."""

from __future__ import annotations

import itertools

import pytest

from distsplat_ns.balance.planner import BandPlanner, ExpectedImagesAssigner


def _measure(plan, costs_by_camera, batch):
    """Per rank, (position, first tile row, measured row costs) of each of its bands."""
    out = []
    for rank_bands in plan.bands:
        out.append([(b.position, b.first_row, costs_by_camera[batch[b.position]][b.first_row:b.end_row]) for b in rank_bands])
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
    (``parallel/plan_gathers.py:halo_slots``): whole images never cut, equal rows of fewer images
    than ranks always do."""
    from distsplat_ns.parallel.plan_gathers import halo_slots

    whole = BandPlanner("whole-images", [64, 48]).plan([0, 1], world_size=2, downscale=1)
    assert not any(halo_slots(bands, [(40, 64), (40, 48)]) for bands in whole.bands)
    cut = BandPlanner("equal-rows", [64, 48]).plan([0], world_size=2, downscale=1)
    assert any(band.first_row > 0 for bands in cut.bands for band in bands)
    assert any(halo_slots(bands, [(40, 64)]) for bands in cut.bands)