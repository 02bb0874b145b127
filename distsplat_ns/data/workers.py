"""How DataLoader worker processes start and end, and how they report a bad image.

Pure: torch and the standard library. Used by every loader of the package (the training stream's
``reader.TrainBatchReader`` and the datamanager's eval loader, through ``worker_kwargs``). Workers
are started by ``forkserver`` (a fork of the multi-threaded training process can inherit a held
lock), exit with the process that owns the loader (``exit_with_owner``), are SIGKILLed at
interpreter exit since they ignore stop signals (``_kill_workers_at_exit``), and send a decode
error as data (``WorkerFailure``) so that its message reaches the consumer unchanged. Why and
measurements: docs/data.md, "Workers and errors".
"""

from __future__ import annotations

import atexit
import functools
import multiprocessing
import multiprocessing.util
import os
import select
import threading
import time
from dataclasses import dataclass

import torch.utils.data  # noqa: F401 - imported before _kill_workers_at_exit is registered (its docstring)

from distsplat_ns.utils.errors import UserError
from distsplat_ns.utils.signals import ignore_stop_signals

WORKER_START_METHOD = "forkserver"
"""How DataLoader workers are started (see the module docstring)."""

_OWNER_POLL_S = 0.2


def _kill_workers_at_exit() -> None:
    """At interpreter exit, SIGKILL this process's daemonic multiprocessing children (DataLoader
    workers, which ignore the SIGTERM that multiprocessing's own exit handler sends before it waits
    for them). Registered after ``multiprocessing.util`` and ``torch.utils.data`` are imported, so it
    runs before their exit handlers (``atexit`` is last in, first out)."""
    for child in multiprocessing.active_children():
        if child.daemon:
            child.kill()


atexit.register(_kill_workers_at_exit)


@dataclass(frozen=True)
class WorkerFailure:
    """A decode error raised in a DataLoader worker, sent to the consumer as data.

    Attributes:
        message: The worker's ``ValueError`` message (file, dataset index, decoder's reason).
    """

    message: str

    def reraise(self) -> None:
        """Raise the worker's error in this process, with the worker's message unchanged."""
        raise UserError(self.message)


def identity_collate(item: object) -> object:
    """The DataLoader ``collate_fn``: hands items over untouched (no stacking, no conversion)."""
    return item


def worker_context(start_method: str = WORKER_START_METHOD) -> multiprocessing.context.BaseContext:
    """The multiprocessing context DataLoader workers start from.

    For ``forkserver`` the server (started once per process, by ``start_worker_server`` or on
    first use) preloads ``worker_server`` (this module, death with the training process, no
    re-run of the main script in workers), so that workers fork from an interpreter that already
    imported torch and the decoders and import nothing more before their first decode.

    Args:
        start_method: ``"forkserver"`` (the default), ``"spawn"`` or ``"fork"``.
    """
    context = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        context.set_forkserver_preload(["distsplat_ns.data.worker_server"])  # type: ignore[attr-defined]
    return context


def start_worker_server(start_method: str = WORKER_START_METHOD) -> None:
    """Start the fork server now (no-op for other start methods), so that its imports overlap the
    rest of start-up instead of delaying the first batch. Safe with threads: it is fork + exec."""
    worker_context(start_method)
    if start_method == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def exit_with_owner(owner_pid: int, worker_id: int = 0) -> None:
    """DataLoader ``worker_init_fn``: ignore SIGINT/SIGTERM, and end this worker as soon as process
    ``owner_pid`` has exited.

    A daemon thread waits on a pidfd of the owner (polls every 0.2 s where pidfds are missing) and
    then ends the worker with ``os._exit``. torch's own check polls the *parent* every 5 s, and with
    forkserver the parent is the fork server, not the owner.

    Args:
        owner_pid: The process that created the DataLoader (the training process).
        worker_id: The DataLoader's worker index (unused; ``worker_init_fn`` signature).
    """
    del worker_id
    ignore_stop_signals()  # the rank, not its workers, handles a stop (utils/signals.py)
    try:
        pidfd: int | None = os.pidfd_open(owner_pid)
    except ProcessLookupError:
        os._exit(1)
    except (AttributeError, OSError):
        pidfd = None

    def wait_then_exit() -> None:
        if pidfd is not None:
            select.select([pidfd], [], [])  # readable once the owner has exited
        else:
            while True:
                try:
                    os.kill(owner_pid, 0)
                except ProcessLookupError:
                    break
                except PermissionError:
                    pass
                time.sleep(_OWNER_POLL_S)
        os._exit(1)

    threading.Thread(target=wait_then_exit, name="exit with owner", daemon=True).start()


def worker_kwargs(
    num_workers: int, start_method: str = WORKER_START_METHOD, prefetch_batches: int | None = None
) -> dict:
    """DataLoader keyword arguments for ``num_workers`` workers: start method, owner watch, prefetch."""
    if num_workers == 0:
        return {}
    kwargs: dict = {
        "multiprocessing_context": worker_context(start_method),
        "worker_init_fn": functools.partial(exit_with_owner, os.getpid()),
    }
    if prefetch_batches is not None:
        kwargs["prefetch_factor"] = prefetch_batches
    return kwargs
