"""A ``torch.save`` file whose largest tensors are written in pieces, never held whole.

Rank 0's consolidation (``parallel/shard_checkpoint.py:consolidate_params``) writes nerfstudio's
``step-N.ckpt`` of a model no process holds: every Gaussian's parameters. Holding them to call
``torch.save`` cost rank 0 N x 244 B beside its own shard, the one per-process term of a sharded
run that grows with all N rather than N / W (docs/sharded.md, "Capacity with W"). Here the file is
written in two passes: ``torch.save`` under ``torch.serialization.skip_data`` writes the layout --
the pickle and room for every storage, the row tensors being untouched ``torch.empty`` placeholders
(no page of them is ever resident) -- and then each storage's bytes are written at its record's
offset in the zip archive: the placeholders' rows piece by piece from a reader, every other tensor
(RNG state, the ids) from memory. ``torch.load`` reads the result as any ``torch.save`` file
(tests/unit/test_streamed_file.py).

Shape letters: N rows of a placeholder.
"""

from __future__ import annotations

import functools
import math
import os
import pickle
import struct
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from distsplat_ns.distributed.torch_compat import save_layout_only

#: ``fill(write)`` of a placeholder: calls ``write(rows, positions)`` for pieces of its rows --
#: ``rows`` `[n, ...]` (the placeholder's dtype and trailing shape) going to rows ``positions``
#: `[n]` int64 of the placeholder -- until every row is written once.
Fill = Callable[[Callable[[torch.Tensor, torch.Tensor], None]], None]

#: The zip local file header before a record's name and extra field (PKWARE APPNOTE 4.3.7).
_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")
_LOCAL_SIGNATURE = 0x04034B50


@dataclass(frozen=True)
class _StorageRef:
    key: str


@dataclass(frozen=True)
class _TensorRef:
    """Where a tensor of the file lies: its storage's record and its first element there."""

    key: str
    storage_offset: int


def _rebuild_tensor_ref(storage: _StorageRef, storage_offset: int, *_rest: Any) -> _TensorRef:
    return _TensorRef(storage.key, int(storage_offset))


class _LayoutUnpickler(pickle.Unpickler):
    """``data.pkl`` of a file this process just wrote, each tensor replaced by its :class:`_TensorRef`."""

    def persistent_load(self, pid: Any) -> _StorageRef:
        # torch.save's persistent id of a storage: ("storage", storage type, key, location, numel).
        return _StorageRef(str(pid[2]))

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor_ref
        return super().find_class(module, name)


def _record_offsets(path: Path) -> dict[str, int]:
    """Storage key -> the byte offset of its record's data in the zip archive ``path``."""
    offsets = {}
    with zipfile.ZipFile(path) as archive, open(path, "rb") as fh:
        for info in archive.infolist():
            parts = info.filename.split("/")
            if len(parts) != 3 or parts[1] != "data":
                continue
            fh.seek(info.header_offset)
            header = _LOCAL_HEADER.unpack(fh.read(_LOCAL_HEADER.size))
            if header[0] != _LOCAL_SIGNATURE:
                raise RuntimeError(f"{path}: record {info.filename} has no local header at {info.header_offset}")
            name_len, extra_len = header[9], header[10]
            offsets[parts[2]] = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
    return offsets


def _layout(path: Path) -> Any:
    with zipfile.ZipFile(path) as archive:
        (pkl,) = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        return _LayoutUnpickler(archive.open(pkl)).load()


def _tensors(obj: Any, keys: tuple = ()) -> Iterator[tuple[tuple, torch.Tensor]]:
    """Every tensor of ``obj`` (dicts, lists and tuples walked in order) with the keys that reach it."""
    if isinstance(obj, torch.Tensor):
        yield keys, obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from _tensors(value, (*keys, key))
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from _tensors(value, (*keys, i))


def _ref_at(layout: Any, keys: tuple) -> _TensorRef:
    """The place in the file of the tensor ``keys`` reach (``layout``: the payload unpickled)."""
    for key in keys:
        layout = layout[key]
    if not isinstance(layout, _TensorRef):
        raise TypeError(f"a tensor of the payload was written as {type(layout).__name__}")
    return layout


def _fill(
    tensor: torch.Tensor, fill: Fill, write_rows: Callable[[torch.Tensor, torch.Tensor], None], path: Path
) -> None:
    """Run a placeholder's ``fill`` with a writer that hands each batch of rows to ``write_rows``;
    every row of ``tensor`` must come."""
    count = 0

    def write(rows: torch.Tensor, positions: torch.Tensor) -> None:
        nonlocal count
        write_rows(rows, positions)
        count += positions.numel()

    fill(write)
    if count != tensor.shape[0]:
        raise RuntimeError(f"write_streamed: a placeholder of {tensor.shape[0]} rows of {path} got {count}")


def _check_placed(placed: set[int], fills: dict[int, Fill], path: Path) -> None:
    if placed != set(fills):
        raise RuntimeError(f"write_streamed: {len(set(fills) - placed)} placeholder(s) not in the payload of {path}")


def _storage_bytes(tensor: torch.Tensor) -> bytes:
    whole = torch.empty(0, dtype=torch.uint8).set_(tensor.untyped_storage())
    return whole.numpy().tobytes()


def write_streamed(path: Path, payload: dict[str, Any], fills: dict[int, Fill]) -> None:
    """Write ``payload`` to ``path`` as ``torch.save`` would, each placeholder's rows from its fill.

    Args:
        path: The file to write (created or replaced; the caller makes it atomic).
        payload: Dicts, lists and tuples of tensors and picklable values; every tensor on the host,
            contiguous and alone in its storage where it is a placeholder.
        fills: ``id(placeholder)`` -> its :data:`Fill`. A placeholder is a ``torch.empty`` tensor
            of the payload; none of its bytes is read.

    Raises:
        RuntimeError: a storage of the file got no bytes, or a placeholder is not in ``payload``.

    Local; no collective.
    """
    layout_only = save_layout_only()
    if layout_only is None:  # torch < 2.5: the placeholders filled in memory, the file saved whole
        _save_filled(path, payload, fills)
        return
    with layout_only:
        torch.save(payload, path)
    offsets = _record_offsets(path)
    written: set[str] = set()
    placed: set[int] = set()
    fd = os.open(path, os.O_WRONLY)
    try:
        layout = _layout(path)
        for keys, tensor in _tensors(payload):
            ref = _ref_at(layout, keys)
            start = offsets[ref.key] + ref.storage_offset * tensor.element_size()
            if id(tensor) in fills:
                row_bytes = math.prod(tensor.shape[1:]) * tensor.element_size()
                _fill(tensor, fills[id(tensor)], functools.partial(_write_rows, fd, start, row_bytes), path)
                placed.add(id(tensor))
            elif ref.key not in written:
                os.pwrite(fd, _storage_bytes(tensor), offsets[ref.key])
            written.add(ref.key)
        os.fsync(fd)
    finally:
        os.close(fd)
    _check_placed(placed, fills, path)
    if written != set(offsets):
        raise RuntimeError(f"write_streamed: storages {sorted(set(offsets) - written)} of {path} were not written")


def _save_filled(path: Path, payload: dict[str, Any], fills: dict[int, Fill]) -> None:
    """``write_streamed`` where torch cannot save a layout alone: each placeholder's rows written
    into the placeholder itself (so held whole, as before the streamed file), then ``torch.save``."""
    placed: set[int] = set()
    for _, tensor in _tensors(payload):
        if id(tensor) not in fills or id(tensor) in placed:
            continue

        def write_rows(rows: torch.Tensor, positions: torch.Tensor, tensor: torch.Tensor = tensor) -> None:
            tensor[positions] = rows.to(tensor.dtype)

        _fill(tensor, fills[id(tensor)], write_rows, path)
        placed.add(id(tensor))
    _check_placed(placed, fills, path)
    torch.save(payload, path)


def _write_rows(fd: int, start: int, row_bytes: int, rows: torch.Tensor, positions: torch.Tensor) -> None:
    """Rows at ``positions`` of the tensor whose first row is at byte ``start``: one write per run
    of consecutive positions (a chunk read in saved order is one run when the ids were not moved)."""
    if positions.numel() == 0:
        return
    order = torch.sort(positions).indices
    positions, rows = positions[order], rows[order].contiguous()
    breaks = (torch.nonzero(positions[1:] - positions[:-1] != 1).flatten() + 1).tolist()
    flat = rows.reshape(rows.shape[0], -1).view(torch.uint8).numpy()
    for lo, hi in zip([0, *breaks], [*breaks, positions.numel()], strict=True):
        os.pwrite(fd, flat[lo:hi].tobytes(), start + int(positions[lo]) * row_bytes)
