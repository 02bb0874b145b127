"""Real spherical harmonics up to degree 3, in gsplat 1.4.0's basis order and signs.

The pure-PyTorch evaluation used by the reference backend. The basis is the one of the original
3D Gaussian Splatting code (and gsplat): index ``l * l + l + m`` for degree ``l`` and order ``m``,
with the Condon-Shortley-free sign convention of Sloan, "Efficient Spherical Harmonic Evaluation",
JCGT 2013. Directions are normalised here, so callers pass raw ``mean - camera_centre`` vectors.

Shape legend: ``C`` cameras, ``N`` Gaussians, ``K`` SH bases (``(degree + 1) ** 2`` used).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["MAX_SH_DEGREE", "evaluate_sh", "num_sh_bases", "sh_basis"]

MAX_SH_DEGREE = 3
"""Highest degree supported (what splatfacto trains with)."""

# Normalisation constants of the real SH basis, grouped by degree. Values follow from
# sqrt((2l + 1) / (4 pi) * (l - |m|)! / (l + |m|)!) times the usual sqrt(2) for m != 0.
_Y00 = 0.28209479177387814  # 1 / (2 sqrt(pi))
_Y1 = 0.4886025119029199  # sqrt(3 / (4 pi))
_Y2_XY = 1.0925484305920792  # sqrt(15 / (4 pi))
_Y2_ZZ = 0.31539156525252005  # sqrt(5 / (16 pi))
_Y2_XX_YY = 0.5462742152960396  # sqrt(15 / (16 pi))
_Y3_A = 0.5900435899266435  # sqrt(35 / (32 pi))
_Y3_B = 2.890611442640554  # sqrt(105 / (4 pi))
_Y3_C = 0.4570457994644658  # sqrt(21 / (32 pi))
_Y3_D = 0.3731763325901154  # sqrt(7 / (16 pi))
_Y3_E = 1.445305721320277  # sqrt(105 / (16 pi))


def num_sh_bases(degree: int) -> int:
    """Number of SH bases used by ``degree``: ``(degree + 1) ** 2``."""
    return (degree + 1) ** 2


def sh_basis(degree: int, unit_dirs: Tensor) -> Tensor:
    """The real SH basis functions evaluated at unit directions.

    Args:
        degree: SH degree, 0..3.
        unit_dirs: Unit-length directions. `[..., 3]`, float.

    Returns:
        Basis values. `[..., (degree + 1) ** 2]`, same dtype as ``unit_dirs``.

    Raises:
        ValueError: if ``degree`` is outside 0..3.

    **Differentiable:** with respect to ``unit_dirs``.
    """
    if not 0 <= degree <= MAX_SH_DEGREE:
        raise ValueError(f"sh_degree must be in 0..{MAX_SH_DEGREE}, got {degree}")
    x, y, z = unit_dirs.unbind(-1)
    bases = [torch.full_like(x, _Y00)]
    if degree >= 1:
        bases += [-_Y1 * y, _Y1 * z, -_Y1 * x]
    if degree >= 2:
        xx, yy, zz = x * x, y * y, z * z
        bases += [
            _Y2_XY * x * y,
            -_Y2_XY * y * z,
            _Y2_ZZ * (2.0 * zz - xx - yy),
            -_Y2_XY * x * z,
            _Y2_XX_YY * (xx - yy),
        ]
    if degree >= 3:
        bases += [
            -_Y3_A * y * (3.0 * xx - yy),
            _Y3_B * x * y * z,
            -_Y3_C * y * (4.0 * zz - xx - yy),
            _Y3_D * z * (2.0 * zz - 3.0 * xx - 3.0 * yy),
            -_Y3_C * x * (4.0 * zz - xx - yy),
            _Y3_E * z * (xx - yy),
            -_Y3_A * x * (xx - 3.0 * yy),
        ]
    return torch.stack(bases, dim=-1)


def evaluate_sh(degree: int, dirs: Tensor, coeffs: Tensor) -> Tensor:
    """Colours from SH coefficients seen along ``dirs`` (before gsplat's ``+ 0.5`` offset).

    Args:
        degree: SH degree to use, 0..3; coefficients past ``(degree + 1) ** 2`` are ignored.
        dirs: View directions, need not be normalised (zero vectors give the degree-0 colour).
            `[..., 3]`, float.
        coeffs: SH coefficients. `[..., K, 3]`, float, ``K >= (degree + 1) ** 2``.

    Returns:
        Colours. `[..., 3]`, same dtype as ``coeffs``.

    Raises:
        ValueError: if ``degree`` is outside 0..3 or ``coeffs`` has too few bases.

    **Differentiable:** with respect to ``dirs`` and ``coeffs``.
    """
    num_bases = num_sh_bases(degree)
    if coeffs.shape[-2] < num_bases:
        raise ValueError(
            f"colors must hold at least (sh_degree + 1) ** 2 = {num_bases} SH bases, got shape {tuple(coeffs.shape)}"
        )
    if degree == 0:
        return _Y00 * coeffs[..., 0, :]
    # F.normalize clamps the norm from below, so a zero direction stays finite (value and grad).
    unit_dirs = torch.nn.functional.normalize(dirs, dim=-1)
    bases = sh_basis(degree, unit_dirs)  # [..., num_bases]
    return (bases[..., None] * coeffs[..., :num_bases, :]).sum(dim=-2)
