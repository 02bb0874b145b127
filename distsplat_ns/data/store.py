"""The encoded image files of a dataset, read once into one shared, read-only byte buffer.

Pure: torch and numpy only.

Why (issue #3): decoded 1080p images take 6 MB each in uint8 (25 MB in float32), their JPEG files
about 0.36 MB. Keeping the *files* in RAM makes memory grow with the size of the files, and the
DataLoader workers decode on demand.

How the workers avoid copies:
- The bytes live in one shared mapping; its pages are shared between processes, never
  copy-on-write, and nobody writes them after the fill.
- ``fork`` start method (Linux default, used by the datamanager): an anonymous ``MAP_SHARED``
  mapping, which every worker inherits at fork. Nothing is pickled, and the store refuses to be.
- ``spawn``/``forkserver``: a ``torch.UntypedStorage`` in POSIX shared memory (``/dev/shm``, the
  mechanism the DataLoader uses to return tensors); the DataLoader pickles the dataset with
  ``ForkingPickler``, for which torch sends the storage's file descriptor, not its bytes. When
  ``/dev/shm`` cannot hold it, the store falls back to disk mode (logged).
- Readers get zero-copy, read-only ``memoryview``s of one file's bytes.

Start-up time: the buffer is filled by a background thread, in dataset order, while training
starts; an entry not yet filled is read from its file (same bytes). The number of filled entries
lives in a shared ``multiprocessing.Value`` whose lock orders the writer's bytes before the
readers' loads. So time to first batch does not grow with the size of the dataset (issue #3).

Disk mode: when the files exceed the RAM budget the store keeps only paths and sizes, and readers
open the file on each access; the store logs this once, at construction.

Shape legend: ``F``: files (entries).
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import threading
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from distsplat_ns.utils.logging import get_logger

_LOGGER = get_logger(__name__)


class _NoSharedMemory(Exception):
    """/dev/shm cannot hold the buffer for spawned workers."""


_SHM_DIR = "/dev/shm"
_MAX_LISTED_MISSING = 10


def format_bytes(num_bytes: float) -> str:
    """Human-readable size, e.g. ``'1.50 GiB'``."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024.0 or unit == "TiB":
            return f"{value:.2f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024.0
    raise AssertionError("unreachable")


def shm_free_bytes() -> int:
    """Free bytes in ``/dev/shm`` (0 where it does not exist)."""
    try:
        stats = os.statvfs(_SHM_DIR)
    except OSError:
        return 0
    return stats.f_bavail * stats.f_frsize


def stat_files(paths: Sequence[Path]) -> np.ndarray:
    """Sizes of ``paths``; every missing or unreadable file is reported at once.

    Args:
        paths: Files to check.

    Returns:
        File sizes. `[F]`, int64, bytes.

    Raises:
        FileNotFoundError: Naming the missing files (the first few and their count).
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
        listed = "\n  ".join(missing[:_MAX_LISTED_MISSING])
        more = f"\n  ... and {len(missing) - _MAX_LISTED_MISSING} more" if len(missing) > _MAX_LISTED_MISSING else ""
        raise FileNotFoundError(f"{len(missing)} of {len(paths)} image files are missing:\n  {listed}{more}")
    return sizes


class EncodedImageStore:
    """Encoded files held in one shared buffer with offsets, or read from disk.

    Args:
        paths: The files, in dataset order.
        ram_budget_bytes: Most bytes the buffer may take. When the files exceed it the store is in
            disk mode. ``0`` forces disk mode without the warning (e.g. eval images, read once).
        name: What the files are, for log messages (``"train images"``).
        background_fill: Fill the buffer in a background thread (True) or before returning.
        multiprocessing_context: Start method of the processes that will read the store
            (``"fork"``, ``"spawn"``, ``"forkserver"``): its shared fill counter must be of that kind.

    Raises:
        FileNotFoundError: A file is missing (all of them are listed), checked at construction.
        ValueError: ``paths`` is empty or ``ram_budget_bytes`` is negative.

    Invariants:
        ``view(i)`` returns exactly the bytes of file ``i``: from the buffer once filled (as they
        were when read), from the file before that and in disk mode. Only the filling thread
        writes the buffer, each byte once.
    """

    def __init__(
        self,
        paths: Sequence[Path | str],
        ram_budget_bytes: int,
        name: str = "images",
        background_fill: bool = True,
        multiprocessing_context: str = "fork",
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
        self._buffer: torch.Tensor | None = None
        self._mmap: mmap.mmap | None = None
        self._array: np.ndarray | None = None
        self._readable: np.ndarray | None = None
        self._num_filled = None
        self._all_filled = False
        self._fill_thread: threading.Thread | None = None
        if ram_budget_bytes == 0:
            return
        if self.num_bytes > ram_budget_bytes:
            _LOGGER.warning(
                "DISK MODE for %s: the %d encoded files take %s, more than the RAM budget of %s "
                "(ram_budget_bytes / ram_budget_fraction). DataLoader workers will read every file "
                "from disk on each access instead of from a shared in-RAM buffer.",
                name,
                len(self.paths),
                format_bytes(self.num_bytes),
                format_bytes(ram_budget_bytes),
            )
            return
        try:
            self._allocate(multiprocessing_context)
        except _NoSharedMemory as exc:
            _LOGGER.warning("DISK MODE for %s: %s. DataLoader workers will read every file from disk.", name, exc)
            return
        # A process-shared counter: forked workers inherit it, spawned ones get it while spawning
        # (a fork-context semaphore is unlinked at once and cannot reach a spawned process).
        self._num_filled = multiprocessing.get_context(multiprocessing_context).Value("q", 0)
        if background_fill:
            self._fill_thread = threading.Thread(target=self._fill, name=f"fill {name}", daemon=True)
            self._fill_thread.start()
        else:
            self._fill()

    # ------------------------------------------------------------------ construction
    def _allocate(self, multiprocessing_context: str) -> None:
        size = max(self.num_bytes, 1)
        if multiprocessing_context == "fork":
            # An anonymous MAP_SHARED mapping: allocated in O(1) (pages appear as the fill touches
            # them), inherited by forked workers, not bounded by the size of /dev/shm.
            self._mmap = mmap.mmap(-1, size, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
            self._array = np.frombuffer(self._mmap, dtype=np.uint8, count=self.num_bytes)
            self.shared = True
        elif shm_free_bytes() >= 2 * self.num_bytes + (256 << 20):
            # Leave headroom in /dev/shm for the DataLoader's own shared tensors (decoded images).
            storage = torch.UntypedStorage._new_shared(size)
            self._buffer = torch.empty(0, dtype=torch.uint8).set_(storage)[: self.num_bytes]
            self._array = self._buffer.numpy()
            self.shared = True
        else:
            raise _NoSharedMemory(
                f"/dev/shm has {format_bytes(shm_free_bytes())} free, too little for the "
                f"{format_bytes(self.num_bytes)} {self.name} buffer of '{multiprocessing_context}' workers"
            )
        self._readable = self._read_only_view()

    def _read_only_view(self) -> np.ndarray:
        assert self._array is not None
        readable = self._array.view()
        readable.flags.writeable = False
        return readable

    def _fill(self) -> None:
        assert self._array is not None and self._num_filled is not None
        for i, path in enumerate(self.paths):
            start, end = int(self.offsets[i]), int(self.offsets[i + 1])
            try:
                with open(path, "rb", buffering=0) as f:
                    target = memoryview(self._array[start:end])
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
        return self._array is None and self._buffer is None

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
        if self._mmap is not None:
            raise RuntimeError(
                f"the {self.name} store was built for fork-started workers (an inherited mapping) and cannot be "
                "pickled: build it with multiprocessing_context='spawn' or 'forkserver' for such workers"
            )
        state = self.__dict__.copy()
        # The numpy views are rebuilt from the tensor, whose storage torch pickles as a shm
        # handle; the filling thread stays in the process that owns it.
        state["_array"] = None
        state["_readable"] = None
        state["_fill_thread"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self._buffer is not None:
            self._array = self._buffer.numpy()
            self._readable = self._read_only_view()
