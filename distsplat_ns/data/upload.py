"""Decoded uint8 images from host to device without stalling the training step (docs/data.md, "Uploads off the critical path").

Pure: torch only.

A plain ``tensor.to("cuda")`` from pageable memory is a synchronous copy: the host waits for the
device's queued work and then for the copy (through a driver staging buffer), every image, every
step. gsplat PRs 1057/1062 measured a step on 8 B200 GPUs fall from 14.1 ms to 9.3 ms once the
images sat in host memory as uint8 and were copied without blocking. Here:

- the reader copies each decoded image out of its decode slot straight into *pinned* host memory
  (``reader.TrainBatchReader(pin_memory=True)``; it made that copy anyway, so pinning costs no
  extra pass);
- ``DeviceUploader.upload`` enqueues the copies ``non_blocking`` on a copy stream of its own, so
  they overlap the compute already queued (the previous step's optimizer and refine), and makes
  the compute stream wait for them on the device (``wait_event``): ordered before their first
  use, no host sync. The device tensors are recorded on the compute stream (``record_stream``) so
  the caching allocator never hands their memory out while that stream may still read them; the
  pinned host blocks are kept by torch's host allocator until their copy has completed.
- On a CPU device the same calls run with plain tensors: nothing is pinned (pinning needs CUDA:
  nerfstudio 1.1.5 crashes pinning without it) and ``upload`` returns its inputs.

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
