"""float64 ``gradcheck`` of the whole reference pipeline (projection + SH + rasterizer).

The renderer is only piecewise smooth: alpha is clamped at 0.999, cut below 1/255, pixels stop at
T <= 1e-4, and radii are ceil()-ed. The scene keeps away from all of them: opacities <= 0.5
(alpha < 0.999, and T stays >> 1e-4 with 4 Gaussians), one 16x16 tile (the 10x9 image) holds
every Gaussian (so a radius change cannot change tile membership), and with the fixed seed no
pixel sits within the finite-difference step (1e-6) of the 1/255 cut-off.

To keep it fast the outputs (all colours and alphas) are checked through 12 fixed random
projections: the numerical Jacobian is complete with respect to every input, and 12 backward
passes replace one per output pixel. That is stronger than gradcheck's ``fast_mode`` (one
projection on each side) and catches any gradient error not orthogonal to 12 random directions.
"""

from __future__ import annotations

import pytest
import torch

from distsplat_ns.rendering import rasterization
from tests.helpers.scenes import random_scene

_NUM_PROJECTIONS = 12


def _tiny_scene(sh_degree=None):
    return random_scene(num_gaussians=4, num_cameras=1, width=10, height=9, seed=11, dtype=torch.float64, extent=0.3,
                        fov_x_deg=20.0, scale_range=(0.08, 0.2), opacity_range=(0.2, 0.5), sh_degree=sh_degree)  # fmt: skip


def _projected(scene, **kwargs):
    bg = torch.tensor([[0.3, 0.1, 0.7]], dtype=torch.float64)
    num_channels = 4 if kwargs.get("render_mode") == "RGB+ED" else 3
    num_outputs = scene.height * scene.width * (num_channels + 1)
    proj_matrix = torch.randn(
        _NUM_PROJECTIONS, num_outputs, generator=torch.Generator().manual_seed(3), dtype=torch.float64
    )

    def render(means, quats, scales, opacities, colors):
        out, alphas, _ = rasterization(
            means, quats, scales, opacities, colors, scene.viewmats, scene.Ks, scene.width, scene.height,
            packed=False, backgrounds=bg, backend="reference", sh_degree=scene.sh_degree, **kwargs,
        )  # fmt: skip
        return proj_matrix @ torch.cat([out.reshape(-1), alphas.reshape(-1)])

    return render


@pytest.mark.parametrize("render_mode", ["RGB", "RGB+ED"])
@pytest.mark.parametrize("rasterize_mode", ["classic", "antialiased"])
def test_gradcheck_colors(render_mode, rasterize_mode):
    scene = _tiny_scene()
    render = _projected(scene, render_mode=render_mode, rasterize_mode=rasterize_mode)
    inputs = tuple(t.detach().clone().requires_grad_() for t in scene.params().values())
    assert torch.autograd.gradcheck(render, inputs, eps=1e-6, atol=1e-6, rtol=1e-4)


def test_gradcheck_sh_coefficients():
    scene = _tiny_scene(sh_degree=2)
    render = _projected(scene)
    inputs = tuple(t.detach().clone().requires_grad_() for t in scene.params().values())
    assert torch.autograd.gradcheck(render, inputs, eps=1e-6, atol=1e-6, rtol=1e-4)


def test_tiny_scene_is_visible_and_smooth():
    # Guard for the gradchecks: every Gaussian is kept and no alpha is near a threshold.
    scene = _tiny_scene()
    _, alphas, meta = rasterization(**scene.kwargs(), packed=False, backend="reference")
    assert bool((meta["radii"] > 0).all())
    assert float(alphas.max()) < 0.99
