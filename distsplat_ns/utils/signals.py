"""Turn SIGINT/SIGTERM into a request to stop at the next step boundary.

The training loop asks :attr:`StopSignals.requested` after every step (and agrees with the other
ranks, ``distributed/lifecycle.py``), so a signal never interrupts a step, a collective or a
checkpoint write. A repeat of the signal more than ``force_after_s`` after the first one aborts at
once (``KeyboardInterrupt``), for a run stuck where no step boundary comes. Repeats closer together
are ignored: under torchrun one Ctrl-C reaches a rank twice (the terminal and torchrun's forward).
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType
from typing import Any

from typing_extensions import Self

from distsplat_ns.utils.logging import get_logger
from distsplat_ns.utils.shm import remove_orphan_semaphores

LOGGER = get_logger(__name__)

#: Signals that request a stop: Ctrl-C, and what schedulers (SLURM, Kubernetes) and torchrun send.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """Context manager installing the stop handlers in the main thread (no-op elsewhere).

    Attributes:
        signum: The first stop signal received, or None.
    """

    def __init__(self, force_after_s: float = 5.0) -> None:
        self.signum: int | None = None
        self._first_at = 0.0
        self._force_after_s = force_after_s
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        """True once a stop signal arrived."""
        return self.signum is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.signum is None:
            self.signum = signum
            self._first_at = now
            # Not "saving a checkpoint": under torchrun this signal usually means another rank died,
            # and nothing can be saved then; the end of the run says what was saved (docs/distributed.md, "Faults").
            LOGGER.warning(
                "%s received: asking every rank to stop after this step (the step is saved if they all can)",
                signal.Signals(signum).name,
            )
            # Under torchrun this is the agent's reaction to a rank's death: if it was SIGKILLed
            # with its resource tracker, its named semaphores are this host's to remove, now --
            # this rank may be ended before it reaches its own failure report.
            remove_orphan_semaphores()
        elif now - self._first_at > self._force_after_s:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: aborting without a checkpoint")

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()


def ignore_stop_signals() -> None:
    """Ignore SIGINT/SIGTERM in this process: for DataLoader workers and their fork server.

    torchrun forwards a stop signal to each rank's whole process group and a terminal's Ctrl-C
    reaches the foreground group, fork server and workers included; one killed by it makes its
    rank fail in the middle of the step it should finish. They still end with their rank
    (``data/worker_server.py``: the kernel's parent-death SIGKILL; ``data/workers.py``:
    ``exit_with_owner``).
    """
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
