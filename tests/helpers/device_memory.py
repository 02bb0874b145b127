"""Live device bytes under the device stand-in (tests/helpers/device_standin.py), counted per storage.

Every :class:`~tests.helpers.device_standin.DeviceTensor` registers its host storage here when it is made;
views and in-place results share that storage and count once. The bytes are released when the last
device tensor on that storage is freed (autograd's saved tensors hold theirs while saved). What it
cannot see (the caching allocator's 512 B / 2 MiB rounding, fragmentation, gsplat's workspace, NCCL's
buffers) is listed in docs/device_standin.md.

With ``DISTSPLAT_STANDIN_PEAK_SITES=1`` each storage also keeps the place that made it (the innermost
frame in ``distsplat_ns``, else the innermost outside torch and these helpers), and each new run peak
copies the live bytes per place: :func:`peak_sites`, what held the device at the peak.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import weakref

import torch

TOTAL_MEMORY_ENV = "DISTSPLAT_STANDIN_TOTAL_MEMORY"
"""Environment variable: the total device memory (bytes) the stand-in reports; an H100's 80 GiB when unset."""

_LOCK = threading.Lock()
_FREED: collections.deque[int] = collections.deque()
"""Storages whose last device tensor died, not yet subtracted: a finalizer only appends here, because
it can run inside a section that holds ``_LOCK`` (a garbage collection started by an allocation there),
and taking the lock in it would deadlock that thread (seen on torch 2.1.2: docs/device_standin.md,
"Counting")."""
_STORAGES: dict[int, list[int]] = {}  # storage data_ptr -> [device index, bytes, device tensors on it]
_LIVE: dict[int, int] = {}
_PEAK: dict[int, int] = {}
_RUN_PEAK: dict[int, int] = {}  # the peak since the process began: reset_peak_memory_stats leaves it
PEAK_SITES_ENV = "DISTSPLAT_STANDIN_PEAK_SITES"
"""Environment variable: ``1`` records where each storage was made and the live bytes per place at each run peak."""
_SITE: dict[int, str] = {}  # storage data_ptr -> the place that made it (sites on)
_SITE_LIVE: dict[int, dict[str, list[int]]] = {}  # device -> place -> [live bytes, live storages]
_PEAK_SITES: dict[int, dict[str, list[int]]] = {}  # device -> _SITE_LIVE's copy at the run peak
_PACKAGE = os.sep + "distsplat_ns" + os.sep
_SKIP = (os.path.dirname(os.path.abspath(torch.__file__)), os.path.dirname(os.path.abspath(__file__)))


def total_memory() -> int:
    """The total memory of each stand-in device, in bytes."""
    return int(os.environ.get(TOTAL_MEMORY_ENV) or 80 << 30)


def register(wrapper: torch.Tensor, host: torch.Tensor, index: int) -> None:
    """Count ``host``'s storage on device ``index`` while ``wrapper`` (a device tensor on it) lives."""
    storage = host.untyped_storage()
    key, size = storage.data_ptr(), storage.nbytes()
    if size == 0:
        return
    with _LOCK:
        _apply_frees()
        entry = _STORAGES.get(key)
        if entry is None:
            entry = _STORAGES[key] = [index, size, 0]
            _LIVE[index] = _LIVE.get(index, 0) + size
            _PEAK[index] = max(_PEAK.get(index, 0), _LIVE[index])
            sites = _sites_on()
            if sites:
                _count_site(key, index, size)
            if _LIVE[index] > _RUN_PEAK.get(index, 0):
                _RUN_PEAK[index] = _LIVE[index]
                if sites:
                    _PEAK_SITES[index] = {site: list(v) for site, v in _SITE_LIVE[index].items() if v[0]}
        entry[2] += 1
    weakref.finalize(wrapper, _FREED.append, key)


def _apply_frees() -> None:
    """Subtract the storages in ``_FREED`` (caller holds ``_LOCK``). Every count is read after this,
    so each answer is the one an immediate release would give; a storage freed and made again at the
    same address is released before it is registered anew."""
    while _FREED:
        key = _FREED.popleft()
        entry = _STORAGES[key]
        entry[2] -= 1
        if entry[2] == 0:
            del _STORAGES[key]
            _LIVE[entry[0]] -= entry[1]
            site = _SITE.pop(key, None)
            if site is not None:
                counts = _SITE_LIVE[entry[0]][site]
                counts[0] -= entry[1]
                counts[1] -= 1


def _sites_on() -> bool:
    """Read at every new storage (a storage made while off has no place and is in no snapshot)."""
    return os.environ.get(PEAK_SITES_ENV) == "1"


def _count_site(key: int, index: int, size: int) -> None:
    """Charge ``size`` bytes to the place that is making the storage (caller holds the lock)."""
    site = creating_site()
    _SITE[key] = site
    counts = _SITE_LIVE.setdefault(index, {}).setdefault(site, [0, 0])
    counts[0] += size
    counts[1] += 1


def creating_site() -> str:
    """``file:line in function`` of the innermost frame in ``distsplat_ns``, else of the innermost
    outside torch and these helpers (``?`` when none: e.g. autograd's engine thread)."""
    frame = sys._getframe(1)
    other = None
    while frame is not None:
        name = frame.f_code.co_filename
        if _PACKAGE in name:
            return f"{name[name.index(_PACKAGE) + 1 :]}:{frame.f_lineno} in {frame.f_code.co_name}"
        if other is None and not name.startswith(_SKIP) and not name.startswith("<"):
            other = f"{os.path.basename(name)}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return other or "?"


def _index(device: object = None) -> int:
    if device is None:
        return torch.cuda.current_device()
    return device if isinstance(device, int) else (torch.device(device).index or 0)


def memory_allocated(device: object = None) -> int:
    """Live bytes on ``device`` (``torch.cuda.memory_allocated`` under the stand-in)."""
    index = _index(device)
    with _LOCK:
        _apply_frees()
        return _LIVE.get(index, 0)


def max_memory_allocated(device: object = None) -> int:
    """Peak live bytes on ``device`` since the last reset (``torch.cuda.max_memory_allocated``)."""
    index = _index(device)
    with _LOCK:
        _apply_frees()
        return _PEAK.get(index, 0)


def reset_peak_memory_stats(device: object = None) -> None:
    """Set the peak of ``device`` to its live bytes (``torch.cuda.reset_peak_memory_stats``)."""
    index = _index(device)
    with _LOCK:
        _apply_frees()
        _PEAK[index] = _LIVE.get(index, 0)


def mem_get_info(device: object = None) -> tuple[int, int]:
    """(free, total) bytes of ``device`` (``torch.cuda.mem_get_info``)."""
    return total_memory() - memory_allocated(device), total_memory()


def run_peak_bytes() -> dict[int, int]:
    """Peak live bytes per device index since the process began (no reset clears it)."""
    with _LOCK:
        _apply_frees()
        return dict(_RUN_PEAK)


def peak_sites() -> dict[int, dict[str, list[int]]]:
    """Per device index, the live ``[bytes, storages]`` per creating place at its run peak
    (empty unless ``DISTSPLAT_STANDIN_PEAK_SITES=1``); the bytes sum to :func:`run_peak_bytes`."""
    with _LOCK:
        _apply_frees()
        return {index: {site: list(v) for site, v in sites.items()} for index, sites in _PEAK_SITES.items()}
