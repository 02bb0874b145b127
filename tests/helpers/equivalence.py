"""The 1-vs-W training equivalence settings and tolerance shared by the multi-process tests."""

from __future__ import annotations

# 100 images at B = 2: 50 steps. Refines (counted in images) at images 40, 60, 80 -> steps 20, 30,
# 40, after the 10 + 20 = 30-image pause that follows an opacity reset in splatfacto's schedule.
# float64 (reference backend): float32 summation-order differences between 1 and 2 processes
# (1e-7 relative) flip a couple of densification thresholds among ~14k Gaussians (measured: 14523
# vs 14521 after 3 refines). In float64, with the float64 mode's rules (unique seed points, Adam
# eps >= 1e-8), the parameters stay within rounding (assert_same_model) and no decision flips
# (docs/float64_exactness.md; bird: none over 900 images).
EQUIV_EXTRA = [
    "--pipeline.model.param-dtype",
    "float64",
    "--pipeline.batch-size",
    "2",
    "--pipeline.model.warmup-length",
    "20",
    "--pipeline.model.refine-every",
    "20",
    "--pipeline.replica-check-every",
    "1",
    "--steps-per-eval-all-images",
    "1000",
    "--steps-per-save",
    "1000",
]


# MCMC on lund_door, float64, B = 2: events every 10 images after a 10-image warm-up; dead below
# opacity 0.1 (splatfacto's initial opacity), so thousands relocate at each event
# (tests/multiproc/test_mcmc_training.py, tests/multiproc/test_budget_training.py).
MCMC_EQUIV_EXTRA = [
    "--pipeline.model.strategy",
    "mcmc",
    "--pipeline.model.param-dtype",
    "float64",
    "--pipeline.batch-size",
    "2",
    "--pipeline.model.warmup-length",
    "10",
    "--pipeline.model.refine-every",
    "10",
    "--pipeline.model.cull-alpha-thresh",
    "0.1",
    "--steps-per-eval-all-images",
    "1000",
]


def assert_same_model(a: dict, b: dict) -> None:
    """Two runs' Gaussians agree within rounding, parameter by parameter: max |a - b| <= 1e-6.

    Summation order differs in the last float64 bits between 1 and W processes (and between
    partitions and modes), so the runs are not bitwise equal. Traced for this configuration
    (benchmarks/float64_divergence.py, 1 vs 2 processes, commit 13c58e5:
    benchmarks/results/float64_divergence_lund_door_equiv_float64_mode_2026-12-01.json): 4.2e-11
    after step 0, at most 2.9e-10 over the 50 steps, the same Gaussians after every refinement.
    The tolerance leaves 3000x of that for other orders of summation (W = 3, sharded, whole-image
    partitions); a wrong reduction or a flipped decision moves entries by about a learning rate
    (1e-4 to 1e-1). Before the float64 mode raised every group's Adam eps, one Gaussian born at a
    refinement with a gradient of about 1e-9 took opposite +-lr first steps in the two runs (0.28).
    """
    for name, value in a.items():
        diff = (value - b[name]).abs()
        if diff.numel() == 0:
            continue
        assert diff.max() <= 1e-6, f"{name}: max |difference| {diff.max().item():.3g} > 1e-6"
