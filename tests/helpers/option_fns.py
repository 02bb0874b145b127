"""Rank functions for splatfacto options that used to be refused (tests/multiproc/test_training_options.py):
depth during training through each parallel mode."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import torch

from distsplat_ns.utils.cameras import BatchCameras
from tests.helpers.model_factory import HEIGHT, make_cameras, make_images, make_model, take_initial_shard_

NUM_POINTS = 300


def _band_step(
    ctx: Any, model: Any, parallel: str, cameras: Any, splits: list, camera_ids: Any = None
) -> tuple[Any, Any]:
    """``model`` (cut to this rank's shard when ``parallel`` is sharded) through one forward and
    backward of the bands ``splits`` (per rank: ``(position, first_row_px, end_row_px)``) of
    ``cameras`` (2, with make_images' images) at step 5; returns ``(mode, BandRenderResult)``."""
    from distsplat_ns.balance.bands import Band
    from distsplat_ns.model.band_backward import backward_bands
    from distsplat_ns.parallel import parallel_mode_class
    from tests.helpers.rank_fns import plan_halo_exchange

    if parallel == "sharded":
        take_initial_shard_(model, ctx.rank, ctx.world_size)
    mode = parallel_mode_class(parallel)(ctx, model)
    images = make_images(2)
    plan = SimpleNamespace(bands=[[Band(*b, tile_size=1) for b in rank_bands] for rank_bands in splits])
    bands = plan.bands[ctx.rank]
    positions = sorted({b.position for b in bands})
    model.step = 5
    batch_cameras = BatchCameras.of(cameras)  # one object for both, as in the pipeline
    source, _ = mode.projections(batch_cameras, plan, 5, contextlib.nullcontext)
    result = model.forward_bands(
        batch_cameras,
        positions,
        [images[p] for p in positions],
        [None] * len(positions),
        bands,
        5,
        mode.regularizer_share(mode.num_gaussians_total()),
        source,
        **({} if camera_ids is None else {"camera_ids": [camera_ids[p] for p in positions]}),
    )
    backward_bands(
        result.loss, result.pixel_links, plan_halo_exchange(ctx, model, cameras, plan.bands, 5), source.anchors
    )
    return mode, result


def training_depth(ctx: Any, parallel: str, splits: list) -> list[dict[str, Any]]:
    """One training forward and backward with ``output_depth_during_training`` through the mode
    ``parallel`` (bands per rank from ``splits``: ``(position, first_row_px, end_row_px)``), the
    depth filled as ``DistSplatPipeline.train_step`` fills it (``BandPass.fill_depths``); returns this rank's bands' depth rows
    as ``{"position", "first_row", "depth"}`` and, on rank 0, ``"whole"``: ``get_outputs``' depth
    of each batch camera (splatfacto's training path: whole image, one process)."""
    from distsplat_ns.pipeline.band_pass import BandPass

    model = make_model(
        2,
        num_points=NUM_POINTS,
        param_dtype="float64",
        rendering_backend="reference",
        output_depth_during_training=True,
    )
    whole = None
    if ctx.rank == 0:
        with torch.no_grad():
            whole = [model.get_outputs(make_cameras(2)[i : i + 1])["depth"].clone() for i in range(2)]
    mode, result = _band_step(ctx, model, parallel, make_cameras(2), splits)
    BandPass(ctx, mode, model).fill_depths(result, 2)
    rows = [
        {"position": d.band.position, "first_row": d.band.first_row_px, "depth": d.depth.clone()}
        for d in result.band_depths
    ]
    return [{"rows": rows, "whole": whole, "height": HEIGHT}]


POSE_CAMERA_IDS = (5, 2)
"""Training-camera index of batch positions 0 and 1 (of make_model's 8 cameras)."""


def pose_step(ctx: Any, parallel: str, splits: list, mode_name: str = "SO3xR3") -> dict[str, Any]:
    """One step's forward, backward and gradient reduction through the mode ``parallel`` with the
    camera optimizer on (float64); the adjustments start perturbed from zero (a zero adjustment
    hides a wrong composition) and the batch's cameras carry their training ids. Returns the batch
    loss, the adjustments' reduced gradient, the logged regulariser share and, keyed by global id,
    this rank's Gaussians' gradients."""
    from nerfstudio.cameras.camera_optimizers import CameraOptimizerConfig

    from distsplat_ns.distributed.collectives import all_reduce_sum_
    from distsplat_ns.model.camera_adjust import with_train_camera_ids

    model = make_model(
        2,
        num_points=NUM_POINTS,
        param_dtype="float64",
        rendering_backend="reference",
        camera_optimizer=CameraOptimizerConfig(mode=mode_name),
    )
    with torch.no_grad():
        adjustment = model.camera_optimizer.pose_adjustment
        adjustment += 0.03 * torch.randn(
            adjustment.shape, generator=torch.Generator().manual_seed(11), dtype=adjustment.dtype
        )
    cameras = with_train_camera_ids(make_cameras(2), POSE_CAMERA_IDS)
    mode, result = _band_step(ctx, model, parallel, cameras, splits, POSE_CAMERA_IDS)
    named = [(n.removeprefix("gauss_params."), p) for n, p in model.named_parameters() if p.requires_grad]
    mode.reduce_gradients(named)
    grads = {
        n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
        for n, p in model.gauss_params.items()
    }
    return {
        "loss": all_reduce_sum_(ctx, result.loss.detach().clone().reshape(1)).reshape(()),
        "pose_grad": model.camera_optimizer.pose_adjustment.grad.detach().clone(),
        "regularizer": result.loss_terms["camera_opt_regularizer"].clone(),
        "ids": model.gauss_ids.clone(),
        "grads": grads,
    }
