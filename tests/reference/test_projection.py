"""Reference projection against gsplat's own PyTorch implementation (CPU, float64).

gsplat's ``_torch_impl`` mirrors its CUDA kernel's maths (Jacobian clamp, eps2d, radius, culling
box) but not its culled-entry zeroing, so only kept entries are compared there. The reference
keeps gsplat 1.4.0's radius (3 sigma of the major axis, one per entry); from gsplat 1.5.0 the radii
are 3.33 sigma per axis (rendering/gsplat_versions.py), so there only the other outputs are compared,
on the entries both keep.
"""

from __future__ import annotations

import pytest
import torch

from distsplat_ns.rendering.gsplat_versions import parse_version
from distsplat_ns.rendering.projection import project_gaussians, quats_to_rotmats
from tests.helpers.scenes import random_scene

gsplat = pytest.importorskip("gsplat")
gsplat_torch = pytest.importorskip("gsplat.cuda._torch_impl")
_RADII_PER_AXIS = parse_version(gsplat.__version__) >= (1, 5, 0)

_F64_TOL = {"rtol": 1e-10, "atol": 1e-10}


def _wide_scene(seed: int):
    # Gaussians spread well beyond the 60-degree frustum and up to the camera plane: exercises
    # the x/z, y/z clamp, the off-image cull and the near plane.
    scene = random_scene(num_gaussians=400, num_cameras=3, width=48, height=40, seed=seed, extent=3.5,
                         camera_distance=3.0, scale_range=(0.01, 0.4), dtype=torch.float64)  # fmt: skip
    return scene


def _gsplat_projection(scene, calc_compensations=False):
    covars, _ = gsplat_torch._quat_scale_to_covar_preci(scene.quats, scene.scales, compute_preci=False)
    return gsplat_torch._fully_fused_projection(
        scene.means, covars, scene.viewmats, scene.Ks, scene.width, scene.height,
        eps2d=0.3, calc_compensations=calc_compensations,
    )  # fmt: skip


@pytest.mark.parametrize("seed", [0, 1])
def test_projection_matches_gsplat_torch_impl(seed):
    scene = _wide_scene(seed)
    ours = project_gaussians(scene.means, scene.quats, scene.scales, scene.viewmats, scene.Ks,
                             scene.width, scene.height, calc_compensations=True)  # fmt: skip
    radii, means2d, depths, conics, comps = _gsplat_projection(scene, calc_compensations=True)
    if _RADII_PER_AXIS:
        kept = (radii > 0).all(dim=-1) & (ours.radii > 0)
        # The two radius rules cull differently only at the image border: 93% and 96% of the kept
        # entries agree on seeds 0 and 1 (measured on gsplat 1.5.3), so 90% leaves room and still
        # fails if the comparison degenerates to a few entries.
        assert int(kept.sum()) >= 0.9 * int((ours.radii > 0).sum())
    else:
        torch.testing.assert_close(ours.radii, radii, rtol=0, atol=0)
        kept = radii > 0
    assert 0 < int(kept.sum()) < kept.numel()  # both kept and culled Gaussians are exercised
    torch.testing.assert_close(ours.means2d[kept], means2d[kept], **_F64_TOL)
    torch.testing.assert_close(ours.depths[kept], depths[kept], **_F64_TOL)
    torch.testing.assert_close(ours.conics[kept], conics[kept], **_F64_TOL)
    torch.testing.assert_close(ours.compensations[kept], comps[kept], **_F64_TOL)


def test_jacobian_clamp_is_exercised():
    # Guard for the parity test: some kept Gaussians have |x/z| beyond the image plus margin.
    scene = _wide_scene(0)
    ours = project_gaussians(
        scene.means, scene.quats, scene.scales, scene.viewmats, scene.Ks, scene.width, scene.height
    )
    fx, cx = scene.Ks[:, 0, 0, None], scene.Ks[:, 0, 2, None]
    means_c = torch.einsum("cij,nj->cni", scene.viewmats[:, :3, :3], scene.means) + scene.viewmats[:, None, :3, 3]
    x_over_z = means_c[..., 0] / means_c[..., 2]
    lim = (scene.width - cx) / fx + 0.3 * 0.5 * scene.width / fx
    assert bool(((x_over_z.abs() > lim) & (ours.radii > 0)).any())


def test_culled_entries_are_zero():
    scene = _wide_scene(0)
    ours = project_gaussians(
        scene.means, scene.quats, scene.scales, scene.viewmats, scene.Ks, scene.width, scene.height
    )
    culled = ours.radii == 0
    assert bool(culled.any())
    for tensor in (ours.means2d, ours.depths, ours.conics):
        assert torch.count_nonzero(tensor[culled]) == 0


@pytest.mark.parametrize("near_plane, far_plane", [(3.5, 1e10), (0.01, 3.0)], ids=["near", "far"])
def test_depth_planes_cull(near_plane, far_plane):
    scene = _wide_scene(0)
    ours = project_gaussians(scene.means, scene.quats, scene.scales, scene.viewmats, scene.Ks, scene.width,
                             scene.height, near_plane=near_plane, far_plane=far_plane)  # fmt: skip
    plain = project_gaussians(
        scene.means, scene.quats, scene.scales, scene.viewmats, scene.Ks, scene.width, scene.height
    )
    kept_depths = plain.depths[ours.radii > 0]
    assert bool(((kept_depths >= near_plane) & (kept_depths <= far_plane)).all())
    assert int((ours.radii > 0).sum()) < int((plain.radii > 0).sum())


def test_radius_clip_culls_small_gaussians():
    scene = _wide_scene(1)
    plain = project_gaussians(
        scene.means, scene.quats, scene.scales, scene.viewmats, scene.Ks, scene.width, scene.height
    )
    clipped = project_gaussians(scene.means, scene.quats, scene.scales, scene.viewmats, scene.Ks, scene.width,
                                scene.height, radius_clip=3.0)  # fmt: skip
    expected = torch.where(plain.radii > 3, plain.radii, torch.zeros_like(plain.radii))
    torch.testing.assert_close(clipped.radii, expected, rtol=0, atol=0)


def test_quats_to_rotmats_is_orthonormal_and_matches_gsplat():
    quats = torch.randn(64, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3
    rot = quats_to_rotmats(quats)
    torch.testing.assert_close(
        rot @ rot.transpose(-1, -2), torch.eye(3, dtype=torch.float64).expand(64, 3, 3), **_F64_TOL
    )
    torch.testing.assert_close(rot, gsplat_torch._quat_to_rotmat(quats), **_F64_TOL)


def test_projection_gradients_match_gsplat_torch_impl():
    # Same maths must mean the same derivatives, including through the clamped Jacobian.
    scene = _wide_scene(2).with_grad()
    gen = torch.Generator().manual_seed(5)
    ours = project_gaussians(scene.means, scene.quats, scene.scales, scene.viewmats, scene.Ks,
                             scene.width, scene.height, calc_compensations=True)  # fmt: skip
    kept = (ours.radii > 0).detach()
    weights = [
        torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in (ours.means2d, ours.depths, ours.conics)
    ]
    weight_comp = torch.randn(ours.depths.shape, generator=gen, dtype=torch.float64)

    def functional(means2d, depths, conics, comps):
        terms = [(w * t)[kept].sum() for w, t in zip(weights, (means2d, depths, conics), strict=False)]
        return sum(terms) + (weight_comp * comps)[kept].sum()

    params = [scene.means, scene.quats, scene.scales]
    got = torch.autograd.grad(functional(ours.means2d, ours.depths, ours.conics, ours.compensations), params)
    covars, _ = gsplat_torch._quat_scale_to_covar_preci(scene.quats, scene.scales, compute_preci=False)
    _, means2d, depths, conics, comps = gsplat_torch._fully_fused_projection(
        scene.means, covars, scene.viewmats, scene.Ks, scene.width, scene.height, eps2d=0.3, calc_compensations=True
    )
    want = torch.autograd.grad(functional(means2d, depths, conics, comps), params)
    for name, g, w in zip(("means", "quats", "scales"), got, want, strict=False):
        torch.testing.assert_close(g, w, rtol=1e-8, atol=1e-10, msg=lambda m, name=name: f"{name}: {m}")
