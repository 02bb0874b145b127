"""The training image stream: an IterableDataset whose DataLoader workers decode each rank's share.

Pure: torch only (plus the sibling pure modules). What runs in the workers: ``ImageBatchStream``
(training) and ``IndexedImageDataset`` (eval); the consumer side is ``reader.py``, how the workers
start and end is ``workers.py``, the shared memory they decode into is ``slots.py``. Worker ``w`` of
``K`` decodes the ``j``-th of this rank's positions of step ``t`` when ``(j + t) % K == w``, and
every worker yields exactly one ``StepPart`` per step (a decode error travels in it as
``workers.WorkerFailure``); no collate (``batch_size=None``). Why: docs/data.md, "Sampling and
sharding".

Shape legend: ``H``, ``W``: pixels. ``B``: images per step over all ranks.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from distsplat_ns.data.image_loader import ImageLoader
from distsplat_ns.data.order import ContiguousAssigner, batch_camera_ids
from distsplat_ns.data.slots import DecodeSlots, SlotRef
from distsplat_ns.data.workers import WorkerFailure
from distsplat_ns.utils.logging import get_logger

_LOGGER = get_logger(__name__)


class Assigner(Protocol):
    """Which positions of a step's global batch a rank must have decoded (see ``ContiguousAssigner``)."""

    def positions_for_rank(self, step: int, batch: list[int], rank: int, world_size: int) -> list[int]: ...


@dataclass
class StepPart:
    """What one worker decoded for one step (internal to the stream and its reader)."""

    step: int
    worker_id: int
    positions: list[int]
    camera_indices: list[int]
    images: list  # torch.Tensor, or SlotRef for pixels left in a decode slot
    masks: list[torch.Tensor | None]
    skipped_indices: list[int]
    decode_s: float
    slot_index: int = -1
    failure: WorkerFailure | None = None


def worker_positions(positions: list[int], step: int, worker_id: int, num_workers: int) -> list[int]:
    """The positions of ``positions`` that worker ``worker_id`` decodes at ``step`` (rotating split)."""
    return [p for j, p in enumerate(positions) if (j + step) % num_workers == worker_id]


class ImageBatchStream(IterableDataset):
    """Infinite stream of ``StepPart``s for one rank, starting at ``start_step``.

    Args:
        loader: Decodes one image (its stores are shared with every worker, never copied).
        batch_size: Global images per step, ``B``.
        seed: Sampling seed.
        rank: Global index of this process.
        world_size: Number of processes.
        start_step: First step to yield (resume point).
        assigner: Split of each batch across ranks; ``ContiguousAssigner()`` if None.
        skip_corrupt_images: Log and drop undecodable images instead of raising.
        num_steps: Stop after this many steps (None: never).
        downscale_at: Render downscale of a step (splatfacto's resolution schedule): step ``t``'s
            images are decoded at ``1 / downscale_at(t)`` of their training resolution. A pure
            function of the step, called in the workers (pickled for spawn/forkserver workers).
            None: always 1.

    Invariants:
        For fixed arguments and worker count the sequence is deterministic; starting at step
        ``t`` yields exactly what an uninterrupted stream yields from step ``t`` on.
    """

    def __init__(
        self,
        loader: ImageLoader,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        start_step: int = 0,
        assigner: Assigner | None = None,
        skip_corrupt_images: bool = False,
        num_steps: int | None = None,
        downscale_at: Callable[[int], int] | None = None,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        if start_step < 0:
            raise ValueError(f"start_step must be >= 0, got {start_step}")
        self.loader = loader
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.start_step = start_step
        self.assigner: Assigner = assigner if assigner is not None else ContiguousAssigner()
        self.skip_corrupt_images = skip_corrupt_images
        self.num_steps = num_steps
        self.downscale_at = downscale_at
        self.slots: DecodeSlots | None = None

    def downscale(self, step: int) -> int:
        """The render downscale of ``step`` (1 without a schedule)."""
        if self.downscale_at is None:
            return 1
        value = self.downscale_at(step)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"downscale_at({step}) must return an int >= 1, got {value!r}")
        return int(value)

    def max_images_per_part(self, num_workers: int) -> int:
        """Most images one worker decodes for one step (its rotating share of a whole batch)."""
        return -(-self.batch_size // max(num_workers, 1))

    def rank_positions(self, step: int) -> tuple[list[int], list[int]]:
        """``(batch, positions)``: the global batch of ``step`` and this rank's positions in it."""
        batch = batch_camera_ids(self.seed, len(self.loader), self.batch_size, step)
        positions = sorted(self.assigner.positions_for_rank(step, batch, self.rank, self.world_size))
        for p in positions:
            if not 0 <= p < len(batch):
                raise ValueError(f"assigner returned position {p} outside the batch of {len(batch)} at step {step}")
        return batch, positions

    def parts(self, worker_id: int, num_workers: int) -> Iterator[StepPart]:
        """The parts worker ``worker_id`` of ``num_workers`` yields, one per step."""
        steps = itertools.count(self.start_step)
        if self.num_steps is not None:
            steps = iter(range(self.start_step, self.start_step + self.num_steps))
        slots = self.slots if num_workers > 0 and get_worker_info() is not None else None
        for part_number, step in enumerate(steps):
            batch, positions = self.rank_positions(step)
            downscale = self.downscale(step)
            mine = worker_positions(positions, step, worker_id, num_workers)
            part = StepPart(step, worker_id, [], [], [], [], [], 0.0)
            start = time.perf_counter()
            if slots is not None:
                part.slot_index = part_number % slots.num_parts
                slots.stamps[worker_id, part.slot_index] = -1
            for j, p in enumerate(mine):
                index = batch[p]
                out = (
                    slots.buffer(worker_id, part.slot_index, j)
                    if slots is not None and j < slots.images_per_part
                    else None
                )
                try:
                    array, mask_array = self.loader.load_array(index, out=out, downscale=downscale)
                except ValueError as exc:
                    if not self.skip_corrupt_images:
                        if get_worker_info() is None:
                            raise
                        part.failure = WorkerFailure(str(exc))
                        yield part
                        return
                    _LOGGER.warning("skipping image (skip_corrupt_images=True): %s", exc)
                    part.skipped_indices.append(index)
                    continue
                part.positions.append(p)
                part.camera_indices.append(index)
                if out is not None and np.shares_memory(array, out):
                    part.images.append(SlotRef(slots.offset(worker_id, part.slot_index, j), tuple(array.shape)))  # type: ignore[union-attr]
                else:
                    part.images.append(torch.from_numpy(array))
                part.masks.append(torch.from_numpy(mask_array) if mask_array is not None else None)
            if slots is not None:
                slots.stamps[worker_id, part.slot_index] = step
            part.decode_s = time.perf_counter() - start
            yield part

    def __iter__(self) -> Iterator[StepPart]:
        info = get_worker_info()
        # OpenCV's thread count is deliberately left alone in workers: cv2.setNumThreads in a
        # forked child whose parent already ran an OpenCV parallel loop can deadlock (measured).
        if info is None:
            return self.parts(0, 1)
        return self.parts(info.id, info.num_workers)


class IndexedImageDataset(Dataset):
    """Map-style dataset over chosen dataset indices, for eval loaders with workers.

    Items are ``(index, image, mask)`` as ``ImageLoader.load`` returns them, or, in a worker, a
    ``WorkerFailure`` for an image that cannot be decoded (raise it with ``reraise``). Picklable.
    """

    def __init__(self, loader: ImageLoader, indices: list[int]) -> None:
        self.loader = loader
        self.indices = list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor | None] | WorkerFailure:
        index = self.indices[i]
        try:
            image, mask = self.loader.load(index)
        except ValueError as exc:
            if get_worker_info() is None:
                raise
            return WorkerFailure(str(exc))
        return index, image, mask
