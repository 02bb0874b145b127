"""``gsplat_backend.rasterize_packed``'s glue with stand-in kernels, against ``packed=False``.

No GPU here, so gsplat's CUDA kernels are replaced: the packed projection by the reference
projection with its visible pairs kept (camera-major, as gsplat's kernel writes them), tile
intersection by gsplat's own PyTorch ``_isect_tiles`` on the scattered-back pairs (its flat ids
mapped to pair ids), and packed ``rasterize_to_pixels`` by the reference compositor which, like
gsplat's, sets ``.absgrad`` on its ``means2d`` input during backward. What runs for real is
``rasterize_packed`` (colours, SH, compensations, depth channel, backgrounds, offsets, meta).

Tolerance 1e-6 absolute on pixels and 1e-6 of each gradient's scale: the stand-ins compute the
same float32 values as the reference path, but the SH colours and the per-pair gathers run in
another order of operations (``[nnz]`` instead of ``[C, N]`` autograd graphs), which may round
the last bit; a glue error (wrong index, channel or factor) changes results by O(1e-2) or more.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from distsplat_ns.rendering import evaluate_sh, gsplat_backend, rasterization
from distsplat_ns.rendering import projection as ref_projection
from distsplat_ns.rendering import reference as ref
from distsplat_ns.rendering.gsplat_versions import parse_version
from tests.helpers.scenes import assert_grads_close, random_scene

gsplat = pytest.importorskip("gsplat")
gsplat_torch = pytest.importorskip("gsplat.cuda._torch_impl")

_TOL = 1e-6
# The installed gsplat's signatures and output form, written here apart from gsplat_versions.py's
# table so that a wrong table fails: a fake binds its arguments to the real signature.
_GSPLAT = parse_version(gsplat.__version__)
_PROJECTION = inspect.signature(gsplat.fully_fused_projection)
_ISECT_TILES = inspect.signature(gsplat.isect_tiles)
_RASTERIZE = inspect.signature(gsplat.rasterize_to_pixels)
_PARAMS = ("means", "quats", "scales", "opacities", "colors")


class _Pairs:
    """The visible pairs of the last fake projection (the real kernels pass them implicitly)."""

    camera_ids: torch.Tensor
    gaussian_ids: torch.Tensor
    num_cameras: int
    num_gaussians: int

    @classmethod
    def dense(cls, values):
        out = values.new_zeros((cls.num_cameras, cls.num_gaussians, *values.shape[1:]))
        return out.index_put((cls.camera_ids, cls.gaussian_ids), values)


def _fake_projection(*args, **kwargs):
    bound = _PROJECTION.bind(*args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    assert a["packed"] and a["covars"] is None and not a["sparse_grad"] and a["camera_model"] == "pinhole"
    means, quats, scales, viewmats, Ks, width, height = (
        a[k] for k in ("means", "quats", "scales", "viewmats", "Ks", "width", "height")
    )
    eps2d, near_plane, far_plane, radius_clip = a["eps2d"], a["near_plane"], a["far_plane"], a["radius_clip"]
    calc_compensations = a["calc_compensations"]
    proj = ref_projection.project_gaussians(
        means, quats, scales, viewmats, Ks, width, height, eps2d=eps2d, near_plane=near_plane,
        far_plane=far_plane, radius_clip=radius_clip, calc_compensations=calc_compensations,
    )  # fmt: skip
    cam, gid = torch.nonzero(proj.radii > 0, as_tuple=True)
    _Pairs.camera_ids, _Pairs.gaussian_ids = cam, gid
    _Pairs.num_cameras, _Pairs.num_gaussians = int(viewmats.shape[0]), int(means.shape[0])
    comp = proj.compensations[cam, gid] if calc_compensations else None
    radii = proj.radii[cam, gid]
    if _GSPLAT >= (1, 5, 0):
        radii = torch.stack([radii, radii], dim=-1)  # per-axis radii [nnz, 2]
    out = (cam, gid, radii, proj.means2d[cam, gid], proj.depths[cam, gid], proj.conics[cam, gid], comp)
    return (torch.zeros_like(cam), *out) if _GSPLAT >= (1, 5, 3) else out  # batch_ids first from 1.5.3


def _fake_sh(degrees_to_use, dirs, coeffs, masks=None):
    return torch.where(masks[..., None], evaluate_sh(degrees_to_use, dirs, coeffs), 0.0)


def _fake_isect_tiles(*args, **kwargs):
    a = _ISECT_TILES.bind(*args, **kwargs).arguments
    means2d, radii, depths, tile_size, tile_width, tile_height = (
        a[k] for k in ("means2d", "radii", "depths", "tile_size", "tile_width", "tile_height")
    )
    # Renamed in gsplat 1.5.3: n_cameras/camera_ids -> n_images/image_ids (no batch dimensions: image = camera).
    n_cameras, camera_ids = (
        (a["n_images"], a["image_ids"]) if _GSPLAT >= (1, 5, 3) else (a["n_cameras"], a["camera_ids"])
    )
    gaussian_ids = a["gaussian_ids"]
    assert a["packed"] and n_cameras == _Pairs.num_cameras and torch.equal(camera_ids, _Pairs.camera_ids)
    tiles_per_gauss, isect_ids, flat_dense = gsplat_torch._isect_tiles(
        _Pairs.dense(means2d), _Pairs.dense(radii), _Pairs.dense(depths), tile_size, tile_width, tile_height
    )
    pair_of = torch.full((n_cameras * _Pairs.num_gaussians,), -1, dtype=torch.int64)
    pair_of[camera_ids * _Pairs.num_gaussians + gaussian_ids] = torch.arange(camera_ids.numel())
    return tiles_per_gauss, isect_ids, pair_of[flat_dense.long()].int()


class _FakePackedRasterize(torch.autograd.Function):
    """Reference compositing of packed pairs; backward sets ``.absgrad`` on means2d, as gsplat."""

    @staticmethod
    def _render(means2d, conics, colors, opacities, ctx, sink=None):
        dense = [_Pairs.dense(t) for t in (means2d, conics, colors, opacities)]
        return ref.rasterize_to_pixels(*dense, ctx.width, ctx.height, ctx.isects, backgrounds=ctx.backgrounds,
                                       absgrad_sink=sink)[:2]  # fmt: skip

    @staticmethod
    def forward(ctx, means2d, conics, colors, opacities, width, height, isects, backgrounds, absgrad):  # type: ignore[override]
        ctx.save_for_backward(means2d, conics, colors, opacities)
        ctx.width, ctx.height, ctx.isects, ctx.backgrounds, ctx.absgrad = width, height, isects, backgrounds, absgrad
        return _FakePackedRasterize._render(means2d, conics, colors, opacities, ctx)

    @staticmethod
    def backward(ctx, grad_colors, grad_alphas):  # type: ignore[override]
        means2d, conics, colors, opacities = ctx.saved_tensors
        sink = torch.zeros(_Pairs.num_cameras, _Pairs.num_gaussians, 2) if ctx.absgrad else None
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in (means2d, conics, colors, opacities)]
            outputs = _FakePackedRasterize._render(*leaves, ctx, sink)
            grads = torch.autograd.grad(outputs, leaves, (grad_colors, grad_alphas))
        if ctx.absgrad:
            means2d.absgrad = sink[_Pairs.camera_ids, _Pairs.gaussian_ids]  # as gsplat's backward
        return (*grads, None, None, None, None, None)


def _fake_rasterize_to_pixels(*args, **kwargs):
    bound = _RASTERIZE.bind(*args, **kwargs)
    bound.apply_defaults()
    (
        means2d,
        conics,
        colors,
        opacities,
        image_width,
        image_height,
        tile_size,
        isect_offsets,
        flatten_ids,
        backgrounds,
        masks,
        packed,
        absgrad,
    ) = bound.arguments.values()
    assert packed and masks is None and means2d.dim() == 2
    num_cameras, rows, cols = isect_offsets.shape
    offsets = torch.cat([isect_offsets.reshape(-1).long(), torch.tensor([flatten_ids.numel()])])
    pairs = flatten_ids.long()
    isects = ref.TileIntersections(
        flat_ids=_Pairs.camera_ids[pairs] * _Pairs.num_gaussians + _Pairs.gaussian_ids[pairs], tile_offsets=offsets,
        tile_counts=(offsets[1:] - offsets[:-1]).reshape(num_cameras, rows, cols).int(),
        tile_size=tile_size, tile_row_starts=[0] * num_cameras,
    )  # fmt: skip
    # Backgrounds are applied inside (non-differentiably here): compare their gradient elsewhere.
    bg = backgrounds.detach() if backgrounds is not None else None
    return _FakePackedRasterize.apply(
        means2d, conics, colors, opacities, image_width, image_height, isects, bg, absgrad
    )


@pytest.fixture
def fake_gsplat(monkeypatch):
    monkeypatch.setattr(gsplat, "fully_fused_projection", _fake_projection)
    monkeypatch.setattr(gsplat, "spherical_harmonics", _fake_sh)
    monkeypatch.setattr(gsplat, "isect_tiles", _fake_isect_tiles)
    monkeypatch.setattr(gsplat, "isect_offset_encode", gsplat_torch._isect_offset_encode)
    monkeypatch.setattr(gsplat, "rasterize_to_pixels", _fake_rasterize_to_pixels)


def _render(scene, packed_glue, **kwargs):
    leaves = {name: getattr(scene, name).detach().clone().requires_grad_() for name in _PARAMS}
    bg = torch.tensor([[0.2, 0.5, 0.9]] * scene.num_cameras)
    common = {"viewmats": scene.viewmats, "Ks": scene.Ks, "width": scene.width, "height": scene.height, "near_plane": 0.01,
                  "far_plane": 1e10, "radius_clip": 0.0, "eps2d": 0.3, "sh_degree": scene.sh_degree, "tile_size": 16,
                  "backgrounds": bg, "absgrad": True}  # fmt: skip
    render_mode = kwargs.get("render_mode", "RGB")
    rasterize_mode = kwargs.get("rasterize_mode", "classic")
    if packed_glue:
        colors, alphas, meta = gsplat_backend.rasterize_packed(
            **leaves, **common, render_mode=render_mode, rasterize_mode=rasterize_mode
        )
    else:
        colors, alphas, meta = rasterization(
            **leaves, **common, packed=False, render_mode=render_mode, rasterize_mode=rasterize_mode,
            backend="reference",
        )  # fmt: skip
    gen = torch.Generator().manual_seed(4)
    (
        (colors * torch.randn(colors.shape, generator=gen)).sum()
        + (alphas * torch.randn(alphas.shape, generator=gen)).sum()
    ).backward()
    return colors.detach(), alphas.detach(), {n: t.grad for n, t in leaves.items()}, meta


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"render_mode": "RGB+ED"}, {"rasterize_mode": "antialiased"}, {"sh_degree": 2}],
    ids=["rgb", "rgb_ed", "antialiased", "sh2"],
)
def test_packed_glue_matches_reference_unpacked(fake_gsplat, kwargs):
    kwargs = dict(kwargs)
    scene = random_scene(num_gaussians=80, num_cameras=2, width=48, height=30, seed=3, extent=2.5,
                         scale_range=(0.05, 0.3), sh_degree=kwargs.pop("sh_degree", None))  # fmt: skip
    c_p, a_p, g_p, meta_p = _render(scene, True, **kwargs)
    c_u, a_u, g_u, meta_u = _render(scene, False, **kwargs)
    cam, gid = meta_p["camera_ids"], meta_p["gaussian_ids"]
    assert 0 < cam.numel() < scene.num_cameras * scene.num_gaussians
    torch.testing.assert_close(c_p, c_u, atol=_TOL, rtol=0)
    torch.testing.assert_close(a_p, a_u, atol=_TOL, rtol=0)
    for name in _PARAMS:
        assert_grads_close(g_p[name], g_u[name], _TOL, name)
    assert torch.equal(meta_p["tile_counts"], meta_u["tile_counts"])
    for key in ("radii", "depths", "conics", "opacities"):
        torch.testing.assert_close(meta_p[key], meta_u[key][cam, gid], atol=0, rtol=0, msg=key)
    assert_grads_close(meta_p["means2d"].grad, meta_u["means2d"].grad[cam, gid], _TOL, "means2d.grad")
    assert float(meta_p["means2d"].absgrad.sum()) > 0
    assert_grads_close(meta_p["means2d"].absgrad, meta_u["means2d"].absgrad[cam, gid], _TOL, "absgrad")
