"""Rank functions for the sharded checkpoint's commit protocol (tests/multiproc/test_dcp_commit.py):
tiny row sets written through ``checkpoint.save_sharded_checkpoint_atomic``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from distsplat_ns.checkpoint import save_sharded_checkpoint_atomic
from distsplat_ns.distributed.row_checkpoint import save_rows


def rows_of(rank: int, step: int) -> dict:
    """Rank ``rank``'s rows at ``step``: ``rank + 2`` rows holding ``step``, ids by rank."""
    n = rank + 2
    return {"param.means": torch.full((n, 3), float(step)), "state.gauss_ids": torch.arange(n) + 10 * rank}


def save_step(ctx: Any, checkpoint_dir: str, step: int, die_on_rank: int = -1) -> str:
    """Save ``step`` (rows :func:`rows_of`) with latest-only pruning; rank ``die_on_rank`` exits
    hard (as a SIGKILL would: no exception, no cleanup) when its DCP write starts."""

    def write(folder: Path) -> int:
        if ctx.rank == die_on_rank:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"__{ctx.rank}_0.distcp").write_bytes(b"half a shard")
            os._exit(9)
        return save_rows(ctx, folder, rows_of(ctx.rank, step), torch.tensor([step]).numpy().tobytes())

    return str(save_sharded_checkpoint_atomic(ctx, Path(checkpoint_dir), step, write, keep_only_latest=True))
