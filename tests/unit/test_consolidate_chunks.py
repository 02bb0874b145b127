"""Rank 0's consolidation read and write (``parallel/shard_checkpoint.py:_read`` in one process) puts every
saved row at its id's place when the rows arrive in chunks smaller than a key and the saved order
is not the id order (rows after densification and rebalancing are not an id range)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from distsplat_ns.distributed.context import DistContext
from distsplat_ns.distributed.dcp_rows import save_rows
from distsplat_ns.gaussians.checkpoint_keys import MODEL_EXTRA_KEY, MODEL_PREFIX
from distsplat_ns.parallel import shard_checkpoint
from distsplat_ns.parallel.shard_checkpoint import IDS_KEY, _read, consolidate_params


@pytest.mark.parametrize("chunk_rows", [1, 7, 1000])
def test_chunked_read_puts_every_row_at_its_ids_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk_rows: int
) -> None:
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


@pytest.mark.parametrize("chunk_rows", [1, 7, 1000])
def test_consolidation_writes_every_parameter_at_its_ids_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk_rows: int
) -> None:
    # The streamed consolidation (parallel/streamed_file.py) against the read of the same rows.
    gen = torch.Generator().manual_seed(5)
    num = 50
    ids = torch.randperm(num, generator=gen)
    means = torch.randn(num, 3, generator=gen)
    rest = torch.randn(num, 15, 3, generator=gen)
    blob = io.BytesIO()
    torch.save({"pipeline": {MODEL_PREFIX + "step": torch.tensor(3)}, "step": 9, "row_keys": {}}, blob)
    save_rows(
        DistContext(),
        tmp_path / "ckpt",
        {IDS_KEY: ids, "param.means": means, "param.features_rest": rest, "opt.means.exp_avg": means * 2},
        blob.getvalue(),
    )
    monkeypatch.setattr(shard_checkpoint, "ALONE_CHUNK_ROWS", chunk_rows)
    path = consolidate_params(tmp_path / "ckpt", tmp_path / "out", 9)
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    order = torch.argsort(ids)
    pipeline = loaded["pipeline"]
    assert torch.equal(pipeline[MODEL_PREFIX + "gauss_params.means"], means[order])
    assert torch.equal(pipeline[MODEL_PREFIX + "gauss_params.features_rest"], rest[order])
    assert torch.equal(pipeline[MODEL_EXTRA_KEY]["strategy_state"]["gauss_ids"], torch.arange(num))
    assert torch.equal(pipeline[MODEL_PREFIX + "step"], torch.tensor(3))
    assert loaded["optimizers"] == {} and loaded["distsplat"]["params_only"] and loaded["step"] == 9
