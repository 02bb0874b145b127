"""One training step's data as the pipeline sees it: asked for once, in two parts.

The plan needs the batch's camera ids before it knows which images this rank renders. So
``ParallelFullImageDatamanager.step_batch(step)`` hands one ``StepBatch``: its ``camera_ids`` at
once (``order.batch_camera_ids``), then ``on_device(positions)``: the images (and masks) prefetched
for this rank, any other decoded on demand, all uploaded. The stream is read only then, so the plan
runs while the workers decode.

Pure: torch and the sibling pure modules.

Shape legend: ``H``, ``W``: pixels.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from distsplat_ns.data.reader import TrainBatch

#: Decodes the given dataset indices in this process at the step's resolution: one
#: ``(image, mask)`` each (``ParallelFullImageDatamanager.get_images_and_masks``).
Decode = Callable[[list[int]], list[tuple[torch.Tensor, torch.Tensor | None]]]
#: Moves images and masks to the device (``ParallelFullImageDatamanager.to_device``).
Upload = Callable[[list[torch.Tensor], list[torch.Tensor | None]], tuple[list[torch.Tensor], list[torch.Tensor | None]]]


@dataclass(frozen=True)
class StepImages:
    """This rank's images of one step, on the device.

    Attributes:
        positions: The batch positions this rank renders, increasing.
        images: One per position. `[H, W, 3 or 4]`, uint8, on the device.
        masks: One per position: `[H, W, 1]` bool on the device, or None.
        wait_s: Seconds the step waited for them on the host: the stream's wait plus the
            on-demand decodes (the upload is asynchronous and not counted).
        num_fetched_on_demand: Images the stream had not prefetched for this rank (the balanced
            cut moved a band of them here), decoded in this process with their masks.
    """

    positions: list[int]
    images: list[torch.Tensor]
    masks: list[torch.Tensor | None]
    wait_s: float
    num_fetched_on_demand: int


class StepBatch:
    """One step's data for this rank, handed once by the datamanager (see the module docstring).

    Args:
        step: The training step.
        camera_ids: The global batch's dataset indices, in batch order (the same on every rank).
        receive: Waits for and returns the stream's prefetched ``TrainBatch`` of ``step``.
        decode: Decodes images the stream did not deliver, at ``step``'s resolution.
        upload: Moves host images and masks to the device without blocking.

    Invariants:
        ``on_device`` is called at most once (it reads the stream's next batch).
    """

    def __init__(
        self, step: int, camera_ids: list[int], receive: Callable[[], TrainBatch], decode: Decode, upload: Upload
    ) -> None:
        self.step = step
        self.camera_ids = camera_ids
        self._receive = receive
        self._decode = decode
        self._upload = upload
        self._taken = False

    def on_device(self, positions: Sequence[int]) -> StepImages:
        """The images and masks at batch ``positions`` on the device, in that order.

        An image the stream prefetched is taken from it; one the plan gave this rank beyond
        those is decoded here with its mask, so it trains exactly as a streamed one.

        Args:
            positions: Batch positions this rank renders (the plan's), increasing.

        Raises:
            RuntimeError: Called twice for one step.
            ValueError: A position outside the batch.

        **Host sync:** none (the uploads are asynchronous: ``upload.DeviceUploader``).
        """
        if self._taken:
            raise RuntimeError(f"the images of step {self.step} were already taken")
        bad = [p for p in positions if not 0 <= p < len(self.camera_ids)]
        if bad:
            raise ValueError(f"positions must lie in [0, {len(self.camera_ids)}), the batch, got {bad}")
        self._taken = True
        streamed = self._receive()
        images = dict(zip(streamed.positions, streamed.images, strict=True))
        masks = dict(zip(streamed.positions, streamed.masks, strict=True))
        missing = [p for p in positions if p not in images]
        wait_s = streamed.wait_s
        if missing:
            start = time.perf_counter()
            for p, (image, mask) in zip(missing, self._decode([self.camera_ids[p] for p in missing]), strict=True):
                images[p], masks[p] = image, mask
            wait_s += time.perf_counter() - start
        on_device, masks_on_device = self._upload([images[p] for p in positions], [masks.get(p) for p in positions])
        return StepImages(list(positions), on_device, masks_on_device, wait_s, len(missing))
