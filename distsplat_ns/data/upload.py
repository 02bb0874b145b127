"""Decoded uint8 images from host to device without stalling the training step (docs/data.md, "Uploads off the critical path").

Pure: torch only. The reader copies each image into *pinned* host memory
(``reader.TrainBatchReader(pin_memory=True)``); ``DeviceUploader.upload`` enqueues ``non_blocking``
copies on a copy stream of its own and makes the compute stream wait for them on the device (no host
sync), with ``record_stream`` keeping the device memory alive. On a CPU device nothing is pinned and
``upload`` returns its inputs.

Shape legend: ``H``, ``W``: pixels.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pins_memory(device: torch.device | str) -> bool:
    """Whether host tensors bound for ``device`` go through pinned memory: a CUDA device only."""
    return torch.device(device).type == "cuda" and torch.cuda.is_available()


def host_tensor_like(shape: Sequence[int], dtype: torch.dtype, pin_memory: bool) -> torch.Tensor:
    """An empty host tensor, pinned when ``pin_memory`` (from torch's caching host allocator)."""
    return torch.empty(tuple(shape), dtype=dtype, pin_memory=pin_memory)


class DeviceUploader:
    """Copies host tensors to one device: pinned and non-blocking on CUDA, as is on CPU.

    Args:
        device: Where the tensors go.

    Invariants:
        ``upload`` returns tensors on ``device`` whose bytes equal the inputs'; on CUDA every kernel
        enqueued on the caller's current stream after ``upload`` returns sees them complete.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.pin_memory = pins_memory(self.device)
        self._stream: torch.cuda.Stream | None = None

    def upload(self, tensors: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """``tensors`` on the device (None stays None).

        **Host sync:** none. On CUDA, a host tensor that is not pinned yet is first copied into
        pinned memory on the host (the reader's images already are).
        """
        if not self.pin_memory:
            return [None if t is None else t.to(self.device) for t in tensors]
        if self._stream is None:
            if self.device.index is None:  # "cuda": the current device, as ``tensor.to("cuda")``
                self.device = torch.device("cuda", torch.cuda.current_device())
            self._stream = torch.cuda.Stream(self.device)
        consumer = torch.cuda.current_stream(self.device)
        moved: list[torch.Tensor | None] = []
        copied: list[torch.Tensor] = []
        # The copy stream does not wait for the compute already queued: the sources are host
        # memory, which no kernel writes, so the copies overlap that compute.
        with torch.cuda.stream(self._stream):
            for t in tensors:
                if t is None or t.device == self.device:
                    moved.append(t)
                    continue
                source = t if t.is_pinned() else t.pin_memory()
                moved.append(source.to(self.device, non_blocking=True))
                copied.append(moved[-1])
        if copied:
            consumer.wait_stream(self._stream)  # ordered before the first use, on the device
            for t in copied:
                t.record_stream(consumer)
        return moved
