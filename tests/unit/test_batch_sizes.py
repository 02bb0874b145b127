"""A batch whose cameras differ in rendered size is refused, naming both sizes, before any collective."""

from __future__ import annotations

import pytest

from distsplat_ns.pipeline import batch_size_px
from distsplat_ns.utils.errors import UserError

SIZES = [(640, 480), (640, 480), (800, 600), (641, 481)]


def test_cameras_of_one_size_give_the_rendered_size() -> None:
    assert batch_size_px(SIZES, [1, 0], 2, step=3) == (320, 240)


def test_cameras_of_two_sizes_are_refused_with_both_sizes() -> None:
    with pytest.raises(UserError, match=r"step 3: .*camera 0 is 640x480 px, camera 2 800x600 px"):
        batch_size_px(SIZES, [0, 2], 1, step=3)


def test_sizes_are_compared_after_the_downscale() -> None:
    # 641x481 and 640x480 px differ at full size but both render 320x240 at 1/2 (downscaled_px rounds).
    assert batch_size_px(SIZES, [0, 3], 2, step=0) == (320, 240)
    with pytest.raises(UserError, match="641x481"):
        batch_size_px(SIZES, [0, 3], 1, step=0)
