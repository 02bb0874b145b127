"""The gsplat CPU shim (tests/helpers/gsplat_cpu.py): gsplat's own Python functions run on it, on
the installed gsplat (1.4.0 here, 1.5.0 to 1.5.3 under scripts/test_gsplat_next.sh), against gsplat's
PyTorch references and the package's reference rasterizer.

Tolerances, each where it is used:

- entry points that call gsplat's own reference: the same torch ops on the same inputs, so exact
  (``_EXACT``) or, through gsplat's autograd wrappers, to float32 rounding of reordered sums;
- the compositor against the package's reference backend (``rendering/reference.py``): both on the
  CPU in float32, with a different projection op order (gsplat's ``_torch_impl`` vs
  ``rendering/projection.py``) and a different transmittance (a running float32 product here, a
  float64 sum of logs there): ~1e-6 per pixel (measured 3e-6 on 3000 Gaussians); ``_COLOR_ATOL``
  1e-5 is 3x that, while a wrong tile, order or threshold moves pixels by > 1e-3.
- gradients ``_GRAD_REL`` 1e-4 of each tensor's scale (``assert_grads_close``): sums over many
  pixels of terms of both signs, measured <= 1e-5.
"""

from __future__ import annotations

import inspect
import math
import sys

import pytest
import torch

from distsplat_ns.gaussians.mcmc_relocation import relocation_opacity_scale
from distsplat_ns.rendering import rasterization
from distsplat_ns.rendering.gsplat_versions import parse_version
from tests.helpers import gsplat_cpu
from tests.helpers.scenes import assert_grads_close, random_scene

gsplat = pytest.importorskip("gsplat")
from gsplat.cuda import _torch_impl

_COLOR_ATOL = 1e-5
_GRAD_REL = 1e-4
_EXACT = {"rtol": 0.0, "atol": 0.0}
WIDTH, HEIGHT = 45, 37
_GSPLAT = parse_version(gsplat.__version__)
_PER_AXIS = _GSPLAT >= (1, 5, 0)  # radii [..., 2] from 1.5.0


@pytest.fixture(autouse=True)
def _shim():
    with gsplat_cpu.installed():
        yield


def _scene(seed=0, sh_degree=None, extent=1.0):
    """400 Gaussians, 2 cameras; ``extent`` 3 puts some outside the images (culled)."""
    return random_scene(num_gaussians=400, num_cameras=2, width=WIDTH, height=HEIGHT, seed=seed,
                        sh_degree=sh_degree, scale_range=(0.02, 0.15), extent=extent)  # fmt: skip


def _cotangents(*tensors, seed=123):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in tensors]


def _loss(outputs, cotangents):
    return sum((o * c).sum() for o, c in zip(outputs, cotangents, strict=True))


def _alive(radii):
    return (radii > 0).all(dim=-1) if _PER_AXIS else radii > 0


# ------------------------------------------------------------------ entry points vs gsplat's references
def _reference_projection(means, quats, scales, viewmats, Ks, **kw):
    covars, _ = _torch_impl._quat_scale_to_covar_preci(quats, scales, compute_preci=False)
    return _torch_impl._fully_fused_projection(means, covars, viewmats, Ks, WIDTH, HEIGHT, **kw)


@pytest.mark.parametrize("calc_compensations", [False, True])
def test_projection_and_its_gradients_equal_gsplats_reference(calc_compensations):
    scene = _scene(seed=1, extent=3.0).with_grad()
    viewmats = scene.viewmats.clone().requires_grad_()
    args = (scene.means, scene.quats, scene.scales, viewmats, scene.Ks)
    kw = {"eps2d": 0.3, "near_plane": 0.01, "far_plane": 1e10, "calc_compensations": calc_compensations}
    got = gsplat.fully_fused_projection(args[0], None, *args[1:], WIDTH, HEIGHT, packed=False, **kw)
    leaves = [t.detach().clone().requires_grad_() for t in args]
    want = _reference_projection(*leaves, **kw)
    torch.testing.assert_close(got[0], want[0], **_EXACT)
    keep = _alive(got[0])
    assert 0 < int(keep.sum()) < keep.numel()  # some culled, some kept
    outs = [o for o in got[1:] if o is not None]
    cots = _cotangents(*outs)
    masked = [c * keep.reshape(*keep.shape, *[1] * (c.dim() - keep.dim())) for c in cots]  # culled: no gradient
    _loss(outs, cots).backward()
    _loss([o for o in want[1:] if o is not None], masked).backward()
    for name, g, leaf in zip(("means", "quats", "scales", "viewmats"), args[:4], leaves[:4], strict=True):
        # Both are autograd through the same torch ops; only the culled entries' zeroing differs.
        assert_grads_close(g.grad, leaf.grad, 1e-6, name)


@pytest.mark.parametrize("sparse_grad", [False, True])
def test_packed_projection_is_the_unpacked_one_kept_entries_and_gradients(sparse_grad):
    scene = _scene(seed=2, extent=3.0)
    a, b = scene.with_grad(), scene.with_grad()
    kw = {"eps2d": 0.3, "calc_compensations": True}
    unpacked = gsplat.fully_fused_projection(a.means, None, a.quats, a.scales, a.viewmats, a.Ks, WIDTH, HEIGHT, **kw)
    packed = gsplat.fully_fused_projection(b.means, None, b.quats, b.scales, b.viewmats, b.Ks, WIDTH, HEIGHT,
                                           packed=True, sparse_grad=sparse_grad, **kw)  # fmt: skip
    packed = packed[-7:]  # 1.5.3 puts batch_ids first
    camera_ids, gaussian_ids = packed[0], packed[1]
    keep = _alive(unpacked[0])
    want_c, want_g = keep.nonzero(as_tuple=True)  # gsplat's order: camera-major, then Gaussian
    torch.testing.assert_close(camera_ids, want_c, **_EXACT)
    torch.testing.assert_close(gaussian_ids, want_g, **_EXACT)
    for got, want in zip(packed[2:], unpacked, strict=True):
        torch.testing.assert_close(got, want[want_c, want_g], **_EXACT)
    cots = _cotangents(*packed[3:])
    _loss(packed[3:], cots).backward()
    _loss([t[want_c, want_g] for t in unpacked[1:]], cots).backward()
    for name in ("means", "quats", "scales"):
        got = getattr(b, name).grad
        got = got.to_dense() if sparse_grad else got
        assert_grads_close(got, getattr(a, name).grad, 1e-6, name)  # per-camera recomputation: reordered sums


def test_isect_tiles_gives_gsplats_reference_ids():
    radii, means2d, depths, _, _ = _reference_projection(*[getattr(_scene(seed=3, extent=3.0), k) for k in
                                                           ("means", "quats", "scales", "viewmats", "Ks")])  # fmt: skip
    got = gsplat.isect_tiles(means2d, radii, depths, 16, 3, 3)
    want = _torch_impl._isect_tiles(means2d, radii, depths, 16, 3, 3)
    assert got[1].numel() > 100
    for g, w, name in zip(got, want, ("tiles_per_gauss", "isect_ids", "flatten_ids"), strict=True):
        torch.testing.assert_close(g, w, **_EXACT, msg=lambda m, name=name: f"{name}: {m}")


def test_isect_ids_of_negative_depths_carry_the_releases_depth_bits():
    # A negative depth's float32 bits go into the id's low 32 bits sign-extended by 1.4.0 and 1.5.0 and
    # zero-extended from 1.5.1 (each release's csrc/IntersectTile.cu); the tile and image bits are those of
    # the same entry at a positive depth (held to gsplat's reference above).
    radii, means2d, depths, _, _ = _reference_projection(*[getattr(_scene(seed=3, extent=3.0), k) for k in
                                                           ("means", "quats", "scales", "viewmats", "Ks")])  # fmt: skip
    flipped = torch.where(torch.arange(depths.shape[-1]) % 3 == 0, -depths, depths)
    _, ids, flat = gsplat.isect_tiles(means2d, radii, depths, 16, 3, 3, sort=False)
    _, got, got_flat = gsplat.isect_tiles(means2d, radii, flipped, 16, 3, 3, sort=False)
    torch.testing.assert_close(got_flat, flat, **_EXACT)
    bits = flipped.reshape(-1)[flat.long()].contiguous().view(torch.int32).to(torch.int64)
    zero_extends = _GSPLAT >= (1, 5, 1)
    if zero_extends:
        bits = bits & 0xFFFFFFFF
    torch.testing.assert_close(got, (ids & ~0xFFFFFFFF) | bits, **_EXACT)
    assert bool((got < 0).any()) != zero_extends  # negative depths were listed, and it shows
    if _GSPLAT < (1, 5, 3):
        # gsplat 1.5.3's own _isect_tiles cannot take a negative depth: it stores the zero-extended bits in
        # an int32 tensor ("value cannot be converted to type int without overflow").
        want = _torch_impl._isect_tiles(means2d, radii, flipped, 16, 3, 3, sort=False)
        torch.testing.assert_close(got, want[1], **_EXACT)


def test_packed_isect_tiles_lists_the_same_pairs_as_unpacked():
    radii, means2d, depths, _, _ = _reference_projection(*[getattr(_scene(seed=3, extent=3.0), k) for k in
                                                           ("means", "quats", "scales", "viewmats", "Ks")])  # fmt: skip
    num_gaussians = means2d.shape[1]
    cam, gauss = _alive(radii).nonzero(as_tuple=True)
    _, ids, flat = gsplat.isect_tiles(means2d, radii, depths, 16, 3, 3)
    renamed = "n_images" in inspect.signature(gsplat.isect_tiles).parameters  # gsplat 1.5.3's names
    ids_kw = {"n_images": 2, "image_ids": cam} if renamed else {"n_cameras": 2, "camera_ids": cam}
    _, p_ids, p_flat = gsplat.isect_tiles(means2d[cam, gauss], radii[cam, gauss], depths[cam, gauss], 16, 3, 3,
                                          packed=True, gaussian_ids=gauss, **ids_kw)  # fmt: skip
    torch.testing.assert_close(p_ids, ids, **_EXACT)
    torch.testing.assert_close(cam[p_flat.long()] * num_gaussians + gauss[p_flat.long()], flat.long(), **_EXACT)


def test_spherical_harmonics_and_gradients_equal_gsplats_reference():
    gen = torch.Generator().manual_seed(4)
    dirs = torch.randn(50, 3, generator=gen, requires_grad=True)
    coeffs = torch.randn(50, 16, 3, generator=gen, requires_grad=True)
    masks = torch.rand(50, generator=gen) > 0.3
    got = gsplat.spherical_harmonics(3, dirs, coeffs, masks=masks)
    d2, c2 = dirs.detach().clone().requires_grad_(), coeffs.detach().clone().requires_grad_()
    want = _torch_impl._spherical_harmonics(3, d2, c2) * masks[:, None]
    torch.testing.assert_close(got, want, **_EXACT)
    (cot,) = _cotangents(got)
    (got * cot).sum().backward()
    (want * cot).sum().backward()
    torch.testing.assert_close(dirs.grad, d2.grad, **_EXACT)
    torch.testing.assert_close(coeffs.grad, c2.grad, **_EXACT)


# ------------------------------------------------------------------ gsplat.rasterization vs the reference backend
def _render(scene, backend, **kw):
    s = scene.with_grad()
    if backend == "gsplat":
        colors, alphas, meta = gsplat.rasterization(**s.kwargs(), **kw)
    else:
        colors, alphas, meta = rasterization(**s.kwargs(), backend="reference", **kw)
    cot_c, cot_a = _cotangents(colors, alphas)
    if kw.get("render_mode") == "RGB+ED":
        # Expected depth is a sum over alpha: where alpha ~ 4e-3 its gradient amplifies float32 rounding
        # (relative 2e-4 there, 9e-6 with this mask, measured); those pixels' depth carries no cotangent.
        cot_c[..., 3] *= (alphas[..., 0].detach() > 0.05).to(cot_c.dtype)
    _loss((colors, alphas), (cot_c, cot_a)).backward()
    grads = {name: p.grad for name, p in s.params().items()}
    if kw.get("absgrad") and not kw.get("packed"):
        grads["absgrad"] = meta["means2d"].absgrad
    return colors.detach(), alphas.detach(), grads


@pytest.mark.parametrize(
    "kw",
    [
        {"packed": False},
        {"packed": True},
        {"packed": False, "render_mode": "RGB+ED", "rasterize_mode": "antialiased"},
        {"packed": False, "absgrad": True},
        {"packed": False, "backgrounds": "grey"},
    ],
    ids=["unpacked", "packed", "ed-antialiased", "absgrad", "background"],
)
def test_gsplat_rasterization_matches_the_reference_backend(kw):
    scene = _scene(seed=5, sh_degree=None if kw.get("render_mode") else 2)
    if kw.get("backgrounds") == "grey":
        kw = {**kw, "backgrounds": torch.full((2, 3), 0.4)}
    got_c, got_a, got_g = _render(scene, "gsplat", **kw)
    want_c, want_a, want_g = _render(scene, "reference", **kw)
    assert float(want_a.mean()) > 0.2  # a scene that covers the images
    # RGB+ED's depth is a sum divided by alpha (gsplat and the reference alike): relative to it.
    rtol = 1e-5 if kw.get("render_mode") == "RGB+ED" else 0.0
    torch.testing.assert_close(got_c, want_c, atol=_COLOR_ATOL, rtol=rtol)
    torch.testing.assert_close(got_a, want_a, atol=_COLOR_ATOL, rtol=0)
    assert set(got_g) == set(want_g)
    for name in want_g:
        assert_grads_close(got_g[name], want_g[name], _GRAD_REL, name)


def test_rasterize_to_pixels_masks_give_the_background():
    radii, means2d, depths, conics, _ = _reference_projection(*[getattr(_scene(seed=6), k) for k in
                                                                ("means", "quats", "scales", "viewmats", "Ks")])  # fmt: skip
    _, ids, flat = gsplat.isect_tiles(means2d, radii, depths, 16, 3, 3)
    offsets = gsplat.isect_offset_encode(ids, 2, 3, 3)
    colors = torch.rand(*depths.shape, 3, generator=torch.Generator().manual_seed(0))
    opacities = torch.full(depths.shape, 0.5)
    bg = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    masks = torch.ones(2, 3, 3, dtype=torch.bool)
    masks[0, 1, 2] = masks[1, 0, 0] = False
    args = (means2d, conics, colors, opacities, WIDTH, HEIGHT, 16, offsets, flat)
    full, _ = gsplat.rasterize_to_pixels(*args, backgrounds=bg)
    got, got_a = gsplat.rasterize_to_pixels(*args, backgrounds=bg, masks=masks)
    pixel_masks = masks.repeat_interleave(16, 1).repeat_interleave(16, 2)[:, :HEIGHT, :WIDTH]
    torch.testing.assert_close(got[~pixel_masks], bg[:, None, None].expand_as(got)[~pixel_masks], **_EXACT)
    assert float(got_a[~pixel_masks].abs().max()) == 0.0
    torch.testing.assert_close(got[pixel_masks], full[pixel_masks], **_EXACT)
    assert float((full[~pixel_masks] - got[~pixel_masks]).abs().max()) > 0.01  # the masked tiles had Gaussians


# ------------------------------------------------------------------ relocation, errors, installing
def test_compute_relocation_equals_the_packages_eq9():
    gen = torch.Generator().manual_seed(7)
    opacities = torch.rand(300, generator=gen, dtype=torch.float64) * 0.98 + 0.01
    scales = torch.rand(300, 3, generator=gen, dtype=torch.float64) + 0.01
    ratios = torch.randint(1, 70, (300,), generator=gen)  # past 51: gsplat's wrapper clamps
    binoms = torch.tensor([[math.comb(n, k) for k in range(51)] for n in range(51)], dtype=torch.float64)
    from gsplat.relocation import compute_relocation

    got_o, got_s = compute_relocation(opacities, scales, ratios.clone(), binoms)
    want_o, want_s = relocation_opacity_scale(opacities, scales, ratios)
    # float64 both, different sums of the same series (a double sum here, regrouped by k there):
    # rounding ~1e-15 relative, amplified by the alternating signs' cancellation for small o'.
    torch.testing.assert_close(got_o, want_o, rtol=1e-10, atol=0)
    torch.testing.assert_close(got_s, want_s, rtol=1e-8, atol=0)


def test_an_entry_point_without_a_cpu_version_names_itself():
    extension = gsplat_cpu.CpuExtension(gsplat.__version__)
    with pytest.raises(gsplat_cpu.MissingEntryPoint, match="'no_such_kernel'"):
        extension.no_such_kernel  # noqa: B018


def test_a_non_contiguous_input_is_refused_as_the_kernels_do():
    extension = gsplat_cpu.CpuExtension(gsplat.__version__)
    name = "isect_offset_encode" if "isect_offset_encode" in extension._entries else "intersect_offset"
    with pytest.raises(RuntimeError, match="not contiguous"):
        getattr(extension, name)(torch.zeros(4, 2, dtype=torch.int64)[:, 0], 1, 2, 2)


def test_installed_nests_and_puts_back_what_it_found():
    backend = "gsplat.cuda._backend"
    before = sys.modules.get(backend)
    with gsplat_cpu.installed() as outer:
        with gsplat_cpu.installed() as inner:
            assert sys.modules[backend]._C is inner
        assert sys.modules[backend]._C is outer
    assert sys.modules.get(backend) is before


@pytest.mark.skipif(not _PER_AXIS, reason="opacities= in the projection and per-axis radii are gsplat >= 1.5's")
def test_projection_with_opacities_culls_below_1_over_255_and_tightens_the_box():
    scene = _scene(seed=8)
    opacities = scene.opacities.clone()
    opacities[:50] = 1.0 / 300.0
    args = (scene.means, None, scene.quats, scene.scales, scene.viewmats, scene.Ks, WIDTH, HEIGHT)
    plain = gsplat.fully_fused_projection(*args)[0]
    tight = gsplat.fully_fused_projection(*args, opacities=opacities)[0]
    assert plain.shape == tight.shape == (2, 400, 2)
    assert int(tight[:, :50].abs().sum()) == 0 and int((plain[:, :50] > 0).sum()) > 0
    assert bool((tight <= plain).all()) and bool((tight[:, 50:] < plain[:, 50:]).any())
