"""Live device bytes under the device stand-in (tests/helpers/device_standin.py), counted per storage.

Every :class:`~tests.helpers.device_standin.DeviceTensor` registers its host storage here when it is made;
views and in-place results share that storage and count once. The bytes are released when the last
device tensor on that storage is freed (autograd's saved tensors hold theirs while saved). What it
cannot see (the caching allocator's 512 B / 2 MiB rounding, fragmentation, gsplat's workspace, NCCL's
buffers) is listed in docs/device_standin.md.
"""

from __future__ import annotations

import os
import threading
import weakref

import torch

TOTAL_MEMORY_ENV = "DISTSPLAT_STANDIN_TOTAL_MEMORY"
"""Environment variable: the total device memory (bytes) the stand-in reports; an H100's 80 GiB when unset."""

_LOCK = threading.Lock()
_STORAGES: dict[int, list[int]] = {}  # storage data_ptr -> [device index, bytes, device tensors on it]
_LIVE: dict[int, int] = {}
_PEAK: dict[int, int] = {}
_RUN_PEAK: dict[int, int] = {}  # the peak since the process began: reset_peak_memory_stats leaves it


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
        entry = _STORAGES.get(key)
        if entry is None:
            entry = _STORAGES[key] = [index, size, 0]
            _LIVE[index] = _LIVE.get(index, 0) + size
            _PEAK[index] = max(_PEAK.get(index, 0), _LIVE[index])
            _RUN_PEAK[index] = max(_RUN_PEAK.get(index, 0), _LIVE[index])
        entry[2] += 1
    weakref.finalize(wrapper, _release, key)


def _release(key: int) -> None:
    with _LOCK:
        entry = _STORAGES[key]
        entry[2] -= 1
        if entry[2] == 0:
            del _STORAGES[key]
            _LIVE[entry[0]] -= entry[1]


def _index(device: object = None) -> int:
    if device is None:
        return torch.cuda.current_device()
    return device if isinstance(device, int) else (torch.device(device).index or 0)


def memory_allocated(device: object = None) -> int:
    """Live bytes on ``device`` (``torch.cuda.memory_allocated`` under the stand-in)."""
    return _LIVE.get(_index(device), 0)


def max_memory_allocated(device: object = None) -> int:
    """Peak live bytes on ``device`` since the last reset (``torch.cuda.max_memory_allocated``)."""
    return _PEAK.get(_index(device), 0)


def reset_peak_memory_stats(device: object = None) -> None:
    """Set the peak of ``device`` to its live bytes (``torch.cuda.reset_peak_memory_stats``)."""
    index = _index(device)
    with _LOCK:
        _PEAK[index] = _LIVE.get(index, 0)


def mem_get_info(device: object = None) -> tuple[int, int]:
    """(free, total) bytes of ``device`` (``torch.cuda.mem_get_info``)."""
    return total_memory() - memory_allocated(device), total_memory()


def run_peak_bytes() -> dict[int, int]:
    """Peak live bytes per device index since the process began (no reset clears it)."""
    with _LOCK:
        return dict(_RUN_PEAK)
