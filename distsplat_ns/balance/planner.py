"""BandPlanner: each step's bands per rank, from a measured per-camera cost history.

Pure (no nerfstudio, no torch.distributed): the pipeline feeds it identical inputs on every rank --
the batch, the resolution, all-gathered measurements -- so every rank computes the same plan.

Costs are the renderer's work per tile row (``TILE_SIZE`` px), as it reports it for the rows it
rendered (``RowRender.tile_work``): Gaussian-tile intersections on gsplat (its ``isect_offsets``),
composited pixel-Gaussian pairs on the reference backend, whose time follows them (docs/balance.md,
"The reference backend's cost unit"). A history saved in another unit is not loaded.
The training resolution changes with splatfacto's schedule, so one history is kept per downscale.

Shape letters: B images in the batch, R ranks, T tile rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch

from distsplat_ns.balance.bands import TILE_SIZE, Band, num_tile_rows, rank_costs
from distsplat_ns.balance.cost import CostHistory
from distsplat_ns.balance.partition import (
    DEFAULT_SNAP_TOLERANCE,
    equal_rows_partition,
    partition_rows,
    whole_image_partition,
)
from distsplat_ns.utils.cameras import downscaled_px
from distsplat_ns.utils.logging import get_logger
from distsplat_ns.utils.stats import max_over_mean, mean_and_p95

PartitionMode = Literal["balanced", "whole-images", "equal-rows"]
"""``--pipeline.partition``: how each batch is cut across ranks (``BandPlanner``)."""
PARTITION_MODES: tuple[PartitionMode, ...] = get_args(PartitionMode)

INTERSECTIONS = "Gaussian-tile intersections"
"""The cost unit of gsplat, and of every history saved before the unit was recorded."""

logger = get_logger(__name__)


@dataclass
class StepPlan:
    """The bands of one step.

    Attributes:
        bands: Per rank, its bands (tile rows at the rendered resolution; ``Band.end_row_px``
            with ``heights_px`` gives the pixel rows). `[R][...]`.
        predicted_costs: Per rank, the cost the history predicts for its bands. `[R]`.
        heights_px: Rendered height of each batch image. `[B]`.
        downscale: The resolution divisor the plan was made for.
    """

    bands: list[list[Band]]
    predicted_costs: list[float]
    heights_px: list[int]
    downscale: int

    def positions(self, rank: int) -> list[int]:
        """The batch positions ``rank`` renders a band of, increasing."""
        return sorted({b.position for b in self.bands[rank]})

    @property
    def predicted_imbalance(self) -> float:
        """Max over mean of the ranks' predicted costs (1.0: the cut expects perfect balance)."""
        return max_over_mean(self.predicted_costs)


@dataclass
class BalanceLog:
    """Per-step balance figures, for tensorboard and the run summary."""

    predicted_imbalance: list[float] = field(default_factory=list)
    measured_imbalance: list[float] = field(default_factory=list)
    prediction_error: list[float] = field(default_factory=list)

    def summary(self, warmup_steps: int = 0) -> dict[str, float | None]:
        """Means and 95th percentiles over the steps after ``warmup_steps``."""

        def stats(values: list[float]) -> tuple[float | None, float | None]:
            return mean_and_p95(values[warmup_steps:] if len(values) > warmup_steps else values)

        m_mean, m_p95 = stats(self.measured_imbalance)
        p_mean, p_p95 = stats(self.predicted_imbalance)
        e_mean, e_p95 = stats(self.prediction_error)
        return {
            "measured_imbalance_mean": m_mean,
            "measured_imbalance_p95": m_p95,
            "predicted_imbalance_mean": p_mean,
            "predicted_imbalance_p95": p_p95,
            "prediction_error_mean": e_mean,
            "prediction_error_p95": e_p95,
            "num_steps": len(self.measured_imbalance[warmup_steps:])
            if len(self.measured_imbalance) > warmup_steps
            else len(self.measured_imbalance),
            "num_warmup_steps_excluded": min(warmup_steps, max(0, len(self.measured_imbalance) - 1)),
        }


class BandPlanner:
    """Plans bands from costs and learns costs from measurements.

    Args:
        mode: "balanced" (cost-weighted cut of the batch's tile rows), "whole-images" (gsplat's
            split) or "equal-rows" (Grendel-GS's cold start).
        full_heights_px: Full-resolution height of every training camera. `[num_cameras]`.
        decay: Weight of the old estimate when a measurement arrives (0 = replace, as Grendel-GS).
        min_band_rows: Thinnest band, in tile rows.
        snap_tolerance: How much more than its share a part may cost to end on an image edge.
        level_smoothing: Weight of the newest step in the smoothed cost level (1 = no smoothing).
        cost_unit: What the measurements count (``rendering/api.py:WORK_UNITS``); saved with
            the history, which is only loaded back in the same unit.
        band_cost_fraction: The fixed cost of rendering one band (its camera's projection and
            render call), as a fraction of the batch's mean image cost (``rendering/api.py:
            BAND_COST_FRACTIONS``). Above 0 the balanced cut minimises the largest rank's rows plus
            this cost per band, and cuts an image only where that pays; 0 balances the rows and
            snaps within ``snap_tolerance`` instead (docs/balance.md, "With a fixed cost per band").
    """

    def __init__(
        self,
        mode: PartitionMode,
        full_heights_px: Sequence[int],
        *,
        decay: float = 0.0,
        min_band_rows: int = 1,
        snap_tolerance: float = DEFAULT_SNAP_TOLERANCE,
        level_smoothing: float = 0.2,
        cost_unit: str = INTERSECTIONS,
        band_cost_fraction: float = 0.0,
    ) -> None:
        if not 0.0 < level_smoothing <= 1.0:
            raise ValueError(f"level_smoothing must be in (0, 1], got {level_smoothing}")
        if mode not in PARTITION_MODES:
            raise ValueError(f"partition mode must be one of {PARTITION_MODES}, got {mode!r}")
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"cost decay must be in [0, 1), got {decay}")
        if not 0.0 <= band_cost_fraction < 1.0:
            raise ValueError(f"band_cost_fraction must be in [0, 1), got {band_cost_fraction}")
        self.mode = mode
        self.full_heights_px = [int(h) for h in full_heights_px]
        self.decay = decay
        self.min_band_rows = min_band_rows
        self.snap_tolerance = snap_tolerance
        self.cost_unit = cost_unit
        self.band_cost_fraction = float(band_cost_fraction)
        self._histories: dict[int, CostHistory] = {}
        self._with_prior: dict[int, set[int]] = {}
        # Cost level (mean measured cost per tile row, smoothed over steps) now and when each
        # camera was last measured: a camera measured an epoch ago is scaled by how much the
        # scene's cost grew since (densification), so images measured at different times compare
        # fairly in one batch (docs/balance_results.md: without it, stale weights made B >= W cuts
        # worse than whole images on short runs).
        self._level: dict[int, float] = {}
        self._camera_level: dict[int, dict[int, float]] = {}
        self.level_smoothing = level_smoothing
        self.log = BalanceLog()

    # ------------------------------------------------------------------ history per resolution
    def heights_at(self, downscale: int, camera_indices: Sequence[int]) -> list[int]:
        """Rendered heights (px) at ``downscale`` (nerfstudio's truncating rescale)."""
        return [downscaled_px(self.full_heights_px[c], downscale) for c in camera_indices]

    def history(self, downscale: int) -> CostHistory:
        if downscale not in self._histories:
            heights = self.heights_at(downscale, range(len(self.full_heights_px)))
            self._histories[downscale] = CostHistory([num_tile_rows(h, TILE_SIZE) for h in heights], decay=self.decay)
            self._with_prior[downscale] = set()
        return self._histories[downscale]

    def cameras_needing_prior(self, downscale: int, batch: Sequence[int]) -> list[int]:
        """Cameras of ``batch`` with neither a measurement nor a prior at this resolution."""
        if self.mode != "balanced":
            return []
        hist = self.history(downscale)
        done = self._with_prior[downscale]
        measured = hist.measured_mask(batch).tolist()
        return sorted({c for c, m in zip(batch, measured, strict=True) if not m and c not in done})

    def set_prior(self, downscale: int, camera_index: int, row_costs: torch.Tensor) -> None:
        self.history(downscale).set_prior(camera_index, row_costs)
        self._with_prior[downscale].add(camera_index)

    # ------------------------------------------------------------------ planning
    def plan(self, batch: Sequence[int], world_size: int, downscale: int) -> StepPlan:
        """The step's bands for every rank: a pure function of the batch, the resolution and the
        history, so every rank computes the same plan."""
        heights = self.heights_at(downscale, batch)
        row_counts = [num_tile_rows(h, TILE_SIZE) for h in heights]
        hist = self.history(downscale)
        costs = [
            row_costs * self.level_factor(downscale, c)
            for row_costs, c in zip(hist.get_arrays(batch), batch, strict=True)
        ]
        if self.mode == "balanced":
            band_cost = self.band_cost_fraction * sum(float(c.sum()) for c in costs) / len(costs)
            bands = partition_rows(
                costs,
                world_size,
                min_band_rows=self.min_band_rows,
                snap_tolerance=self.snap_tolerance,
                band_cost=band_cost,
            )
        elif self.mode == "whole-images":
            bands = whole_image_partition(row_counts, world_size)
        else:
            bands = equal_rows_partition(row_counts, world_size)
        return StepPlan(bands=bands, predicted_costs=rank_costs(bands, costs), heights_px=heights, downscale=downscale)

    def level_factor(self, downscale: int, camera_index: int) -> float:
        """How much the scene's cost level grew since ``camera_index`` was last measured (1.0 for
        cameras never measured: their prior is already in current units)."""
        then = self._camera_level.get(downscale, {}).get(camera_index)
        now = self._level.get(downscale)
        if then is None or now is None or then <= 0.0:
            return 1.0
        return now / then

    # ------------------------------------------------------------------ learning
    def observe(
        self,
        plan: StepPlan,
        batch: Sequence[int],
        downscale: int,
        measurements: Sequence[Sequence[tuple[int, int, list[float]]]],
    ) -> float:
        """Fold every rank's measured tile-row costs into the history; log the step's balance.

        Args:
            plan: The plan the step ran.
            batch: The step's camera indices. `[B]`.
            downscale: The step's resolution divisor.
            measurements: Per rank, ``(position, first_tile_row, row_costs)`` for each band it
                rendered; identical on every rank (all-gathered), applied in rank order.

        Returns:
            The measured imbalance (max/mean of the ranks' measured costs; 1.0 when all are 0).
        """
        hist = self.history(downscale)
        measured = []
        rows_measured = 0
        cameras_measured = []
        bands = []
        for rank_meas in measurements:
            total = 0.0
            for position, first_tile_row, row_costs in rank_meas:
                bands.append((batch[position], first_tile_row, row_costs))
                total += float(sum(row_costs))
                rows_measured += len(row_costs)
                cameras_measured.append(batch[position])
            measured.append(total)
        # One vectorised fold of every rank's bands, in rank order: no torch operator per band.
        hist.update_bands(bands)
        if rows_measured:
            step_level = sum(measured) / rows_measured
            old = self._level.get(downscale)
            a = self.level_smoothing
            self._level[downscale] = step_level if old is None else (1 - a) * old + a * step_level
            levels = self._camera_level.setdefault(downscale, {})
            for camera in cameras_measured:
                levels[camera] = self._level[downscale]
        measured_imb = max_over_mean(measured)
        self.log.measured_imbalance.append(measured_imb)
        self.log.predicted_imbalance.append(plan.predicted_imbalance)
        denom = max(sum(measured), 1e-12)
        # Relative error of the predicted share of each rank (costs of a camera's first step are
        # priors in other units, so shares, not absolute values, are what the cut relies on).
        pred_total = max(sum(plan.predicted_costs), 1e-12)
        err = (
            max(
                abs(p / pred_total - m / denom) / max(m / denom, 1e-12)
                for p, m in zip(plan.predicted_costs, measured, strict=False)
            )
            if sum(measured) > 0
            else 0.0
        )
        self.log.prediction_error.append(float(err))
        return measured_imb

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {
            "mode": self.mode,
            "cost_unit": self.cost_unit,
            "histories": {str(d): h.state_dict() for d, h in self._histories.items()},
            "with_prior": {str(d): sorted(s) for d, s in self._with_prior.items()},
            "level": {str(d): v for d, v in self._level.items()},
            "camera_level": {str(d): {str(c): v for c, v in lv.items()} for d, lv in self._camera_level.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a saved history; one in another cost unit (a checkpoint of the other backend)
        is dropped with a warning: costs are then estimated again, as at a fresh start."""
        self._histories.clear()
        self._with_prior.clear()
        saved_unit = state.get("cost_unit", INTERSECTIONS)
        if saved_unit != self.cost_unit:
            self._level, self._camera_level = {}, {}
            logger.warning(
                "the checkpoint's balancing costs count %s, this renderer's count %s: they are measured again "
                "(footprint estimates until each camera is rendered once)",
                saved_unit,
                self.cost_unit,
            )
            return
        for key, hist_state in state.get("histories", {}).items():
            hist = self.history(int(key))
            hist.load_state_dict(hist_state)
        for key, cams in state.get("with_prior", {}).items():
            self._with_prior[int(key)] = {int(c) for c in cams}
        self._level = {int(d): float(v) for d, v in state.get("level", {}).items()}
        self._camera_level = {
            int(d): {int(c): float(v) for c, v in lv.items()} for d, lv in state.get("camera_level", {}).items()
        }


class ExpectedImagesAssigner:
    """Which images a rank's data stream decodes ahead of time, for a given partition mode.

    The balanced cut is decided at the step boundary from costs measured up to the previous step,
    after the stream has prefetched. So the stream decodes the images a rank is expected to need:
    for whole images, exactly its images; for row splits, every image overlapping its equal share
    of the batch (``[r B / W, (r + 1) B / W)`` in image units), which covers the cut unless it
    moves past a neighbouring image. An image the stream did not deliver is decoded on demand by
    the pipeline and counted. Picklable and pure (it runs in DataLoader workers).
    """

    def __init__(self, mode: PartitionMode) -> None:
        if mode not in PARTITION_MODES:
            raise ValueError(f"partition mode must be one of {PARTITION_MODES}, got {mode!r}")
        self.mode = mode

    def positions_for_rank(self, step: int, batch: list[int], rank: int, world_size: int) -> list[int]:
        del step
        num = len(batch)
        if self.mode == "whole-images":
            plan = whole_image_partition([1] * num, world_size)
            return sorted({b.position for b in plan[rank]})
        first = (rank * num) // world_size
        end = -((-(rank + 1) * num) // world_size)  # ceil((rank + 1) * B / W)
        return list(range(first, max(end, first + 1) if num else 0))[: max(0, num - first)]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ExpectedImagesAssigner) and other.mode == self.mode

    def __hash__(self) -> int:
        return hash(("ExpectedImagesAssigner", self.mode))

    def __repr__(self) -> str:
        return f"ExpectedImagesAssigner({self.mode!r})"
