"""The consumer side of the training stream: one ``TrainBatch`` per step, from the workers' parts.

Pure: torch (plus the sibling pure modules). ``TrainBatchReader`` runs an ``ImageBatchStream`` in a
DataLoader (``make_stream_loader``, workers started as ``workers.py`` says), maps the decode slots
(``slots.py``) the workers write into, and merges the ``K`` parts of each step (``merge_parts``) in
batch-position order, copying pixels out of the slots into tensors the caller owns. A worker's
decode error (``workers.WorkerFailure``) is raised here with the worker's message.

Shape legend: ``H``, ``W``: pixels.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch.utils.data import DataLoader

from distsplat_ns.data.slots import DecodeSlots, SlotRef
from distsplat_ns.data.stream import ImageBatchStream, StepPart
from distsplat_ns.data.workers import WORKER_START_METHOD, identity_collate, worker_kwargs


@dataclass
class TrainBatch:
    """One step's images for this rank.

    Attributes:
        step: 0-based training step.
        camera_indices: Dataset indices of this rank's images, in batch-position order.
        positions: Their positions in the global batch (increasing).
        images: Pixels, one tensor per image. `[H, W, 3]` (or `[H, W, 4]` RGBA), uint8, CPU
            (pinned when the reader pins: ``TrainBatchReader(pin_memory=True)``).
        masks: Per image, a mask `[H, W, 1]` bool, or None.
        wait_s: Seconds the training loop blocked waiting for this batch.
        skipped_indices: Dataset indices dropped as corrupt (only with skip_corrupt_images).
    """

    step: int
    camera_indices: list[int]
    positions: list[int]
    images: list[torch.Tensor]
    masks: list[torch.Tensor | None]
    wait_s: float = 0.0
    skipped_indices: list[int] = field(default_factory=list)


def make_stream_loader(
    stream: ImageBatchStream, num_workers: int, prefetch_batches: int, start_method: str = WORKER_START_METHOD
) -> DataLoader:
    """The DataLoader that runs ``stream`` in ``num_workers`` processes.

    Args:
        stream: The rank's stream.
        num_workers: Worker processes (0: decode in the calling process).
        prefetch_batches: Steps decoded ahead of the consumer (each worker holds this many parts).
        start_method: How workers start (``worker_context``); tests compare the three.

    Returns:
        A DataLoader yielding ``StepPart``s, ``num_workers`` (or 1) per step, in step order.
    """
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    if prefetch_batches < 1:
        raise ValueError(f"prefetch_batches must be >= 1, got {prefetch_batches}")
    return DataLoader(
        stream,
        batch_size=None,
        collate_fn=identity_collate,
        num_workers=num_workers,
        **worker_kwargs(num_workers, start_method, prefetch_batches),
    )


def _copy_out_slots(part: StepPart, slots: DecodeSlots | None, pin_memory: bool = False) -> None:
    refs = [i for i, image in enumerate(part.images) if isinstance(image, SlotRef)]
    if not refs:
        return
    if slots is None:
        raise RuntimeError("a worker used decode slots that this reader does not have")

    def check() -> None:
        stamp = int(slots.stamps[part.worker_id, part.slot_index])
        if stamp != part.step:
            raise RuntimeError(
                f"decode slot {part.slot_index} of worker {part.worker_id} holds step {stamp}, expected {part.step}: "
                "it was reused before being read (internal error: ring shorter than the prefetch depth)"
            )

    check()
    for i in refs:
        part.images[i] = slots.copy_out(part.images[i], pin_memory)
    check()  # the pixels did not change while being copied


def merge_parts(
    step: int, parts: list[StepPart], slots: DecodeSlots | None = None, pin_memory: bool = False
) -> TrainBatch:
    """Join the workers' parts of one step into a ``TrainBatch`` ordered by batch position.

    Pixels left in decode slots are copied out into tensors the caller owns (pinned host memory
    when ``pin_memory``: only for a CUDA device, ``upload.py``).

    Raises:
        ValueError: A worker's decode error (``WorkerFailure``), with the worker's message.
    """
    for part in parts:
        if part.failure is not None:
            part.failure.reraise()
        if part.step != step:
            raise RuntimeError(f"data stream out of order: expected step {step}, a worker delivered step {part.step}")
        _copy_out_slots(part, slots, pin_memory)
    items = sorted(
        (
            (p, i, img, m)
            for part in parts
            for p, i, img, m in zip(part.positions, part.camera_indices, part.images, part.masks, strict=False)
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
        start_method: How workers start (``worker_context``).
        pin_memory: Copy the pixels out of the decode slots into pinned host memory (only when
            they go to a CUDA device: pinning needs CUDA; ``upload.pins_memory``).
    """

    def __init__(
        self,
        stream: ImageBatchStream,
        num_workers: int,
        prefetch_batches: int,
        start_method: str = WORKER_START_METHOD,
        pin_memory: bool = False,
    ) -> None:
        self.stream = stream
        self.pin_memory = pin_memory
        self.num_parts = max(num_workers, 1)
        self.next_step = stream.start_step
        self.num_images_delivered = 0
        self.decode_s = 0.0
        self.wait_s = 0.0
        self.skipped_indices: list[int] = []
        self.slots: DecodeSlots | None = None
        if num_workers > 0:
            # More parts than the DataLoader can have in flight per worker (prefetch_batches),
            # plus the one being consumed and one of margin.
            self.slots = DecodeSlots(
                num_workers,
                prefetch_batches + 2,
                stream.max_images_per_part(num_workers),
                stream.loader.max_output_bytes(),
            )
        stream.slots = self.slots
        self._dataloader = make_stream_loader(stream, num_workers, prefetch_batches, start_method)
        self._iterator: Iterator[StepPart] | None = iter(self._dataloader)

    def next_batch(self, step: int) -> TrainBatch:
        """The batch of ``step``, which must be the reader's next step.

        Raises:
            ValueError: ``step`` is not the next step of this reader.
            RuntimeError: The reader was closed or a worker failed earlier.
            ValueError: A worker could not decode an image: the worker's message (file, dataset
                index, decoder's reason), unchanged.
            Exception: Any other worker exception, re-raised by the DataLoader with its traceback.
        """
        if step != self.next_step:
            raise ValueError(f"step {step} requested, but this stream's next step is {self.next_step}")
        if self._iterator is None:
            raise RuntimeError("this train stream is closed (a worker failed or close() was called)")
        start = time.perf_counter()
        try:
            parts = [next(self._iterator) for _ in range(self.num_parts)]
            wait_s = time.perf_counter() - start
            batch = merge_parts(step, parts, self.slots, self.pin_memory)
        except BaseException:
            self.close()
            raise
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
