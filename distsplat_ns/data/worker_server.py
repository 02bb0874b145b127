"""What the DataLoader workers' fork server preloads: the stream code, death with its parent, and
workers that do not re-run the training process's main script.

Pure: the standard library (and ``stream.py``). Imported only in the fork server
(``workers.worker_context`` names it in ``set_forkserver_preload``), never by the training process.

Main script: a child of the fork server first runs multiprocessing's start-up (``spawn.prepare``),
which re-runs the parent's main script (as ``__mp_main__``) unless that script is already the
server's ``__main__`` -- and the standard library's server never preloads it (Python 3.11 looks up
a ``main_path`` key that the preparation data does not have, so ``"__main__"`` in the preload list
does nothing). Under ``ns-train`` the main script imports nerfstudio's whole training CLI, so every
worker, at every (re)start, spent seconds importing it before its first decode
(``benchmarks/bench_worker_start.py``, ``forkserver_ns_train_main``; docs/data.md). The workers need
only what they unpickle, from importable modules (``distsplat_ns``, torch), never the main script:
this server's children skip it (``skip_main_script``). So objects defined in a main script cannot
be sent to these workers; the stream sends none.

The fork server is started by the training process; workers are forked by the server. On import
(in the server) this module asks the kernel for SIGKILL when the server's parent dies
(``PR_SET_PDEATHSIG``), and registers the same request in every child the server forks, right
after the fork. So when a rank dies, even by SIGKILL, the kernel kills its fork server and then
every worker at once -- also a worker still starting, before any Python code of ours runs in it.
The standard library's server would otherwise notice the death only through its alive pipe and
take seconds to shut down, and a worker in start-up would wait on it.
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
