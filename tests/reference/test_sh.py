"""Spherical harmonics: against an independent textbook formula and gsplat's basis."""

from __future__ import annotations

import math

import pytest
import torch

from distsplat_ns.rendering import evaluate_sh, project
from tests.helpers.scenes import random_scene


def _legendre(l: int, m: int, x: torch.Tensor) -> torch.Tensor:
    """Associated Legendre P_l^m(x), m >= 0, without the Condon-Shortley phase (recurrence)."""
    pmm = torch.ones_like(x)
    somx2 = torch.sqrt((1 - x) * (1 + x))
    for i in range(1, m + 1):
        pmm = pmm * (2 * i - 1) * somx2
    if l == m:
        return pmm
    pmmp1 = x * (2 * m + 1) * pmm
    for ll in range(m + 2, l + 1):
        pmm, pmmp1 = pmmp1, ((2 * ll - 1) * x * pmmp1 - (ll + m - 1) * pmm) / (ll - m)
    return pmmp1


def _textbook_basis(l: int, m: int, dirs: torch.Tensor) -> torch.Tensor:
    """Real SH Y_lm in spherical coordinates (Wikipedia's real form), times the (-1)^m of 3DGS.

    3DGS/gsplat's basis equals the usual real SH with an extra (-1)^m (e.g. Y_1,-1 = -c y).
    """
    x, y, z = dirs.unbind(-1)
    theta = torch.acos(z.clamp(-1, 1))
    phi = torch.atan2(y, x)
    am = abs(m)
    norm = math.sqrt((2 * l + 1) / (4 * math.pi) * math.factorial(l - am) / math.factorial(l + am))
    p = _legendre(l, am, torch.cos(theta))
    if m == 0:
        value = norm * p
    elif m > 0:
        value = math.sqrt(2) * norm * p * torch.cos(m * phi)
    else:
        value = math.sqrt(2) * norm * p * torch.sin(am * phi)
    return (-1) ** m * value


def _dirs(n: int = 200) -> torch.Tensor:
    return torch.randn(n, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_sh_matches_textbook_formula(degree):
    dirs = _dirs()
    coeffs = torch.randn(200, 16, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    unit = dirs / dirs.norm(dim=-1, keepdim=True)
    expected = torch.zeros(200, 3, dtype=torch.float64)
    for l in range(degree + 1):
        for m in range(-l, l + 1):
            expected += _textbook_basis(l, m, unit)[:, None] * coeffs[:, l * l + l + m]
    torch.testing.assert_close(evaluate_sh(degree, dirs, coeffs), expected, rtol=1e-10, atol=1e-10)


def test_sh_basis_matches_gsplat():
    gsplat_torch = pytest.importorskip("gsplat.cuda._torch_impl")
    from distsplat_ns.rendering.sh import sh_basis

    unit = torch.nn.functional.normalize(_dirs(), dim=-1)
    torch.testing.assert_close(sh_basis(3, unit), gsplat_torch._eval_sh_bases_fast(16, unit), rtol=1e-12, atol=1e-12)


def test_sh_ignores_coefficients_past_degree():
    dirs = _dirs(10)
    coeffs = torch.randn(10, 16, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    changed = coeffs.clone()
    changed[:, 4:] = 100.0
    torch.testing.assert_close(evaluate_sh(1, dirs, coeffs), evaluate_sh(1, dirs, changed), rtol=0, atol=0)


@pytest.mark.parametrize("degree", [0, 3])
def test_project_evaluates_sh_along_view_direction_plus_half(degree):
    scene = random_scene(num_gaussians=50, num_cameras=2, width=40, height=30, sh_degree=3, dtype=torch.float64,
                         extent=3.0)  # fmt: skip
    proj = project(**dict(scene.kwargs(), sh_degree=degree), backend="reference")
    cam_centres = torch.linalg.inv(scene.viewmats)[:, :3, 3]
    dirs = scene.means[None] - cam_centres[:, None]
    expected = torch.clamp_min(evaluate_sh(degree, dirs, scene.colors[None].expand(2, -1, -1, -1)) + 0.5, 0.0)
    visible = proj.radii > 0
    assert bool(visible.any()) and not bool(visible.all())
    torch.testing.assert_close(proj.colors[visible], expected[visible], rtol=1e-12, atol=1e-12)
    # gsplat masks culled Gaussians to SH value 0 -> colour 0.5.
    torch.testing.assert_close(proj.colors[~visible], torch.full_like(proj.colors[~visible], 0.5), rtol=0, atol=0)
