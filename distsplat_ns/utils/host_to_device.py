"""Small host-built tensors (sizes, counts, flags) onto the device without stalling its queue."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def host_tensor(values: Sequence, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.tensor(values, dtype=dtype)`` on ``device`` (as :func:`to_device` moves it)."""
    return to_device(torch.tensor(values, dtype=dtype), device)


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor.to(device)``. A host tensor goes to a GPU from pinned memory, without waiting for
    the queue: torch's blocking copy from pageable memory would synchronise the stream."""
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
