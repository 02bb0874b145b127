"""Each camera of a batch keeps its own rendered size (a multi-camera capture)."""

from __future__ import annotations

import pytest
import torch

from distsplat_ns.balance.bands import Band
from distsplat_ns.model.band_render import render_calls
from distsplat_ns.parallel.mode import info_for
from distsplat_ns.utils.cameras import BatchCameras

SIZES = [(640, 480), (640, 480), (800, 600), (641, 481)]


def _batch(camera_ids: list[int]) -> BatchCameras:
    def take(ids: list[int]):
        raise AssertionError(f"sizes must not index cameras (asked for {ids})")

    return BatchCameras(camera_ids, take, [SIZES[c] for c in camera_ids])


def test_each_camera_gets_its_rendered_size_in_batch_order() -> None:
    assert _batch([2, 0]).sizes_px([0, 1], 2) == [(400, 300), (320, 240)]
    assert _batch([2, 0]).sizes_px([1], 1) == [(640, 480)]


def test_sizes_are_taken_after_the_downscale() -> None:
    # 641x481 and 640x480 px differ at full size but both render 320x240 at 1/2 (downscaled_px rounds).
    assert _batch([0, 3]).sizes_px([0, 1], 2) == [(320, 240), (320, 240)]


def test_sizes_outside_the_batch_or_of_another_batch_size_are_refused() -> None:
    with pytest.raises(IndexError, match="outside a batch of 2"):
        _batch([0, 3]).sizes_px([2], 1)
    with pytest.raises(ValueError, match="1 image sizes for a batch of 2"):
        BatchCameras([0, 3], list, [SIZES[0]])


def test_cameras_of_two_sizes_are_projected_one_by_one() -> None:
    bands = [Band(0, 0, 3), Band(1, 0, 3)]  # one whole band per image, both 3 tile rows (48 px)
    assert len(render_calls(bands, [0, 1], [(40, 48), (40, 48)])) == 1
    assert [(first, stop) for first, stop, _ in render_calls(bands, [0, 1], [(40, 48), (32, 48)])] == [(0, 1), (1, 2)]


def test_statistics_carry_one_size_per_camera_only_when_they_differ() -> None:
    grads = torch.zeros(2, 3, 2)
    radii = torch.zeros(2, 3, dtype=torch.int32)
    same = info_for(grads, grads, radii, [(40, 48), (40, 48)])
    assert (same["width"], same["height"]) == (40, 48)
    mixed = info_for(grads, grads, radii, [(40, 48), (32, 40)])
    assert mixed["width"].reshape(-1).tolist() == [40.0, 32.0] and mixed["height"].reshape(-1).tolist() == [48.0, 40.0]
