"""The traffic model's pure counting and bytes functions (benchmarks/traffic_counts.py) on layouts
small enough to count by hand, and against balance/routing.py's per-Gaussian test."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks import traffic_counts as tm
from distsplat_ns.balance.bands import Band
from distsplat_ns.balance.routing import touching_rows
from distsplat_ns.parallel.exchange import render_tile_rows


def test_replicated_payload_is_the_trainers_measured_figure():
    # trainer/distsplat_trainer.py reported 3,141,984 bytes per step at 11,384 Gaussians, B = 2, while densifying
    # (benchmarks/results/distributed_2026-11-29.json); a 2-rank ring moves exactly the payload.
    payload = tm.replicated_payload_bytes(11_384, 2, densifying=True)
    assert payload == 3_141_984
    assert tm.ring_all_reduce_bytes(payload, 2) == payload


def test_ring_all_reduce_moves_two_times_r_minus_one_over_r():
    assert tm.ring_all_reduce_bytes(1000, 4) == 1500
    assert tm.replicated_payload_bytes(10, 3, densifying=False) == 10 * 59 * 4


@pytest.mark.parametrize(
    "band, height, expected",
    [
        (Band(0, 0, 2), 64, (0, 3)),  # 32 px + 10 px halo -> pixel row 42 -> tile row 3
        (Band(0, 2, 4), 64, (2, 4)),  # bottom band: the halo is cut at the image
        (Band(0, 0, 1), 20, (0, 2)),  # last tile row partial: 16 + 10 -> clipped to 20 px
    ],
)
def test_render_rows_add_the_ssim_halo(band, height, expected):
    assert render_tile_rows(band, height) == expected


def _hand_layout():
    # One 64-px image (4 tile rows), 3 ranks: rank 0 owns tile rows [0, 1), rank 1 [1, 2), rank 2
    # [2, 4); with the halo they render [0, 2), [1, 3), [2, 4).
    first = torch.tensor([0, 0, 3, 2, 1])
    end = torch.tensor([1, 4, 4, 2, 2])  # Gaussian 3 is culled (end == first)
    owners = torch.tensor([0, 2, 1, 0, 0])
    ((first_hist, end_hist),) = tm.owner_histograms(first[None], end[None], {3: owners}, 4).values()
    counts = tm.OwnerRowCounts.from_histograms(first_hist[0], end_hist[0])
    plan = [[Band(0, 0, 1)], [Band(0, 1, 2)], [Band(0, 2, 4)]]
    return plan, counts


def test_step_rows_count_each_gaussian_once_per_destination_and_never_to_its_owner():
    plan, counts = _hand_layout()
    rows = tm.step_rows(plan, [counts], [64])
    # Gaussian 0 stays home; 1 (rank 2's) goes to ranks 0 and 1; 2 (rank 1's) to rank 2;
    # 4 (rank 0's) to rank 1.
    assert rows.sent.tolist() == [1, 1, 2]
    assert rows.received.tolist() == [1, 2, 1]
    assert rows.rendered.tolist() == [3, 2, 2]


def test_step_bytes_are_forward_rows_out_and_gradients_back():
    plan, counts = _hand_layout()
    rows = tm.step_rows(plan, [counts], [64])
    assert (tm.FORWARD_ROW_BYTES, tm.BACKWARD_ROW_BYTES) == (52, 44)
    assert rows.bytes_out().tolist() == [52 + 44, 52 + 2 * 44, 2 * 52 + 44]
    assert rows.bytes_in().tolist() == [52 + 44, 2 * 52 + 44, 52 + 2 * 44]
    assert rows.bytes_per_rank().tolist() == [96, 148, 148]


def test_two_bands_of_one_image_on_one_rank_are_refused():
    _, counts = _hand_layout()
    plan = [[Band(0, 0, 1), Band(0, 2, 4)], [Band(0, 1, 2)], []]
    with pytest.raises(ValueError, match="two bands of one image"):
        tm.step_rows(plan, [counts], [64])


def test_histogram_counts_equal_routings_touching_rows():
    gen = torch.Generator().manual_seed(0)
    num, num_rows, world_size = 500, 9, 4
    first = torch.randint(0, num_rows + 1, (num,), generator=gen)
    end = torch.clamp(first + torch.randint(-1, 4, (num,), generator=gen), 0, num_rows)
    owners = torch.randint(0, world_size, (num,), generator=gen)
    # Two cameras: the second sees the footprints shifted down one row (and must not mix with the first).
    firsts, ends = (
        torch.stack([first, (first + 1).clamp(max=num_rows)]),
        torch.stack([end, (end + 1).clamp(max=num_rows)]),
    )
    first_hist, end_hist = tm.owner_histograms(firsts, ends, {world_size: owners}, num_rows)[world_size]
    for cam in range(2):
        counts = tm.OwnerRowCounts.from_histograms(first_hist[cam], end_hist[cam])
        for a in range(num_rows):
            for b in range(a + 1, num_rows + 1):
                idx = touching_rows(firsts[cam], ends[cam], a, b)
                expected = np.bincount(owners[idx].numpy(), minlength=world_size)
                assert counts.touching(a, b).tolist() == expected.tolist(), (cam, a, b)


def test_crossover_interpolates_between_grid_points():
    rows = [{"B": 1, "r": 0.25}, {"B": 2, "r": 0.5}, {"B": 4, "r": 1.5}]
    assert tm.crossover(rows, "r") == pytest.approx(3.0)  # 2 + (1 - 0.5) * 2 / 1.0
    assert tm.crossover(rows[:2], "r") is None


def test_a_street_copy_sees_its_copy_as_the_original_camera_sees_the_original():
    from benchmarks.traffic_model import SceneCameras, street_of_copies

    gen = torch.Generator().manual_seed(0)
    points = torch.randn(50, 3, generator=gen) * torch.tensor([4.0, 1.0, 1.0])
    rot, _ = torch.linalg.qr(torch.randn(3, 3, generator=gen))
    view = torch.eye(4)
    view[:3, :3], view[:3, 3] = rot, torch.tensor([0.1, -0.2, 5.0])
    scene = SceneCameras(points, view[None], torch.eye(3)[None], 10, 10, ["a"])
    street = street_of_copies(scene, 3)
    assert street.points.shape == (150, 3) and street.names == ["a@0", "a@1", "a@2"]

    def camera_coords(viewmat, pts):
        return pts @ viewmat[:3, :3].T + viewmat[:3, 3]

    # float32 rounding of the offset (copies sit ~16 units apart): 1e-5 is ~100 ulps at that size.
    for k in range(3):
        copy_k = street.points[50 * k : 50 * (k + 1)]
        torch.testing.assert_close(
            camera_coords(street.viewmats[k], copy_k), camera_coords(view, points), atol=1e-5, rtol=0
        )
