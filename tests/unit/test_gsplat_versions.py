"""rendering/gsplat_versions.py: the table of gsplat 1.4.0 -> 1.5.3 call differences.

The table is checked for every release of the tested range, and against the installed gsplat: its
keywords must be that gsplat's ``isect_tiles`` parameters, and its radii conversions must give what
that gsplat's own PyTorch reference (``gsplat/cuda/_torch_impl.py``) returns and accepts, and its
packed rules must be what that gsplat's own wrappers do on the CPU shim (tests/helpers/gsplat_cpu.py).
Runs on gsplat 1.4.0 (scripts/test.sh) and on any of 1.5.0 to 1.5.3 (scripts/test_gsplat_next.sh,
``GSPLAT_VERSION``).
"""

from __future__ import annotations

import inspect
import os

import pytest
import torch

from distsplat_ns.rendering import gsplat_backend
from distsplat_ns.rendering.gsplat_versions import GsplatApi, gsplat_api, parse_version
from tests.helpers import gsplat_cpu
from tests.helpers.scenes import random_scene


@pytest.mark.parametrize(
    "text, want", [("1.4.0", (1, 4, 0)), ("1.5.3", (1, 5, 3)), ("1.5.3+cu124", (1, 5, 3)), ("1.10.0.dev1", (1, 10, 0))]
)
def test_parse_version(text, want):
    assert parse_version(text) == want


@pytest.mark.parametrize("text", ["", "1.5", "v1.5.3"])
def test_parse_version_rejects_malformed(text):
    with pytest.raises(ValueError, match="major.minor.patch"):
        parse_version(text)


def test_older_than_the_tested_range_is_refused():
    with pytest.raises(ValueError, match=">= 1.4.0"):
        gsplat_api("1.3.0")


@pytest.mark.parametrize(
    "version, per_axis, image_ids, backgrounds_ours",
    [
        ("1.4.0", False, False, False),
        ("1.4.9", False, False, False),
        # Read in each release's gsplat/cuda/_wrapper.py: 1.5.0 to 1.5.2 return radii [C, N, 2], keep
        # isect_tiles' n_cameras/camera_ids, give 7 packed outputs and assert packed backgrounds [C, D].
        ("1.5.0", True, False, False),
        ("1.5.1", True, False, False),
        ("1.5.2", True, False, False),
        ("1.5.3", True, True, True),
    ],
)
def test_each_difference_starts_at_its_release(version, per_axis, image_ids, backgrounds_ours):
    api = gsplat_api(version)
    assert (api.radii_per_axis, api.image_ids, api.packed_backgrounds_ours) == (per_axis, image_ids, backgrounds_ours)
    want_keys = {"n_images", "image_ids"} if image_ids else {"n_cameras", "camera_ids"}
    assert set(api.isect_ids_kwargs(2, torch.zeros(3, dtype=torch.int32))) == want_keys
    assert set(api.isect_ids_kwargs(2)) == want_keys - {"image_ids", "camera_ids"}


@pytest.mark.parametrize("version", ["1.4.0", "1.5.0", "1.5.3"])
def test_radii_round_trip(version):
    api = gsplat_api(version)
    radii = torch.tensor([[0, 3, 7], [2, 0, 5]], dtype=torch.int32)  # [C, N]
    to_gsplat = api.radii_to_gsplat(radii)
    assert to_gsplat.shape == ((2, 3, 2) if api.radii_per_axis else (2, 3))
    assert torch.equal(api.radii_to_contract(to_gsplat), radii)
    packed = radii[radii > 0]  # [nnz]
    assert torch.equal(api.radii_to_contract(api.radii_to_gsplat(packed)), packed)


def test_per_axis_radii_become_their_larger_axis():
    # The square of the larger axis covers gsplat's (x, y) box, so no footprint shrinks.
    per_axis = torch.tensor([[[3, 5], [4, 1], [0, 0]]], dtype=torch.int32)  # [C, N, 2]
    assert torch.equal(GsplatApi((1, 5, 3)).radii_to_contract(per_axis), torch.tensor([[5, 4, 0]], dtype=torch.int32))


def test_packed_projection_outputs_split_to_the_old_seven():
    outputs = tuple(torch.full((1,), float(i)) for i in range(8))
    assert [int(t) for t in gsplat_api("1.5.3").split_packed_projection(outputs)] == list(range(1, 8))
    assert [int(t) for t in gsplat_api("1.5.2").split_packed_projection(outputs[1:])] == list(range(1, 8))
    with pytest.raises(ValueError, match="gave 7 outputs, expected 8"):
        gsplat_api("1.5.3").split_packed_projection(outputs[1:])


def test_table_matches_the_installed_gsplat():
    gsplat = pytest.importorskip("gsplat")
    gsplat_torch = pytest.importorskip("gsplat.cuda._torch_impl")
    api = gsplat_backend._api()
    assert api.version == parse_version(gsplat.__version__)
    assert set(api.isect_ids_kwargs(2, torch.zeros(3, dtype=torch.int32))) <= set(
        inspect.signature(gsplat.isect_tiles).parameters
    )

    scene = random_scene(num_gaussians=30, num_cameras=2, width=40, height=32, seed=1)
    covars, _ = gsplat_torch._quat_scale_to_covar_preci(scene.quats, scene.scales, compute_preci=False)
    radii, means2d, depths, _, _ = gsplat_torch._fully_fused_projection(
        scene.means, covars, scene.viewmats, scene.Ks, scene.width, scene.height
    )
    contract = api.radii_to_contract(radii)
    assert contract.shape == (2, 30)  # the package's contract on every release: [C, N]
    assert int((contract > 0).sum()) > 0
    # gsplat's own reference asserts the radii shape of its release.
    tiles_per_gauss, _, _ = gsplat_torch._isect_tiles(means2d, api.radii_to_gsplat(contract), depths, 16, 3, 2)
    assert int(tiles_per_gauss.sum()) > 0


def _packed_on_the_shim(gsplat):
    """The installed gsplat's packed projection and tile intersection on the CPU shim, called as
    ``rasterize_packed`` calls them: ``(api, outputs of the projection, rasterize_to_pixels' arguments)``."""
    api = gsplat_backend._api()
    s = random_scene(num_gaussians=30, num_cameras=2, width=40, height=32, seed=1)
    outputs = gsplat.fully_fused_projection(s.means, None, s.quats, s.scales, s.viewmats, s.Ks, s.width, s.height,
                                            packed=True)  # fmt: skip
    camera_ids, gaussian_ids, radii, means2d, depths, conics, _ = api.split_packed_projection(outputs)
    _, isect_ids, flatten_ids = gsplat.isect_tiles(means2d, radii, depths, 16, 3, 2, packed=True,
                                                   gaussian_ids=gaussian_ids, **api.isect_ids_kwargs(2, camera_ids))  # fmt: skip
    offsets = gsplat.isect_offset_encode(isect_ids, 2, 3, 2)
    nnz = camera_ids.numel()
    assert nnz > 0
    colors, opacities = torch.rand(nnz, 3, generator=torch.Generator().manual_seed(0)), torch.full((nnz,), 0.5)
    return api, outputs, (means2d, conics, colors, opacities, s.width, s.height, 16, offsets, flatten_ids)


def test_packed_projection_output_count_is_the_installed_gsplats():
    gsplat = pytest.importorskip("gsplat")
    with gsplat_cpu.installed():
        api, outputs, _ = _packed_on_the_shim(gsplat)  # split_packed_projection raises on another count
    assert len(outputs) == (8 if api.image_ids else 7)


def test_packed_backgrounds_rule_is_the_installed_gsplats():
    # packed_backgrounds_ours <=> this gsplat's packed rasterize_to_pixels refuses [C, D] backgrounds.
    gsplat = pytest.importorskip("gsplat")
    with gsplat_cpu.installed():
        api, _, args = _packed_on_the_shim(gsplat)
        backgrounds = torch.tensor([[0.2, 0.5, 0.9], [0.1, 0.1, 0.1]])
        if api.packed_backgrounds_ours:
            with pytest.raises(AssertionError):
                gsplat.rasterize_to_pixels(*args, backgrounds=backgrounds, packed=True)
            return
        colors, alphas = gsplat.rasterize_to_pixels(*args, backgrounds=backgrounds, packed=True)
        plain, _ = gsplat.rasterize_to_pixels(*args, packed=True)
    # the kernel's rule, which rasterize_packed applies itself where gsplat refuses: colour + (1 - alpha) bg
    torch.testing.assert_close(colors, plain + (1.0 - alphas) * backgrounds[:, None, None, :])


def test_the_expected_gsplat_is_the_one_imported():
    # scripts/test_gsplat_next.sh sets DISTSPLAT_EXPECT_GSPLAT: fails if its gsplat is not the one in use.
    expected = os.environ.get("DISTSPLAT_EXPECT_GSPLAT")
    if expected is None:
        pytest.skip("DISTSPLAT_EXPECT_GSPLAT unset: the installed gsplat is whichever it is")
    gsplat = pytest.importorskip("gsplat")
    assert gsplat.__version__ == expected, gsplat.__file__
