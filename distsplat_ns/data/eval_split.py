"""The eval split of ``ParallelFullImageDatamanager``: its files checked at set-up, a random eval
image at a time (each once before any repeats, seeded alike on every rank), and every eval image
decoded lazily by DataLoader workers (nerfstudio's ``fixed_indices_eval_dataloader``).

``EvalSplit`` is an object the datamanager (``data/datamanager.py``) builds and calls from
nerfstudio's eval methods; it is given how to check and load the split's files and how an image
reaches the device, and keeps its loader and its draw order.

Shape legend: ``H``, ``W``: pixels. ``C``: cameras.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from nerfstudio.cameras.cameras import Cameras
from nerfstudio.data.datasets.base_dataset import InputDataset
from torch.utils.data import DataLoader

from distsplat_ns.data.image_loader import ImageLoader
from distsplat_ns.data.stream import IndexedImageDataset
from distsplat_ns.data.workers import WorkerFailure, identity_collate, worker_kwargs

#: ``(index, image, mask)`` -> nerfstudio's batch dict on the device (the datamanager's ``_to_device_data``).
ToDeviceData = Callable[[int, torch.Tensor, torch.Tensor | None], dict]


@dataclass(eq=False)
class EvalSplit:
    """The eval images of one datamanager (see the module docstring).

    Args:
        dataset: The eval ``InputDataset`` (undistorted cameras).
        build_loader: Checks the split's files and returns their loader (called once, at
            :meth:`setup` or on first use).
        to_device_data: An image's batch dict on the device.
        device: Where cameras go.
        num_workers: DataLoader workers of :meth:`all_images` (``eval_num_workers``; 0: in process).
        seed: Seed of the random draw order (the same on every rank).
    """

    dataset: InputDataset
    build_loader: Callable[[], ImageLoader]
    to_device_data: ToDeviceData
    device: torch.device | str
    num_workers: int
    seed: int
    _loader: ImageLoader | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        #: Eval images not drawn yet in this round (:meth:`next_image`).
        self.unseen_cameras = list(range(len(self.dataset)))

    def setup(self) -> None:
        """Check the eval files as the training files; they are read from disk when used (once per evaluation)."""
        if self._loader is None and len(self.dataset) > 0:
            self._loader = self.build_loader()

    def loader(self) -> ImageLoader:
        """The split's loader (checked and built on first use).

        Raises:
            RuntimeError: the split has no images.
        """
        if self._loader is None:
            self.setup()
        if self._loader is None:
            raise RuntimeError("the eval split has no images")
        return self._loader

    def next_image(self) -> tuple[Cameras, dict]:
        """A random eval image, each once before any repeats (seeded), decoded in this process.

        Returns:
            ``(camera, data)``: one camera on device, ``{"image": [H, W, C] uint8 on device,
            "image_idx": int, ("mask")}``.
        """
        index = self.unseen_cameras.pop(self._rng.randint(0, len(self.unseen_cameras) - 1))
        if not self.unseen_cameras:
            self.unseen_cameras = list(range(len(self.dataset)))
        image, mask = self.loader().load(index)
        camera = self.dataset.cameras[index : index + 1].to(self.device)
        return camera, self.to_device_data(index, image, mask)

    def all_images(self) -> EvalImages:
        """Every eval image as ``(camera, data)``, decoded lazily by ``num_workers`` workers."""
        return EvalImages(self)


class EvalImages:
    """Sized iterable of ``(camera, data)`` over all eval images (nerfstudio's fixed-indices loader).

    Each iteration starts a DataLoader with the split's ``num_workers`` (started as the training
    workers, ``workers.worker_kwargs``); only the small picklable ``ImageLoader`` reaches the
    workers, never the datamanager. A decode error is raised with the worker's message.
    """

    def __init__(self, split: EvalSplit) -> None:
        self.split = split

    def __len__(self) -> int:
        return len(self.split.dataset)

    def __iter__(self) -> Iterator[tuple[Cameras, dict]]:
        split = self.split
        dataset = IndexedImageDataset(split.loader(), list(range(len(self))))
        num_workers = min(split.num_workers, len(dataset))
        loader = DataLoader(
            dataset, batch_size=None, collate_fn=identity_collate, num_workers=num_workers, **worker_kwargs(num_workers)
        )
        cameras = split.dataset.cameras
        for item in loader:
            if isinstance(item, WorkerFailure):
                item.reraise()
            index, image, mask = item
            yield cameras[index : index + 1].to(split.device), split.to_device_data(index, image, mask)
