"""What the DataLoader workers' fork server preloads: the stream code, and death with its parent.

Pure: the standard library (and ``stream.py``). Imported only in the fork server
(``stream.worker_context`` names it in ``set_forkserver_preload``), never by the training process.

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

from distsplat_ns.data import stream  # noqa: F401 - preloaded so that workers start without importing it
from distsplat_ns.utils.signals import ignore_stop_signals

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when the thread that created it exits (Linux)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


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
