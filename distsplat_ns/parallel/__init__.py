"""What differs between modes: how the Gaussians are held across ranks (replicated or sharded), one
``ParallelMode`` chosen at set-up (``parallel/mode.py``), with its exchanges, gathers and checkpoint
rows. Not here: the process group and its collectives (``distributed/``)."""

from __future__ import annotations

from distsplat_ns.parallel.mode import PARALLEL_MODES, ParallelMode, ParallelModeName
from distsplat_ns.parallel.replicated import ReplicatedMode
from distsplat_ns.parallel.sharded import ShardedMode

#: The class of each of ``PARALLEL_MODES``.
MODES: dict[str, type[ParallelMode]] = {mode.name: mode for mode in (ReplicatedMode, ShardedMode)}


def parallel_mode_class(name: str) -> type[ParallelMode]:
    """The mode ``--pipeline.parallel name`` names.

    Raises:
        ValueError: an unknown name.
    """
    if name not in MODES:
        raise ValueError(f"--pipeline.parallel must be one of {sorted(MODES)}, got {name!r}")
    return MODES[name]


__all__ = [
    "MODES",
    "PARALLEL_MODES",
    "ParallelMode",
    "ParallelModeName",
    "ReplicatedMode",
    "ShardedMode",
    "parallel_mode_class",
]
