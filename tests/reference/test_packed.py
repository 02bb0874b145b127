"""``rasterization(packed=True)`` against ``packed=False`` on the reference backend.

Tolerance: none -- images and every input gradient must be bitwise equal. On the reference backend
packed mode gathers the visible pairs and scatters them back (``rendering/packed.py``): both moves
copy values to distinct places and add nothing, so no floating-point operation is reordered, and
culled entries are never read by the rasterizer in either layout (their gradient is exactly 0).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from distsplat_ns.rendering import rasterization
from tests.helpers.scenes import random_scene

_PARAMS = ("means", "quats", "scales", "opacities", "colors")


def _scene(sh_degree=None, per_camera_colors=False):
    # extent 2.5 around cameras 4 units away: some Gaussians leave the 48x40 view, so the packed
    # layout really drops pairs (checked below).
    scene = random_scene(num_gaussians=120, num_cameras=3, width=48, height=40, seed=5, extent=2.5,
                         scale_range=(0.05, 0.3), sh_degree=sh_degree)  # fmt: skip
    if per_camera_colors:
        colors = torch.rand(3, scene.num_gaussians, 3, generator=torch.Generator().manual_seed(9))
        scene = replace(scene, colors=colors)
    return scene


def _run(scene, packed, **kwargs):
    leaves = {name: getattr(scene, name).detach().clone().requires_grad_() for name in _PARAMS}
    backgrounds = torch.tensor([[0.2, 0.5, 0.9]] * scene.num_cameras).requires_grad_()
    colors, alphas, meta = rasterization(
        **leaves, viewmats=scene.viewmats, Ks=scene.Ks, width=scene.width, height=scene.height,
        sh_degree=scene.sh_degree, packed=packed, backgrounds=backgrounds, backend="reference", **kwargs,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(4)
    loss = (colors * torch.randn(colors.shape, generator=gen)).sum() + (
        alphas * torch.randn(alphas.shape, generator=gen)
    ).sum()
    loss.backward()
    grads = {name: leaf.grad for name, leaf in leaves.items()}
    grads["backgrounds"] = backgrounds.grad
    return colors.detach(), alphas.detach(), meta, grads


@pytest.mark.parametrize(
    "case",
    [
        {},
        {"render_mode": "RGB+ED"},
        {"rasterize_mode": "antialiased"},
        {"sh_degree": 2},
        {"per_camera_colors": True},
    ],
    ids=["rgb", "rgb_ed", "antialiased", "sh2", "per_camera_colors"],
)
def test_packed_gives_the_same_images_and_gradients(case):
    scene = _scene(sh_degree=case.pop("sh_degree", None), per_camera_colors=case.pop("per_camera_colors", False))
    dense = _run(scene, packed=False, absgrad=True, **case)
    packed = _run(scene, packed=True, absgrad=True, **case)

    assert torch.equal(packed[0], dense[0]) and torch.equal(packed[1], dense[1])
    for name in (*_PARAMS, "backgrounds"):
        assert packed[3][name] is not None and torch.equal(packed[3][name], dense[3][name]), name

    dense_meta, packed_meta = dense[2], packed[2]
    visible = dense_meta["radii"] > 0
    cam, gid = packed_meta["camera_ids"], packed_meta["gaussian_ids"]
    assert 0 < cam.numel() < visible.numel(), "the scene must cull some pairs and keep others"
    # gsplat's order: camera-major, Gaussian index ascending within a camera.
    assert torch.equal(cam * scene.num_gaussians + gid, torch.nonzero(visible.reshape(-1)).squeeze(1))
    for key in ("radii", "depths", "conics", "opacities"):
        assert torch.equal(packed_meta[key], dense_meta[key][cam, gid]), key
    assert torch.equal(packed_meta["means2d"].detach(), dense_meta["means2d"].detach()[cam, gid])
    # means2d's gradient and absgrad are the [nnz, 2] view of the dense ones; culled pairs get 0.
    assert torch.equal(packed_meta["means2d"].grad, dense_meta["means2d"].grad[cam, gid])
    assert torch.equal(packed_meta["means2d"].absgrad, dense_meta["means2d"].absgrad[cam, gid])
    assert not dense_meta["means2d"].grad[~visible].any() and not dense_meta["means2d"].absgrad[~visible].any()
    assert packed_meta["means2d"].absgrad.abs().sum() > 0
    assert torch.equal(packed_meta["tile_counts"], dense_meta["tile_counts"])
    assert packed_meta["projection"] is None and dense_meta["camera_ids"] is None


def test_packed_is_gsplats_default():
    scene = _scene()
    colors, _, meta = rasterization(**scene.kwargs(), backend="reference")
    expected, _, _ = rasterization(**scene.kwargs(), packed=False, backend="reference")
    assert torch.equal(colors, expected)
    assert meta["means2d"].shape == (meta["camera_ids"].numel(), 2)
    assert meta["camera_ids"].dtype == torch.int64 and meta["gaussian_ids"].dtype == torch.int64


def test_packed_with_nothing_visible_renders_the_background():
    scene = _scene()
    behind = scene.means.detach().clone()
    behind[:, 2] = -100.0  # the cameras sit near z = -4 looking along +z: all behind them
    scene = replace(scene, means=behind)
    colors, alphas, meta = rasterization(**scene.kwargs(), packed=True, backend="reference")
    assert meta["camera_ids"].numel() == 0
    assert not colors.any() and not alphas.any()
