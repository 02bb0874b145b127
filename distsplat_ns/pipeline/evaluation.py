"""Eval of ``DistSplatPipeline``: one eval image's metrics and images, and every eval image's
metrics averaged (nerfstudio's ``VanillaPipeline`` methods, here rendered as the parallel mode says:
by rank 0 alone from the whole model, or by every rank from its shard).

``PipelineEval`` is an object the pipeline (``pipeline/distsplat_pipeline.py``) builds from its datamanager and model
and calls from nerfstudio's eval methods, inside :func:`eval_mode`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torchvision.utils as vutils
from nerfstudio.data.datamanagers.base_datamanager import DataManager

from distsplat_ns.model.distsplat_model import DistSplatModel


@contextmanager
def eval_mode(module: torch.nn.Module) -> Iterator[None]:
    """``module`` in eval mode inside the block, in training mode after it (as nerfstudio's eval methods)."""
    module.eval()
    try:
        yield
    finally:
        module.train()


class PipelineEval:
    """Renders and scores the eval split (see the module docstring).

    Args:
        datamanager: Gives the eval images (``next_eval_image``, ``fixed_indices_eval_dataloader``).
        model: Renders them (``get_outputs_for_camera``) and scores them (``get_image_metrics_and_images``).
    """

    def __init__(self, datamanager: DataManager, model: DistSplatModel) -> None:
        self.datamanager = datamanager
        self.model = model

    def one_image(self, step: int) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """One eval image's metrics and images (nerfstudio's ``get_eval_image_metrics_and_images``),
        on every rank ``mode.evaluates_here`` names; where the view is a collective only rank 0
        gets metrics and images (the others ``{"num_rays": ...}`` and ``{}``).

        **Collective:** where the mode's views are (sharded: every rank, the same eval image: the
        eval order is seeded alike on every rank).
        """
        camera, batch = self.datamanager.next_eval_image(step)
        outputs = self.model.get_outputs_for_camera(camera)
        metrics, images = ({}, {}) if outputs is None else self.model.get_image_metrics_and_images(outputs, batch)
        metrics["num_rays"] = int(camera.height.reshape(-1)[0]) * int(camera.width.reshape(-1)[0])
        return metrics, images

    def average(self, output_path: Path | None = None, get_std: bool = False) -> dict[str, float]:
        """Every eval image's metrics averaged (nerfstudio's ``get_average_eval_image_metrics``
        keys: the metrics, ``num_rays_per_sec``, ``fps``, with ``_std`` when ``get_std``); ``{}``
        on a rank whose mode renders views as collectives but is not rank 0 (it took part in
        every render). With ``output_path``, each image's renders are written there as PNGs.

        **Collective:** as :meth:`one_image`, once per eval image in the fixed eval order.
        """
        per_image: list[dict[str, float]] = []
        if output_path is not None:
            output_path.mkdir(exist_ok=True, parents=True)
        for idx, (camera, batch) in enumerate(self.datamanager.fixed_indices_eval_dataloader):
            start = time.perf_counter()
            outputs = self.model.get_outputs_for_camera(camera=camera)
            if outputs is None:
                continue
            num_rays = int(camera.height.reshape(-1)[0]) * int(camera.width.reshape(-1)[0])
            metrics, images = self.model.get_image_metrics_and_images(outputs, batch)
            if output_path is not None:
                for key, image in images.items():
                    vutils.save_image(image.permute(2, 0, 1).cpu(), output_path / f"eval_{key}_{idx:04d}.png")
            elapsed = max(time.perf_counter() - start, 1e-9)
            metrics["num_rays_per_sec"] = num_rays / elapsed
            metrics["fps"] = 1.0 / elapsed
            per_image.append(metrics)
        averaged: dict[str, float] = {}
        for key in per_image[0] if per_image else []:
            values = torch.tensor([m[key] for m in per_image], dtype=torch.float64)
            if get_std:
                std, mean = torch.std_mean(values)
                averaged[key], averaged[f"{key}_std"] = float(mean), float(std)
            else:
                averaged[key] = float(values.mean())
        return averaged
