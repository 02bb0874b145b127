"""The eval split of ``ParallelFullImageDatamanager``: its files checked at set-up, a random eval
image at a time (each once before any repeats, seeded alike on every rank), and every eval image
decoded lazily by DataLoader workers (nerfstudio's ``fixed_indices_eval_dataloader``).

``EvalSplit`` is a mixin of ``ParallelFullImageDatamanager`` (``data/datamanager.py``), ahead of
nerfstudio's ``DataManager``; it reads the manager's ``eval_dataset``, ``_eval_specs``,
``_eval_loader``, ``_eval_rng``, ``eval_unseen_cameras``, ``_build_loader``, ``_to_device_data``,
``device`` and ``config``.

Shape legend: ``H``, ``W``: pixels. ``C``: cameras.
"""

from __future__ import annotations

from collections.abc import Iterator

from nerfstudio.cameras.cameras import Cameras
from torch.utils.data import DataLoader

from distsplat_ns.data.image_loader import ImageLoader
from distsplat_ns.data.stream import IndexedImageDataset
from distsplat_ns.data.workers import WorkerFailure, identity_collate, worker_kwargs


class EvalSplit:
    """The eval methods of ``ParallelFullImageDatamanager`` (see the module docstring)."""

    def setup_eval(self) -> None:
        """Check the eval files as the training files; they are read from disk when used (once per evaluation)."""
        if self._eval_loader is None and len(self.eval_dataset) > 0:
            self._eval_loader = self._build_loader(self.eval_dataset, self._eval_specs, 0, "eval images")

    def _require_eval_loader(self) -> ImageLoader:
        if self._eval_loader is None:
            self.setup_eval()
        if self._eval_loader is None:
            raise RuntimeError("the eval split has no images")
        return self._eval_loader

    def next_eval(self, step: int) -> tuple[Cameras, dict]:
        """A random eval image (see ``next_eval_image``)."""
        return self.next_eval_image(step=step)

    def next_eval_image(self, step: int) -> tuple[Cameras, dict]:
        """A random eval image, each once before any repeats (seeded), decoded in this process.

        Returns:
            ``(camera, data)``: one camera on device, ``{"image": [H, W, C] uint8 on device,
            "image_idx": int, ("mask")}``.
        """
        del step
        index = self.eval_unseen_cameras.pop(self._eval_rng.randint(0, len(self.eval_unseen_cameras) - 1))
        if not self.eval_unseen_cameras:
            self.eval_unseen_cameras = list(range(len(self.eval_dataset)))
        image, mask = self._require_eval_loader().load(index)
        camera = self.eval_dataset.cameras[index : index + 1].to(self.device)
        return camera, self._to_device_data(index, image, mask)

    @property
    def fixed_indices_eval_dataloader(self) -> EvalImages:
        """Every eval image as ``(camera, data)``, decoded lazily by ``eval_num_workers`` workers."""
        return EvalImages(self)


class EvalImages:
    """Sized iterable of ``(camera, data)`` over all eval images (nerfstudio's fixed-indices loader).

    Each iteration starts a DataLoader with the manager's ``eval_num_workers`` (started as the
    training workers, ``workers.worker_kwargs``); only the small picklable ``ImageLoader`` reaches
    the workers, never the datamanager. A decode error is raised with the worker's message.
    """

    def __init__(self, manager: EvalSplit) -> None:
        self.manager = manager

    def __len__(self) -> int:
        return len(self.manager.eval_dataset)

    def __iter__(self) -> Iterator[tuple[Cameras, dict]]:
        manager = self.manager
        dataset = IndexedImageDataset(manager._require_eval_loader(), list(range(len(self))))
        num_workers = min(manager.config.eval_num_workers, len(dataset))
        loader = DataLoader(dataset, batch_size=None, collate_fn=identity_collate, num_workers=num_workers, **worker_kwargs(num_workers))
        cameras = manager.eval_dataset.cameras
        for item in loader:
            if isinstance(item, WorkerFailure):
                item.reraise()
            index, image, mask = item
            yield cameras[index : index + 1].to(manager.device), manager._to_device_data(index, image, mask)
