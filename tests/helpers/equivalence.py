"""The 1-vs-W training equivalence settings and tolerance shared by the multi-process tests."""

from __future__ import annotations

import torch

# 100 images at B = 2: 50 steps. Refines (counted in images) at images 40, 60, 80 -> steps 20, 30,
# 40, after the 10 + 20 = 30-image pause that follows an opacity reset in splatfacto's schedule.
# float64 (reference backend): float32 summation-order differences between 1 and 2 processes
# (1e-7 relative) flip a couple of densification thresholds among ~14k Gaussians (measured: 14523
# vs 14521 after 3 refines). In float64 the parameters still differ (max 0.035 after 50 steps, see
# assert_same_model), but at this horizon no refinement decision flips; over longer runs one does
# (docs/float64_exactness.md: bird, B=4, first refinement at step 150).
EQUIV_EXTRA = [
    "--pipeline.model.param-dtype", "float64",
    "--pipeline.batch-size", "2",
    "--pipeline.model.warmup-length", "20",
    "--pipeline.model.refine-every", "20",
    "--pipeline.replica-check-every", "1",
    "--steps-per-eval-all-images", "1000",
    "--steps-per-save", "1000",
]


def assert_same_model(a: dict, b: dict) -> None:
    """Two runs' Gaussians agree within the stated tolerance, parameter by parameter.

    Summation order differs in the last float64 bits between 1 and 2 processes (and between
    partitions). The rasterizer's discontinuities (alpha < 1/255 skipped, transmittance stop at
    1e-4) and Adam's eps of 1e-15 (a gradient ~0 in one run and ~1e-20 in the other) turn that into
    updates differing by up to a learning rate for a few entries, and the difference grows with the
    steps (docs/float64_exactness.md). Measured after 50 steps, before images were decoded at the
    training scale: median 1e-8..2e-7, 99th percentile <= 1.1e-4, max <= 0.035; since (ground truth
    box-averaged in uint8, another trajectory): median <= 3.7e-7, 99th percentile 1.7e-3, max 0.29
    (opacity logits, lr 0.05), with the same Gaussian count. Stated tolerance: median <= 1e-6 (the
    sharp check: a wrong reduction moves most entries), 99th percentile <= 1e-2, max <= 1.0.
    """
    for name in a:
        diff = (a[name] - b[name]).abs().flatten()
        if diff.numel() == 0 or a[name].abs().max() == 0:
            continue
        sample = diff[:1_000_000]
        assert sample.median() <= 1e-6, name
        assert torch.quantile(sample, 0.99) <= 1e-2, name
        assert diff.max() <= 1.0, name


