"""Bands, batches and tiles: the invariances distributed rendering relies on."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from distsplat_ns.rendering import project, rasterization, rasterize_rows
from tests.helpers.scenes import assert_grads_close, random_scene
from tests.reference.oracle import naive_rasterize

WIDTH, HEIGHT = 45, 61  # neither a multiple of 16

# Band pixels are computed by the same float ops as the whole image's; only the padding width of
# the reference's chunks (and so the BLAS blocking of one bmm) can differ: ~1 ulp.
_PIXEL_TOL = {"rtol": 1e-6, "atol": 1e-6}
# Gradients are sums over pixels in a different grouping (per band, then across bands): float32
# reassociation of ~1e3 mixed-sign terms. Checked at 1e-5 relative to each tensor's largest entry
# (see assert_grads_close), the budget docs/distributed.md states for distributed vs single-process gradients.
_GRAD_REL = 1e-5

SPLITS = {
    "aligned": [0, 16, 48],
    "unaligned": [0, 5, 21, 22, 40],
    "one-row-bands-at-top": [0, 1, 2, 3, 37],
    "whole": [0],
}


def _scene(num_cameras: int = 2):
    # Opaque enough that tile truncation and early termination both show up.
    return random_scene(num_gaussians=400, num_cameras=num_cameras, width=WIDTH, height=HEIGHT, seed=5,
                        opacity_range=(0.2, 1.0), scale_range=(0.02, 0.2))  # fmt: skip


def _bands(starts):
    ends = starts[1:] + [HEIGHT]
    return list(zip(starts, ends, strict=False))


def _cotangent(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _whole(scene, absgrad=False):
    proj = project(**scene.kwargs(), backend="reference")
    out = rasterize_rows(proj, [0] * scene.num_cameras, HEIGHT, absgrad=absgrad)
    return proj, out


def _band_loss_and_images(proj, bands, cot_colors, cot_alphas, absgrad=False):
    colors, alphas, loss = [], [], 0.0
    for start, stop in bands:
        out = rasterize_rows(proj, [start] * proj.num_cameras, stop - start, absgrad=absgrad)
        colors.append(out.colors)
        alphas.append(out.alphas)
        loss = loss + (out.colors * cot_colors[:, start:stop]).sum() + (out.alphas * cot_alphas[:, start:stop]).sum()
    return torch.cat(colors, dim=1), torch.cat(alphas, dim=1), loss


@pytest.mark.parametrize("split", SPLITS.values(), ids=SPLITS.keys())
def test_bands_concatenate_to_whole_image(split):
    scene = _scene()
    _, whole = _whole(scene)
    proj = project(**scene.kwargs(), backend="reference")
    colors, alphas, _ = _band_loss_and_images(
        proj, _bands(split), torch.zeros(2, HEIGHT, WIDTH, 3), torch.zeros(2, HEIGHT, WIDTH, 1)
    )
    torch.testing.assert_close(colors, whole.colors, **_PIXEL_TOL)
    torch.testing.assert_close(alphas, whole.alphas, **_PIXEL_TOL)


@pytest.mark.parametrize("split", SPLITS.values(), ids=SPLITS.keys())
def test_band_gradients_sum_to_whole_image_gradients(split):
    scene = _scene().with_grad()
    cot_c, cot_a = _cotangent((2, HEIGHT, WIDTH, 3), 1), _cotangent((2, HEIGHT, WIDTH, 1), 2)
    params = list(scene.params().values())
    proj, whole = _whole(scene)
    want = torch.autograd.grad((whole.colors * cot_c).sum() + (whole.alphas * cot_a).sum(), params + [proj.means2d])
    proj = project(**scene.kwargs(), backend="reference")
    _, _, loss = _band_loss_and_images(proj, _bands(split), cot_c, cot_a)
    got = torch.autograd.grad(loss, params + [proj.means2d])
    for name, g, w in zip(list(scene.params()) + ["means2d"], got, want, strict=False):
        assert_grads_close(g, w, _GRAD_REL, name)


@pytest.mark.parametrize("split", [SPLITS["aligned"], SPLITS["unaligned"]], ids=["aligned", "unaligned"])
def test_band_absgrads_sum_to_whole_image_absgrad(split):
    scene = _scene().with_grad()
    cot_c, cot_a = _cotangent((2, HEIGHT, WIDTH, 3), 3), _cotangent((2, HEIGHT, WIDTH, 1), 4)
    proj, whole = _whole(scene, absgrad=True)
    ((whole.colors * cot_c).sum() + (whole.alphas * cot_a).sum()).backward()
    want = proj.means2d.absgrad.clone()
    proj = project(**scene.kwargs(), backend="reference")
    _, _, loss = _band_loss_and_images(proj, _bands(split), cot_c, cot_a, absgrad=True)
    loss.backward()
    assert float(want.abs().sum()) > 0
    assert_grads_close(proj.means2d.absgrad, want, _GRAD_REL, "absgrad")


def test_bands_may_start_at_different_rows_per_camera():
    scene = _scene(num_cameras=3)
    proj = project(**scene.kwargs(), backend="reference")
    whole = rasterize_rows(proj, [0, 0, 0], HEIGHT)
    starts = [3, 16, 40]
    out = rasterize_rows(proj, starts, 20)
    for c, start in enumerate(starts):
        rows = min(20, HEIGHT - start)
        torch.testing.assert_close(out.colors[c, :rows], whole.colors[c, start : start + rows], **_PIXEL_TOL)
    assert out.tile_row_starts == [0, 1, 2]


def test_rows_past_the_bottom_are_rendered_empty_of_nothing_new():
    scene = _scene()
    proj = project(**scene.kwargs(), backend="reference")
    whole = rasterize_rows(proj, [0, 0], HEIGHT)
    out = rasterize_rows(proj, [50, 50], 30)  # 11 rows inside, 19 past the bottom
    assert out.colors.shape == (2, 30, WIDTH, 3)
    torch.testing.assert_close(out.colors[:, :11], whole.colors[:, 50:], **_PIXEL_TOL)


def test_batch_of_cameras_equals_single_camera_calls():
    scene = _scene(num_cameras=3).with_grad()
    cot = _cotangent((3, HEIGHT, WIDTH, 3), 6)
    params = list(scene.params().values())
    colors, alphas, _ = rasterization(**scene.kwargs(), packed=False, backend="reference")
    want = torch.autograd.grad((colors * cot).sum(), params)
    singles = [rasterization(**scene.select_cameras([c]).kwargs(), packed=False, backend="reference") for c in range(3)]
    torch.testing.assert_close(colors, torch.cat([s[0] for s in singles]), **_PIXEL_TOL)
    torch.testing.assert_close(alphas, torch.cat([s[1] for s in singles]), **_PIXEL_TOL)
    got = torch.autograd.grad(sum((s[0] * cot[c : c + 1]).sum() for c, s in enumerate(singles)), params)
    for name, g, w in zip(scene.params(), got, want, strict=False):
        assert_grads_close(g, w, _GRAD_REL, name)


def _brute_force_tile_counts(proj, tile_size):
    """Per tile, the number of kept Gaussians whose radius-square overlaps it (gsplat's rule)."""
    rows, cols = math.ceil(proj.height / tile_size), math.ceil(proj.width / tile_size)
    counts = torch.zeros(proj.num_cameras, rows, cols, dtype=torch.int64)
    for c in range(proj.num_cameras):
        for g in range(proj.num_gaussians):
            r = int(proj.radii[c, g])
            if r <= 0:
                continue
            x, y = (float(v) for v in proj.means2d[c, g])
            x0, x1 = (
                max(0, math.floor(x / tile_size - r / tile_size)),
                min(cols, math.ceil(x / tile_size + r / tile_size)),
            )
            y0, y1 = (
                max(0, math.floor(y / tile_size - r / tile_size)),
                min(rows, math.ceil(y / tile_size + r / tile_size)),
            )
            if x1 > x0 and y1 > y0:
                counts[c, y0:y1, x0:x1] += 1
    return counts


@pytest.mark.parametrize("tile_size", [8, 16])
def test_tile_counts_match_brute_force_intersections(tile_size):
    scene = _scene()
    proj = project(**scene.kwargs(), backend="reference")
    out = rasterize_rows(proj, [0, 0], HEIGHT, tile_size=tile_size)
    expected = _brute_force_tile_counts(proj, tile_size)
    assert out.tile_counts.dtype == torch.int32
    torch.testing.assert_close(out.tile_counts.to(torch.int64), expected, rtol=0, atol=0)


@pytest.mark.parametrize("tile_size", [8, 16])
def test_reference_tile_work_is_each_tiles_composited_pairs(tile_size):
    # The balancer's cost on this backend. Every pixel of a tile is composited, also those past
    # the image's edge that the crop drops: the oracle renders the whole tile grid.
    scene = _scene()
    proj = project(**scene.kwargs(), backend="reference")
    out = rasterize_rows(proj, [0, 0], HEIGHT, tile_size=tile_size, chunk_elements=4096)  # many blocks, many chunks
    rows, cols = math.ceil(HEIGHT / tile_size), math.ceil(WIDTH / tile_size)
    per_pixel = torch.zeros(2, rows * tile_size, cols * tile_size, dtype=torch.int64)
    naive_rasterize(proj.means2d.detach(), proj.conics.detach(), proj.colors.detach(), proj.opacities.detach(), proj.radii,
                    proj.depths, cols * tile_size, rows * tile_size, tile_size, pair_counts=per_pixel)  # fmt: skip
    expected = per_pixel.reshape(2, rows, tile_size, cols, tile_size).sum(dim=(2, 4))
    assert out.tile_work.dtype == torch.int64 and int(expected.sum()) > 0
    torch.testing.assert_close(out.tile_work, expected, rtol=0, atol=0)


@pytest.mark.parametrize("split", SPLITS.values(), ids=SPLITS.keys())
def test_a_bands_tile_work_is_the_whole_images_on_the_same_tile_rows(split):
    # What the balancer measures on a band is what the whole image costs on those tile rows, so
    # measurements of any cut fold into one history.
    proj, whole = _whole(_scene())
    for start, stop in _bands(split):
        out = rasterize_rows(proj, [start, start], stop - start)
        first = out.tile_row_starts[0]
        torch.testing.assert_close(
            out.tile_work, whole.tile_work[:, first : first + out.tile_work.shape[1]], rtol=0, atol=0
        )


def test_tile_size_does_not_change_the_image():
    # gsplat lets a Gaussian reach every pixel of each tile its 3-sigma square touches; outside
    # that square alpha <= opacity * exp(-4.5), which stays below the 1/255 cut-off only for
    # opacity < 0.353. Under that bound the image cannot depend on the tile grid.
    scene = random_scene(num_gaussians=400, width=WIDTH, height=HEIGHT, seed=2, opacity_range=(0.05, 0.35))
    c16, a16, _ = rasterization(**scene.kwargs(), packed=False, tile_size=16, backend="reference")
    c8, a8, _ = rasterization(**scene.kwargs(), packed=False, tile_size=8, backend="reference")
    torch.testing.assert_close(c8, c16, **_PIXEL_TOL)
    torch.testing.assert_close(a8, a16, **_PIXEL_TOL)


def test_chunk_size_does_not_change_the_image():
    scene = _scene()
    proj = project(**scene.kwargs(), backend="reference")
    big = rasterize_rows(proj, [0, 0], HEIGHT)
    small = rasterize_rows(proj, [0, 0], HEIGHT, chunk_elements=4096)  # one tile per block, 512-pair chunks
    torch.testing.assert_close(small.colors, big.colors, **_PIXEL_TOL)


def test_per_camera_colors_equal_shared_colors():
    scene = _scene(num_cameras=2)
    shared, _, _ = rasterization(**scene.kwargs(), packed=False, backend="reference")
    per_camera = dict(scene.kwargs(), colors=scene.colors[None].expand(2, -1, -1).contiguous())
    colors, _, _ = rasterization(**per_camera, packed=False, backend="reference")
    torch.testing.assert_close(colors, shared, rtol=0, atol=0)


@pytest.mark.parametrize(
    "backend",
    [
        "reference",
        pytest.param(
            "gsplat",
            marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")],
        ),
    ],
)
def test_a_band_of_no_gaussian_is_its_background_and_differentiable(backend):
    # A sharded rank whose band no Gaussian reaches renders a projection of N = 0 (parallel/exchange.py).
    device = "cuda" if backend == "gsplat" else "cpu"
    scene = random_scene(num_gaussians=8, num_cameras=1, width=WIDTH, height=HEIGHT, seed=5, device=device).with_grad()
    proj = project(**scene.kwargs(), backend=backend)
    empty = dataclasses.replace(
        proj,
        **{
            name: getattr(proj, name)[:, :0] for name in ("means2d", "conics", "depths", "radii", "opacities", "colors")
        },
        num_gaussians=0,
    )
    background = torch.tensor([[0.2, 0.4, 0.6]], device=device, requires_grad=True)
    out = rasterize_rows(empty, [16], 20, backgrounds=background, absgrad=True)
    assert out.colors.shape == (1, 20, WIDTH, 3)
    torch.testing.assert_close(out.colors, background.detach()[:, None, None].expand_as(out.colors), rtol=0, atol=0)
    assert not out.alphas.any()
    assert int(out.tile_counts.sum()) == 0
    out.colors.sum().backward()
    # Every pixel shows the background unattenuated: d sum / d background = pixels per channel (exact in float32).
    torch.testing.assert_close(background.grad, torch.full_like(background, 20 * WIDTH), rtol=0, atol=0)
    assert empty.means2d.absgrad.shape == (1, 0, 2)
