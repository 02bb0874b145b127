"""Rank 0's consolidation read (``parallel/shard_checkpoint.py:_read`` in one process) puts every
saved row at its id's place when the rows arrive in chunks smaller than a key and the saved order
is not the id order (rows after densification and rebalancing are not an id range)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from distsplat_ns.distributed.context import DistContext
from distsplat_ns.distributed.row_checkpoint import save_rows
from distsplat_ns.parallel import shard_checkpoint
from distsplat_ns.parallel.shard_checkpoint import IDS_KEY, _read


@pytest.mark.parametrize("chunk_rows", [1, 7, 1000])
def test_chunked_read_puts_every_row_at_its_ids_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk_rows: int) -> None:
    gen = torch.Generator().manual_seed(3)
    num = 50
    ids = torch.randperm(num, generator=gen)
    means = torch.randn(num, 3, generator=gen, dtype=torch.float64)
    rest = torch.randn(num, 15, 3, generator=gen)
    blob = io.BytesIO()
    torch.save({"row_keys": {}}, blob)
    save_rows(
        DistContext(),
        tmp_path / "ckpt",
        {IDS_KEY: ids, "param.means": means, "param.features_rest": rest, "opt.means.exp_avg": means * 2},
        blob.getvalue(),
    )
    monkeypatch.setattr(shard_checkpoint, "ALONE_CHUNK_ROWS", chunk_rows)
    rows, _ = _read(None, tmp_path / "ckpt", lambda n: (0, n), only_params=True)
    order = torch.argsort(ids)
    assert sorted(rows) == sorted([IDS_KEY, "param.features_rest", "param.means"])  # params only: no moments
    assert torch.equal(rows[IDS_KEY], torch.arange(num))
    assert torch.equal(rows["param.means"], means[order]) and torch.equal(rows["param.features_rest"], rest[order])
    assert rows["param.means"].dtype == torch.float64
