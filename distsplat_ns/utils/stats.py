"""Summary figures of per-rank and per-step values: the one imbalance rule and one percentile."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def max_over_mean(values: Sequence[float]) -> float:
    """``max(values) / mean(values)``: 1.0 is perfect balance; 1.0 too when the mean is 0 or there
    are no values (nothing to balance)."""
    if len(values) == 0:
        return 1.0
    mean = sum(values) / len(values)
    return float(max(values) / mean) if mean > 0 else 1.0


def mean_and_p95(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and 95th percentile (numpy's linear interpolation) of ``values``; ``(None, None)`` when
    empty."""
    if len(values) == 0:
        return None, None
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()), float(np.percentile(arr, 95))
