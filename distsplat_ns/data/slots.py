"""Decode slots: shared memory that workers decode into, so that no image costs a new shared-memory segment.

Pure: numpy, torch (and ``store.SharedBuffer``). ``reader.TrainBatchReader`` maps one
``DecodeSlots`` ring; a worker decodes straight into its slot and sends only a ``SlotRef``
``(offset, shape)``; the reader copies the pixels out into a tensor the caller owns. A slot is
reused ``num_parts`` parts later, when the DataLoader's bounded prefetch guarantees the copy; a
stamp per slot turns any violation into an error. Why and cost: docs/data.md, "Decoding and
hand-over".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from distsplat_ns.data.store import SharedBuffer
from distsplat_ns.data.upload import host_tensor_like


@dataclass(frozen=True)
class SlotRef:
    """Pixels a worker left in its decode slot: byte ``offset`` in the ring's data, and the shape."""

    offset: int
    shape: tuple[int, ...]


class DecodeSlots:
    """A ring of shared decode slots: per worker, ``num_parts`` parts of ``images_per_part`` images.

    One ``SharedBuffer`` made by the reader before the workers start and sent to them by handle. A
    stamp per (worker, part slot) holds the step whose pixels it holds.

    Args:
        num_workers: DataLoader workers.
        num_parts: Parts per worker kept before a slot is reused (> prefetch depth).
        images_per_part: Most images a worker decodes for one step.
        image_bytes: Most bytes of one image.
    """

    _ALIGN = 64

    def __init__(self, num_workers: int, num_parts: int, images_per_part: int, image_bytes: int) -> None:
        self.num_workers = num_workers
        self.num_parts = num_parts
        self.images_per_part = images_per_part
        self.image_bytes = -(-image_bytes // self._ALIGN) * self._ALIGN
        self._header = -(-(8 * num_workers * num_parts) // self._ALIGN) * self._ALIGN
        self.num_bytes = self._header + num_workers * num_parts * images_per_part * self.image_bytes
        self._buffer = SharedBuffer(self.num_bytes, "distsplat decode slots")
        self._make_views()
        self.stamps[:] = -1

    def _make_views(self) -> None:
        raw = self._buffer.array
        self.stamps = (
            raw[: 8 * self.num_workers * self.num_parts].view(np.int64).reshape(self.num_workers, self.num_parts)
        )
        self.data = raw[self._header :]

    def offset(self, worker_id: int, slot_index: int, image_index: int) -> int:
        """Byte offset in ``data`` of one image slot."""
        return ((worker_id * self.num_parts + slot_index) * self.images_per_part + image_index) * self.image_bytes

    def buffer(self, worker_id: int, slot_index: int, image_index: int) -> np.ndarray:
        """One image slot as a flat writable uint8 array. `[image_bytes]`."""
        start = self.offset(worker_id, slot_index, image_index)
        return self.data[start : start + self.image_bytes]

    def copy_out(self, ref: SlotRef, pin_memory: bool = False) -> torch.Tensor:
        """A new tensor holding the pixels ``ref`` points at; in pinned host memory when
        ``pin_memory`` (for a non-blocking upload to a CUDA device: ``upload.py``)."""
        size = int(np.prod(ref.shape))
        pixels = self.data[ref.offset : ref.offset + size].reshape(ref.shape)
        if not pin_memory:
            return torch.from_numpy(pixels.copy())
        out = host_tensor_like(ref.shape, torch.uint8, pin_memory=True)
        out.numpy()[...] = pixels
        return out

    def __getstate__(self) -> dict:
        # The buffer travels as its file descriptor (SharedBuffer refuses any other pickling).
        state = self.__dict__.copy()
        del state["stamps"], state["data"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._make_views()
