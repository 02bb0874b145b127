"""Checkpoints that survive crashes, torch >= 2.6, and a change of world size.

* Two formats, one name scheme (``step-XXXXXXXXX`` plus a suffix), listed together by
  :func:`checkpoint_steps` / :func:`checkpoints_by_step`:

  - ``step-XXXXXXXXX.ckpt``: nerfstudio's single ``torch.save`` file, written by rank 0 only (the
    replicated mode; and the sharded mode's params-only consolidation of a run's last checkpoint,
    which ``ns-export``/``ns-eval``/``ns-render``/``ns-viewer`` read). Written to a temporary file
    in the same folder, flushed, then renamed over the final name: a crash mid-write leaves the
    previous checkpoint intact, never a truncated file.
  - ``step-XXXXXXXXX.dcp/``: a ``torch.distributed.checkpoint`` folder written by every rank of
    the sharded mode (``parallel/shard_checkpoint.py``, docs/sharded.md). Written into
    ``<run>/.distsplat_partial/`` and renamed into the checkpoint folder by rank 0 once every
    rank's file and DCP's ``.metadata`` are fsynced: the final name exists only for a complete one.
    (The partial folder is outside the checkpoint folder because ``ns-eval`` parses every name
    there as ``step-N.``.) Where both formats hold a step, the folder is the one resumed (it holds
    the Adam state).
* With ``--save-only-latest-checkpoint`` an older checkpoint (either format) is deleted only
  after a newer one (higher step) is durable: file and folder fsynced. A save of an older or equal
  step deletes nothing.
* Only tensors and plain Python values are stored (numpy scalars converted), so
  ``torch.load(..., weights_only=True)`` -- torch >= 2.6's default, used by nerfstudio's
  ``ns-export``/``ns-eval`` -- loads them. Older nerfstudio checkpoints holding numpy scalars load
  through the safe globals registered in :func:`register_numpy_safe_globals`.
* Nothing in a checkpoint's meaning depends on the number of processes (the single file holds the
  whole model; the DCP folder one global tensor per row key, read back in any row range), so a run
  saved on R ranks resumes on R' ranks, in either mode.

The optimizer configuration rules (batch-size scaling, float64 eps) are in ``trainer/optimizer_rules.py``.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from nerfstudio.engine.optimizers import Optimizers

from distsplat_ns.distributed.context import DistContext
from distsplat_ns.distributed.dcp_rows import METADATA_FILE
from distsplat_ns.distributed.lifecycle import agree_outcome
from distsplat_ns.distributed.restart import is_complete_checkpoint
from distsplat_ns.distributed.torch_compat import add_safe_globals, numpy_scalar_reconstructor
from distsplat_ns.utils.errors import UserError

#: Suffixes of the two formats (module docstring).
FILE_SUFFIX = ".ckpt"
SHARDED_SUFFIX = ".dcp"
#: Where sharded checkpoints are written before they are complete (a sibling of the checkpoint folder).
PARTIAL_FOLDER = ".distsplat_partial"
_NAME = re.compile(r"^step-(\d{9})(\.ckpt|\.dcp)$")


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
    payload = checkpoint_payload(step, pipeline_state, optimizers, scalers, extra, optimizer_states)
    return write_payload_atomic(checkpoint_dir, step, payload, keep_only_latest)


def checkpoint_payload(
    step: int,
    pipeline_state: dict[str, Any],
    optimizers: Optimizers | None,
    scalers: dict[str, Any],
    extra: dict[str, Any],
    optimizer_states: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """nerfstudio's checkpoint dictionary (``step``, ``pipeline``, ``optimizers``, ``schedulers``,
    ``scalers``) plus ``distsplat``'s entries, with numpy values made plain (:func:`plain`)."""
    return plain(
        {
            "step": int(step),
            "pipeline": pipeline_state,
            "optimizers": optimizer_states
            if optimizer_states is not None
            else {k: v.state_dict() for k, v in optimizers.optimizers.items()}
            if optimizers is not None
            else {},
            "schedulers": {k: v.state_dict() for k, v in optimizers.schedulers.items()}
            if optimizers is not None
            else {},
            "scalers": scalers,
            "distsplat": extra,
        }
    )


def write_payload_atomic(
    checkpoint_dir: Path,
    step: int,
    payload: dict[str, Any],
    keep_only_latest: bool,
    write: Callable[[Path, dict[str, Any]], None] | None = None,
) -> Path:
    """Write ``payload`` as ``step-{step:09d}.ckpt`` atomically and durably (see
    :func:`save_checkpoint_atomic`); returns its path. ``write(path, payload)``, when given,
    writes and fsyncs the temporary file in place of ``torch.save`` (the consolidation's streamed
    writer, ``parallel/streamed_file.py``)."""
    checkpoint_dir = Path(checkpoint_dir)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    path = checkpoint_dir / f"step-{step:09d}{FILE_SUFFIX}"
    tmp = checkpoint_dir / f".{path.name}.tmp-{os.getpid()}"
    try:
        if write is not None:
            write(tmp, payload)
        else:
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
        prune_older(checkpoint_dir, step)
    return path


def prune_older(checkpoint_dir: Path, step: int) -> None:
    """Delete every checkpoint (both formats) of a step below ``step``. Call only once ``step``'s
    checkpoint is durable."""
    for old in Path(checkpoint_dir).iterdir():
        old_step = _step_of(old)
        if old_step is not None and old_step < step:
            if old.is_dir():
                shutil.rmtree(old)
            else:
                old.unlink()


def save_sharded_checkpoint_atomic(
    ctx: DistContext, checkpoint_dir: Path, step: int, write: Callable[[Path], int], keep_only_latest: bool
) -> Path:
    """Write ``step-{step:09d}.dcp`` with every rank's ``write(folder)`` (a DCP save), atomically:
    into ``<run>/.distsplat_partial/``, then renamed into ``checkpoint_dir`` by rank 0 once DCP's
    save returned on every rank (each rank's file fsynced, ``.metadata`` written after all of them)
    and the folder is fsynced; older checkpoints are pruned only after that.

    Raises:
        RunFailure: on every rank when any rank's write failed (DCP tells every rank), or when
            rank 0 could not prepare or commit the folder; the previous checkpoint is kept.

    **Collective:** world group: one broadcast (rank 0 cleared a stale partial folder of this
    step), ``write``'s DCP save on every rank, one broadcast (the commit's outcome). A rank killed
    during the save makes the others' DCP collective fail within ``--collective-timeout-s``; the
    partial folder is then never renamed, and the previous checkpoint stays the latest.
    """
    checkpoint_dir = Path(checkpoint_dir)
    name = f"step-{step:09d}{SHARDED_SUFFIX}"
    partial = checkpoint_dir.parent / PARTIAL_FOLDER / name
    final = checkpoint_dir / name

    def prepare() -> None:
        if partial.exists():
            shutil.rmtree(partial)  # a save of this step that never completed (a killed rank)
        partial.parent.mkdir(parents=True, exist_ok=True)
        checkpoint_dir.mkdir(parents=True, exist_ok=True)

    agree_outcome(ctx, f"preparing {partial}", prepare)
    write(partial)

    def commit() -> Path:
        if not (partial / METADATA_FILE).is_file():
            raise OSError(errno.ENOENT, f"DCP wrote no {METADATA_FILE}: not every rank finished", str(partial))
        _fsync_directory(partial)
        aside = partial.parent / f"{name}.replaced"
        if final.exists():  # the same step saved again: keep it until the new one is in place
            if aside.exists():
                shutil.rmtree(aside)
            os.replace(final, aside)
        os.replace(partial, final)
        _fsync_directory(checkpoint_dir)
        _fsync_directory(partial.parent)
        if aside.exists():
            shutil.rmtree(aside)
        if keep_only_latest:
            prune_older(checkpoint_dir, step)
        return final

    agree_outcome(ctx, f"committing checkpoint {name} to {checkpoint_dir} (the previous checkpoint is kept)", commit)
    return final


def is_complete(path: Path) -> bool:
    """Whether ``path`` is a complete checkpoint of either format (a non-empty final-named file, or
    a final-named folder holding DCP's ``.metadata``)."""
    return is_complete_checkpoint(path)


def checkpoints_by_step(folder: Path) -> dict[int, Path]:
    """Every complete checkpoint in ``folder`` by step; where a step has both formats, the DCP
    folder (it holds the Adam state; the file beside it is its params-only consolidation)."""
    folder = Path(folder)
    found: dict[int, Path] = {}
    if not folder.is_dir():
        return found
    for path in sorted(folder.iterdir()):
        step = _step_of(path)
        if step is not None and is_complete(path) and (step not in found or path.name.endswith(SHARDED_SUFFIX)):
            found[step] = path
    return found


def checkpoint_steps(folder: Path) -> list[int]:
    """Steps of the complete checkpoints in ``folder``, of both formats, ascending (for
    ``distributed/restart.py``: a launch resumes from the largest)."""
    return sorted(checkpoints_by_step(folder))


def latest_checkpoint(folder: Path) -> Path | None:
    """The complete checkpoint of the largest step in ``folder`` (:func:`checkpoints_by_step`), or None."""
    found = checkpoints_by_step(folder)
    return found[max(found)] if found else None


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (POSIX: the entry lives in the directory's data)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _step_of(path: Path) -> int | None:
    """The step in a ``step-XXXXXXXXX.ckpt`` / ``.dcp`` name, or None for other names."""
    match = _NAME.match(Path(path).name)
    return int(match.group(1)) if match else None


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
    dtypes = [type(np.dtype(t)) for t in ("float64", "float32", "int64", "int32", "bool")]
    add_safe_globals([numpy_scalar_reconstructor(), np.dtype, *dtypes])


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
        # str: torch.load(mmap=True) takes a Path only from torch 2.3 (distributed/torch_compat.py)
        loaded = torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as err:
        raise UserError(f"checkpoint {path} could not be read ({type(err).__name__}: {err})") from err
    for key in ("step", "pipeline", "optimizers"):
        if key not in loaded:
            raise UserError(f"checkpoint {path} has no '{key}' entry: not a nerfstudio/distsplat checkpoint")
    return loaded
