"""The sharded exchange on gsplat's kernels: 2 ranks sharing the GPU (gloo stages the rows through
host memory) against the reference backend on one CPU process."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import rank_fns
from tests.helpers.model_factory import HEIGHT
from tests.helpers.multiproc import run_ranks
from tests.helpers.rows_by_id import grads_by_id

# CUDA only: on the CPU the sharded exchange on gsplat's path runs end to end instead, 2 ranks under the
# device stand-in (tests/multiproc/test_standin_training.py, "2-sharded-mcmc").
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SPLIT = [[(0, 0, 21)], [(0, 21, HEIGHT), (1, 0, HEIGHT)]]


def test_sharded_gsplat_two_ranks_match_reference_one_process() -> None:
    reference = run_ranks(rank_fns.band_gradients_dtype, 1, [[[(0, 0, HEIGHT), (1, 0, HEIGHT)]]], 2, 5, "float32")[0][0]
    ranks = run_ranks(
        rank_fns.sharded_band_gradients, 2, [SPLIT], 2, 5, "float32", "gsplat", device_type="cuda", backend="gloo"
    )
    joined = grads_by_id([r[0] for r in ranks])
    for name, ref in reference.items():
        if ref.numel() == 0 or name == "loss":
            continue
        got = joined[name]
        # float32 on different kernels (gsplat's sorting and atomics): 1e-3 of the largest entry,
        # the tolerance of tests/gpu/test_cuda_training.py.
        scale = ref.abs().max().clamp_min(1e-12)
        assert (got - ref).abs().max() / scale <= 1e-3, name
    assert abs(float(sum(r[0]["loss"] for r in ranks)) - float(reference["loss"])) <= 1e-4 * abs(
        float(reference["loss"])
    )
