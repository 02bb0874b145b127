"""Closed-form cases of the reference backend: one Gaussian, empty scenes, compositing order."""

from __future__ import annotations

import math

import pytest
import torch

from distsplat_ns.rendering import project, rasterization
from tests.helpers.scenes import random_scene, single_gaussian_scene, two_gaussian_scene

# float32 rendering vs a float64 formula: ~10 float32 ops on values <= 1 -> a few ulp (6e-8).
_F32_ATOL = 2e-6


def _closed_form_alpha(scene, eps2d: float = 0.3, compensate: bool = False) -> torch.Tensor:
    """alpha(px) of one isotropic Gaussian on the optical axis of an identity camera.

    Camera covariance s^2 I; at x = y = 0 the EWA Jacobian is (f/z) [I | 0], so the screen
    covariance is ((f s / z)^2 + eps2d) I and the centre projects to (cx, cy). With pixel centres
    at +0.5: alpha = min(0.999, o exp(-r^2 / (2 sigma^2))), zeroed below 1/255 (gsplat's skip).
    Antialiased mode scales o by sqrt(det_orig / det_blur) = var0 / (var0 + eps2d).
    """
    focal = float(scene.Ks[0, 0, 0])
    cx, cy = float(scene.Ks[0, 0, 2]), float(scene.Ks[0, 1, 2])
    depth, scale = float(scene.means[0, 2]), float(scene.scales[0, 0])
    opacity = float(scene.opacities[0])
    var0 = (focal * scale / depth) ** 2
    var = var0 + eps2d
    if compensate:
        opacity *= var0 / var
    ys = torch.arange(scene.height, dtype=torch.float64)[:, None] + 0.5
    xs = torch.arange(scene.width, dtype=torch.float64)[None, :] + 0.5
    r2 = (xs - cx) ** 2 + (ys - cy) ** 2
    alpha = torch.clamp(opacity * torch.exp(-0.5 * r2 / var), max=0.999)
    return torch.where(alpha >= 1 / 255, alpha, torch.zeros_like(alpha))


def test_single_centred_gaussian_matches_closed_form():
    # radius ceil(3 sqrt(var + 0.1)) = 5 px < 16: the 2x2 tiles around the centre hold it, and the
    # alpha there already falls below 1/255 within the 32x32 image, so no tile truncation shows.
    scene = single_gaussian_scene(32, 32)
    bg = torch.tensor([[0.1, 0.2, 0.3]])
    colors, alphas, _ = rasterization(**scene.kwargs(), packed=False, backgrounds=bg, backend="reference")
    alpha = _closed_form_alpha(scene)
    expected = alpha[..., None] * scene.colors[0].double() + (1 - alpha[..., None]) * bg[0].double()
    torch.testing.assert_close(alphas[0, ..., 0].double(), alpha, atol=_F32_ATOL, rtol=0)
    torch.testing.assert_close(colors[0].double(), expected, atol=_F32_ATOL, rtol=0)


def test_off_centre_principal_point_moves_the_gaussian():
    scene = single_gaussian_scene(32, 32, center_px=(9.25, 20.5))
    _, alphas, _ = rasterization(**scene.kwargs(), packed=False, backend="reference")
    torch.testing.assert_close(alphas[0, ..., 0].double(), _closed_form_alpha(scene), atol=_F32_ATOL, rtol=0)


def test_antialiased_mode_scales_opacity_by_compensation():
    scene = single_gaussian_scene(32, 32, scale=0.05)
    _, alphas, meta = rasterization(**scene.kwargs(), packed=False, rasterize_mode="antialiased", backend="reference")
    torch.testing.assert_close(
        alphas[0, ..., 0].double(), _closed_form_alpha(scene, compensate=True), atol=_F32_ATOL, rtol=0
    )
    var0 = (40.0 * 0.05 / 3.0) ** 2
    torch.testing.assert_close(meta["opacities"][0, 0].item(), 0.8 * var0 / (var0 + 0.3), rtol=1e-6, atol=0)


def test_empty_scene_renders_background_and_zero_alpha():
    scene = random_scene(num_gaussians=0, num_cameras=2, width=40, height=24)
    bg = torch.tensor([[0.2, 0.4, 0.6], [1.0, 0.0, 0.5]])
    colors, alphas, meta = rasterization(**scene.kwargs(), packed=False, backgrounds=bg, backend="reference")
    assert colors.shape == (2, 24, 40, 3) and alphas.shape == (2, 24, 40, 1)
    torch.testing.assert_close(colors, bg[:, None, None, :].expand_as(colors), atol=0, rtol=0)
    assert torch.count_nonzero(alphas) == 0
    assert int(meta["tile_counts"].sum()) == 0


def test_gaussians_behind_the_camera_are_culled():
    scene = random_scene(num_gaussians=50, width=40, height=24)
    scene.means = scene.means - torch.tensor([0.0, 0.0, 10.0])  # all behind the camera at z=-4
    colors, alphas, meta = rasterization(**scene.kwargs(), packed=False, backend="reference")
    assert int((meta["radii"] > 0).sum()) == 0
    assert torch.count_nonzero(alphas) == 0 and torch.count_nonzero(colors) == 0


@pytest.mark.parametrize("depths", [(2.0, 4.0), (4.0, 2.0)], ids=["red-in-front", "blue-in-front"])
def test_two_gaussians_composite_front_to_back(depths):
    scene = two_gaussian_scene(depths)
    colors, alphas, _ = rasterization(**scene.kwargs(), packed=False, backend="reference")
    centre = colors[0, 16, 16].double()
    # Both project to (16, 16) with std f * (0.1 z) / z = 4 px (+ eps2d); pixel (16, 16) has its
    # centre at (16.5, 16.5), so r^2 = 0.5.
    var = 4.0**2 + 0.3
    alpha = 0.9 * math.exp(-0.5 * 0.5 / var)
    front, back = (0, 2) if depths[0] < depths[1] else (2, 0)
    expected = torch.zeros(3, dtype=torch.float64)
    expected[front] = alpha
    expected[back] = (1 - alpha) * alpha
    torch.testing.assert_close(centre, expected, atol=_F32_ATOL, rtol=0)
    torch.testing.assert_close(alphas[0, 16, 16, 0].item(), 1 - (1 - alpha) ** 2, atol=_F32_ATOL, rtol=0)


def test_rgb_ed_depth_of_single_gaussian_is_its_depth():
    scene = single_gaussian_scene(32, 32, depth=2.5, opacity=0.99)
    colors, alphas, _ = rasterization(**scene.kwargs(), packed=False, render_mode="RGB+ED", backend="reference")
    assert colors.shape[-1] == 4
    covered = alphas[0, ..., 0] > 0
    assert covered.sum() > 50
    depth = colors[0, ..., 3][covered]
    # depth = (alpha z) / (1 - (1 - alpha)): the float32 round trip through T costs up to
    # eps32 / alpha relative, i.e. 6e-8 * 255 = 1.5e-5 at the faintest pixel kept (alpha = 1/255).
    torch.testing.assert_close(depth, torch.full_like(depth, 2.5), rtol=2e-5, atol=0)
    assert torch.all(colors[0, ..., 3][~covered] == 0)


def test_projection_means2d_retains_grad():
    scene = random_scene(num_gaussians=40, width=32, height=32).with_grad()
    proj = project(**scene.kwargs(), backend="reference")
    from distsplat_ns.rendering import rasterize_rows

    out = rasterize_rows(proj, [0], 32)
    out.colors.sum().backward()
    assert proj.means2d.grad is not None and proj.means2d.grad.shape == (1, 40, 2)
