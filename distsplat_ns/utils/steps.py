"""Images <-> optimizer steps: the two rules every schedule and run length use.

Schedules are counted in training images (splatfacto's numbers at batch size 1); a step trains a
batch of B images. Two questions need two roundings, each with its own name:

* ``images_to_steps``: *when* (or how often) something happens that splatfacto does after ``n``
  images -- the nearest step, so a schedule point moves by at most half a batch;
* ``steps_to_cover``: *how many* steps it takes to train at least ``n`` images -- rounded up, so
  a run (``--max-num-iterations``) or an epoch is never cut short.
"""

from __future__ import annotations

import math

from distsplat_ns.utils.validation import check_int


def images_to_steps(num_images: int, batch_size: int, *, minimum: int = 1) -> int:
    """The step nearest to ``num_images`` images at ``batch_size`` images per step.

    Args:
        num_images: A schedule point or period, in images.
        batch_size: Images per step, >= 1.
        minimum: Smallest result: 1 for periods and stop points (a period of 0 steps is
            meaningless), 0 for a warm-up that may be absent.
    """
    batch_size = check_int("batch_size", batch_size, 1)
    return max(minimum, round(num_images / batch_size))


def steps_to_cover(num_images: int, batch_size: int) -> int:
    """The fewest steps of ``batch_size`` images that train at least ``num_images`` images (>= 1)."""
    batch_size = check_int("batch_size", batch_size, 1)
    return max(1, math.ceil(num_images / batch_size))
