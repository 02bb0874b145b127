"""Rank functions for views rendered by every rank's shard (tests/multiproc/test_sharded_views.py)."""

from __future__ import annotations

from typing import Any

import torch

from distsplat_ns.parallel.view_render import render_view_collectively
from tests.helpers.model_factory import make_cameras, make_model, take_initial_shard_

NUM_POINTS = 300


#: The colour nerfstudio's viewer sets on rank 0's model (``set_background``) for its frames:
#: what a ``background_color="random"`` model composites eval and viewer frames over.
VIEWER_BACKGROUND = (0.9, 0.1, 0.4)


def view_model(dtype: str, **overrides: Any) -> Any:
    """The test scene's model, in eval mode (every rank builds the same one)."""
    model = make_model(1, num_points=NUM_POINTS, param_dtype=dtype, rendering_backend="reference", **overrides)
    model.eval()
    return model


def whole_model_view(dtype: str, camera_index: int, viewer_background: bool = False) -> dict[str, torch.Tensor]:
    """One process's ``get_outputs`` of the whole model (no view renderer: nerfstudio's path);
    with ``viewer_background``, a random-background model with the viewer's colour set."""
    model = view_model(dtype, background_color="random") if viewer_background else view_model(dtype)
    if viewer_background:
        model.set_background(torch.tensor(VIEWER_BACKGROUND))
    with torch.no_grad():
        out = model.get_outputs(make_cameras(4)[camera_index : camera_index + 1])
    return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}


def sharded_view(ctx: Any, dtype: str, camera_index: int) -> Any:
    """This rank's shard renders the camera with every other rank's (the image on rank 0)."""
    model = view_model(dtype)
    take_initial_shard_(model, ctx.rank, ctx.world_size)
    out = render_view_collectively(ctx, model, make_cameras(4)[camera_index : camera_index + 1])
    return None if out is None else {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}


def grouped_step(ctx: Any, group_cameras: int, dtype: str) -> dict[str, Any]:
    """One sharded step's forward and backward (``pipeline/band_pass.py:BandPass.run``) on a
    batch of 3 cameras in groups of ``group_cameras``, bands cut across the 2 ranks; returns the
    rank's loss share and, with its Gaussians' ids, their gradients and densification statistics."""

    from distsplat_ns.balance.bands import Band
    from distsplat_ns.balance.planner import StepPlan
    from distsplat_ns.data.step_batch import StepImages
    from distsplat_ns.distributed.gradient_sum import GradientSum
    from distsplat_ns.parallel.sharded import ShardedMode
    from distsplat_ns.pipeline.band_pass import BandPass
    from distsplat_ns.utils.cameras import BatchCameras
    from distsplat_ns.utils.timing import PhaseClock
    from tests.helpers.model_factory import HEIGHT, WIDTH, make_images

    batch = [0, 1, 2]
    model = make_model(len(batch), num_points=NUM_POINTS, param_dtype=dtype, rendering_backend="reference")
    take_initial_shard_(model, ctx.rank, ctx.world_size)
    model.step = 5
    mode = ShardedMode(ctx, model)
    mode.group_cameras = group_cameras
    cuts = [[(0, 0, HEIGHT), (1, 0, 20)], [(1, 20, HEIGHT), (2, 0, HEIGHT)]]
    bands = [[Band(*b, tile_size=1) for b in rank] for rank in cuts]
    plan = StepPlan(bands=bands, predicted_costs=[0.0] * len(bands), heights_px=[HEIGHT] * len(batch), downscale=1)
    positions = plan.positions(ctx.rank)
    images = make_images(len(batch))
    step_images = StepImages(
        positions, [images[p] for p in positions], [None] * len(positions), wait_s=0.0, num_fetched_on_demand=0
    )
    # No gradient sum: the test reads each rank's own gradients.
    cameras = BatchCameras.of(make_cameras(len(batch)))
    result, sources, _ = BandPass(ctx, mode, model).run(
        5, cameras, plan, step_images, PhaseClock(), GradientSum(lambda: 0)
    )
    info, _ = mode.statistics(sources, len(batch), [(WIDTH, HEIGHT)] * len(batch))
    grads = {n: p.grad.detach().clone() for n, p in model.gauss_params.items()}
    return {
        "loss": result.loss.detach(),
        "ids": model.gauss_ids.clone(),
        "grads": grads,
        "means2d_grad": info["means2d"].grad.detach().clone(),
        "absgrad": info["means2d"].absgrad.detach().clone(),
        "radii": info["radii"].clone(),
        "num_groups": len(sources),
        "num_tile_work": len(result.band_tile_work),
    }


def viewer_frame_at_step_boundary(ctx: Any, dtype: str, camera_index: int) -> Any:
    """Rank 0's viewer thread asks its model for a frame mid-step; every rank then reaches the
    step's cost all-gather (``pipeline/step_balance.py:StepBalance.measure``), which carries rank 0's
    flag, and renders the request right after it, every rank over rank 0's viewer
    background. Returns, on rank 0, the frame the viewer thread got and whether the model was back
    in training mode; on other ranks, whether they rendered (served) it."""
    import threading
    import time
    from types import SimpleNamespace

    from distsplat_ns.balance.planner import BandPlanner
    from distsplat_ns.parallel.sharded import ShardedMode
    from distsplat_ns.pipeline.step_balance import StepBalance
    from distsplat_ns.utils.timing import PhaseClock
    from tests.helpers.model_factory import HEIGHT

    model = view_model(dtype, background_color="random")  # splatfacto's default: frames over the viewer's colour
    take_initial_shard_(model, ctx.rank, ctx.world_size)
    model.train()  # mid-training
    mode = ShardedMode(ctx, model)
    balance = StepBalance(
        ctx,
        BandPlanner("balanced", [HEIGHT] * 4),
        mode,
        model,
        host_cameras=lambda ids: make_cameras(4)[torch.tensor(list(ids))],
    )
    plan = balance.planner.plan([0], ctx.world_size, 1)
    result = SimpleNamespace(band_tile_work=[(b, torch.ones(b.num_cost_rows(HEIGHT), 2)) for b in plan.bands[ctx.rank]])
    frame: dict[str, Any] = {}
    viewer = None
    if ctx.rank == 0:
        camera = make_cameras(4)[camera_index : camera_index + 1]
        model.set_background(torch.tensor(VIEWER_BACKGROUND))  # the viewer's choice, on rank 0's model only
        viewer = threading.Thread(target=lambda: frame.update(out=model.get_outputs(camera)))
        viewer.start()
        while mode.view_requests._pending is None:  # the viewer thread has posted its camera
            time.sleep(0.01)
    served_before = mode.view_requests.num_served
    clock = PhaseClock()
    balance.measure(plan, [0], result, None, clock)
    if viewer is None:
        return {"served_here": True}
    viewer.join(timeout=60)
    out = frame["out"]
    return {
        "frame": {k: v for k, v in out.items() if isinstance(v, torch.Tensor)},
        "training": model.training,
        "served": mode.view_requests.num_served - served_before,
    }


def eval_metrics(ctx: Any, dtype: str, overrides: dict | None = None) -> dict[str, Any]:
    """``DistSplatPipeline``'s eval on this rank's shard (sharded mode; at one rank the model is
    whole and renders itself): one eval image's metrics and the average over every eval image,
    on the eval cameras 1 and 3 with fixed target images; ``overrides``: model config fields.
    Also, on rank 0, the one image's render and target (``"rgb"``, ``"gt"``)."""
    from types import SimpleNamespace

    from distsplat_ns.parallel.sharded import ShardedMode
    from distsplat_ns.pipeline.distsplat_pipeline import DistSplatPipeline
    from distsplat_ns.pipeline.evaluation import PipelineEval
    from tests.helpers.model_factory import make_images

    model = make_model(
        1, num_points=NUM_POINTS, param_dtype=dtype, rendering_backend="reference", lpips="off", **(overrides or {})
    )
    take_initial_shard_(model, ctx.rank, ctx.world_size)
    cameras, images = make_cameras(4), make_images(4, seed=3)
    views = [(cameras[i : i + 1], {"image": images[i], "image_idx": i}) for i in (1, 3)]
    pipe = object.__new__(DistSplatPipeline)  # only what the eval methods read
    torch.nn.Module.__init__(pipe)
    pipe.ctx, pipe.mode, pipe._model = ctx, ShardedMode(ctx, model), model
    pipe.datamanager = SimpleNamespace(fixed_indices_eval_dataloader=views, next_eval_image=lambda step: views[1])
    pipe.evaluation = PipelineEval(pipe.datamanager, model)
    one, images_out = pipe.get_eval_image_metrics_and_images(step=7)
    average = pipe.get_average_eval_image_metrics(step=7)
    out = {"one": one, "average": average, "has_image": "img" in images_out, "training": model.training}
    if "img" in images_out:  # the combined image: target left, render right
        width = images_out["img"].shape[1] // 2
        out["gt"], out["rgb"] = images_out["img"][:, :width].clone(), images_out["img"][:, width:].clone()
    return out
