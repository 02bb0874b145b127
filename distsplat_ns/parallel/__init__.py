"""How the Gaussians are held across ranks: one ``ParallelMode`` chosen at set-up (``parallel/mode.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distsplat_ns.distributed.context import DistContext
from distsplat_ns.parallel.mode import ParallelMode
from distsplat_ns.parallel.replicated import ReplicatedMode
from distsplat_ns.parallel.sharded import ShardedMode

if TYPE_CHECKING:
    from distsplat_ns.model.distsplat_model import DistSplatModel

MODES = {mode.name: mode for mode in (ReplicatedMode, ShardedMode)}


def parallel_mode_class(name: str) -> type[ParallelMode]:
    """The mode ``--pipeline.parallel name`` names.

    Raises:
        ValueError: an unknown name.
    """
    if name not in MODES:
        raise ValueError(f"--pipeline.parallel must be one of {sorted(MODES)}, got {name!r}")
    return MODES[name]


def build_parallel_mode(name: str, ctx: DistContext, model: DistSplatModel) -> ParallelMode:
    """The mode ``--pipeline.parallel name`` names, for this rank's model (see :func:`parallel_mode_class`)."""
    return parallel_mode_class(name)(ctx, model)


__all__ = ["MODES", "ParallelMode", "ReplicatedMode", "ShardedMode", "build_parallel_mode", "parallel_mode_class"]
