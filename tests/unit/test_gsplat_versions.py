"""rendering/gsplat_versions.py: the table of gsplat 1.4.0 -> 1.5.3 call differences.

The table is checked for every release of the tested range, and against the installed gsplat: its
keywords must be that gsplat's ``isect_tiles`` parameters, and its radii conversions must give what
that gsplat's own PyTorch reference (``gsplat/cuda/_torch_impl.py``) returns and accepts. CI runs
this file on gsplat 1.4.0 (scripts/test.sh) and 1.5.3 (scripts/test_gsplat_next.sh).
"""

from __future__ import annotations

import inspect
import os

import pytest
import torch

from distsplat_ns.rendering import gsplat_backend
from distsplat_ns.rendering.gsplat_versions import GsplatApi, gsplat_api, parse_version
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
    "version, per_axis, image_ids",
    [
        ("1.4.0", False, False),
        ("1.4.9", False, False),
        ("1.5.0", True, False),
        ("1.5.2", True, False),
        ("1.5.3", True, True),
    ],
)
def test_each_difference_starts_at_its_release(version, per_axis, image_ids):
    api = gsplat_api(version)
    assert (api.radii_per_axis, api.image_ids) == (per_axis, image_ids)
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


def test_the_expected_gsplat_is_the_one_imported():
    # scripts/test_gsplat_next.sh sets DISTSPLAT_EXPECT_GSPLAT: fails if its gsplat is not the one in use.
    expected = os.environ.get("DISTSPLAT_EXPECT_GSPLAT")
    if expected is None:
        pytest.skip("DISTSPLAT_EXPECT_GSPLAT unset: the installed gsplat is whichever it is")
    gsplat = pytest.importorskip("gsplat")
    assert gsplat.__version__ == expected, gsplat.__file__
