"""The encoded image files of a dataset, read once into one shared, read-only byte buffer per host.

Pure: numpy and the standard library only. Memory grows with the size of the files, not of the
decoded images. The host's lowest rank (its *filler*) decides RAM or disk mode for the host and
fills a ``SharedBuffer`` (a nameless ``memfd``, freed when its last holder ends, SIGKILL included)
in a background thread; the other local ranks receive its descriptor read-only (``host``:
``HostShare``, ``LocalHost``), workers map the same file, and readers get zero-copy ``memoryview``s.
The fill count sits in the buffer's header under a POSIX record lock; an entry not yet filled is
read from its file. Design and measurements: docs/data.md, "The shared byte buffer (how workers
avoid copies)" and "One store per host".

Shape legend: ``F``: files (entries).
"""

from __future__ import annotations

import fcntl
import mmap
import multiprocessing
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from multiprocessing import reduction
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from distsplat_ns.utils.logging import get_logger
from distsplat_ns.utils.units import format_bytes

_LOGGER = get_logger(__name__)

_MAX_LISTED_MISSING = 10

HEADER_BYTES = 64
"""Bytes before the files in a store's buffer: the fill count and state (two int64), padded."""

_FILLING, _FILLED, _FILL_STOPPED = 0, 1, 2
"""The fill state in the header: running, every entry in the buffer, stopped on a read error."""

_POLL_S = 0.01


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
    """Bytes shared between a process and the processes it starts or hands the descriptor to.

    A ``memfd`` mapped ``MAP_SHARED``. Forked children inherit the mapping; forkserver and spawn
    children receive the file descriptor while being started and map the same pages; unrelated
    processes receive a descriptor over a Unix socket (``from_fd``). Pickling at any other time
    raises (the buffer is never copied by value).

    Args:
        num_bytes: Size of the buffer.
        name: Name of the memfd (shows in ``/proc/<pid>/fd`` as ``memfd:<name>``).

    Attributes:
        array: The whole buffer. `[num_bytes]`, uint8; writable unless mapped read-only.
        writable: Whether this process mapped it for writing.
        share_writable: Whether processes this buffer is pickled to map it for writing (True;
            the image store sends it read-only).
    """

    def __init__(self, num_bytes: int, name: str) -> None:
        self.num_bytes = int(num_bytes)
        self.share_writable = True
        self._reader_fd: int | None = None
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, max(self.num_bytes, 1))
            self._attach(fd, writable=True)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def from_fd(cls, fd: int, num_bytes: int, writable: bool = False) -> SharedBuffer:
        """The buffer behind a received descriptor ``fd`` (this object takes it over and closes it).

        Raises:
            ValueError: The file is smaller than ``num_bytes`` (it is not the buffer expected).
        """
        size = os.fstat(fd).st_size
        if size < max(int(num_bytes), 1):
            os.close(fd)
            raise ValueError(f"the shared buffer received holds {size} bytes, expected {num_bytes}")
        buffer = cls.__new__(cls)
        buffer.num_bytes = int(num_bytes)
        buffer.share_writable = writable
        buffer._reader_fd = None
        buffer._attach(fd, writable)
        return buffer

    def _attach(self, fd: int, writable: bool) -> None:
        # The fd stays open: it is what a child process is sent, and what the store's lock holds.
        # The mapping is allocated in O(1); pages appear as they are written.
        self._fd = fd
        self.writable = writable
        self._finalizer = weakref.finalize(self, os.close, fd)
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        self._mmap = mmap.mmap(fd, max(self.num_bytes, 1), flags=mmap.MAP_SHARED, prot=prot)
        self.array = np.frombuffer(self._mmap, dtype=np.uint8, count=self.num_bytes)

    @property
    def fd(self) -> int:
        """This process's descriptor of the memfd."""
        return self._fd

    def reader_fd(self) -> int:
        """A read-only descriptor of the same memfd, to send to other processes: opened once
        (through ``/proc/self/fd``) and closed with the buffer; the writable one where there is no
        procfs."""
        if self._reader_fd is None:
            try:
                fd = os.open(f"/proc/self/fd/{self._fd}", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return self._fd
            self._reader_fd = fd
            self._reader_finalizer = weakref.finalize(self, os.close, fd)
        return self._reader_fd

    def __reduce__(self) -> tuple:
        if multiprocessing.context.get_spawning_popen() is None:
            raise RuntimeError(
                "a SharedBuffer is sent to a process only while that process is being started "
                "(e.g. a DataLoader worker); it is never pickled by value"
            )
        return _attach_shared_buffer, (reduction.DupFd(self._fd), self.num_bytes, self.share_writable)


def _attach_shared_buffer(dup_fd: object, num_bytes: int, writable: bool = True) -> SharedBuffer:
    # ``dup_fd`` is multiprocessing's DupFd: ``detach()`` gives this process's copy of the fd.
    buffer = SharedBuffer.__new__(SharedBuffer)
    buffer.num_bytes = num_bytes
    buffer.share_writable = writable
    buffer._reader_fd = None
    buffer._attach(dup_fd.detach(), writable)  # type: ignore[attr-defined]
    return buffer


class HostShare(Protocol):
    """The local ranks of one host, as one rank sees them (``distributed/host_share.HostGroup``).

    Attributes:
        is_leader: Whether this rank fills the host's stores and decides for the host.
        num_local_ranks: Ranks on this host (this one included).
    """

    is_leader: bool
    num_local_ranks: int

    def share(self, make: Callable[[], tuple[Any, list[int]]]) -> tuple[Any, list[int]]:
        """The leader calls ``make() -> (info, fds)``; every local rank gets ``info`` (picklable)
        and descriptors of the same files (the leader its own, the others received copies they
        own). **Collective:** every rank of the job calls it, in the same order."""
        ...


class LocalHost:
    """A process alone on its host: it fills and decides for itself (``share`` is ``make()``)."""

    is_leader = True
    num_local_ranks = 1

    def share(self, make: Callable[[], tuple[Any, list[int]]]) -> tuple[Any, list[int]]:
        return make()


_STORES: weakref.WeakSet[EncodedImageStore] = weakref.WeakSet()
"""This process's stores, for :func:`_after_fork_in_child`."""


def _after_fork_in_child() -> None:
    """A forked child has only the forking thread: a store's count lock, copied while the
    filler's thread held it (``_publish`` runs after every file), would stay locked in the child
    forever, and every ``view`` there would wait on it. The child gets fresh locks, and its
    ``wait_filled`` reads the header that the parent's fill thread keeps writing."""
    for store in list(_STORES):
        store._count_lock = threading.Lock()
        store._fill_thread = None


os.register_at_fork(after_in_child=_after_fork_in_child)


class EncodedImageStore:
    """Encoded files held in one shared buffer per host with offsets, or read from disk.

    Args:
        paths: The files, in dataset order.
        ram_budget_bytes: Most bytes the buffer may take on this host (the leader's value counts).
            When the files exceed it the store is in disk mode on every local rank. ``0`` forces
            disk mode without the warning and without any exchange (e.g. eval images, read once).
        name: What the files are, for log messages (``"train images"``).
        background_fill: Fill the buffer in a background thread (True) or before returning.
        host: The local ranks sharing the buffer (``LocalHost()`` when None). **Collective**
            when given and ``ram_budget_bytes > 0``: one ``host.share``.

    Raises:
        FileNotFoundError: A file is missing (all of them are listed), checked at construction.
        ValueError: ``paths`` is empty or ``ram_budget_bytes`` is negative.

    Attributes:
        budget_bytes: The host's budget as its leader decided it (``ram_budget_bytes`` alone).
        is_filler: Whether this process fills the buffer (the host's leader, in RAM mode).

    Invariants:
        ``view(i)`` returns exactly the bytes of file ``i``: from the buffer once filled (as they
        were when read), from the file before that and in disk mode. Only the filler's thread
        writes the buffer, each byte once; every other process maps it read-only. Local ranks and
        worker processes started by fork, forkserver or spawn share the one buffer.
    """

    def __init__(
        self,
        paths: Sequence[Path | str],
        ram_budget_bytes: int,
        name: str = "images",
        background_fill: bool = True,
        host: HostShare | None = None,
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
        self.budget_bytes = int(ram_budget_bytes)
        self.shared = False
        self.is_filler = False
        self.num_local_ranks = 1
        self.fill_error: str | None = None
        self._buffer: SharedBuffer | None = None
        self._readable: np.ndarray | None = None
        self._header: np.ndarray | None = None
        self._count_lock = threading.Lock()
        self._all_filled = False
        self._fill_thread: threading.Thread | None = None
        _STORES.add(self)
        if ram_budget_bytes == 0:
            return
        host = host if host is not None else LocalHost()
        self.num_local_ranks = host.num_local_ranks
        (mode, self.budget_bytes), fds = host.share(lambda: self._create(ram_budget_bytes, background_fill))
        if mode != "ram":
            return
        if not self.is_filler:
            self._buffer = SharedBuffer.from_fd(fds[0], HEADER_BYTES + self.num_bytes, writable=False)
            self._make_views()
        self.shared = True

    # ------------------------------------------------------------------ construction
    def _create(self, budget_bytes: int, background_fill: bool) -> tuple[tuple[str, int], list[int]]:
        """The leader's part: decide RAM or disk mode for the host, make and start filling the
        buffer; returns ``((mode, budget), descriptors to send)``."""
        if self.num_bytes > budget_bytes:
            _LOGGER.warning(
                "DISK MODE for %s: the %d encoded files take %s, more than the RAM budget of %s on this host "
                "(--pipeline.datamanager.ram-budget-bytes). DataLoader workers will read every file "
                "from disk on each access instead of from a shared in-RAM buffer.",
                self.name,
                len(self.paths),
                format_bytes(self.num_bytes),
                format_bytes(budget_bytes),
            )
            return ("disk", budget_bytes), []
        self._buffer = SharedBuffer(HEADER_BYTES + self.num_bytes, f"distsplat {self.name}")
        self._buffer.share_writable = False  # workers map it read-only
        self.is_filler = True
        self._make_views()
        if background_fill:
            self._fill_thread = threading.Thread(target=self._fill, name=f"fill {self.name}", daemon=True)
            self._fill_thread.start()
        else:
            self._fill()
        return ("ram", budget_bytes), [self._buffer.reader_fd()]

    def _make_views(self) -> None:
        assert self._buffer is not None
        self._header = self._buffer.array[:HEADER_BYTES].view(np.int64)
        readable = self._buffer.array[HEADER_BYTES:].view()
        readable.flags.writeable = False
        self._readable = readable

    def _publish(self, count: int, state: int) -> None:
        """The filler's write of the header, under the memfd's exclusive record lock."""
        assert self._buffer is not None and self._header is not None
        with self._count_lock:  # record locks are per process: the lock orders this process's threads
            fcntl.lockf(self._buffer.fd, fcntl.LOCK_EX, 16, 0, os.SEEK_SET)
            try:
                self._header[0], self._header[1] = count, state
            finally:
                fcntl.lockf(self._buffer.fd, fcntl.LOCK_UN, 16, 0, os.SEEK_SET)

    def _read_header(self) -> tuple[int, int]:
        """``(count, state)`` under the memfd's shared record lock: every byte of the first
        ``count`` entries is visible once the lock is taken."""
        assert self._buffer is not None and self._header is not None
        with self._count_lock:
            fcntl.lockf(self._buffer.fd, fcntl.LOCK_SH, 16, 0, os.SEEK_SET)
            try:
                return int(self._header[0]), int(self._header[1])
            finally:
                fcntl.lockf(self._buffer.fd, fcntl.LOCK_UN, 16, 0, os.SEEK_SET)

    def _fill(self) -> None:
        assert self._buffer is not None
        array = self._buffer.array
        for i, path in enumerate(self.paths):
            start, end = HEADER_BYTES + int(self.offsets[i]), HEADER_BYTES + int(self.offsets[i + 1])
            try:
                with open(path, "rb", buffering=0) as f:
                    target = memoryview(array[start:end])
                    num_read = 0
                    while num_read < end - start:
                        n = f.readinto(target[num_read:])
                        if not n:
                            raise OSError(
                                f"{path} shrank while being read: expected {end - start} bytes, got {num_read}"
                            )
                        num_read += n
            except OSError as exc:
                # Entries from here on are read from their files, which then report the problem.
                self.fill_error = str(exc)
                self._publish(i, _FILL_STOPPED)
                return
            self._publish(i + 1, _FILLED if i + 1 == len(self.paths) else _FILLING)

    def wait_filled(self, timeout_s: float | None = None) -> bool:
        """Block until the fill ends (the filler's, seen from any local rank or worker); True
        when every entry is in the buffer."""
        if self._buffer is None:
            return False
        if self._fill_thread is not None:
            self._fill_thread.join(timeout_s)
        else:
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while self._read_header()[1] == _FILLING and (deadline is None or time.monotonic() < deadline):
                time.sleep(_POLL_S)
        return self.num_filled() == len(self.paths)

    def num_filled(self) -> int:
        """Entries already in the buffer (0 in disk mode)."""
        if self._buffer is None:
            return 0
        if self._all_filled:
            return len(self.paths)
        count = self._read_header()[0]
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
        # views and the lock are rebuilt from it, and the filling thread stays in the filler.
        state = self.__dict__.copy()
        for key in ("_readable", "_header", "_fill_thread", "_count_lock"):
            state[key] = None
        state["is_filler"] = False
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._count_lock = threading.Lock()
        _STORES.add(self)
        if self._buffer is not None:
            self._make_views()
