"""Each camera of a batch keeps its own rendered size (a multi-camera capture)."""

from __future__ import annotations

import torch

from distsplat_ns.balance.bands import Band
from distsplat_ns.model.band_render import render_calls
from distsplat_ns.parallel.mode import info_for
from distsplat_ns.pipeline import batch_sizes_px

SIZES = [(640, 480), (640, 480), (800, 600), (641, 481)]


def test_each_camera_gets_its_rendered_size_in_batch_order() -> None:
    assert batch_sizes_px(SIZES, [2, 0], 2) == [(400, 300), (320, 240)]


def test_sizes_are_taken_after_the_downscale() -> None:
    # 641x481 and 640x480 px differ at full size but both render 320x240 at 1/2 (downscaled_px rounds).
    assert batch_sizes_px(SIZES, [0, 3], 2) == [(320, 240), (320, 240)]


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
