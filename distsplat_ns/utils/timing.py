"""Phase timings of a step: a context manager per phase, nested phases counted once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext


class PhaseClock:
    """Seconds per named phase. A phase entered inside another is counted in its own name only
    (the outer phase's time excludes it), so e.g. the exchange inside the forward counts as
    communication, not render time. Not thread-safe beyond one phase open per thread at a time."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._nested: list[float] = []  # per open phase, the seconds of the phases inside it
        self._open_spans: dict[str, int] = {}  # per span name, how many are open

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count the time inside the ``with`` block under ``name``."""
        start = time.perf_counter()
        self._nested.append(0.0)
        try:
            yield
        finally:
            inner = self._nested.pop()
            elapsed = time.perf_counter() - start
            self.add(name, elapsed - inner)
            if self._nested:
                self._nested[-1] += elapsed

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        """Count the time inside the ``with`` block under ``name`` besides the phases it runs in (a
        second tally across phases, e.g. exposed communication): spans of one name nested in each
        other count once."""
        depth = self._open_spans.get(name, 0)
        self._open_spans[name] = depth + 1
        start = time.perf_counter()
        try:
            yield
        finally:
            self._open_spans[name] = depth
            if depth == 0:
                self.add(name, time.perf_counter() - start)

    @contextmanager
    def communicating(self, phase: str | None = "all_reduce") -> Iterator[None]:
        """A blocking collective: its time counts in ``phase`` (None: no phase) and in the
        ``exposed_comm`` span (once where such blocks nest: the sharded exchange times its parts
        inside its whole)."""
        with self.span("exposed_comm"), self.phase(phase) if phase is not None else nullcontext():
            yield

    def add(self, name: str, seconds: float) -> None:
        """Count ``seconds`` under ``name`` (time measured elsewhere, e.g. the data stream's wait)."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def __getitem__(self, name: str) -> float:
        return self.seconds.get(name, 0.0)
