"""A view rendered by W sharded ranks (parallel/view_render.py) is one process's render of the
whole model: each rank projects its shard, bands are cut by cost, terms travel by the training
exchange, only band pixels reach rank 0."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import view_fns
from tests.helpers.multiproc import run_ranks


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_view_rendered_by_shards_equals_the_whole_model(world: int, dtype: str) -> None:
    camera_index = 1
    want = view_fns.whole_model_view(dtype, camera_index)
    got = run_ranks(view_fns.sharded_view, world, dtype, camera_index)
    assert all(g is None for g in got[1:]), "only rank 0 gets the image"
    image = got[0]
    assert set(image) == set(want)
    # The same Gaussians, composited in the same (depth, then global-id) order per pixel by the
    # same reference rasterizer: the band render differs from the whole image only in the
    # rasterizer's chunking of its tile grid (rows offset by the band start), so float64 agrees to
    # rounding (1e-12) and float32 to 1e-5 of the largest value.
    tol = 1e-12 if dtype == "float64" else 1e-5
    for name, ref in want.items():
        assert image[name].shape == ref.shape, name
        scale = ref.abs().max().clamp_min(1e-12)
        assert ((image[name] - ref).abs().max() / scale).item() <= tol, name
    assert want["accumulation"].max() > 0.5, "the view sees the scene"
