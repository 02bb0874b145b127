"""A Gaussian with equal scales has an exactly zero quaternion gradient (reference backend).

Rotating an isotropic Gaussian changes nothing, so d loss / d quats is 0 in exact arithmetic.
``projection._covariances`` computes it as 0: otherwise it is rounding noise (~1e-15, against
O(10) for the other gradients) that differs between renders split into different bands, and
Adam's eps of 1e-15 makes steps of about the learning rate from it (docs/float64_exactness.md).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from distsplat_ns.rendering import project, rasterize_rows
from distsplat_ns.rendering.projection import _covariances, quats_to_rotmats
from tests.helpers.scenes import random_scene

HEIGHT, WIDTH = 48, 64


def _isotropic_scene():
    scene = random_scene(num_gaussians=300, width=WIDTH, height=HEIGHT, seed=0, dtype=torch.float64)
    return replace(scene, scales=scene.scales[:, :1].expand(-1, 3).contiguous())  # splatfacto's initial shape


def _gradients(scene, bands):
    scene = scene.with_grad()
    proj = project(**scene.kwargs())
    cot = torch.randn(1, HEIGHT, WIDTH, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    loss = sum((rasterize_rows(proj, [a], b - a).colors * cot[:, a:b]).sum() for a, b in bands)
    loss.backward()
    return {name: p.grad for name, p in scene.params().items()}


def test_isotropic_gaussians_get_exactly_zero_quaternion_gradients_whatever_the_bands():
    scene = _isotropic_scene()
    for bands in ([(0, HEIGHT)], [(0, 16), (16, HEIGHT)]):
        grads = _gradients(scene, bands)
        assert grads["means"].abs().max() > 1.0  # the scene is seen
        assert torch.count_nonzero(grads["quats"]) == 0


def test_covariances_equal_the_textbook_product():
    # Tolerance 1e-14 relative (float64): the two forms differ by rounding only (R R^T = I).
    scene = random_scene(num_gaussians=200, seed=3, dtype=torch.float64, scale_range=(0.01, 0.5))
    rot = quats_to_rotmats(scene.quats)
    m = rot * scene.scales[:, None, :]
    want = m @ m.transpose(-1, -2)
    torch.testing.assert_close(
        _covariances(scene.quats, scene.scales), want, rtol=1e-14, atol=1e-14 * float(want.abs().max())
    )


def test_anisotropic_gaussians_keep_a_quaternion_gradient():
    scene = random_scene(num_gaussians=300, width=WIDTH, height=HEIGHT, seed=0, dtype=torch.float64)
    grads = _gradients(scene, [(0, HEIGHT)])
    assert grads["quats"].abs().max() > 1e-3
