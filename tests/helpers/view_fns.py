"""Rank functions for views rendered by every rank's shard (tests/multiproc/test_sharded_views.py)."""

from __future__ import annotations

from typing import Any, Dict

import torch

from distsplat_ns.parallel.shard_rows import take_initial_shard_
from distsplat_ns.parallel.view_render import render_view_collectively
from tests.helpers.model_factory import make_cameras, make_model

NUM_POINTS = 300


def view_model(dtype: str) -> Any:
    """The test scene's model, in eval mode (every rank builds the same one)."""
    model = make_model(1, num_points=NUM_POINTS, param_dtype=dtype, rendering_backend="reference")
    model.eval()
    return model


def whole_model_view(dtype: str, camera_index: int) -> Dict[str, torch.Tensor]:
    """One process's ``get_outputs`` of the whole model (no view renderer: nerfstudio's path)."""
    model = view_model(dtype)
    with torch.no_grad():
        out = model.get_outputs(make_cameras(4)[camera_index : camera_index + 1])
    return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}


def sharded_view(ctx: Any, dtype: str, camera_index: int) -> Any:
    """This rank's shard renders the camera with every other rank's (the image on rank 0)."""
    model = view_model(dtype)
    take_initial_shard_(model, ctx.rank, ctx.world_size)
    out = render_view_collectively(ctx, model, make_cameras(4)[camera_index : camera_index + 1])
    return None if out is None else {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}
