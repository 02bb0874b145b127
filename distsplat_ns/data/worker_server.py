"""What the DataLoader workers' fork server preloads: the stream code, death with its parent, and
workers that do not re-run the training process's main script.

Pure: the standard library (and ``stream.py``). Imported only in the fork server
(``workers.worker_context`` names it in ``set_forkserver_preload``), never by the training process.
Its children skip the main script (``skip_main_script``: under ``ns-train`` it imports nerfstudio's
whole CLI), so objects defined in a main script cannot be sent to these workers. On import it asks
the kernel to SIGKILL the server when its parent dies (``PR_SET_PDEATHSIG``), and every child it
forks likewise, so a rank's death takes its workers with it at once. Why and measurements:
docs/data.md, "How workers start".
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from multiprocessing import spawn

from distsplat_ns.data import stream  # noqa: F401 - preloaded so that workers start without importing it
from distsplat_ns.utils.signals import ignore_stop_signals

_PR_SET_PDEATHSIG = 1

_MAIN_SCRIPT_KEYS = ("init_main_from_path", "init_main_from_name")
"""Keys of multiprocessing's preparation data that make a child re-run the parent's main script."""


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when the thread that created it exits (Linux)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def skip_main_script() -> None:
    """Make every child this process starts through multiprocessing skip re-running the parent's
    main script (module docstring); the rest of the child's start-up (``sys.path``, working
    folder, authentication key, ...) is unchanged."""
    prepare = spawn.prepare

    def prepare_without_main_script(data: dict) -> None:
        prepare({key: value for key, value in data.items() if key not in _MAIN_SCRIPT_KEYS})

    spawn.prepare = prepare_without_main_script


def in_fork_server() -> bool:
    """Whether this process is a multiprocessing fork server (its command line says so)."""
    return any("multiprocessing.forkserver import main" in arg for arg in sys.orig_argv)


if in_fork_server():  # imported anywhere else, the module changes nothing
    die_with_parent()
    # A stop signal sent to the rank's process group must not kill the server (its workers would
    # die with it, mid-step): the rank handles the stop, the server dies with the rank.
    ignore_stop_signals()
    if os.getppid() == 1:  # the training process died before the request took effect
        os._exit(1)
    os.register_at_fork(after_in_child=die_with_parent)
    skip_main_script()
