"""The training image stream: an IterableDataset whose DataLoader workers decode each rank's share.

Pure: torch only (plus the sibling pure modules).

Who decodes what (issue #3):
- Step ``t``'s global batch is ``batch_camera_ids(seed, num_images, B, t)``, the same on every rank.
- The assigner says which positions of it this rank needs (contiguous split by default).
- Worker ``w`` of ``K`` takes the ``j``-th of those positions when ``(j + t) % K == w``: each image
  is decoded by one worker of one rank, and with fewer images than workers per step the work still
  rotates over all workers.
- Every worker yields exactly one ``StepPart`` per step (possibly empty), so the DataLoader's
  round-robin, in-order delivery hands over the ``K`` parts of step ``t`` before those of ``t + 1``;
  ``TrainBatchReader`` merges them into one ``TrainBatch``.

No collate: the DataLoader runs with ``batch_size=None`` and an identity ``collate_fn``; each image
is its own tensor (images may differ in size), returned from the worker through shared memory.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Iterator, Optional, Protocol

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from distsplat_ns.data.decode import ImageLoader
from distsplat_ns.data.order import ContiguousAssigner, batch_camera_ids
from distsplat_ns.utils.logging import get_logger

_LOGGER = get_logger(__name__)


class Assigner(Protocol):
    """Which positions of a step's global batch a rank must have decoded (see ``ContiguousAssigner``)."""

    def positions_for_rank(self, step: int, batch: list[int], rank: int, world_size: int) -> list[int]: ...


@dataclass
class TrainBatch:
    """One step's images for this rank.

    Attributes:
        step: 0-based training step.
        camera_indices: Dataset indices of this rank's images, in batch-position order.
        positions: Their positions in the global batch (increasing).
        images: Pixels, one tensor per image. `[H, W, 3]` (or `[H, W, 4]` RGBA), uint8, CPU.
        masks: Per image, a mask `[H, W, 1]` bool, or None.
        wait_s: Seconds the training loop blocked waiting for this batch.
        skipped_indices: Dataset indices dropped as corrupt (only with skip_corrupt_images).
    """

    step: int
    camera_indices: list[int]
    positions: list[int]
    images: list[torch.Tensor]
    masks: list[Optional[torch.Tensor]]
    wait_s: float = 0.0
    skipped_indices: list[int] = field(default_factory=list)


@dataclass
class StepPart:
    """What one worker decoded for one step (internal to the stream and its reader)."""

    step: int
    worker_id: int
    positions: list[int]
    camera_indices: list[int]
    images: list[torch.Tensor]
    masks: list[Optional[torch.Tensor]]
    skipped_indices: list[int]
    decode_s: float


def identity_collate(item: object) -> object:
    """The DataLoader ``collate_fn``: hands items over untouched (no stacking, no conversion)."""
    return item


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
        assigner: Optional[Assigner] = None,
        skip_corrupt_images: bool = False,
        num_steps: Optional[int] = None,
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
        for step in steps:
            batch, positions = self.rank_positions(step)
            mine = worker_positions(positions, step, worker_id, num_workers)
            part = StepPart(step, worker_id, [], [], [], [], [], 0.0)
            start = time.perf_counter()
            for p in mine:
                index = batch[p]
                try:
                    image, mask = self.loader.load(index)
                except ValueError as exc:
                    if not self.skip_corrupt_images:
                        raise
                    _LOGGER.warning("skipping image (skip_corrupt_images=True): %s", exc)
                    part.skipped_indices.append(index)
                    continue
                part.positions.append(p)
                part.camera_indices.append(index)
                part.images.append(image)
                part.masks.append(mask)
            part.decode_s = time.perf_counter() - start
            yield part

    def __iter__(self) -> Iterator[StepPart]:
        info = get_worker_info()
        # OpenCV's thread count is deliberately left alone in workers: cv2.setNumThreads in a
        # forked child whose parent already ran an OpenCV parallel loop can deadlock (measured).
        if info is None:
            return self.parts(0, 1)
        return self.parts(info.id, info.num_workers)


def make_stream_loader(
    stream: ImageBatchStream, num_workers: int, prefetch_batches: int, multiprocessing_context: Optional[str] = None
) -> DataLoader:
    """The DataLoader that runs ``stream`` in ``num_workers`` processes.

    Args:
        stream: The rank's stream.
        num_workers: Worker processes (0: decode in the calling process).
        prefetch_batches: Steps decoded ahead of the consumer (each worker holds this many parts).
        multiprocessing_context: ``"fork"``, ``"spawn"``, ``"forkserver"`` or None (torch default).

    Returns:
        A DataLoader yielding ``StepPart``s, ``num_workers`` (or 1) per step, in step order.
    """
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    if prefetch_batches < 1:
        raise ValueError(f"prefetch_batches must be >= 1, got {prefetch_batches}")
    kwargs: dict = {}
    if num_workers > 0:
        kwargs["prefetch_factor"] = prefetch_batches
        kwargs["multiprocessing_context"] = multiprocessing_context
    return DataLoader(stream, batch_size=None, collate_fn=identity_collate, num_workers=num_workers, **kwargs)


def merge_parts(step: int, parts: list[StepPart]) -> TrainBatch:
    """Join the workers' parts of one step into a ``TrainBatch`` ordered by batch position."""
    for part in parts:
        if part.step != step:
            raise RuntimeError(f"data stream out of order: expected step {step}, a worker delivered step {part.step}")
    items = sorted(
        (
            (p, i, img, m)
            for part in parts
            for p, i, img, m in zip(part.positions, part.camera_indices, part.images, part.masks)
        ),
        key=lambda item: item[0],
    )
    skipped = [i for part in parts for i in part.skipped_indices]
    return TrainBatch(
        step=step,
        camera_indices=[item[1] for item in items],
        positions=[item[0] for item in items],
        images=[item[2] for item in items],
        masks=[item[3] for item in items],
        skipped_indices=skipped,
    )


class TrainBatchReader:
    """Pulls a stream's parts from its DataLoader and hands out one ``TrainBatch`` per step.

    Args:
        stream: The rank's stream (its ``start_step`` is the first step to request).
        num_workers: DataLoader workers.
        prefetch_batches: Steps decoded ahead.
        multiprocessing_context: DataLoader start method.
    """

    def __init__(
        self,
        stream: ImageBatchStream,
        num_workers: int,
        prefetch_batches: int,
        multiprocessing_context: Optional[str] = None,
    ) -> None:
        self.stream = stream
        self.num_parts = max(num_workers, 1)
        self.next_step = stream.start_step
        self.num_images_delivered = 0
        self.decode_s = 0.0
        self.wait_s = 0.0
        self.skipped_indices: list[int] = []
        self._dataloader = make_stream_loader(stream, num_workers, prefetch_batches, multiprocessing_context)
        self._iterator: Optional[Iterator[StepPart]] = iter(self._dataloader)

    def next_batch(self, step: int) -> TrainBatch:
        """The batch of ``step``, which must be the reader's next step.

        Raises:
            ValueError: ``step`` is not the next step of this reader.
            RuntimeError: The reader was closed or a worker failed earlier.
            Exception: A worker's exception, re-raised by the DataLoader with its original message.
        """
        if step != self.next_step:
            raise ValueError(f"step {step} requested, but this stream's next step is {self.next_step}")
        if self._iterator is None:
            raise RuntimeError("this train stream is closed (a worker failed or close() was called)")
        start = time.perf_counter()
        try:
            parts = [next(self._iterator) for _ in range(self.num_parts)]
        except BaseException:
            self.close()
            raise
        wait_s = time.perf_counter() - start
        batch = merge_parts(step, parts)
        batch.wait_s = wait_s
        self.next_step += 1
        self.wait_s += wait_s
        self.decode_s += sum(part.decode_s for part in parts)
        self.num_images_delivered += len(batch.images)
        self.skipped_indices.extend(batch.skipped_indices)
        return batch

    def close(self) -> None:
        """Stop the workers."""
        iterator, self._iterator = self._iterator, None
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()  # type: ignore[attr-defined]


class IndexedImageDataset(Dataset):
    """Map-style dataset over chosen dataset indices, for eval loaders with workers.

    Items are ``(index, image, mask)`` as ``ImageLoader.load`` returns them. Picklable.
    """

    def __init__(self, loader: ImageLoader, indices: list[int]) -> None:
        self.loader = loader
        self.indices = list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, Optional[torch.Tensor]]:
        index = self.indices[i]
        image, mask = self.loader.load(index)
        return index, image, mask
