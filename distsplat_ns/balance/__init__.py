"""Load balancing: per-camera tile-row cost history and the tile-row partitioner.

Pure (torch, numpy, stdlib and ``distsplat_ns.utils`` only): no nerfstudio, gsplat or
``torch.distributed``. Every rank runs the same functions on the same all-gathered inputs and gets
the same answer. See docs/balance.md.
"""

from distsplat_ns.balance.bands import (
    TILE_SIZE,
    Band,
    band_pixel_rows,
    imbalance,
    num_tile_rows,
    rank_costs,
    tile_rows_to_pixel_rows,
)
from distsplat_ns.balance.cost import CostHistory, footprint_row_costs
from distsplat_ns.balance.partition import (
    DEFAULT_SNAP_TOLERANCE,
    equal_rows_partition,
    partition_rows,
    whole_image_partition,
)

__all__ = [
    "DEFAULT_SNAP_TOLERANCE",
    "TILE_SIZE",
    "Band",
    "CostHistory",
    "band_pixel_rows",
    "equal_rows_partition",
    "footprint_row_costs",
    "imbalance",
    "num_tile_rows",
    "partition_rows",
    "rank_costs",
    "tile_rows_to_pixel_rows",
    "whole_image_partition",
]
