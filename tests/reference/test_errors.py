"""Bad settings fail early with a one-line ValueError naming the argument."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from distsplat_ns.rendering import project, rasterization, rasterize_rows, resolve_backend
from tests.helpers.scenes import random_scene


def _scene():
    return random_scene(num_gaussians=10, num_cameras=2, width=20, height=16)


def test_gsplat_backend_on_cpu_tensors_is_rejected():
    with pytest.raises(ValueError, match=r"backend='gsplat'.*device 'cpu'"):
        rasterization(**_scene().kwargs(), packed=False, backend="gsplat")


def test_project_with_gsplat_backend_on_cpu_is_rejected():
    with pytest.raises(ValueError, match=r"backend='gsplat'.*cpu"):
        project(**_scene().kwargs(), backend="gsplat")


def test_unknown_backend_is_rejected():
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("cuda", torch.device("cpu"))


def test_auto_backend_on_cpu_is_reference():
    assert project(**_scene().kwargs()).backend == "reference"


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        ({"render_mode": "D"}, "render_mode"),
        ({"rasterize_mode": "fancy"}, "rasterize_mode"),
        ({"sh_degree": 1}, "colors"),
        ({"opacities": torch.ones(9)}, "opacities"),
        ({"Ks": torch.eye(3)[None]}, "Ks"),
    ],
    ids=["render_mode", "rasterize_mode", "sh_without_coeffs", "opacities_shape", "Ks_count"],
)
def test_bad_project_arguments_are_rejected(overrides, pattern):
    kwargs = dict(_scene().kwargs(), **overrides)
    with pytest.raises(ValueError, match=pattern):
        project(**kwargs)


@pytest.mark.parametrize(
    "row_starts, num_rows, pattern",
    [([0], 8, "row_starts"), ([0, 0], 0, "num_rows"), (torch.zeros(2, 1, dtype=torch.int64), 8, "row_starts")],
    ids=["too_few_starts", "no_rows", "2d_starts"],
)
def test_bad_band_arguments_are_rejected(row_starts, num_rows, pattern):
    proj = project(**_scene().kwargs())
    with pytest.raises(ValueError, match=pattern):
        rasterize_rows(proj, row_starts, num_rows)


def test_backgrounds_of_wrong_shape_are_rejected():
    proj = project(**_scene().kwargs())
    with pytest.raises(ValueError, match="backgrounds"):
        rasterize_rows(proj, [0, 0], 16, backgrounds=torch.zeros(2, 4))


def test_rendering_on_cpu_imports_neither_gsplat_nor_nerfstudio():
    code = textwrap.dedent(
        """
        import sys, torch
        from distsplat_ns.rendering import rasterization
        means = torch.tensor([[0.0, 0.0, 3.0]])
        out = rasterization(means, torch.tensor([[1.0, 0, 0, 0]]), torch.full((1, 3), 0.1), torch.ones(1),
                            torch.ones(1, 3), torch.eye(4)[None], torch.tensor([[[20.0, 0, 8], [0, 20.0, 8], [0, 0, 1]]]),
                            16, 16, packed=False)
        packed = rasterization(means, torch.tensor([[1.0, 0, 0, 0]]), torch.full((1, 3), 0.1), torch.ones(1),
                               torch.ones(1, 3), torch.eye(4)[None], torch.tensor([[[20.0, 0, 8], [0, 20.0, 8], [0, 0, 1]]]),
                               16, 16, packed=True)
        assert torch.equal(packed[0], out[0])
        bad = [m for m in sys.modules if m.split(".")[0] in ("gsplat", "nerfstudio")]
        assert not bad, bad
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True)
