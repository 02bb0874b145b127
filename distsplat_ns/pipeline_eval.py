"""Eval of ``DistSplatPipeline``: one eval image's metrics and images, and every eval image's
metrics averaged (nerfstudio's ``VanillaPipeline`` methods, here rendered as the parallel mode says:
by rank 0 alone from the whole model, or by every rank from its shard).

A mixin of ``DistSplatPipeline`` (``pipeline.py``), ahead of ``VanillaPipeline``'s methods; it reads
the pipeline's ``datamanager`` and ``model``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
import torchvision.utils as vutils


class PipelineEval:
    """``get_eval_image_metrics_and_images`` and ``get_average_eval_image_metrics`` of ``DistSplatPipeline``."""

    def get_eval_image_metrics_and_images(self, step: int) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """One eval image's metrics and images (nerfstudio's), on every rank ``mode.evaluates_here``
        names; where the view is a collective only rank 0 gets metrics and images (the others
        ``{"num_rays": ...}`` and ``{}``).

        **Collective:** where the mode's views are (sharded: every rank, the same eval image: the
        eval order is seeded alike on every rank).
        """
        self.eval()
        try:
            camera, batch = self.datamanager.next_eval_image(step)
            outputs = self.model.get_outputs_for_camera(camera)
            metrics, images = ({}, {}) if outputs is None else self.model.get_image_metrics_and_images(outputs, batch)
            metrics["num_rays"] = int(camera.height.reshape(-1)[0]) * int(camera.width.reshape(-1)[0])
        finally:
            self.train()
        return metrics, images

    def get_average_eval_image_metrics(
        self, step: int | None = None, output_path: Path | None = None, get_std: bool = False
    ) -> dict[str, float]:
        """Every eval image's metrics averaged (nerfstudio's keys: the metrics, ``num_rays_per_sec``,
        ``fps``, with ``_std`` when ``get_std``); ``{}`` on a rank whose mode renders views as
        collectives but is not rank 0 (it took part in every render).

        **Collective:** as :meth:`get_eval_image_metrics_and_images`, once per eval image in the
        fixed eval order.
        """
        self.eval()
        per_image: list[dict[str, float]] = []
        try:
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
        finally:
            self.train()
        averaged: dict[str, float] = {}
        for key in per_image[0] if per_image else []:
            values = torch.tensor([m[key] for m in per_image], dtype=torch.float64)
            if get_std:
                std, mean = torch.std_mean(values)
                averaged[key], averaged[f"{key}_std"] = float(mean), float(std)
            else:
                averaged[key] = float(values.mean())
        return averaged
