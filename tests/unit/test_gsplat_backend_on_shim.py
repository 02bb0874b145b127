"""The package's gsplat backend (rendering/gsplat_backend.py) run for real on the CPU: device tensors of
the stand-in (tests/helpers/device_standin.py), gsplat's Python code, the shim's entry points
(tests/helpers/gsplat_cpu.py). The start of tests/gpu/test_gsplat_parity.py's checks on the CPU:
the gsplat backend against the reference backend, forward, gradients and absgrad, unpacked and packed.

Tolerances: as tests/unit/test_gsplat_cpu.py's (both backends on the CPU in float32; the projections
differ in op order and the compositors in how they keep T): pixels 1e-5, gradients 1e-4 of each
tensor's scale (measured ~1e-6).
"""

from __future__ import annotations

import pytest
import torch

from distsplat_ns.rendering import rasterization
from tests.helpers import device_standin
from tests.helpers.scenes import assert_grads_close, random_scene

pytest.importorskip("gsplat")

_COLOR_ATOL = 1e-5
_GRAD_REL = 1e-4
WIDTH, HEIGHT = 45, 37


def _render(scene, backend, **kw):
    s = scene.with_grad()
    colors, alphas, meta = rasterization(**s.kwargs(), backend=backend, **kw)
    gen = torch.Generator().manual_seed(123)
    cot_c = torch.randn(colors.shape, generator=gen).to(colors.device)
    cot_a = torch.randn(alphas.shape, generator=gen).to(alphas.device)
    if kw.get("render_mode") == "RGB+ED":
        # Expected depth is a sum over alpha: where alpha ~ 4e-3 its gradient amplifies float32 rounding
        # (relative 2e-4 there, 9e-6 with this mask, measured); those pixels' depth carries no cotangent.
        cot_c[..., 3] *= (alphas[..., 0].detach() > 0.05).to(cot_c.dtype)
    ((colors * cot_c).sum() + (alphas * cot_a).sum()).backward()
    grads = {name: p.grad.cpu() for name, p in s.params().items()}
    if kw.get("absgrad") and not kw.get("packed"):
        grads["absgrad"] = meta["means2d"].absgrad.cpu()
    return colors.detach().cpu(), alphas.detach().cpu(), grads, meta


@pytest.mark.parametrize(
    "kw",
    [{"packed": False, "absgrad": True}, {"packed": True}, {"packed": False, "render_mode": "RGB+ED"}],
    ids=["unpacked-absgrad", "packed", "ed"],
)
def test_gsplat_backend_on_the_shim_matches_the_reference_backend(kw):
    scene = random_scene(num_gaussians=400, num_cameras=2, width=WIDTH, height=HEIGHT, seed=9,
                         sh_degree=None if kw.get("render_mode") else 2, scale_range=(0.02, 0.15))  # fmt: skip
    want_c, want_a, want_g, _ = _render(scene, "reference", **kw)
    with device_standin.installed():
        got_c, got_a, got_g, meta = _render(scene.to("cuda"), "gsplat", **kw)
    assert meta["backend"] == "gsplat"
    # RGB+ED's depth is a sum divided by alpha: relative to it.
    rtol = 1e-5 if kw.get("render_mode") == "RGB+ED" else 0.0
    torch.testing.assert_close(got_c, want_c, atol=_COLOR_ATOL, rtol=rtol)
    torch.testing.assert_close(got_a, want_a, atol=_COLOR_ATOL, rtol=0)
    assert set(got_g) == set(want_g)
    for name in want_g:
        assert_grads_close(got_g[name], want_g[name], _GRAD_REL, name)
