"""Bands (strips of whole tile rows), their pixel rows, and the cost of a partition.

The one band type of the package: the planner cuts bands, the model renders them, the measured
costs come back per band. Shape legend: ``C`` cameras in the batch, ``R`` ranks, ``T`` tile rows
(``TILE_SIZE``-px strips) of one image; "row" means a tile row unless a name ends in ``_px``.

A partition is ``list[list[Band]]``: entry ``r`` holds rank ``r``'s bands in batch order. The
partitioners live in ``partition.py``; this module holds what they and their callers share.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from distsplat_ns.utils.stats import max_over_mean
from distsplat_ns.utils.validation import check_int

__all__ = [
    "TILE_SIZE",
    "ArrayLike",
    "Band",
    "band_pixel_rows",
    "imbalance",
    "num_tile_rows",
    "rank_costs",
    "tile_rows_to_pixel_rows",
]

ArrayLike = torch.Tensor | np.ndarray | Sequence[float]
"""One camera's tile-row costs: a 1-D tensor (any device), ndarray or sequence of floats."""

TILE_SIZE = 16
"""gsplat's tile edge in pixels (the rasterizer's, the cost history's and the bands' row unit)."""


@dataclass(frozen=True)
class Band:
    """A horizontal strip of one image of the batch, in tile rows.

    Attributes:
        position: Index of the camera in the step's batch (not the dataset camera id).
        first_row: First tile row of the strip (inclusive).
        end_row: One past the last tile row of the strip (exclusive).
        tile_size: Pixels per row of the band: ``TILE_SIZE`` for every band the planner cuts (its
            rows are then the rasterizer's tile rows); tests use 1 to cut an image at any pixel row.

    Invariants:
        ``0 <= first_row < end_row``; the pixel rows are ``[first_row_px, end_row_px(height_px))``.
    """

    position: int
    first_row: int
    end_row: int
    tile_size: int = TILE_SIZE

    def __post_init__(self) -> None:
        for name in ("position", "first_row", "end_row", "tile_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"Band.{name}: expected an int, got {type(value).__name__}")
            # Normalise numpy ints so equality and hashing match plain ints.
            object.__setattr__(self, name, int(value))
        if self.position < 0:
            raise ValueError(f"Band.position: expected >= 0, got {self.position}")
        if not 0 <= self.first_row < self.end_row:
            raise ValueError(
                f"Band rows: expected 0 <= first_row < end_row, got first_row={self.first_row}, end_row={self.end_row}"
            )
        if self.tile_size < 1:
            raise ValueError(f"Band.tile_size: expected >= 1, got {self.tile_size}")

    @property
    def num_rows(self) -> int:
        """Number of tile rows in the band."""
        return self.end_row - self.first_row

    @property
    def first_row_px(self) -> int:
        """First pixel row of the band."""
        return self.first_row * self.tile_size

    def end_row_px(self, height_px: int) -> int:
        """One past the last pixel row of the band in an image ``height_px`` high (the last tile
        row of an image may be partial)."""
        return band_pixel_rows(self, height_px)[1]

    def num_rows_px(self, height_px: int) -> int:
        """Pixel rows of the band in an image ``height_px`` high."""
        return self.end_row_px(height_px) - self.first_row_px

    def num_cost_rows(self, height_px: int) -> int:
        """Rasterizer tile rows (``TILE_SIZE`` px from the band's first pixel row) over its own
        pixel rows: how many measured row costs the band has (its halo rows belong to the next)."""
        return -(-self.num_rows_px(height_px) // TILE_SIZE)


# --------------------------------------------------------------------------------------------
# Tile rows <-> pixel rows
# --------------------------------------------------------------------------------------------


def num_tile_rows(height_px: int, tile_size: int = TILE_SIZE) -> int:
    """Number of tile rows covering an image: ``ceil(height_px / tile_size)``.

    Args:
        height_px: Image height in pixels, >= 1.
        tile_size: Tile edge in pixels, >= 1.

    Returns:
        The tile-row count; the last tile row is partial when ``tile_size`` does not divide
        ``height_px``.

    Raises:
        ValueError: A non-positive height or tile size.
    """
    height_px = check_int("height_px", height_px, 1)
    tile_size = check_int("tile_size", tile_size, 1)
    return -(-height_px // tile_size)


def tile_rows_to_pixel_rows(
    first_row: int, end_row: int, height_px: int, tile_size: int = TILE_SIZE
) -> tuple[int, int]:
    """Pixel rows ``[first_px, end_px)`` covered by tile rows ``[first_row, end_row)``.

    Args:
        first_row: First tile row (inclusive).
        end_row: One past the last tile row.
        height_px: Height of the image in pixels; the last tile row is cut off here.
        tile_size: Tile edge in pixels.

    Returns:
        ``(first_row * tile_size, min(end_row * tile_size, height_px))``.

    Raises:
        ValueError: An empty or out-of-image tile-row range.
    """
    rows = num_tile_rows(height_px, tile_size)
    if not 0 <= first_row < end_row <= rows:
        raise ValueError(
            f"tile rows: expected 0 <= first_row < end_row <= {rows} (height_px={height_px}, "
            f"tile_size={tile_size}), got first_row={first_row}, end_row={end_row}"
        )
    return first_row * tile_size, min(end_row * tile_size, height_px)


def band_pixel_rows(band: Band, height_px: int) -> tuple[int, int]:
    """Pixel rows ``[first_px, end_px)`` of ``band`` in an image ``height_px`` pixels high."""
    return tile_rows_to_pixel_rows(band.first_row, band.end_row, height_px, band.tile_size)


# --------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------


def _as_cost_array(costs: ArrayLike, name: str) -> np.ndarray:
    """Copy one camera's row costs into a float64 host array, validating them."""
    if isinstance(costs, torch.Tensor):
        # host sync: a device tensor is copied to the host; the partitioner runs at the step
        # boundary on the (CPU) cost history, so this is normally a no-op.
        array = costs.detach().to(device="cpu", dtype=torch.float64).numpy()
    else:
        array = np.asarray(costs, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array of tile-row costs, got shape {tuple(array.shape)}")
    if array.shape[0] < 1:
        raise ValueError(f"{name}: expected at least one tile row, got 0")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name}: expected finite costs, got a non-finite value")
    if np.any(array < 0):
        raise ValueError(f"{name}: expected non-negative costs, got min {float(array.min())}")
    return array


def as_cost_arrays(row_costs: Sequence[ArrayLike]) -> list[np.ndarray]:
    """Validated float64 host copies of a batch's per-camera row costs (see ``partition_rows``)."""
    if isinstance(row_costs, (torch.Tensor, np.ndarray)):
        raise TypeError(
            f"row_costs: expected a sequence with one 1-D array per camera, got a single {type(row_costs).__name__}"
        )
    arrays = [_as_cost_array(costs, f"row_costs[{i}]") for i, costs in enumerate(row_costs)]
    if not arrays:
        raise ValueError("row_costs: expected at least one camera, got an empty batch")
    return arrays


def check_row_counts(row_counts: Sequence[int]) -> list[int]:
    """Validated per-camera tile-row counts of a non-empty batch."""
    counts = [check_int(f"row_counts[{i}]", c, 1) for i, c in enumerate(row_counts)]
    if not counts:
        raise ValueError("row_counts: expected at least one camera, got an empty batch")
    return counts


# --------------------------------------------------------------------------------------------
# Cuts -> bands
# --------------------------------------------------------------------------------------------


def cuts_to_bands(cuts: Sequence[int], offsets: np.ndarray, world_size: int) -> list[list[Band]]:
    """Turn strictly increasing cuts ``0 = c_0 < ... < c_P = n`` into per-rank bands.

    Rank ``r < P`` gets the laid-out rows ``[c_r, c_{r+1})``; ranks ``P .. world_size-1`` get none.
    """
    partition: list[list[Band]] = [[] for _ in range(world_size)]
    image = 0
    for rank in range(len(cuts) - 1):
        start, end = int(cuts[rank]), int(cuts[rank + 1])
        while offsets[image + 1] <= start:
            image += 1
        position = image
        while position + 1 < len(offsets) and offsets[position] < end:
            first = max(start, int(offsets[position])) - int(offsets[position])
            last = min(end, int(offsets[position + 1])) - int(offsets[position])
            partition[rank].append(Band(position, first, last))
            position += 1
    return partition


# --------------------------------------------------------------------------------------------
# Measuring a partition
# --------------------------------------------------------------------------------------------


def rank_costs(partition: Sequence[Sequence[Band]], row_costs: Sequence[ArrayLike]) -> list[float]:
    """Total cost of each rank's bands.

    Args:
        partition: ``partition[r]`` = bands of rank ``r``.
        row_costs: The batch's per-camera tile-row costs the bands index into.

    Returns:
        One float per rank, in rank order.

    Raises:
        ValueError: A band outside the batch or its image.
    """
    costs = as_cost_arrays(row_costs)
    totals = []
    for rank, bands in enumerate(partition):
        total = 0.0
        for band in bands:
            if band.position >= len(costs) or band.end_row > costs[band.position].shape[0]:
                raise ValueError(f"partition[{rank}]: band {band} lies outside the batch ({len(costs)} cameras)")
            total += float(costs[band.position][band.first_row : band.end_row].sum())
        totals.append(total)
    return totals


def imbalance(partition: Sequence[Sequence[Band]], row_costs: Sequence[ArrayLike]) -> float:
    """Max over mean of the per-rank costs (1.0 is perfect; 1.0 too when the total cost is 0).

    Args:
        partition: ``partition[r]`` = bands of rank ``r``; ranks with no bands count as cost 0.
        row_costs: The batch's per-camera tile-row costs.

    Returns:
        ``max(rank_costs) / mean(rank_costs)``.
    """
    if len(partition) == 0:
        raise ValueError("partition: expected at least one rank, got 0")
    return max_over_mean(rank_costs(partition, row_costs))
