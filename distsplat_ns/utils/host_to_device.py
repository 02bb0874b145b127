"""Small host-built tensors (sizes, counts, flags) onto the device without stalling its queue."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def host_tensor(values: Sequence, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.tensor(values, dtype=dtype)`` on ``device``. To a GPU it goes from pinned memory,
    without waiting for the queue: a copy from pageable memory would synchronise the stream."""
    tensor = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
