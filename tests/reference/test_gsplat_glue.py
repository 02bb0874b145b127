"""The gsplat backend's glue (band shift, tile counts, absgrad forwarding) with stand-in kernels.

No GPU here, so gsplat's CUDA ``isect_tiles`` / ``isect_offset_encode`` / ``rasterize_to_pixels``
are replaced by gsplat's own PyTorch ``isect`` implementations and a ``rasterize_to_pixels``
built on the reference compositor that, like gsplat's, sets ``.absgrad`` on its saved
``means2d`` input during backward. What runs for real is ``gsplat_backend.rasterize_band`` and ``api.rasterize_rows``.
"""

from __future__ import annotations

import gc
import inspect

import pytest
import torch

from distsplat_ns.rendering import gsplat_backend, project, rasterize_rows
from distsplat_ns.rendering import reference as ref
from tests.helpers.scenes import assert_grads_close, random_scene

gsplat = pytest.importorskip("gsplat")
gsplat_torch = pytest.importorskip("gsplat.cuda._torch_impl")

WIDTH, HEIGHT = 37, 45


# The installed gsplat's signatures: a fake takes exactly the arguments the real function takes, so
# a keyword this gsplat release does not know (e.g. 1.4.0's n_cameras on 1.5.3) fails here.
_ISECT_TILES = inspect.signature(gsplat.isect_tiles)
_ISECT_OFFSET_ENCODE = inspect.signature(gsplat.isect_offset_encode)


def _fake_isect_tiles(*args, **kwargs):
    bound = _ISECT_TILES.bind(*args, **kwargs).arguments
    assert not bound.get("packed", False)
    # gsplat's own reference asserts the radii shape of its release ([C, N] on 1.4, [C, N, 2] from 1.5.0).
    return gsplat_torch._isect_tiles(
        *(bound[k] for k in ("means2d", "radii", "depths", "tile_size", "tile_width", "tile_height"))
    )


def _fake_isect_offset_encode(*args, **kwargs):
    return gsplat_torch._isect_offset_encode(*_ISECT_OFFSET_ENCODE.bind(*args, **kwargs).args)


class _FakeRasterizeToPixels(torch.autograd.Function):
    """Reference compositing with gsplat's habit: backward sets ``.absgrad`` on the saved means2d."""

    @staticmethod
    def forward(ctx, means2d, conics, colors, opacities, width, height, isects, absgrad):  # type: ignore[override]
        ctx.save_for_backward(means2d, conics, colors, opacities)
        ctx.width, ctx.height, ctx.isects, ctx.absgrad = width, height, isects, absgrad
        return ref.rasterize_to_pixels(means2d, conics, colors, opacities, width, height, isects)[:2]

    @staticmethod
    def backward(ctx, grad_colors, grad_alphas):  # type: ignore[override]
        means2d, conics, colors, opacities = ctx.saved_tensors
        sink = torch.zeros_like(means2d) if ctx.absgrad else None
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in (means2d, conics, colors, opacities)]
            outputs = ref.rasterize_to_pixels(*leaves, ctx.width, ctx.height, ctx.isects, absgrad_sink=sink)[:2]
            grads = torch.autograd.grad(outputs, leaves, (grad_colors, grad_alphas))
        if ctx.absgrad:
            means2d.absgrad = sink  # exactly what gsplat's _RasterizeToPixels.backward does
        return (*grads, None, None, None, None)


def _fake_rasterize_to_pixels(means2d, conics, colors, opacities, image_width, image_height, tile_size,
                              isect_offsets, flatten_ids, backgrounds=None, packed=False, absgrad=False):  # fmt: skip
    assert backgrounds is None  # not needed here
    num_cameras, rows, cols = isect_offsets.shape
    offsets = torch.cat([isect_offsets.reshape(-1).long(), torch.tensor([flatten_ids.numel()])])
    isects = ref.TileIntersections(
        flat_ids=flatten_ids.long(), tile_offsets=offsets,
        tile_counts=(offsets[1:] - offsets[:-1]).reshape(num_cameras, rows, cols).int(),
        tile_size=tile_size, tile_row_starts=[0] * num_cameras,
    )  # fmt: skip
    return _FakeRasterizeToPixels.apply(means2d, conics, colors, opacities, image_width, image_height, isects, absgrad)


@pytest.fixture
def fake_gsplat(monkeypatch):
    monkeypatch.setattr(gsplat, "isect_tiles", _fake_isect_tiles)
    monkeypatch.setattr(gsplat, "isect_offset_encode", _fake_isect_offset_encode)
    monkeypatch.setattr(gsplat, "rasterize_to_pixels", _fake_rasterize_to_pixels)


def _render(starts, backend_name):
    scene = random_scene(num_gaussians=60, num_cameras=2, width=WIDTH, height=HEIGHT, seed=4,
                         opacity_range=(0.2, 1.0), scale_range=(0.05, 0.25)).with_grad()  # fmt: skip
    proj = project(**scene.kwargs(), backend="reference")
    proj.backend = backend_name  # route rasterize_rows through gsplat_backend.rasterize_band
    cot = torch.randn(2, HEIGHT, WIDTH, 3, generator=torch.Generator().manual_seed(9))
    bands, counts, loss = [], [], 0.0
    for start, stop in zip(starts, starts[1:] + [HEIGHT], strict=False):
        out = rasterize_rows(proj, [start, start], stop - start, absgrad=True)
        bands.append(out.colors)
        counts.append(out.tile_counts)
        loss = loss + (out.colors * cot[:, start:stop]).sum()
    loss.backward()
    grads = {n: p.grad for n, p in scene.params().items()}
    grads["means2d"], grads["absgrad"] = proj.means2d.grad, proj.means2d.absgrad
    return torch.cat(bands, dim=1).detach(), counts, grads


@pytest.mark.parametrize("starts", [[0], [0, 16, 32], [0, 7, 19, 40]], ids=["whole", "aligned", "unaligned"])
def test_gsplat_glue_matches_reference_path(fake_gsplat, starts):
    want_img, want_counts, want = _render(starts, "reference")
    got_img, got_counts, got = _render(starts, "gsplat")
    torch.testing.assert_close(got_img, want_img, atol=1e-5, rtol=0)  # band shift rounds (<= 2e-6 px)
    for g, w in zip(got_counts, want_counts, strict=False):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert float(want["absgrad"].sum()) > 0
    for name in want:
        assert_grads_close(got[name], want[name], 1e-5, name)


def test_gsplat_absgrad_survives_dropping_the_projection(fake_gsplat):
    # Callers often keep only proj.means2d (to read .grad/.absgrad later), not the Projection.
    scene = random_scene(num_gaussians=20, width=WIDTH, height=HEIGHT, seed=1).with_grad()
    results = []
    for backend_name in ("reference", "gsplat"):
        proj = project(**scene.kwargs(), backend="reference")
        proj.backend = backend_name
        out = rasterize_rows(proj, [16], 16, absgrad=True)
        means2d = proj.means2d
        del proj
        gc.collect()
        out.colors.sum().backward()
        results.append(means2d.absgrad)
    assert float(results[0].sum()) > 0
    assert_grads_close(results[1], results[0], 1e-5, "absgrad")


def test_empty_band_gives_zero_tile_counts(fake_gsplat):
    scene = random_scene(num_gaussians=0, width=WIDTH, height=HEIGHT)
    proj = project(**scene.kwargs(), backend="reference")
    _colors, alphas, counts = gsplat_backend.rasterize_band(
        proj.means2d, proj.conics, proj.colors, proj.opacities, proj.radii, proj.depths, WIDTH, 20, 16, [0],
        backgrounds=None, absgrad_sink=None, keepalive=None,
    )  # fmt: skip
    assert counts.shape == (1, 2, 3) and int(counts.sum()) == 0
    assert torch.count_nonzero(alphas) == 0
