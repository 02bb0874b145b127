"""The encoded image files of a dataset, read once into one shared, read-only byte buffer.

Pure: numpy and the standard library only.

Why (docs/data.md): decoded 1080p images take 6 MB each in uint8 (25 MB in float32), their JPEG files
about 0.36 MB. Keeping the *files* in RAM makes memory grow with the size of the files, and the
DataLoader workers decode on demand.

How the workers avoid copies:
- The bytes live in one ``SharedBuffer``: a ``memfd`` (an anonymous shared-memory file) mapped
  ``MAP_SHARED``; its pages are shared between processes, never copy-on-write, and nobody writes
  them after the fill.
- Whatever the start method, workers map the *same* file: forked ones inherit the mapping, and
  forkserver/spawn ones (the datamanager's choice: ``workers.py``) receive the file descriptor while
  being started (``multiprocessing.reduction.DupFd``), never the bytes. Unlike ``/dev/shm``, a
  memfd is not bounded by the size of a tmpfs mount. Outside process start-up the store refuses
  to be pickled.
- Readers get zero-copy, read-only ``memoryview``s of one file's bytes.

Start-up time: the buffer is filled by a background thread, in dataset order, while training
starts; an entry not yet filled is read from its file (same bytes). The number of filled entries
lives in a shared ``multiprocessing.Value`` whose lock orders the writer's bytes before the
readers' loads. So time to first batch does not grow with the size of the dataset (docs/data.md).

Disk mode: when the files exceed the RAM budget the store keeps only paths and sizes, and readers
open the file on each access; the store logs this once, at construction.

Shape legend: ``F``: files (entries).
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import threading
import weakref
from collections.abc import Sequence
from multiprocessing import reduction
from pathlib import Path

import numpy as np

from distsplat_ns.utils.logging import get_logger

_LOGGER = get_logger(__name__)

_MAX_LISTED_MISSING = 10


def format_bytes(num_bytes: float) -> str:
    """Human-readable size, e.g. ``'1.50 GiB'``."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024.0 or unit == "TiB":
            return f"{value:.2f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024.0
    raise AssertionError("unreachable")


def stat_files(paths: Sequence[Path]) -> np.ndarray:
    """Sizes of ``paths``; every missing or unreadable file is reported at once.

    Args:
        paths: Files to check.

    Returns:
        File sizes. `[F]`, int64, bytes.

    Raises:
        FileNotFoundError: One line naming the missing files (the first few) and their count.
    """
    sizes = np.zeros(len(paths), dtype=np.int64)
    missing: list[str] = []
    for i, path in enumerate(paths):
        try:
            sizes[i] = os.stat(path).st_size
        except OSError:
            missing.append(str(path))
            continue
        if not os.path.isfile(path):
            missing.append(f"{path} (not a regular file)")
    if missing:
        # One line: error reports that keep only the first line still list the files.
        listed = ", ".join(missing[:_MAX_LISTED_MISSING])
        more = f" and {len(missing) - _MAX_LISTED_MISSING} more" if len(missing) > _MAX_LISTED_MISSING else ""
        raise FileNotFoundError(f"{len(missing)} of {len(paths)} image files are missing: {listed}{more}")
    return sizes


class SharedBuffer:
    """Bytes shared between a process and the workers it starts, by any start method.

    A ``memfd`` mapped ``MAP_SHARED``. Forked children inherit the mapping; forkserver and spawn
    children receive the file descriptor while being started and map the same pages. Pickling at
    any other time raises (the buffer is never copied by value).

    Args:
        num_bytes: Size of the buffer.
        name: Name of the memfd (shows in ``/proc/<pid>/fd``).

    Attributes:
        array: The whole buffer. `[num_bytes]`, uint8, writable.
    """

    def __init__(self, num_bytes: int, name: str) -> None:
        self.num_bytes = int(num_bytes)
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, max(self.num_bytes, 1))
            self._attach(fd)
        except BaseException:
            os.close(fd)
            raise

    def _attach(self, fd: int) -> None:
        # The fd stays open: it is what a child process is sent. The mapping is allocated in O(1);
        # pages appear as they are written.
        self._fd = fd
        self._finalizer = weakref.finalize(self, os.close, fd)
        self._mmap = mmap.mmap(fd, max(self.num_bytes, 1), flags=mmap.MAP_SHARED)
        self.array = np.frombuffer(self._mmap, dtype=np.uint8, count=self.num_bytes)

    def __reduce__(self) -> tuple:
        if multiprocessing.context.get_spawning_popen() is None:
            raise RuntimeError(
                "a SharedBuffer is sent to a process only while that process is being started "
                "(e.g. a DataLoader worker); it is never pickled by value"
            )
        return _attach_shared_buffer, (reduction.DupFd(self._fd), self.num_bytes)


def _attach_shared_buffer(dup_fd: object, num_bytes: int) -> SharedBuffer:
    # ``dup_fd`` is multiprocessing's DupFd: ``detach()`` gives this process's copy of the fd.
    buffer = SharedBuffer.__new__(SharedBuffer)
    buffer.num_bytes = num_bytes
    buffer._attach(dup_fd.detach())  # type: ignore[attr-defined]
    return buffer


class EncodedImageStore:
    """Encoded files held in one shared buffer with offsets, or read from disk.

    Args:
        paths: The files, in dataset order.
        ram_budget_bytes: Most bytes the buffer may take. When the files exceed it the store is in
            disk mode. ``0`` forces disk mode without the warning (e.g. eval images, read once).
        name: What the files are, for log messages (``"train images"``).
        background_fill: Fill the buffer in a background thread (True) or before returning.

    Raises:
        FileNotFoundError: A file is missing (all of them are listed), checked at construction.
        ValueError: ``paths`` is empty or ``ram_budget_bytes`` is negative.

    Invariants:
        ``view(i)`` returns exactly the bytes of file ``i``: from the buffer once filled (as they
        were when read), from the file before that and in disk mode. Only the filling thread
        writes the buffer, each byte once. Worker processes started by fork, forkserver or spawn
        share the one buffer (``SharedBuffer``).
    """

    def __init__(
        self,
        paths: Sequence[Path | str],
        ram_budget_bytes: int,
        name: str = "images",
        background_fill: bool = True,
    ) -> None:
        if len(paths) == 0:
            raise ValueError(f"paths must hold at least one file for the {name} store, got none")
        if ram_budget_bytes < 0:
            raise ValueError(f"ram_budget_bytes must be >= 0, got {ram_budget_bytes}")
        self.name = name
        self.paths: list[str] = [str(p) for p in paths]
        self.sizes = stat_files([Path(p) for p in self.paths])
        self.offsets = np.zeros(len(self.paths) + 1, dtype=np.int64)
        np.cumsum(self.sizes, out=self.offsets[1:])
        self.num_bytes = int(self.offsets[-1])
        self.shared = False
        self.fill_error: str | None = None
        self._buffer: SharedBuffer | None = None
        self._readable: np.ndarray | None = None
        self._num_filled = None
        self._all_filled = False
        self._fill_thread: threading.Thread | None = None
        if ram_budget_bytes == 0:
            return
        if self.num_bytes > ram_budget_bytes:
            _LOGGER.warning(
                "DISK MODE for %s: the %d encoded files take %s, more than the RAM budget of %s "
                "(--pipeline.datamanager.ram-budget-bytes). DataLoader workers will read every file "
                "from disk on each access instead of from a shared in-RAM buffer.",
                name,
                len(self.paths),
                format_bytes(self.num_bytes),
                format_bytes(ram_budget_bytes),
            )
            return
        self._buffer = SharedBuffer(self.num_bytes, f"distsplat {name}")
        self._readable = self._read_only_view()
        self.shared = True
        # A process-shared counter that reaches workers of any start method: a spawn-context lock
        # is a named semaphore (a fork-context one is unlinked at once and cannot be sent).
        self._num_filled = multiprocessing.get_context("spawn").Value("q", 0)
        if background_fill:
            self._fill_thread = threading.Thread(target=self._fill, name=f"fill {name}", daemon=True)
            self._fill_thread.start()
        else:
            self._fill()

    # ------------------------------------------------------------------ construction
    def _read_only_view(self) -> np.ndarray:
        assert self._buffer is not None
        readable = self._buffer.array.view()
        readable.flags.writeable = False
        return readable

    def _fill(self) -> None:
        assert self._buffer is not None and self._num_filled is not None
        array = self._buffer.array
        for i, path in enumerate(self.paths):
            start, end = int(self.offsets[i]), int(self.offsets[i + 1])
            try:
                with open(path, "rb", buffering=0) as f:
                    target = memoryview(array[start:end])
                    num_read = 0
                    while num_read < end - start:
                        n = f.readinto(target[num_read:])
                        if not n:
                            raise OSError(f"{path} shrank while being read: expected {end - start} bytes, got {num_read}")
                        num_read += n
            except OSError as exc:
                # Entries from here on are read from their files, which then report the problem.
                self.fill_error = str(exc)
                return
            with self._num_filled.get_lock():  # the lock orders the bytes before the count
                self._num_filled.value = i + 1

    def wait_filled(self, timeout_s: float | None = None) -> bool:
        """Block until the background fill ends; True when every entry is in the buffer."""
        if self._fill_thread is not None:
            self._fill_thread.join(timeout_s)
        return self.num_filled() == len(self.paths)

    def num_filled(self) -> int:
        """Entries already in the buffer (0 in disk mode)."""
        if self._num_filled is None:
            return 0
        if self._all_filled:
            return len(self.paths)
        with self._num_filled.get_lock():
            count = int(self._num_filled.value)
        self._all_filled = count == len(self.paths)
        return count

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return len(self.paths)

    @property
    def disk_mode(self) -> bool:
        """Whether readers open the files instead of reading the shared buffer."""
        return self._buffer is None

    def path(self, index: int) -> str:
        """File of entry ``index``."""
        return self.paths[index]

    def view(self, index: int) -> memoryview | bytes:
        """The encoded bytes of entry ``index``: a zero-copy read-only view of the buffer, or the file's bytes."""
        if self._readable is None or index >= self.num_filled():
            with open(self.paths[index], "rb") as f:
                return f.read()
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        return memoryview(self._readable[start:end])

    # ------------------------------------------------------------------ pickling
    def __getstate__(self) -> dict:
        # The buffer pickles as its file descriptor (only while a worker is being started); the
        # read-only view is rebuilt from it, and the filling thread stays in the owning process.
        state = self.__dict__.copy()
        state["_readable"] = None
        state["_fill_thread"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self._buffer is not None:
            self._readable = self._read_only_view()
