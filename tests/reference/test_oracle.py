"""The reference backend against the naive per-Gaussian oracle (tests/reference/oracle.py)."""

from __future__ import annotations

import pytest
import torch

from distsplat_ns.rendering import project, rasterize_rows
from tests.helpers.scenes import random_scene
from tests.reference.oracle import naive_rasterize

# Both run in float64 and differ only in summation order: 1e-10 leaves ample headroom.
_F64_TOL = {"rtol": 1e-9, "atol": 1e-10}


def _scene(seed: int, **kwargs):
    defaults = {"num_gaussians": 60, "num_cameras": 2, "width": 37, "height": 29, "seed": seed, "dtype": torch.float64}
    defaults.update(kwargs)
    return random_scene(**defaults)


def _oracle_inputs(proj):
    return {
        "means2d": proj.means2d, "conics": proj.conics, "colors": proj.colors, "opacities": proj.opacities,
        "radii": proj.radii, "depths": proj.depths, "width": proj.width, "height": proj.height,
    }  # fmt: skip


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("opacity_range", [(0.05, 0.6), (0.9, 1.0)], ids=["translucent", "opaque"])
def test_forward_matches_oracle(seed, opacity_range):
    scene = _scene(seed, opacity_range=opacity_range)
    bg = torch.rand(2, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    proj = project(**scene.kwargs(), backend="reference")
    out = rasterize_rows(proj, [0, 0], scene.height, backgrounds=bg)
    colors, alphas = naive_rasterize(**_oracle_inputs(proj), backgrounds=bg)
    torch.testing.assert_close(out.colors, colors, **_F64_TOL)
    torch.testing.assert_close(out.alphas, alphas, **_F64_TOL)


def test_opaque_scene_hits_early_termination():
    # Guard for the test above: the opaque scene must exercise the T <= 1e-4 stop.
    scene = _scene(0, opacity_range=(0.9, 1.0), num_gaussians=200)
    proj = project(**scene.kwargs(), backend="reference")
    out = rasterize_rows(proj, [0, 0], scene.height)
    _colors, alphas = naive_rasterize(**_oracle_inputs(proj))
    assert float(alphas.max()) > 1 - 2e-4
    torch.testing.assert_close(out.alphas, alphas, **_F64_TOL)


@pytest.mark.parametrize("seed", [0, 1])
def test_gradients_match_oracle(seed):
    scene = _scene(seed, opacity_range=(0.3, 1.0)).with_grad()
    cot_gen = torch.Generator().manual_seed(100 + seed)
    proj = project(**scene.kwargs(), backend="reference")
    out = rasterize_rows(proj, [0, 0], scene.height)
    cot = torch.randn(out.colors.shape, generator=cot_gen, dtype=torch.float64)
    cot_a = torch.randn(out.alphas.shape, generator=cot_gen, dtype=torch.float64)
    params = list(scene.params().values())
    got = torch.autograd.grad((out.colors * cot).sum() + (out.alphas * cot_a).sum(), params)

    proj2 = project(**scene.kwargs(), backend="reference")
    colors, alphas = naive_rasterize(**_oracle_inputs(proj2))
    want = torch.autograd.grad((colors * cot).sum() + (alphas * cot_a).sum(), params)
    for name, g, w in zip(scene.params(), got, want, strict=False):
        torch.testing.assert_close(g, w, **_F64_TOL, msg=lambda m: f"{name}: {m}")


def test_absgrad_matches_oracle():
    scene = _scene(3, num_gaussians=30, width=24, height=20)
    proj = project(**scene.kwargs(), backend="reference")
    means2d = proj.means2d.detach().requires_grad_()
    proj.means2d = means2d
    out = rasterize_rows(proj, [0, 0], scene.height, absgrad=True)
    cot = torch.randn(out.colors.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    (out.colors * cot).sum().backward()

    per_pixel = means2d.detach()[:, :, None, None, :].expand(2, 30, 20, 24, 2).clone().requires_grad_()
    colors, _ = naive_rasterize(**_oracle_inputs(proj), pixel_means2d=per_pixel)
    (colors * cot).sum().backward()
    torch.testing.assert_close(means2d.absgrad, per_pixel.grad.abs().sum(dim=(2, 3)), **_F64_TOL)
    torch.testing.assert_close(means2d.grad, per_pixel.grad.sum(dim=(2, 3)), **_F64_TOL)
