"""Tile-row partitioner: split one step's batch of images across ranks by estimated cost.

Pure functions, no collectives: every rank calls ``partition_rows`` with the same all-gathered
cost history and gets the same answer, so no rank needs to broadcast the assignment.

Shape legend: ``C`` cameras in the batch, ``R`` ranks, ``T`` tile rows (16-px strips) of one
image; "row" below always means a tile row unless a name ends in ``_px``.

The algorithm (nearest cut on the cost prefix sum, legalise, snap, repair; with ``band_cost > 0`` a
min-max bisection, ``_BandCostCuts``), its bound ``imbalance <= max(1 + world_size * Q / total, 1 + tau)``
and the proof: docs/balance.md, "The partition", "The bound" and "With a fixed cost per band".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from distsplat_ns.balance.bands import (
    TILE_SIZE,
    ArrayLike,
    Band,
    as_cost_arrays,
    band_pixel_rows,
    check_row_counts,
    cuts_to_bands,
    imbalance,
    num_tile_rows,
    rank_costs,
    tile_rows_to_pixel_rows,
)
from distsplat_ns.utils.logging import get_logger
from distsplat_ns.utils.validation import check_int, check_nonnegative_float

__all__ = [
    "DEFAULT_SNAP_TOLERANCE",
    "TILE_SIZE",
    "Band",
    "band_pixel_rows",
    "equal_rows_partition",
    "imbalance",
    "num_tile_rows",
    "partition_rows",
    "rank_costs",
    "tile_rows_to_pixel_rows",
    "whole_image_partition",
]

logger = get_logger(__name__)

DEFAULT_SNAP_TOLERANCE = 0.05
"""Snap a cut onto an image edge if the part that grows stays within 5% of the ideal share.

Half of the balancer's 1.10 max/mean target: snapping never pushes a rank above
``1 + snap_tolerance`` times its share, and each avoided split saves one crop render and its halo.
"""


def _equal_cut(k: int, num_rows: int, num_parts: int) -> int:
    """The integer closest to ``k * num_rows / num_parts`` (halves round down), exactly."""
    quotient, remainder = divmod(k * num_rows, num_parts)
    return quotient + (1 if 2 * remainder > num_parts else 0)


# --------------------------------------------------------------------------------------------
# Baselines
# --------------------------------------------------------------------------------------------


def whole_image_partition(row_counts: Sequence[int], world_size: int) -> list[list[Band]]:
    """gsplat's split: whole images, contiguous in batch order, counts differing by at most one.

    Args:
        row_counts: Tile rows of each camera of the batch (``num_tile_rows(H_i)``), length ``C``.
        world_size: Number of ranks ``R``.

    Returns:
        ``result[r]``: the bands of rank ``r``, each a whole image. The first ``C % R`` ranks get
        ``ceil(C / R)`` images, the others ``floor(C / R)``; with ``C < R`` ranks ``C ..`` get none.

    Raises:
        ValueError: Empty batch, a non-positive row count or ``world_size``.
    """
    counts = check_row_counts(row_counts)
    world_size = check_int("world_size", world_size, 1)
    partition: list[list[Band]] = [[] for _ in range(world_size)]
    base, extra = divmod(len(counts), world_size)
    position = 0
    for rank in range(world_size):
        for _ in range(base + (1 if rank < extra else 0)):
            partition[rank].append(Band(position, 0, counts[position]))
            position += 1
    return partition


def equal_rows_partition(row_counts: Sequence[int], world_size: int) -> list[list[Band]]:
    """Grendel-GS's cold start: the laid-out rows cut into ``world_size`` near-equal counts.

    Cut ``k`` is at the laid-out row closest to ``k * n / world_size`` (halves round down), where
    ``n = sum(row_counts)``; cost is ignored.

    Args:
        row_counts: Tile rows of each camera of the batch, length ``C``.
        world_size: Number of ranks ``R``.

    Returns:
        ``result[r]``: the bands of rank ``r`` in batch order. With ``n < R`` some ranks get none.

    Raises:
        ValueError: Empty batch, a non-positive row count or ``world_size``.
    """
    counts = check_row_counts(row_counts)
    world_size = check_int("world_size", world_size, 1)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    num_rows = int(offsets[-1])
    cuts = [_equal_cut(k, num_rows, world_size) for k in range(world_size + 1)]
    partition: list[list[Band]] = [[] for _ in range(world_size)]
    for rank in range(world_size):
        if cuts[rank] < cuts[rank + 1]:
            partition[rank] = cuts_to_bands([cuts[rank], cuts[rank + 1]], offsets, 1)[0]
    return partition


# --------------------------------------------------------------------------------------------
# The cost-weighted partitioner
# --------------------------------------------------------------------------------------------


class _Layout:
    """The batch laid end to end, with the cut positions the min-band rule allows.

    ``allowed`` (sorted) holds every image edge plus every row boundary at least ``min_band_rows``
    from both edges of its image. ``nxt[j]`` is the earliest legal position of the cut after a cut
    at ``allowed[j]``: one row later after an image edge, ``min_band_rows`` rows later after an
    interior cut (``num_rows + 1`` after the last position). ``nxt`` is non-decreasing.
    """

    def __init__(self, heights: Sequence[int], min_band_rows: int) -> None:
        self.offsets = np.concatenate([[0], np.cumsum(heights)]).astype(np.int64)
        self.num_rows = int(self.offsets[-1])
        pieces = [self.offsets]
        for image, height in enumerate(heights):
            if height >= 2 * min_band_rows:
                start = int(self.offsets[image])
                pieces.append(np.arange(start + min_band_rows, start + height - min_band_rows + 1))
        self.allowed = np.unique(np.concatenate(pieces).astype(np.int64))
        is_edge = np.isin(self.allowed, self.offsets)
        threshold = self.allowed + np.where(is_edge, 1, min_band_rows)
        index = np.searchsorted(self.allowed, threshold, side="left")
        sentinel = self.num_rows + 1
        padded = np.concatenate([self.allowed, [sentinel]])
        self.nxt = padded[index]

    def next_cut(self, position: int) -> int:
        """Earliest legal cut after a cut at ``position`` (which must be allowed)."""
        return int(self.nxt[int(np.searchsorted(self.allowed, position))])

    def latest_before(self, position: int) -> int:
        """Latest allowed ``a`` with ``next_cut(a) <= position``; -1 if none."""
        index = int(np.searchsorted(self.nxt, position, side="right")) - 1
        return int(self.allowed[index]) if index >= 0 else -1

    def capacity(self, limit: int) -> int:
        """Most non-empty legal parts (at most ``limit``): greedy earliest cuts from row 0."""
        count, position = 0, 0
        while position < self.num_rows and count < limit:
            position = self.next_cut(position)
            count += 1
        return count


def _closest_boundaries(prefix: np.ndarray, num_parts: int) -> list[int]:
    """Step 2: the row boundary whose prefix cost is closest to ``k * total / num_parts``."""
    num_rows = prefix.shape[0] - 1
    total = float(prefix[-1])
    cuts = [0]
    for k in range(1, num_parts):
        target = k * total / num_parts
        above = int(np.searchsorted(prefix, target, side="left"))
        candidates = []
        if above <= num_rows:
            candidates.append(prefix[above])
        if above >= 1:
            candidates.append(prefix[above - 1])
        best = min(abs(v - target) for v in candidates)
        equal = _equal_cut(k, num_rows, num_parts)
        options = []
        for value in candidates:
            if abs(value - target) != best:
                continue
            # A plateau of equal prefix values (zero-cost rows): any boundary on it is as good by
            # cost, so take the one closest to the equal-rows cut (all-zero costs -> equal rows).
            lo = int(np.searchsorted(prefix, value, side="left"))
            hi = int(np.searchsorted(prefix, value, side="right")) - 1
            options.append(min(max(equal, lo), hi))
        cuts.append(min(options, key=lambda g: (abs(g * num_parts - k * num_rows), g)))
    cuts.append(num_rows)
    return cuts


def _legalise(cuts: list[int], prefix: np.ndarray, layout: _Layout, num_parts: int) -> list[int]:
    """Step 3: move each cut to the nearer (by cost, then rows, then lower) allowed neighbour."""
    total = float(prefix[-1])
    legal = list(cuts)
    for k in range(1, num_parts):
        cut = cuts[k]
        index = int(np.searchsorted(layout.allowed, cut, side="left"))
        if layout.allowed[index] == cut:
            continue
        below, above = int(layout.allowed[index - 1]), int(layout.allowed[index])
        target = k * total / num_parts
        legal[k] = min((below, above), key=lambda g: (abs(prefix[g] - target), abs(g - cut), g))
    return legal


def _snap(cuts: list[int], prefix: np.ndarray, offsets: np.ndarray, limit: float) -> list[int]:
    """Step 4: move interior cuts onto an edge of their image when the grown part stays <= limit.

    Processed left to right, so a part's cost is checked against its final left cut and its
    right cut as it is now; a later move of that right cut either shrinks the part or is checked
    itself. Cuts never cross or meet a neighbour (no rank is emptied).
    """
    snapped = list(cuts)
    for k in range(1, len(cuts) - 1):
        cut = snapped[k]
        image = int(np.searchsorted(offsets, cut, side="right")) - 1
        if int(offsets[image]) == cut:  # already on an edge (the last edge included)
            continue
        lo, hi = int(offsets[image]), int(offsets[image + 1])
        left, right = snapped[k - 1], snapped[k + 1]
        options = []
        if lo > left:  # part k grows
            grown = prefix[right] - prefix[lo]
            if grown <= limit:
                options.append((max(prefix[lo] - prefix[left], grown), cut - lo, lo))
        if hi < right:  # part k-1 grows
            grown = prefix[hi] - prefix[left]
            if grown <= limit:
                options.append((max(grown, prefix[right] - prefix[hi]), hi - cut, hi))
        if options:
            snapped[k] = min(options)[2]
    return snapped


def _repair(cuts: list[int], layout: _Layout, num_parts: int) -> list[int]:
    """Step 5: ``c'_k = min(max(c_k, next_cut(c'_{k-1})), latest_k)`` -- every part legal, non-empty."""
    latest = [0] * (num_parts + 1)
    latest[num_parts] = layout.num_rows
    for k in range(num_parts - 1, 0, -1):
        latest[k] = layout.latest_before(latest[k + 1])
    repaired = [0] * (num_parts + 1)
    repaired[num_parts] = layout.num_rows
    for k in range(1, num_parts):
        repaired[k] = min(max(cuts[k], layout.next_cut(repaired[k - 1])), latest[k])
    assert all(layout.next_cut(repaired[k]) <= repaired[k + 1] for k in range(num_parts)), (
        "partition repair left an illegal part"
    )
    return repaired


# --------------------------------------------------------------------------------------------
# With a fixed cost per band
# --------------------------------------------------------------------------------------------


class _BandCostCuts:
    """Min-max contiguous cuts when each band also costs ``band_cost`` (docs/balance.md, "With a
    fixed cost per band", has the proofs).

    A part ``[a, p)`` costs ``upper[p] - lower[a]`` (indices into ``layout.allowed``), where
    ``upper[p] = P[p] + band_cost * #(images starting before p)`` and ``lower[a] = P[a] +
    band_cost * #(images ending at or before a)``: its rows plus ``band_cost`` per image it
    touches. Both arrays are non-decreasing in float64 too, so the computed cost only grows when
    ``p`` moves right or ``a`` moves left -- all the greedy's exchange argument needs.
    """

    def __init__(self, prefix: np.ndarray, layout: _Layout, band_cost: float) -> None:
        allowed = layout.allowed
        starts_before = np.searchsorted(layout.offsets[:-1], allowed, side="left")
        ends_by = np.searchsorted(layout.offsets[1:], allowed, side="right")
        self.allowed = allowed.tolist()
        self.upper = (prefix[allowed] + band_cost * starts_before).tolist()
        self.lower = (prefix[allowed] + band_cost * ends_by).tolist()
        # first[j]: index of the earliest legal cut after a cut at allowed[j].
        self.first = np.searchsorted(allowed, layout.nxt, side="left").tolist()

    def _farthest(self, j: int, bottleneck: float) -> int:
        """One past the largest index ``q >= first[j]`` with part cost ``<= bottleneck``."""
        base = self.lower[j]
        lo, hi = self.first[j], len(self.upper)
        while lo < hi:  # first index whose part cost exceeds the bottleneck
            mid = (lo + hi) // 2
            if self.upper[mid] - base <= bottleneck:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def greedy(self, bottleneck: float, num_parts: int) -> tuple[list[int] | None, float]:
        """Each part as far as its cost allows: ``(cuts, largest part cost)`` if at most
        ``num_parts`` parts cover the batch, else ``(None, next)``: ``next`` is the least part cost
        the greedy refused, so every bottleneck in ``[bottleneck, next)`` gives these same cuts."""
        last = len(self.upper) - 1
        cuts, largest, following, j = [0], 0.0, math.inf, 0
        for _ in range(num_parts):
            end = self._farthest(j, bottleneck)
            if end <= last:
                following = min(following, self.upper[end] - self.lower[j])
            if end == self.first[j]:  # not even the smallest legal step fits
                break
            largest = max(largest, self.upper[end - 1] - self.lower[j])
            j = end - 1
            cuts.append(self.allowed[j])
            if j == last:
                return cuts, largest
        return None, following

    def solve(self, world_size: int) -> list[int]:
        """Cuts of the least bottleneck the greedy meets, found by bisection over part costs.

        ``lo`` stays at most the answer and ``hi`` is the largest part cost of the cuts in hand.
        A probe at ``mid`` either succeeds (``hi <= mid``) or fails (``lo > mid``), so the gap
        halves from at most ``W * lo`` down to a float's spacing: the loop ends with ``lo >= hi``
        after at most about ``log2(W) + 55`` probes, each ``O(W log n)``.
        """
        last = len(self.upper) - 1
        # The costliest smallest legal step (one row when min_band_rows == 1) and the mean part:
        # no cuts beat either. The mean's float sums are off by far less than 1e-9 relative.
        steps = max(self.upper[self.first[j]] - self.lower[j] for j in range(last))
        mean = (self.upper[last] - self.lower[0]) / world_size * (1.0 - 1e-9)
        lo = max(steps, mean)
        best, hi = self.greedy(math.inf, world_size)
        assert best is not None, "one part always covers the batch"
        for _ in range(_MAX_PROBES):
            if lo >= hi:
                break
            mid = lo + (hi - lo) / 2.0
            if not lo < mid < hi:  # adjacent floats: probe lo itself
                mid = lo
            cuts, value = self.greedy(mid, world_size)
            if cuts is None:
                lo = value
            else:
                best, hi = cuts, value
        return best


_MAX_PROBES = 256
"""A cap the bisection never reaches (about ``log2(W) + 55`` probes at worst): a bug cannot hang
a training step, and the cuts in hand are legal whatever happens."""


def partition_rows(
    row_costs: Sequence[ArrayLike],
    world_size: int,
    *,
    min_band_rows: int = 1,
    snap_tolerance: float = DEFAULT_SNAP_TOLERANCE,
    band_cost: float = 0.0,
) -> list[list[Band]]:
    """Split a batch's tile rows across ranks into contiguous parts of near-equal cost.

    See the module docstring for the five steps (``band_cost == 0``) and the min-max search
    (``band_cost > 0``). Deterministic: no RNG, float64 host arithmetic, ties broken by position,
    so every rank computes the same partition from the same costs.

    Args:
        row_costs: One 1-D array per camera of the batch, in batch order: estimated cost of each
            16-px tile row. ``[T_i]`` tensor, ndarray or sequence, non-negative, finite.
        world_size: Number of ranks ``R``, >= 1.
        min_band_rows: No band is thinner than this many tile rows unless it is a whole image
            thinner than that. >= 1.
        snap_tolerance: Snap a cut onto an image edge when the part that grows costs at most
            ``(1 + snap_tolerance)`` times the ideal share ``total / W'``. >= 0; 0 snaps only
            moves that keep every part within its share. Ignored when ``band_cost > 0``.
        band_cost: Fixed cost of rendering one band, in the unit of ``row_costs`` (each band
            projects all of its camera's Gaussians again and renders its own SSIM halo). >= 0,
            finite. 0 (default): the five steps above. > 0: a part costs its rows plus
            ``band_cost`` per image it touches, and the cuts minimise the largest part cost
            (exactly when ``min_band_rows == 1``); whether cutting an image pays is then decided
            by that cost, not by snapping.

    Returns:
        ``result[r]``: the bands of rank ``r``, in batch order.

    Raises:
        TypeError: ``row_costs`` is a single array, or an argument has the wrong type.
        ValueError: Empty batch, an empty, non-1-D, negative or non-finite cost array, or a bad
            ``world_size``, ``min_band_rows``, ``snap_tolerance`` or ``band_cost``.

    Invariants:
        - Every row of every image is in exactly one band; bands of one image do not overlap.
        - Rank ``r``'s rows are one contiguous range of the laid-out order, and ranks follow each
          other in rank order (rank 0 starts at image 0, row 0).
        - Only trailing ranks are empty. With ``band_cost == 0`` these are ranks ``W' .. R-1``,
          where ``W' = min(R, capacity)``; ``capacity`` is the total row count when
          ``min_band_rows == 1``. With ``band_cost > 0`` more may be empty where fewer bands
          are cheaper.
        - Every band has ``num_rows >= min_band_rows`` or is a whole image.
        - ``band_cost == 0``: every rank's cost is at most ``max(total / W' + Q, (1 +
          snap_tolerance) * total / W')``, ``Q`` = the largest cost of ``2 * min_band_rows - 1``
          consecutive rows of one image (the largest row cost when ``min_band_rows == 1``).
        - ``band_cost > 0``: the largest part cost (rows plus ``band_cost`` per band) is the least
          any partition achieves when ``min_band_rows == 1``; otherwise at most the larger of
          that least value and the costliest smallest legal step (at most ``Q + band_cost``).
          docs/balance.md has the proofs.

    Host sync:
        Only if ``row_costs`` live on a device (they are copied to the host).
    """
    costs = as_cost_arrays(row_costs)
    world_size = check_int("world_size", world_size, 1)
    min_band_rows = check_int("min_band_rows", min_band_rows, 1)
    snap_tolerance = check_nonnegative_float("snap_tolerance", snap_tolerance)
    band_cost = check_nonnegative_float("band_cost", band_cost)

    layout = _Layout([c.shape[0] for c in costs], min_band_rows)
    prefix = np.concatenate([[0.0], np.cumsum(np.concatenate(costs))])
    if band_cost > 0:
        cuts = _BandCostCuts(prefix, layout, band_cost).solve(world_size)
        return cuts_to_bands(cuts, layout.offsets, world_size)
    num_parts = layout.capacity(world_size)
    if num_parts < world_size:
        logger.debug(
            "partition_rows: only %d legal parts for %d ranks (%d rows, min_band_rows=%d); ranks %d..%d get no rows",
            num_parts,
            world_size,
            layout.num_rows,
            min_band_rows,
            num_parts,
            world_size - 1,
        )
    cuts = _closest_boundaries(prefix, num_parts)
    cuts = _legalise(cuts, prefix, layout, num_parts)
    total = float(prefix[-1])
    if total > 0:
        # With no cost information at all, snapping would be free everywhere and turn the
        # equal-rows split into whole images; keep equal rows instead.
        cuts = _snap(cuts, prefix, layout.offsets, (1.0 + snap_tolerance) * total / num_parts)
    cuts = _repair(cuts, layout, num_parts)
    return cuts_to_bands(cuts, layout.offsets, world_size)
