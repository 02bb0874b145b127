"""The sharded checkpoint's commit: a rank killed during the save leaves the previous checkpoint
the one resumed; latest-only pruning deletes the older one only once the newer is durable."""

from __future__ import annotations

import queue
from pathlib import Path

import pytest
import torch

from distsplat_ns import checkpoint
from distsplat_ns.checkpoint import checkpoint_steps, latest_checkpoint, save_sharded_checkpoint_atomic
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.distributed.dcp_rows import load_rows, save_rows
from tests.helpers.dcp_fns import rows_of, save_step
from tests.helpers.multiproc import run_ranks


def test_rank_killed_during_save_leaves_the_previous_checkpoint_the_one_resumed(tmp_path: Path) -> None:
    models = tmp_path / "run" / "nerfstudio_models"
    run_ranks(save_step, 2, str(models), 5)
    with pytest.raises(
        (RuntimeError, queue.Empty)
    ):  # rank 0's collective times out; rank 1 never reports (run_ranks: queue.Empty)
        run_ranks(save_step, 2, str(models), 10, 1, timeout_s=10.0)
    assert checkpoint_steps(models) == [5]
    assert latest_checkpoint(models) == models / "step-000000005.dcp"
    rows, _ = load_rows(None, models / "step-000000005.dcp", ["param.means"], (0, 5))
    assert torch.equal(rows["param.means"], torch.full((5, 3), 5.0))
    # The next save of that step clears the half-written folder and completes.
    run_ranks(save_step, 2, str(models), 10)
    assert checkpoint_steps(models) == [10]


def test_older_checkpoint_is_pruned_only_after_the_newer_is_renamed_and_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = tmp_path / "run" / "nerfstudio_models"
    ctx = DistContext()
    write = lambda step: lambda folder: save_rows(ctx, folder, rows_of(0, step), b"")
    save_sharded_checkpoint_atomic(ctx, models, 5, write(5), keep_only_latest=True)
    events = []
    fsync = checkpoint._fsync_directory
    monkeypatch.setattr(checkpoint, "_fsync_directory", lambda d: (events.append(("fsync", Path(d).name)), fsync(d)))
    prune = checkpoint.prune_older

    def checked_prune(folder: Path, step: int) -> None:
        assert (models / "step-000000010.dcp" / ".metadata").is_file()
        assert ("fsync", "nerfstudio_models") in events
        events.append(("prune", step))
        prune(folder, step)

    monkeypatch.setattr(checkpoint, "prune_older", checked_prune)
    save_sharded_checkpoint_atomic(ctx, models, 10, write(10), keep_only_latest=True)
    assert events[-1] == ("prune", 10)
    assert checkpoint_steps(models) == [10]


def test_a_save_that_fails_keeps_the_older_checkpoint(tmp_path: Path) -> None:
    models = tmp_path / "run" / "nerfstudio_models"
    ctx = DistContext()
    save_sharded_checkpoint_atomic(
        ctx, models, 5, lambda folder: save_rows(ctx, folder, rows_of(0, 5), b""), keep_only_latest=True
    )
    with pytest.raises(Exception, match="not every rank finished"):
        save_sharded_checkpoint_atomic(ctx, models, 10, lambda folder: 0, keep_only_latest=True)  # DCP never finished
    assert checkpoint_steps(models) == [5]
