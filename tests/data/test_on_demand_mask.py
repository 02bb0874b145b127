"""An image the stream did not deliver, decoded on demand for the pipeline
(``data/step_batch.py:StepBatch.on_device`` -> ``get_images_and_masks``), trains with its mask exactly as a streamed one: its masked pixels get
no gradient (issue 27; before, that path kept the image and dropped the mask)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig
from nerfstudio.engine.optimizers import Optimizers

import distsplat_ns.pipeline.band_pass as render_module
import distsplat_ns.pipeline.distsplat_pipeline as pipeline_module
from distsplat_ns.data.datamanager import ParallelFullImageDatamanagerConfig
from distsplat_ns.data.reader import TrainBatch
from distsplat_ns.registry import distsplat_trainer_config
from tests.helpers.data_fixtures import write_nerfstudio_scene


def _masked_pipeline(scene: Path) -> tuple[pipeline_module.DistSplatPipeline, Optimizers]:
    config = distsplat_trainer_config()
    config.pipeline.batch_size = 2
    config.pipeline.datamanager = ParallelFullImageDatamanagerConfig(
        dataparser=NerfstudioDataParserConfig(data=scene, load_3D_points=False), num_workers=0, eval_num_workers=0
    )
    model = config.pipeline.model
    model.num_downscales = 0  # full resolution from the first step: the mask is the file's
    model.num_random = 300
    model.background_color = "black"
    torch.manual_seed(0)
    pipeline = config.pipeline.setup(device="cpu", seed=3)
    return pipeline, Optimizers(config.optimizers, pipeline.get_param_groups())


@pytest.fixture()
def on_demand_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[pipeline_module.DistSplatPipeline, list, dict]:
    """One training step whose images all come through the on-demand path; returns the pipeline,
    the per-band ``(position, first row, loss gradient of the rendered pixels)`` and each
    position's expected mask."""
    scene = write_nerfstudio_scene(tmp_path / "scene", num_frames=6, size_hw=(40, 48), with_masks=True)
    pipeline, optimizers = _masked_pipeline(scene)
    manager = pipeline.datamanager
    streamed = manager.next_train_batch

    def nothing_streamed(step: int) -> TrainBatch:
        batch = streamed(step)  # the stream advances as usual; its images are withheld
        return TrainBatch(step=step, camera_indices=[], positions=[], images=[], masks=[], wait_s=batch.wait_s)

    monkeypatch.setattr(manager, "next_train_batch", nothing_streamed)
    grads: list = []
    backward = render_module.backward_bands

    def recording_backward(loss, links, exchange, anchors=(), **kwargs):
        backward(loss, links, exchange, anchors=anchors, **kwargs)
        grads.extend((link.position, link.first_row_px, link.leaf.grad.detach().clone()) for link in links)

    monkeypatch.setattr(render_module, "backward_bands", recording_backward)
    pipeline.train_step(0, optimizers)
    batch = manager.batch_camera_ids(0)
    loader = manager._train_loader
    masks = {p: loader.load(i)[1] for p, i in enumerate(batch)}
    return pipeline, grads, masks


def test_every_image_of_the_step_came_on_demand(on_demand_step) -> None:
    pipeline, grads, _ = on_demand_step
    assert pipeline.images_fetched_on_demand == 2
    assert grads, "no band was rendered"


def test_masked_pixels_of_an_on_demand_image_get_no_gradient(on_demand_step) -> None:
    _, grads, masks = on_demand_step
    for position, first_row, grad in grads:
        mask = masks[position]
        assert mask is not None and not bool(mask.all()) and bool(mask.any()), "the test needs a partial mask"
        rows = mask[first_row : first_row + grad.shape[0], :, 0].numpy()
        pixel_grad = grad.abs().sum(dim=-1).numpy()
        assert np.all(pixel_grad[~rows] == 0.0), f"position {position}: masked pixels got a gradient"
        assert np.any(pixel_grad[rows] != 0.0), f"position {position}: unmasked pixels got none"
