"""Checkpoints that survive crashes, torch >= 2.6, and a change of world size.

* Written by rank 0 only, to a temporary file in the same folder, flushed, then renamed over the
  final name: a crash mid-write leaves the previous checkpoint intact, never a truncated file.
* With ``--save-only-latest-checkpoint`` an older checkpoint is deleted only after a newer one
  (higher step) is durable: file and folder fsynced. A save of an older or equal step deletes
  nothing.
* Only tensors and plain Python values are stored (numpy scalars converted), so
  ``torch.load(..., weights_only=True)`` -- torch >= 2.6's default, used by nerfstudio's
  ``ns-export``/``ns-eval`` -- loads them. Older nerfstudio checkpoints holding numpy scalars load
  through the safe globals registered in :func:`register_numpy_safe_globals`.
* Nothing in a checkpoint depends on the number of processes (every rank holds the whole model,
  or, in the sharded mode, rank 0 writes the whole model gathered in id order), so a run saved on R
  ranks resumes on R' ranks, in either mode.

The optimizer configuration rules (batch-size scaling, float64 eps) are in ``optimizer_rules.py``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from nerfstudio.engine.optimizers import Optimizers

from distsplat_ns.utils.errors import UserError


def plain(value: Any) -> Any:
    """``value`` with numpy scalars and arrays replaced by Python numbers and tensors."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    return value


def save_checkpoint_atomic(
    checkpoint_dir: Path,
    step: int,
    pipeline_state: dict[str, Any],
    optimizers: Optimizers | None,
    scalers: dict[str, Any],
    extra: dict[str, Any],
    keep_only_latest: bool,
    optimizer_states: dict[str, Any] | None = None,
) -> Path:
    """Write ``step-{step:09d}.ckpt`` atomically and durably; optionally delete older checkpoints.

    ``optimizer_states``, when given, replaces the optimizers' own state dicts (the sharded mode
    saves the whole model's, gathered by ``parallel/full_state.py``); the schedulers' are still
    ``optimizers``' (None: no schedulers saved).

    Only checkpoints of a lower step are deleted, and only once the new file and its directory
    entry are on disk (``fsync``), so at every instant -- power loss included -- the newest
    checkpoint is complete.

    Returns:
        The checkpoint's path.

    Raises:
        OSError: when the folder cannot be written; the previous checkpoint is untouched.
    """
    checkpoint_dir = Path(checkpoint_dir)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    path = checkpoint_dir / f"step-{step:09d}.ckpt"
    tmp = checkpoint_dir / f".{path.name}.tmp-{os.getpid()}"
    payload = plain(
        {
            "step": int(step),
            "pipeline": pipeline_state,
            "optimizers": optimizer_states if optimizer_states is not None
            else {k: v.state_dict() for k, v in optimizers.optimizers.items()} if optimizers is not None else {},
            "schedulers": {k: v.state_dict() for k, v in optimizers.schedulers.items()} if optimizers is not None else {},
            "scalers": scalers,
            "distsplat": extra,
        }
    )
    try:
        with open(tmp, "wb") as fh:
            torch.save(payload, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_directory(checkpoint_dir)
    finally:
        if tmp.exists():
            tmp.unlink()
    if keep_only_latest:
        for old in checkpoint_dir.glob("step-*.ckpt"):
            old_step = _step_of(old)
            if old_step is not None and old_step < step:
                old.unlink()
    return path


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (POSIX: the entry lives in the directory's data)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _step_of(path: Path) -> int | None:
    """The step in a ``step-XXXXXXXXX.ckpt`` file name, or None for other names."""
    name = Path(path).name
    if name.startswith("step-") and name.endswith(".ckpt") and name[5:-5].isdigit():
        return int(name[5:-5])
    return None


def probe_writable(directory: Path) -> None:
    """Check that checkpoints can be written to ``directory`` without leaving anything behind.

    Creates the folder (and its parents) if needed, writes, fsyncs and deletes a small file, then
    removes the folders it created.

    Raises:
        OSError: naming the path that cannot be created or written.
    """
    directory = Path(directory)
    created = []
    for folder in reversed([directory, *directory.parents]):
        if not folder.exists():
            folder.mkdir()
            created.append(folder)
    try:
        probe = directory / f".write-probe-{os.getpid()}"
        try:
            with open(probe, "wb") as fh:
                fh.write(b"distsplat")
                fh.flush()
                os.fsync(fh.fileno())
        finally:
            if probe.exists():
                probe.unlink()
    finally:
        for folder in reversed(created):
            folder.rmdir()


def register_numpy_safe_globals() -> None:
    """Allow the numpy scalar types nerfstudio's own checkpoints hold under ``weights_only``."""
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is None:
        return
    try:
        from numpy.core.multiarray import scalar  # type: ignore[attr-defined]
    except ImportError:  # numpy >= 2 moved it
        from numpy._core.multiarray import scalar  # type: ignore[no-redef]
    dtypes = [type(np.dtype(t)) for t in ("float64", "float32", "int64", "int32", "bool")]
    add([scalar, np.dtype, *dtypes])


def load_checkpoint_file(path: Path, mmap: bool = False) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True`` (no arbitrary code runs).

    With ``mmap`` the tensors stay in the file (memory-mapped, copy-on-write) until read: a rank of
    the sharded mode then copies only the rows it owns into memory (``parallel/full_state.py``).

    Raises:
        UserError: naming the file when it is missing, truncated or not a checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint {path} does not exist")
    register_numpy_safe_globals()
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as err:
        raise UserError(f"checkpoint {path} could not be read ({type(err).__name__}: {err})") from err
    for key in ("step", "pipeline", "optimizers"):
        if key not in loaded:
            raise UserError(f"checkpoint {path} has no '{key}' entry: not a nerfstudio/distsplat checkpoint")
    return loaded
