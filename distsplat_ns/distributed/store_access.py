"""The process group's key-value store, reached with bounds on the paths that must end.

The lifecycle's phase, error and heartbeat keys live in the default group's store (torchrun's agent
store, or rank 0's under ``env://``) under :data:`KEY_PREFIX`. On error and shutdown paths every
operation goes through :func:`bounded`: a TCPStore client whose server's host is cut off blocks in
``recv()`` until the kernel gives up on the connection (docs/distributed.md, "Faults across hosts").
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TypeVar

import torch.distributed as dist

T = TypeVar("T")

KEY_PREFIX = "distsplat/"


def default_store() -> dist.Store | None:
    """The default group's key-value store, or None without a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.distributed_c10d._get_default_store()


#: Seconds a store read or write on an error or shutdown path may take. The store lives on one host
#: (torchrun's agent, or rank 0's); after a partition a TCPStore ``check``/``set`` blocks in
#: ``recv()`` until the kernel gives up on TCP (measured 925 s: docs/distributed.md, "Faults across hosts"). Its host answers in
#: milliseconds when it is alive, so 5 s only ever cuts off a lost one.
STORE_REPLY_S = 5.0


#: Set once the store failed to answer: later bounded calls fail at once (an error report makes
#: several reads; each would wait again for a host that is gone).
_LOST_STORE: list = []


class StoreUnreachable(RuntimeError):
    """The store did not answer within :data:`STORE_REPLY_S` (its host lost or partitioned)."""


def store_address() -> str:
    """Where the store lives, for messages (torchrun and ``env://`` set ``MASTER_ADDR``/``MASTER_PORT``)."""
    return f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"


def bounded(fn: Callable[[], T], timeout_s: float = STORE_REPLY_S, remember_loss: bool = True) -> T:
    """``fn()`` in a daemon thread, abandoned after ``timeout_s``: for store operations on paths
    that must end (error reports, shutdown), whose client has no timeout of its own.

    ``remember_loss=False`` is for periodic polls that judge the store themselves (the abort
    watch): a reply late under load then does not mark the store lost for every later call.

    Raises:
        StoreUnreachable: ``fn`` did not return in time (the thread is left to the OS at exit).
        Whatever ``fn`` raised.
    """
    if _LOST_STORE:
        raise StoreUnreachable(_LOST_STORE[0])
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001 -- re-raised in the caller's thread
            box["error"] = err

    thread = threading.Thread(target=run, name="distsplat-bounded-store", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        lost = f"the rendezvous store at {store_address()} did not answer within {timeout_s:g} s (its host is down or the network is partitioned)"
        if remember_loss:
            _LOST_STORE.append(lost)
        raise StoreUnreachable(_LOST_STORE[0] if _LOST_STORE else lost)
    if "error" in box:
        raise box["error"]
    return box["value"]
