"""Freed host memory kept for reuse in a CPU training process: glibc malloc's two thresholds.

On CPU every step's tensors are host memory. glibc's malloc sets its mmap threshold (and a trim
threshold twice as high) from the blocks freed so far and gives the heap's free top back to the
kernel above the trim threshold; with buffers whose sizes change from image to image, a run can
fall into trimming and faulting the heap in again step after step (on bird at 90x160 px: 4 of 5
1-rank runs, 3-8% of their CPU time in the kernel; docs/time_to_quality.md, "Page faults").

:func:`keep_freed_host_memory` fixes both thresholds (``mallopt`` also stops glibc's adjustment):
blocks up to 32 MiB (the largest mmap threshold glibc accepts on 64-bit) come from the heap,
which is trimmed only above 2 GiB of free memory. Resident memory then stays near its peak
between steps; blocks above 32 MiB still go to ``mmap``.

Written by hand: torch's CPU launcher (``torch.backends.xeon.run_cpu``) preloads jemalloc or
tcmalloc, which are not installed here and cannot be preloaded into a running ``ns-train``;
``mallopt`` through ``ctypes`` is glibc's own interface for these settings.
"""

from __future__ import annotations

import ctypes

# glibc <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

#: The largest M_MMAP_THRESHOLD glibc accepts on 64-bit (HEAP_MAX_SIZE / 2).
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
#: Free memory at the heap's top that may stay there: INT_MAX (mallopt takes an int), 2 GiB, far
#: above what a step frees at once here.
TRIM_THRESHOLD_BYTES = 2**31 - 1


def _glibc() -> ctypes.CDLL | None:
    """The C library this process runs on (its own symbols, as ``distributed/context.py``'s prctl
    call reads them) when it is glibc, else None."""
    libc = ctypes.CDLL(None)
    return libc if hasattr(libc, "gnu_get_libc_version") else None


def keep_freed_host_memory() -> bool:
    """Set glibc's mmap threshold to 32 MiB and its trim threshold out of reach, for this process
    (module docstring). Returns whether both were set: False where the C library is not glibc
    (musl, macOS), which keeps its own behaviour."""
    libc = _glibc()
    if libc is None:
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
