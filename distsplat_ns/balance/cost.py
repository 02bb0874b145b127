"""Per-camera tile-row cost estimates for the partitioner, and the footprint cold-start estimate.

Shape legend: ``C`` cameras of the dataset, ``T`` tile rows of one image (16-px strips),
``B`` cameras or bands of one call, ``N`` Gaussians.

Every rank holds one ``CostHistory`` and updates it with the same all-gathered measurements in
the same order; all arithmetic is float64 on the host, one elementwise op at a time (no fused
multiply-add) and scalar sums use ``math.fsum`` (exact, so independent of thread count or SIMD),
so every rank ends bit-identical and ``partition_rows`` agrees everywhere without a broadcast.

The state is numpy, not torch: it is host bookkeeping of a few hundred float64 values touched on
every step, where a numpy op costs about a microsecond and a torch op several (dispatch), and
torch ops here showed up in the per-step operator count growing with the world size
(docs/host_cost.md). ``get`` and ``state_dict`` still hand out torch tensors.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from distsplat_ns.balance.bands import ArrayLike
from distsplat_ns.utils.validation import check_int

__all__ = ["BandMeasurement", "CostHistory", "footprint_row_costs"]


_STATE_VERSION = 1

BandMeasurement = tuple[int, int, ArrayLike]
"""``(camera_index, first_row, row_costs)``: one band's measured tile-row costs (``update_bands``)."""


def _host_costs(name: str, values: ArrayLike) -> np.ndarray:
    """Float64 host array of a 1-D array of tile-row costs, checked for shape only.

    Finiteness and sign are checked by the caller, once over all bands (``_check_costs``).
    """
    if isinstance(values, Tensor):
        # host sync: measurements may arrive on the device; history updates happen only after
        # the all-gather, where a sync is already paid. The planner passes lists (no torch op).
        array = values.detach().to(device="cpu", dtype=torch.float64).numpy()
    else:
        array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array of tile-row costs, got shape {tuple(array.shape)}")
    if array.shape[0] < 1:
        raise ValueError(f"{name}: expected at least one tile row, got 0")
    return array


def _band_prefix(index: int | None) -> str:
    """How an error names band ``index`` of ``update_bands`` (``None``: the one band of ``update``)."""
    return "" if index is None else f"measurements[{index}]: "


def _check_costs(arrays: Sequence[np.ndarray], flat: np.ndarray, *, numbered: bool) -> None:
    """ValueError naming the first band with a non-finite or negative cost.

    ``flat`` is ``arrays`` concatenated: one finiteness and one sign check over every band; the
    bands are looked at one by one only to name the bad one. ``numbered``: name them as
    ``update_bands`` does (``measurements[i]: row_costs``), else ``row_costs``.
    """
    if np.isfinite(flat).all() and flat.min() >= 0.0:
        return
    for i, array in enumerate(arrays):
        name = f"{_band_prefix(i if numbered else None)}row_costs"
        if not np.isfinite(array).all():
            raise ValueError(f"{name}: expected finite costs, got a non-finite value")
        if array.min() < 0:
            raise ValueError(f"{name}: expected non-negative costs, got min {float(array.min())}")
    raise AssertionError("unreachable: the flat check failed but no band is bad")


class CostHistory:
    """Tile-row cost estimates of every camera of the dataset, blended over time.

    ``get`` returns per row a measurement (blended by ``decay``), else the camera's prior times
    ``prior_scale`` (measured / prior over rows that had both: one unit for a batch mixing
    measured and unmeasured cameras), else a uniform mean (docs/balance.md, "The cost history").

    Args:
        row_counts: Tile rows of each camera of the dataset (``ceil(H_c / 16)``); cameras may
            differ in height. Length ``C``, each >= 1.
        decay: Weight of the old estimate when a new measurement arrives, in ``[0, 1)``.
            0 (default) replaces, like Grendel-GS: a camera is seen about once per epoch, and
            densification changes the scene between two visits more than timing noise does.

    Raises:
        ValueError: No cameras, a row count < 1, or ``decay`` outside ``[0, 1)``.

    Invariants:
        Ranks that call ``update``/``update_bands``/``set_prior`` with the same arguments in the
        same order hold bit-identical state (``state_dict`` compares equal). The per-step
        methods (``update_bands`` with lists, ``get_arrays``, ``measured_mask``) dispatch no
        torch operator.
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
        self._counts = np.array(counts, dtype=np.int64)  # [C]
        self._offsets = np.zeros(len(counts) + 1, dtype=np.int64)  # [C + 1]: camera c's rows start at [c]
        np.cumsum(self._counts, out=self._offsets[1:])
        self._row_offsets = tuple(self._offsets.tolist())  # the same as ints, for per-band arithmetic
        total = int(self._offsets[-1])
        self._values = np.zeros(total, dtype=np.float64)
        self._measured = np.zeros(total, dtype=np.bool_)
        self._prior = np.zeros(total, dtype=np.float64)
        self._has_prior = np.zeros(len(counts), dtype=np.bool_)
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

    def _camera(self, camera_index: int, name: str = "camera_index") -> int:
        index = check_int(name, camera_index, 0)
        if index >= self.num_cameras:
            raise ValueError(f"{name}: expected an int in [0, {self.num_cameras}), got {index}")
        return index

    def _cameras(self, camera_indices: Sequence[int]) -> np.ndarray:
        """Validated camera indices. ``[B]`` int64."""
        return np.array([self._camera(c, f"camera_indices[{i}]") for i, c in enumerate(camera_indices)], dtype=np.int64)

    def _gather(self, cameras: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Flat rows of ``cameras``, laid end to end.

        Returns:
            ``(rows, counts, begins)``: history row index of each of them (``[sum T]`` int64),
            each camera's row count and where its rows begin in ``rows`` (``[B]`` int64 each).
        """
        counts = self._counts[cameras]
        begins = np.cumsum(counts) - counts
        rows = np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(self._offsets[cameras] - begins, counts)
        return rows, counts, begins

    @property
    def prior_scale(self) -> float:
        """Measured cost per unit of prior cost, over rows measured so far that had a prior (1 if none)."""
        if self._first_prior_sum > 0.0:
            return self._first_measured_sum / self._first_prior_sum
        return 1.0

    def _uniform_cost(self) -> float:
        if self._fallback is None:
            if self._measured.any():
                measured = self._values[self._measured].tolist()
                self._fallback = math.fsum(measured) / len(measured)
            elif self._has_prior.any():
                rows = self._prior[np.repeat(self._has_prior, self._counts)].tolist()
                self._fallback = math.fsum(rows) / len(rows) * self.prior_scale
            else:
                self._fallback = 1.0
        return self._fallback

    def measured_mask(self, camera_indices: Sequence[int]) -> np.ndarray:
        """Whether every tile row of each camera has been measured at least once.

        Args:
            camera_indices: Dataset indices of the cameras, each in ``[0, C)``. ``[B]``.

        Returns:
            ``[B]`` bool numpy array, in the order asked.
        """
        cameras = self._cameras(camera_indices)
        if cameras.shape[0] == 0:
            return np.zeros(0, dtype=np.bool_)
        rows, _, begins = self._gather(cameras)
        return np.logical_and.reduceat(self._measured[rows], begins)

    def has_measurement(self, camera_index: int) -> bool:
        """Whether every tile row of the camera has been measured at least once."""
        camera = self._camera(camera_index)
        return bool(self._measured[self._offsets[camera] : self._offsets[camera + 1]].all())

    def get_arrays(self, camera_indices: Sequence[int]) -> list[np.ndarray]:
        """Current cost estimate of each tile row of each camera, in one vectorised pass.

        Args:
            camera_indices: Dataset indices of the cameras, each in ``[0, C)``; repeats allowed.

        Returns:
            Per camera, its row costs: ``[T_c]`` float64 numpy, non-negative. Views into one new
            array (disjoint), the caller may keep and modify them.
        """
        cameras = self._cameras(camera_indices)
        if cameras.shape[0] == 0:
            return []
        rows, counts, begins = self._gather(cameras)
        with_prior = np.repeat(self._has_prior[cameras], counts)
        fill = self._prior[rows] * self.prior_scale
        if not with_prior.all():
            fill = np.where(with_prior, fill, self._uniform_cost())
        costs = np.where(self._measured[rows], self._values[rows], fill)
        return np.split(costs, begins[1:])

    def get(self, camera_index: int) -> Tensor:
        """Current cost estimate of each tile row of a camera.

        Args:
            camera_index: Dataset index of the camera, in ``[0, C)``.

        Returns:
            Row costs. ``[T]`` float64 on CPU, non-negative; a new tensor the caller may keep.
        """
        return torch.from_numpy(self.get_arrays([self._camera(camera_index)])[0])

    def get_batch(self, camera_indices: Sequence[int]) -> list[Tensor]:
        """``[get(c) for c in camera_indices]``: the ``row_costs`` argument of ``partition_rows``.

        ``get_arrays`` is the same as numpy arrays (what the planner uses every step).
        """
        return [torch.from_numpy(costs) for costs in self.get_arrays(camera_indices)]

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
        _check_costs([costs], costs, numbered=False)
        if costs.shape[0] != self._row_counts[camera]:
            raise ValueError(
                f"row_costs: expected {self._row_counts[camera]} rows for camera {camera}, got {costs.shape[0]}"
            )
        self._prior[self._offsets[camera] : self._offsets[camera + 1]] = costs
        self._has_prior[camera] = True
        self._fallback = None

    def update(self, camera_index: int, first_row: int, row_costs: ArrayLike) -> None:
        """Blend measured costs of the rows actually rendered into the history.

        Rows ``first_row .. first_row + len(row_costs) - 1`` of the camera are updated; the
        others keep their estimate. A row's first measurement replaces its estimate; a later
        one gives ``decay * old + (1 - decay) * measured``. ``update_bands`` with one band.

        Args:
            camera_index: Dataset index of the camera.
            first_row: First tile row the measurement covers.
            row_costs: Measured cost of each covered tile row. ``[T_band]``, non-negative, finite.

        Raises:
            ValueError: Bad index, rows outside the image, negative or non-finite costs.
        """
        self._update(((camera_index, first_row, row_costs),), single=True)

    def update_bands(self, measurements: Sequence[BandMeasurement]) -> None:
        """Blend one step's measured bands into the history, in one vectorised pass.

        The result is that of ``update(*band)`` for each band in order, bit for bit for the
        estimates and measured flags. Bands of one step normally cover disjoint rows; where two
        bands cover the same row of the same camera, the bands are applied one at a time, in
        order (the later one blends into the earlier one, as sequential calls would).

        ``prior_scale``'s two sums get each call's new terms with one ``math.fsum`` (exact, then
        one rounding), where sequential ``update`` calls round once per band: the two may differ
        in the last bit. Every rank calls this with the same bands, so all ranks still agree.

        Args:
            measurements: ``(camera_index, first_row, row_costs)`` per band, e.g. every rank's
                bands in rank order; ``row_costs`` is ``[T_band]``, non-negative and finite.
                Empty: nothing changes.

        Raises:
            TypeError: A band that is not a ``(camera_index, first_row, row_costs)`` triple, or
                a non-int index.
            ValueError: A bad camera index, rows outside the image, no rows, negative or
                non-finite costs; the message names the band (``measurements[i]``). Nothing is
                applied when it raises.
        """
        self._update(measurements, single=False)

    def _update(self, measurements: Sequence[BandMeasurement], *, single: bool) -> None:
        """Validate every band, then fold them in (``update``/``update_bands``)."""
        num_cameras, offsets, row_counts = self.num_cameras, self._row_offsets, self._row_counts
        cameras, spans, arrays = [], [], []  # per band: camera, history rows [start, end), costs
        for i, band in enumerate(measurements):
            prefix = _band_prefix(None if single else i)
            try:
                camera, first_row, row_costs = band
            except (TypeError, ValueError):
                raise TypeError(
                    f"measurements[{i}]: expected a (camera_index, first_row, row_costs) triple, got {type(band).__name__}"
                ) from None
            # Plain in-range ints skip the validators (every band of every step goes through here).
            if not (type(camera) is int and 0 <= camera < num_cameras):
                camera = self._camera(camera, f"{prefix}camera_index")
            if not (type(first_row) is int and first_row >= 0):
                first_row = check_int(f"{prefix}first_row", first_row, 0)
            costs = _host_costs(f"{prefix}row_costs", row_costs)
            end_row = first_row + costs.shape[0]
            if end_row > row_counts[camera]:
                raise ValueError(
                    f"{prefix}first_row + len(row_costs): expected <= {row_counts[camera]} (rows of camera {camera}), got {end_row}"
                )
            cameras.append(camera)
            spans.append((offsets[camera] + first_row, offsets[camera] + end_row))
            arrays.append(costs)
        if not arrays:
            return
        costs = np.concatenate(arrays) if len(arrays) > 1 else arrays[0]  # read only: may alias the caller's
        _check_costs(arrays, costs, numbered=not single)
        lengths = np.array([end - start for start, end in spans], dtype=np.int64)
        begins = np.cumsum(lengths) - lengths
        starts = np.array([start for start, _ in spans], dtype=np.int64)
        rows = np.arange(costs.shape[0], dtype=np.int64) + np.repeat(starts - begins, lengths)
        band_cameras = np.repeat(np.array(cameras, dtype=np.int64), lengths)
        ordered = sorted(spans)
        if any(later[0] < earlier[1] for earlier, later in itertools.pairwise(ordered)):
            # Overlapping bands: a row's second measurement must blend into its first.
            for begin, end in zip(begins.tolist(), (begins + lengths).tolist(), strict=True):
                self._fold(rows[begin:end], band_cameras[begin:end], costs[begin:end])
        else:
            self._fold(rows, band_cameras, costs)

    def _fold(self, rows: np.ndarray, cameras: np.ndarray, costs: np.ndarray) -> None:
        """Blend ``costs`` into history rows ``rows`` (distinct), of cameras ``cameras``. ``[n]`` each."""
        was_measured = self._measured[rows]
        fresh = ~was_measured & self._has_prior[cameras]
        if fresh.any():
            self._first_measured_sum = math.fsum([self._first_measured_sum, *costs[fresh].tolist()])
            self._first_prior_sum = math.fsum([self._first_prior_sum, *self._prior[rows[fresh]].tolist()])
        # Two separate elementwise ops: no fused multiply-add, so every CPU rounds the same way.
        blended = self._values[rows] * self._decay
        blended = blended + costs * (1.0 - self._decay)
        self._values[rows] = np.where(was_measured, blended, costs)
        self._measured[rows] = True
        self._fallback = None

    # ---- checkpointing -------------------------------------------------------------------------

    def state_dict(self) -> dict[str, object]:
        """Everything ``load_state_dict`` needs; tensors are CPU torch copies. ``decay`` is config, not state."""
        return {
            "version": _STATE_VERSION,
            "row_counts": torch.tensor(self._row_counts, dtype=torch.int64),
            "values": torch.from_numpy(self._values.copy()),
            "measured": torch.from_numpy(self._measured.copy()),
            "prior": torch.from_numpy(self._prior.copy()),
            "has_prior": torch.from_numpy(self._has_prior.copy()),
            "first_measured_sum": self._first_measured_sum,
            "first_prior_sum": self._first_prior_sum,
        }

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Restore a ``state_dict`` saved for the same cameras (any world size).

        Args:
            state: A ``state_dict``; its arrays may be torch tensors (as saved) or numpy arrays.

        Raises:
            ValueError: A different camera count or per-camera row counts, an unknown version,
                or missing entries. The history is unchanged when it raises.
        """
        required = (
            "version",
            "row_counts",
            "values",
            "measured",
            "prior",
            "has_prior",
            "first_measured_sum",
            "first_prior_sum",
        )
        missing = [key for key in required if key not in state]
        if missing:
            raise ValueError(f"state: expected keys {list(required)}, missing {missing}")
        if state["version"] != _STATE_VERSION:
            raise ValueError(f"state['version']: expected {_STATE_VERSION}, got {state['version']}")
        counts = [int(c) for c in _host_array(state["row_counts"], np.int64).reshape(-1).tolist()]
        if len(counts) != self.num_cameras:
            raise ValueError(
                f"camera count: expected {self.num_cameras} cameras (this dataset), got {len(counts)} in the saved cost history"
            )
        if tuple(counts) != self._row_counts:
            camera = next(i for i, (a, b) in enumerate(zip(counts, self._row_counts, strict=False)) if a != b)
            raise ValueError(
                f"row_counts[{camera}]: expected {self._row_counts[camera]} tile rows, got {counts[camera]} in the saved cost history"
            )
        total = int(self._offsets[-1])
        arrays = {}
        for key, dtype, size in (
            ("values", np.float64, total),
            ("measured", np.bool_, total),
            ("prior", np.float64, total),
            ("has_prior", np.bool_, self.num_cameras),
        ):
            array = _host_array(state[key], dtype)
            if array.shape != (size,):
                raise ValueError(f"state['{key}']: expected shape ({size},), got {tuple(array.shape)}")
            arrays[key] = array
        self._values = arrays["values"]
        self._measured = arrays["measured"]
        self._prior = arrays["prior"]
        self._has_prior = arrays["has_prior"]
        self._first_measured_sum = float(state["first_measured_sum"])  # type: ignore[arg-type]
        self._first_prior_sum = float(state["first_prior_sum"])  # type: ignore[arg-type]
        self._fallback = None


def _host_array(value: object, dtype: type) -> np.ndarray:
    """A new numpy array of ``dtype`` from a saved entry (torch tensor, numpy array or list)."""
    if isinstance(value, Tensor):
        value = value.detach().cpu().numpy()
    return np.array(value, dtype=dtype)  # copy=True: the history never shares memory with ``state``


def footprint_row_costs(means2d: Tensor, radii: Tensor, height: int, width: int, tile_size: int = 16) -> Tensor:
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
    # Filled on the device: torch.tensor(..., device=) would be a blocking host-to-device copy on
    # every step of a camera's first epoch (found by the device stand-in, docs/device_standin.md).
    limits = torch.full((2,), float(tiles_wide), dtype=torch.float64, device=means.device)
    limits[1] = tiles_high
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
