"""MCMC on CUDA (gaussians/mcmc.py): the device generator, gsplat's Eq. 9 kernel, no host sync in the noise,
and shards equal to one process with the kernel in the loop.

The relocation kernel's test runs without a GPU too, on the device stand-in (tests/gpu/conftest.py:
``cuda_device``), where the package takes gsplat's path and gsplat's kernel runs on its PyTorch
stand-in (tests/helpers/gsplat_cpu.py); the others check CUDA's own kernels and syncs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.cuda
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _to_cuda(gaussians: tuple[dict, dict, dict]) -> tuple[dict, dict, dict]:
    params, optimizers, state = gaussians
    out_params, out_opts = {}, {}
    for k, p in params.items():
        q = torch.nn.Parameter(p.detach().cuda())
        old = optimizers[k].state[p]
        out_opts[k] = torch.optim.Adam([q], lr=1e-3)
        out_opts[k].state[q] = {
            "step": old["step"].clone(),
            "exp_avg": old["exp_avg"].cuda(),
            "exp_avg_sq": old["exp_avg_sq"].cuda(),
        }
        out_params[k] = q
    return out_params, out_opts, {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in state.items()}


@needs_cuda  # CUDA's integer kernels against numpy; on the CPU tests/unit/test_keyed_random.py
def test_device_bits_on_cuda_equal_numpys_bitwise() -> None:
    from distsplat_ns.utils.keyed_random import keyed_bits, keyed_bits_device

    ids = torch.randperm(1 << 20, generator=torch.Generator().manual_seed(0))[:100_000] * 7919
    for stream in range(4):
        got = keyed_bits_device(42, 1234, ids.cuda(), 3, stream=stream).cpu().numpy()
        assert np.array_equal(got, keyed_bits(42, 1234, ids, 3, stream=stream).view(np.int64)), stream


def test_gsplats_relocation_kernel_matches_the_float64_equation(cuda_device: str) -> None:
    from distsplat_ns.gaussians.mcmc_relocation import relocation_opacity_scale

    gen = torch.Generator().manual_seed(0)
    opacities = 0.006 + 0.99 * torch.rand(5000, generator=gen)
    scales = torch.rand(5000, 3, generator=gen) + 0.01
    ratios = torch.randint(1, 52, (5000,), generator=gen)
    kernel_o, kernel_s = relocation_opacity_scale(
        opacities.to(cuda_device), scales.to(cuda_device), ratios.to(cuda_device)
    )  # gsplat's
    exact_o, exact_s = relocation_opacity_scale(opacities.double(), scales.double(), ratios)  # CPU float64
    # The kernel evaluates Eq. 9 in float32: 1 - (1 - o)^(1/n) loses ~1e-7 absolute, and the
    # alternating sum of up to 51 terms (each <= C(51, k) o^k, up to ~1e2) ~1e-5 relative. The
    # bounds are that estimate with margin, not a measurement (no device in the writing session).
    assert torch.allclose(kernel_o.double().cpu(), exact_o, rtol=1e-4, atol=1e-6)
    assert torch.allclose(kernel_s.double().cpu(), exact_s, rtol=1e-3, atol=0)


@needs_cuda  # a host sync exists only on CUDA (set_sync_debug_mode); the stand-in cannot see one
def test_position_noise_does_not_sync() -> None:
    from distsplat_ns.gaussians.mcmc import inject_keyed_position_noise
    from tests.helpers.mcmc_shards import mcmc_gaussians

    params, _, state = _to_cuda(mcmc_gaussians(torch.float32))
    ids = state["gauss_ids"]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        inject_keyed_position_noise(params, ids, seed=42, step=7, scaler=80.0)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@needs_cuda  # bitwise on CUDA's float32 kernels; on the CPU tests/multiproc/test_mcmc_ranks.py
@pytest.mark.parametrize("partition", ["blocks2", "random3"])
def test_sharded_mcmc_on_cuda_equals_one_process_bitwise(partition: str) -> None:
    from distsplat_ns.gaussians.densifier import gather_local
    from tests.helpers.mcmc_shards import gaussians_by_id, mcmc_gaussians, mcmc_sequence, run_ranks, shards_of

    host = mcmc_gaussians(torch.float32)
    full = _to_cuda(host)
    shards = [_to_cuda(s) for s in shards_of(host, partition)]
    expected = mcmc_sequence(full, gather_local)  # float32 on CUDA: gsplat's Eq. 9 kernel
    assert all(e.num_relocated > 0 for e in expected) and expected[0].num_added > 0
    results, _ = run_ranks(len(shards), lambda rank, gather: mcmc_sequence(shards[rank], gather))
    assert all(r == expected for r in results)
    want, got = gaussians_by_id([full]), gaussians_by_id(shards)
    for key in want:
        assert torch.equal(want[key], got[key]), key
