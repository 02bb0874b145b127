"""Running code that builds tensors in torch's default dtype at another dtype."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """torch's default dtype is ``dtype`` inside, and what it was before on leaving (also on an
    error). For library code that builds tensors with ``torch.zeros`` and the like (splatfacto's
    checkpoint load, gsplat's duplicate and opacity reset) on Gaussians that are not float32.
    torch offers no public context manager for it."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
