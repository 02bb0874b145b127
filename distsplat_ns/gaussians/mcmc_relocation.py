"""MCMC relocation: Eq. 9 of Kheradmand et al. 2024, the opacity and scales of ``n`` Gaussians that
share the place of one, so that together they render as it did.

On CUDA float32 gsplat's kernel computes it (what its ``MCMCStrategy`` uses); elsewhere the same
equation in float64 torch, element-wise, so each Gaussian's result is independent of its row.
gsplat is imported lazily (the layer rule of tests/unit/test_layers.py).
"""

from __future__ import annotations

import functools
import math

import torch

_N_MAX = 51
"""Largest relocation ratio gsplat's kernel resolves (its binomial table is 51 x 51)."""


@functools.cache
def _eq9_coefficients() -> torch.Tensor:
    """``a[n, k] = (-1)^k C(n, k+1) / sqrt(k+1)`` for n <= 51 (0 for k >= n). `[52, 51]`, float64.

    Eq. 9's denominator ``sum_{i=1..n} sum_{k<i} C(i-1, k) (-1)^k o^(k+1) / sqrt(k+1)`` regrouped by
    k with the hockey-stick identity ``sum_{i=k+1..n} C(i-1, k) = C(n, k+1)``.
    """
    return torch.tensor(
        [[(-1) ** k * math.comb(n, k + 1) / math.sqrt(k + 1) for k in range(_N_MAX)] for n in range(_N_MAX + 1)],
        dtype=torch.float64,
    )


def relocation_opacity_scale(
    opacities: torch.Tensor, scales: torch.Tensor, ratios: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 9 of the paper: the opacity and scales each of ``n`` Gaussians sharing one place gets.

    On CUDA float32 this is gsplat's ``gsplat.relocation.compute_relocation`` (its kernel, what
    ``MCMCStrategy`` computes); elsewhere (CPU, float64) the same equation in float64 torch, every
    operation element-wise (``exp``, ``log1p``, products), so a Gaussian's result does not depend on
    its row or on the others drawn with it.

    Args:
        opacities: Source opacities in (0, 1). `[J]`.
        scales: Source scales (not logs). `[J, 3]`.
        ratios: Copies sharing the place, source included, >= 1 (clamped to 51 as gsplat does). `[J]`, int.

    Returns:
        ``(new_opacities, new_scales)``: `[J]`, `[J, 3]`, in ``opacities``' dtype, not clamped.
    """
    if opacities.is_cuda and opacities.dtype == torch.float32:
        from gsplat.relocation import compute_relocation  # gsplat's kernel (the same call 1.4.0 to 1.5.3)

        binoms = torch.tensor(
            [[math.comb(n, k) for k in range(_N_MAX)] for n in range(_N_MAX)],
            dtype=torch.float32,
            device=opacities.device,
        )
        return compute_relocation(opacities.contiguous(), scales.contiguous(), ratios.clone(), binoms)
    n = ratios.to(torch.int64).clamp(1, _N_MAX)
    o = opacities.to(torch.float64)
    new_o = 1.0 - torch.exp(torch.log1p(-o) / n.to(torch.float64))  # 1 - (1 - o)^(1/n)
    coefficients = _eq9_coefficients().to(o.device)[n]  # [J, 51]
    power = torch.ones_like(new_o)
    denominator = torch.zeros_like(new_o)
    for k in range(_N_MAX):
        power = power * new_o
        denominator = denominator + coefficients[:, k] * power
    new_scales = (o / denominator)[:, None] * scales.to(torch.float64)
    return new_o.to(opacities.dtype), new_scales.to(scales.dtype)
