"""Per-camera tile-row cost estimates for the partitioner, and the footprint cold-start estimate.

Shape legend: ``C`` cameras of the dataset, ``T`` tile rows of one image (16-px strips),
``N`` Gaussians.

Every rank holds one ``CostHistory`` and updates it with the same all-gathered measurements in
the same order; all arithmetic is float64 on the host, one elementwise op at a time (no fused
multiply-add) and scalar sums use ``math.fsum`` (exact, so independent of thread count or SIMD),
so every rank ends bit-identical and ``partition_rows`` agrees everywhere without a broadcast.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from distsplat_ns.balance.bands import ArrayLike
from distsplat_ns.utils.validation import check_int

__all__ = ["CostHistory", "footprint_row_costs"]



_STATE_VERSION = 1


def _host_costs(name: str, values: ArrayLike) -> Tensor:
    """Validated float64 CPU copy of a 1-D array of non-negative, finite costs."""
    if isinstance(values, Tensor):
        # host sync: measurements may arrive on the device; history updates happen only on
        # rebalance steps, after the all-gather, where a sync is already paid.
        tensor = values.detach().to(device="cpu", dtype=torch.float64).clone()
    else:
        tensor = torch.as_tensor(np.asarray(values, dtype=np.float64)).clone()
    if tensor.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array of tile-row costs, got shape {tuple(tensor.shape)}")
    if tensor.numel() < 1:
        raise ValueError(f"{name}: expected at least one tile row, got 0")
    if not bool(torch.isfinite(tensor).all()):
        raise ValueError(f"{name}: expected finite costs, got a non-finite value")
    if bool((tensor < 0).any()):
        raise ValueError(f"{name}: expected non-negative costs, got min {float(tensor.min())}")
    return tensor


class CostHistory:
    """Tile-row cost estimates of every camera of the dataset, blended over time.

    What ``get`` returns for a row, in order of preference:

    1. A measurement: the first one replaces whatever was there; each later one is blended in
       as ``new = decay * old + (1 - decay) * measured`` (``decay = 0``: replace, as Grendel-GS).
    2. The camera's prior (``set_prior``, e.g. ``footprint_row_costs``), times ``prior_scale``:
       the ratio of measured to prior cost over every row measured so far that had a prior. A
       prior counts Gaussian-tile overlaps, a measurement is whatever the caller measures
       (intersections, milliseconds); the scale keeps both in one unit, so a batch that mixes
       measured and unmeasured cameras is still balanced.
    3. Uniform: the mean of all measured rows, else the mean of all (scaled) prior rows, else 1.

    Args:
        row_counts: Tile rows of each camera of the dataset (``ceil(H_c / 16)``); cameras may
            differ in height. Length ``C``, each >= 1.
        decay: Weight of the old estimate when a new measurement arrives, in ``[0, 1)``.
            0 (default) replaces, like Grendel-GS: a camera is seen about once per epoch, and
            densification changes the scene between two visits more than timing noise does.

    Raises:
        ValueError: No cameras, a row count < 1, or ``decay`` outside ``[0, 1)``.

    Invariants:
        Ranks that call ``update``/``set_prior`` with the same arguments in the same order hold
        bit-identical state (``state_dict`` compares equal).
    """

    def __init__(self, row_counts: Sequence[int], *, decay: float = 0.0) -> None:
        counts = [check_int(f"row_counts[{i}]", c, 1) for i, c in enumerate(row_counts)]
        if not counts:
            raise ValueError("row_counts: expected at least one camera, got 0")
        if isinstance(decay, bool) or not isinstance(decay, numbers.Real):
            raise TypeError(f"decay: expected a float in [0, 1), got {type(decay).__name__}")
        decay = float(decay)
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay: expected a float in [0, 1), got {decay}")
        self._decay = decay
        self._row_counts = tuple(counts)
        self._offsets = [0]
        for count in counts:
            self._offsets.append(self._offsets[-1] + count)
        total = self._offsets[-1]
        self._values = torch.zeros(total, dtype=torch.float64)
        self._measured = torch.zeros(total, dtype=torch.bool)
        self._prior = torch.zeros(total, dtype=torch.float64)
        self._has_prior = torch.zeros(len(counts), dtype=torch.bool)
        # Sums over rows at their first measurement, where a prior existed: measured vs prior.
        self._first_measured_sum = 0.0
        self._first_prior_sum = 0.0
        self._fallback: float | None = None  # cached uniform cost; None = recompute

    # ---- configuration -------------------------------------------------------------------------

    @property
    def num_cameras(self) -> int:
        """Number of cameras ``C``."""
        return len(self._row_counts)

    @property
    def row_counts(self) -> tuple[int, ...]:
        """Tile rows of each camera."""
        return self._row_counts

    @property
    def decay(self) -> float:
        """Weight of the old estimate in a blend, in ``[0, 1)``."""
        return self._decay

    # ---- queries -------------------------------------------------------------------------------

    def _camera(self, camera_index: int) -> int:
        index = check_int("camera_index", camera_index, 0)
        if index >= self.num_cameras:
            raise ValueError(
                f"camera_index: expected an int in [0, {self.num_cameras}), got {index}"
            )
        return index

    def _rows(self, camera_index: int) -> slice:
        return slice(self._offsets[camera_index], self._offsets[camera_index + 1])

    @property
    def prior_scale(self) -> float:
        """Measured cost per unit of prior cost, over rows measured so far that had a prior (1 if none)."""
        if self._first_prior_sum > 0.0:
            return self._first_measured_sum / self._first_prior_sum
        return 1.0

    def _uniform_cost(self) -> float:
        if self._fallback is None:
            if bool(self._measured.any()):
                measured = self._values[self._measured].tolist()
                self._fallback = math.fsum(measured) / len(measured)
            elif bool(self._has_prior.any()):
                counts = torch.tensor(self._row_counts, dtype=torch.int64)
                rows = self._prior[torch.repeat_interleave(self._has_prior, counts)].tolist()
                self._fallback = math.fsum(rows) / len(rows) * self.prior_scale
            else:
                self._fallback = 1.0
        return self._fallback

    def has_measurement(self, camera_index: int) -> bool:
        """Whether every tile row of the camera has been measured at least once."""
        rows = self._rows(self._camera(camera_index))
        return bool(self._measured[rows].all())

    def get(self, camera_index: int) -> Tensor:
        """Current cost estimate of each tile row of a camera.

        Args:
            camera_index: Dataset index of the camera, in ``[0, C)``.

        Returns:
            Row costs. ``[T]`` float64 on CPU, non-negative; a new tensor the caller may keep.
        """
        camera = self._camera(camera_index)
        rows = self._rows(camera)
        if self._has_prior[camera]:
            fill = self._prior[rows] * self.prior_scale
        else:
            fill = torch.full((self._row_counts[camera],), self._uniform_cost(), dtype=torch.float64)
        return torch.where(self._measured[rows], self._values[rows], fill)

    def get_batch(self, camera_indices: Sequence[int]) -> list[Tensor]:
        """``[get(c) for c in camera_indices]``: the ``row_costs`` argument of ``partition_rows``."""
        return [self.get(c) for c in camera_indices]

    # ---- updates -------------------------------------------------------------------------------

    def set_prior(self, camera_index: int, row_costs: ArrayLike) -> None:
        """Set a camera's cold-start estimate, used for its rows until they are measured.

        Args:
            camera_index: Dataset index of the camera.
            row_costs: Estimated cost of each tile row, e.g. ``footprint_row_costs``. ``[T]``,
                non-negative, finite, length = the camera's row count.

        Raises:
            ValueError: Bad index, wrong length, negative or non-finite costs.
        """
        camera = self._camera(camera_index)
        costs = _host_costs("row_costs", row_costs)
        if costs.numel() != self._row_counts[camera]:
            raise ValueError(
                f"row_costs: expected {self._row_counts[camera]} rows for camera {camera}, "
                f"got {costs.numel()}"
            )
        self._prior[self._rows(camera)] = costs
        self._has_prior[camera] = True
        self._fallback = None

    def update(self, camera_index: int, first_row: int, row_costs: ArrayLike) -> None:
        """Blend measured costs of the rows actually rendered into the history.

        Rows ``first_row .. first_row + len(row_costs) - 1`` of the camera are updated; the
        others keep their estimate. A row's first measurement replaces its estimate; a later
        one gives ``decay * old + (1 - decay) * measured``.

        Args:
            camera_index: Dataset index of the camera.
            first_row: First tile row the measurement covers.
            row_costs: Measured cost of each covered tile row. ``[T_band]``, non-negative, finite.

        Raises:
            ValueError: Bad index, rows outside the image, negative or non-finite costs.
        """
        camera = self._camera(camera_index)
        first_row = check_int("first_row", first_row, 0)
        costs = _host_costs("row_costs", row_costs)
        end_row = first_row + costs.numel()
        if end_row > self._row_counts[camera]:
            raise ValueError(
                f"first_row + len(row_costs): expected <= {self._row_counts[camera]} "
                f"(rows of camera {camera}), got {end_row}"
            )
        start = self._offsets[camera]
        rows = slice(start + first_row, start + end_row)
        was_measured = self._measured[rows]
        old = self._values[rows]
        if self._has_prior[camera]:
            fresh = ~was_measured
            if bool(fresh.any()):
                self._first_measured_sum += math.fsum(costs[fresh].tolist())
                self._first_prior_sum += math.fsum(self._prior[rows][fresh].tolist())
        # Two separate elementwise ops: no fused multiply-add, so every CPU rounds the same way.
        blended = old * self._decay
        blended = blended + costs * (1.0 - self._decay)
        self._values[rows] = torch.where(was_measured, blended, costs)
        self._measured[rows] = True
        self._fallback = None

    # ---- checkpointing -------------------------------------------------------------------------

    def state_dict(self) -> dict[str, object]:
        """Everything ``load_state_dict`` needs; tensors are copies on CPU. ``decay`` is config, not state."""
        return {
            "version": _STATE_VERSION,
            "row_counts": torch.tensor(self._row_counts, dtype=torch.int64),
            "values": self._values.clone(),
            "measured": self._measured.clone(),
            "prior": self._prior.clone(),
            "has_prior": self._has_prior.clone(),
            "first_measured_sum": self._first_measured_sum,
            "first_prior_sum": self._first_prior_sum,
        }

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Restore a ``state_dict`` saved for the same cameras (any world size).

        Raises:
            ValueError: A different camera count or per-camera row counts, an unknown version,
                or missing entries. The history is unchanged when it raises.
        """
        required = ("version", "row_counts", "values", "measured", "prior", "has_prior",
                    "first_measured_sum", "first_prior_sum")
        missing = [key for key in required if key not in state]
        if missing:
            raise ValueError(f"state: expected keys {list(required)}, missing {missing}")
        if state["version"] != _STATE_VERSION:
            raise ValueError(f"state['version']: expected {_STATE_VERSION}, got {state['version']}")
        counts = [int(c) for c in torch.as_tensor(state["row_counts"]).tolist()]
        if len(counts) != self.num_cameras:
            raise ValueError(
                f"camera count: expected {self.num_cameras} cameras (this dataset), got "
                f"{len(counts)} in the saved cost history"
            )
        if tuple(counts) != self._row_counts:
            camera = next(i for i, (a, b) in enumerate(zip(counts, self._row_counts, strict=False)) if a != b)
            raise ValueError(
                f"row_counts[{camera}]: expected {self._row_counts[camera]} tile rows, got "
                f"{counts[camera]} in the saved cost history"
            )
        total = self._offsets[-1]
        tensors = {}
        for key, dtype, size in (("values", torch.float64, total), ("measured", torch.bool, total),
                                 ("prior", torch.float64, total), ("has_prior", torch.bool, self.num_cameras)):
            tensor = torch.as_tensor(state[key]).detach().to(device="cpu", dtype=dtype)
            if tuple(tensor.shape) != (size,):
                raise ValueError(f"state['{key}']: expected shape ({size},), got {tuple(tensor.shape)}")
            tensors[key] = tensor.clone()
        self._values = tensors["values"]
        self._measured = tensors["measured"]
        self._prior = tensors["prior"]
        self._has_prior = tensors["has_prior"]
        self._first_measured_sum = float(state["first_measured_sum"])  # type: ignore[arg-type]
        self._first_prior_sum = float(state["first_prior_sum"])  # type: ignore[arg-type]
        self._fallback = None


def footprint_row_costs(
    means2d: Tensor, radii: Tensor, height: int, width: int, tile_size: int = 16
) -> Tensor:
    """Cold-start cost of each tile row: Gaussian-tile overlaps counted per row.

    Each Gaussian covers the tiles of its 3-sigma bounding box, the way gsplat's ``isect_tiles``
    counts them: tile columns ``[floor((x - r) / s), ceil((x + r) / s))`` and rows likewise,
    clipped to the image's tile grid; Gaussians with radius <= 0 (culled) cover nothing. A row's
    cost is the number of (Gaussian, tile) pairs in it -- the rasterizer's per-row work.

    Args:
        means2d: Projected centres. ``[N, 2]`` float, pixels, (x, y).
        radii: 3-sigma screen radii. ``[N]`` (gsplat 1.4) or ``[N, 2]`` (x, y; later gsplat),
            pixels; <= 0 means culled.
        height: Image height in pixels.
        width: Image width in pixels.
        tile_size: Tile edge in pixels.

    Returns:
        Overlaps per tile row. ``[ceil(height / tile_size)]`` float64 on ``means2d``'s device.

    Raises:
        ValueError: Mismatched or wrong shapes, non-positive sizes.
    """
    height = check_int("height", height, 1)
    width = check_int("width", width, 1)
    tile_size = check_int("tile_size", tile_size, 1)
    if means2d.ndim != 2 or means2d.shape[-1] != 2:
        raise ValueError(f"means2d: expected shape [N, 2], got {tuple(means2d.shape)}")
    num = means2d.shape[0]
    if radii.shape not in ((num,), (num, 2)):
        raise ValueError(f"radii: expected shape [{num}] or [{num}, 2], got {tuple(radii.shape)}")
    tiles_high = -(-height // tile_size)
    tiles_wide = -(-width // tile_size)
    means = means2d.detach().to(torch.float64)
    radius = radii.detach().to(torch.float64)
    radius_xy = radius.unsqueeze(-1).expand(num, 2) if radius.ndim == 1 else radius
    visible = (radius_xy > 0).all(dim=-1)
    limits = torch.tensor([tiles_wide, tiles_high], dtype=torch.float64, device=means.device)
    # Same order of operations as gsplat: divide by the tile size first, then offset.
    centre, extent = means / tile_size, radius_xy / tile_size
    lo = torch.minimum(torch.clamp(torch.floor(centre - extent), min=0), limits)
    hi = torch.minimum(torch.clamp(torch.ceil(centre + extent), min=0), limits)
    lo, hi = lo.to(torch.int64), hi.to(torch.int64)
    cols = torch.where(visible, (hi[:, 0] - lo[:, 0]).clamp(min=0), 0)
    row_lo, row_hi = lo[:, 1], torch.maximum(hi[:, 1], lo[:, 1])
    # Difference array: +cols at each Gaussian's first row, -cols one past its last, then cumsum.
    diff = torch.zeros(tiles_high + 1, dtype=torch.int64, device=means.device)
    diff.index_add_(0, row_lo, cols)
    diff.index_add_(0, row_hi, -cols)
    return torch.cumsum(diff, 0)[:tiles_high].to(torch.float64)
