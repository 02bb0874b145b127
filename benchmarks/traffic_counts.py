"""The traffic model's pure part: bytes per step of the replicated all-reduce and of the sharded
exchange, from counts of Gaussians per band and owner (benchmarks/traffic_model.py is the driver,
docs/sharded_traffic.md the write-up, tests/unit/test_traffic_model.py the tests).

Shape letters: N Gaussians, C cameras, T tile rows of one image, R ranks (``world_size``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from distsplat_ns.balance.bands import Band
from distsplat_ns.parallel.exchange import render_tile_rows

PARAM_FLOATS = 59
"""Trainable floats per Gaussian: 3 means + 3 scales + 4 quats + 3 SH dc + 45 SH rest + 1 opacity."""
FLOAT_BYTES = 4
STATS_BYTES_PER_IMAGE = 2 * FLOAT_BYTES + 2 * FLOAT_BYTES + 4
"""Densification statistics summed per (image, Gaussian) in replicated mode (pipeline/distsplat_pipeline.py):
grads2d and absgrads (2 float32 each) and radii (int32)."""
STATE_COPIES = 4
"""Per-Gaussian model state in floats of ``PARAM_FLOATS``: parameter, gradient, Adam's two moments."""
FORWARD_ROW_BYTES = (2 + 3 + 3 + 1 + 1 + 1) * FLOAT_BYTES + 8
"""One Gaussian's screen-space terms for a band: means2d, conic, colour, opacity, depth, radius
(float32) and its int64 global id."""
BACKWARD_ROW_BYTES = (2 + 3 + 3 + 1 + 2) * FLOAT_BYTES
"""Gradients of means2d, conic, colour, opacity and the absgrad of means2d, float32."""
COUNT_BYTES = 8
"""One int64 row count per peer, exchanged before each variable-size all_to_all."""


def ring_all_reduce_bytes(payload_bytes: float, world_size: int) -> float:
    """Bytes a ring all-reduce sends out of (and receives into) each rank: ``2 (R-1)/R x payload``."""
    return 2.0 * (world_size - 1) / world_size * payload_bytes


def replicated_payload_bytes(num_gaussians: int, batch_size: int, densifying: bool) -> int:
    """Bytes handed to the all-reduce per step in replicated mode (what trainer/distsplat_trainer.py reports as
    ``bytes_communicated_per_step``): the dense gradient, plus the batch's densification
    statistics while densifying."""
    payload = num_gaussians * PARAM_FLOATS * FLOAT_BYTES
    if densifying:
        payload += batch_size * num_gaussians * STATS_BYTES_PER_IMAGE
    return payload


@dataclass
class OwnerRowCounts:
    """Footprints of one camera's Gaussians, counted by owner: enough to answer "how many
    Gaussians of owner q touch tile rows [a, b)" for any a < b in O(R).

    Attributes:
        first_below: ``first_below[q, t]`` = Gaussians of owner q, visible in the image, whose
            first tile row is < t. `[R, T + 1]` int64.
        end_at_most: ``end_at_most[q, t]`` = the same Gaussians whose end tile row is <= t.
            `[R, T + 1]` int64.
    """

    first_below: np.ndarray
    end_at_most: np.ndarray

    @classmethod
    def from_histograms(cls, first_hist: np.ndarray, end_hist: np.ndarray) -> OwnerRowCounts:
        """From per-owner histograms of first rows and of end rows (`[R, T + 1]`, values 0..T)."""
        zeros = np.zeros((first_hist.shape[0], 1), dtype=np.int64)
        first_below = np.concatenate([zeros, np.cumsum(first_hist, axis=1)[:, :-1]], axis=1)
        return cls(first_below=first_below, end_at_most=np.cumsum(end_hist, axis=1))

    def touching(self, first_row: int, end_row: int) -> np.ndarray:
        """Gaussians per owner whose footprint rows meet ``[first_row, end_row)``. `[R]` int64.

        A visible footprint ``[f, e)`` (``e > f``) meets the range iff ``f < end_row`` and
        ``e > first_row``; the two excluded sets (``f >= end_row``, ``e <= first_row``) are
        disjoint, so the count is ``#(f < end_row) - #(e <= first_row)``.
        """
        return self.first_below[:, end_row] - self.end_at_most[:, first_row]


def owner_histograms(
    first_row: Tensor, end_row: Tensor, owners: dict[int, Tensor], num_rows: int
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per-camera, per-owner histograms of the first and end tile rows of the visible footprints.

    Args:
        first_row, end_row: Footprint tile rows (``routing.footprint_tile_rows``). `[C, N]` int64.
        owners: For each world size ``R``, the owning rank of each Gaussian. `[N]` int64 in ``[0, R)``.
        num_rows: Tile rows of the image ``T``.

    Returns:
        ``{R: (first_hist, end_hist)}``, each `[C, R, T + 1]` int64.
    """
    num_cams, num = first_row.shape
    visible = end_row > first_row
    # Cameras and rows folded into one key once; each world size only adds its owner offset.
    base = torch.arange(num_cams)[:, None] * (num_rows + 1)
    first_key, end_key = (base + first_row)[visible], (base + end_row)[visible]
    gaussian = torch.arange(num).expand(num_cams, num)[visible]
    per_owner = num_cams * (num_rows + 1)
    result = {}
    for world_size, owner in owners.items():
        offset = owner[gaussian] * per_owner
        hists = []
        for key in (first_key, end_key):
            hist = torch.bincount(offset + key, minlength=world_size * per_owner)
            hists.append(hist.reshape(world_size, num_cams, num_rows + 1).transpose(0, 1).numpy())
        result[world_size] = (hists[0], hists[1])
    return result


@dataclass
class StepRows:
    """Screen-space rows moved in one step's forward all_to_all, per rank. Each `[R]` int64.

    Attributes:
        sent: Rows of Gaussians a rank owns that it sends to other ranks' bands.
        received: Rows a rank receives for its bands from other owners.
        rendered: Rows a rank rasterizes (received plus its own), summed over its bands.
    """

    sent: np.ndarray
    received: np.ndarray
    rendered: np.ndarray

    def bytes_out(self) -> np.ndarray:
        """Bytes each rank sends in the step: forward rows out, gradients of received rows back."""
        return self.sent * FORWARD_ROW_BYTES + self.received * BACKWARD_ROW_BYTES

    def bytes_in(self) -> np.ndarray:
        """Bytes each rank receives in the step."""
        return self.received * FORWARD_ROW_BYTES + self.sent * BACKWARD_ROW_BYTES

    def bytes_per_rank(self) -> np.ndarray:
        """The busier direction of each rank's (full-duplex) link: ``max(out, in)``."""
        return np.maximum(self.bytes_out(), self.bytes_in())


def step_rows(plan: Sequence[Sequence[Band]], counts: Sequence[OwnerRowCounts], heights_px: Sequence[int]) -> StepRows:
    """Rows each rank sends, receives and renders in one sharded step.

    Args:
        plan: ``plan[r]``: rank r's bands (``Band.position`` indexes the batch).
        counts: Per batch position, the footprints counted by owner.
        heights_px: Per batch position, the image height.

    Returns:
        The step's rows. A Gaussian counts once per (camera, destination rank): a rank holds at
        most one band of each image (``partition_rows``' parts are contiguous), and its own
        Gaussians do not travel.

    Raises:
        ValueError: A rank holds two bands of one image.
    """
    world_size = len(plan)
    sent = np.zeros(world_size, dtype=np.int64)
    received = np.zeros(world_size, dtype=np.int64)
    rendered = np.zeros(world_size, dtype=np.int64)
    for rank, bands in enumerate(plan):
        positions = [band.position for band in bands]
        if len(set(positions)) != len(positions):
            raise ValueError(f"plan[{rank}]: two bands of one image {positions}")
        for band in bands:
            first, end = render_tile_rows(band, heights_px[band.position])
            by_owner = counts[band.position].touching(first, end)
            if by_owner.shape[0] != world_size:
                raise ValueError(f"counts[{band.position}]: {by_owner.shape[0]} owners, plan has {world_size} ranks")
            total = int(by_owner.sum())
            rendered[rank] += total
            received[rank] += total - int(by_owner[rank])
            outgoing = by_owner.copy()
            outgoing[rank] = 0
            sent += outgoing
    return StepRows(sent=sent, received=received, rendered=rendered)


def crossover(rows: Sequence[dict[str, float]], key: str) -> float | None:
    """The batch size where ``key`` (sharded / replicated) reaches 1, linear between grid points;
    None if sharded stays below replicated over the whole grid (rows sorted by B)."""
    previous = None
    for row in rows:
        if row[key] >= 1.0:
            if previous is None:
                return float(row["B"])
            b0, r0, b1, r1 = previous["B"], previous[key], row["B"], row[key]
            return float(b0 + (1.0 - r0) * (b1 - b0) / (r1 - r0))
        previous = row
    return None
