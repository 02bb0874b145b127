"""Counting the torch operators a piece of host code dispatches (benchmarks/bench_host_cost.py's measure)."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


class _CountOps(TorchDispatchMode):
    def __init__(self, counts: collections.Counter) -> None:
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.counts[f"{func.namespace}::{func.overloadpacket.__name__}"] += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def count_torch_ops() -> Iterator[collections.Counter]:
    """Every operator dispatched inside the block, by name (``aten::add``): the counter is filled
    as the block runs. Views count too; the benchmark's host-cost figures include them in ``ops``."""
    counts: collections.Counter = collections.Counter()
    with _CountOps(counts):
        yield counts
