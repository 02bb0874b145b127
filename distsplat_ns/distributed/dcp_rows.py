"""Row tensors written by every rank with ``torch.distributed.checkpoint`` (DCP), and read back in
any row range on any number of ranks.

Each row key is ONE global tensor ``[sum(n_r), ...]``, every rank's rows in rank order: rank ``r``
writes its ``n_r`` rows as the chunk at offset ``n_0 + ... + n_{r-1}``, which the planners below
declare (DTensor's ``Shard(0)`` cannot express arbitrary sizes). Everything else is one ``bytes``
blob from rank 0, kept raw so that the caller loads it with ``weights_only=True``. Layout and why:
docs/sharded.md, "Checkpoint format (sharded mode)".

Shape letters: N rows on this rank, R ranks.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, ReadItem, SavePlan, TensorWriteData, WriteItem, WriteItemType
from torch.distributed.checkpoint.planner_helpers import _create_read_items, create_read_items_for_chunk_list

from distsplat_ns.distributed.collectives import all_gather_counts
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.distributed.torch_compat import dcp_load, dcp_save, planner_kwargs
from distsplat_ns.utils.errors import RunFailure

#: Key of the blob in the DCP state dict; row keys are prefixed with :data:`ROWS_PREFIX`.
BLOB_KEY = "blob"
ROWS_PREFIX = "rows/"
#: DCP's metadata file: a folder holding it was finished by DCP's coordinator.
METADATA_FILE = ".metadata"


class _RowSavePlanner(DefaultSavePlanner):
    """DCP's default save planner, with each row key written as its chunk of the global tensor.

    Args:
        row_offset: Row offset of this rank's rows in every global row tensor.
        num_rows_total: Rows of every global row tensor (over all ranks).
    """

    def __init__(self, row_offset: int, num_rows_total: int) -> None:
        super().__init__(
            **planner_kwargs(
                DefaultSavePlanner,
                flatten_state_dict=False,
                flatten_sharded_tensors=False,
                dedup_save_to_lowest_rank=False,
            )
        )
        self.row_offset = row_offset
        self.num_rows_total = num_rows_total

    def create_local_plan(self) -> SavePlan:
        items: list[WriteItem] = []
        for fqn, obj in self.state_dict.items():
            if fqn.startswith(ROWS_PREFIX):
                if obj.shape[0] == 0:
                    continue  # an empty shard holds no chunk
                offsets = torch.Size([self.row_offset] + [0] * (obj.dim() - 1))
                items.append(
                    WriteItem(
                        index=MetadataIndex(fqn, offsets),
                        type=WriteItemType.SHARD,
                        tensor_data=TensorWriteData(
                            chunk=ChunkStorageMetadata(offsets=offsets, sizes=obj.size()),
                            properties=TensorProperties.create_from_tensor(obj),
                            size=torch.Size([self.num_rows_total, *obj.shape[1:]]),
                        ),
                    )
                )
            elif fqn == BLOB_KEY and self.is_coordinator:
                items.append(WriteItem(index=MetadataIndex(fqn), type=WriteItemType.BYTE_IO))
        self.plan = SavePlan(items)
        return self.plan

    def lookup_object(self, index: MetadataIndex) -> object:
        return self.state_dict[index.fqn]  # a row key is a plain tensor standing for its chunk

    def transform_object(self, write_item: WriteItem, object: object):
        if write_item.type == WriteItemType.BYTE_IO:
            return io.BytesIO(bytes(object))  # the caller's bytes as they are (no second pickle)
        return object


class _RowLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, with each row key read as rows ``[row_offset, row_offset + N)``
    of the global tensor (DCP's resharding), and the blob kept as raw bytes."""

    def __init__(self, row_offset: int) -> None:
        super().__init__(
            **planner_kwargs(
                DefaultLoadPlanner, flatten_state_dict=False, flatten_sharded_tensors=False, allow_partial_load=True
            )
        )
        self.row_offset = row_offset

    def create_local_plan(self) -> LoadPlan:
        assert self.metadata is not None
        items: list[ReadItem] = []
        for fqn, obj in self.state_dict.items():
            md = self.metadata.state_dict_metadata.get(fqn)
            if fqn.startswith(ROWS_PREFIX):
                if obj.shape[0] == 0 or md is None:
                    continue
                offsets = torch.Size([self.row_offset] + [0] * (obj.dim() - 1))
                items += create_read_items_for_chunk_list(
                    fqn, md, [ChunkStorageMetadata(offsets=offsets, sizes=obj.size())]
                )
            elif fqn == BLOB_KEY and isinstance(md, BytesStorageMetadata):
                items += _create_read_items(fqn, md, None)  # DCP's own byte read item
        return LoadPlan(items)

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        return self.state_dict[index.fqn]  # the local tensor is the requested chunk

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        self.state_dict[read_item.dest_index.fqn] = value.read()


def save_rows(ctx: DistContext, folder: Path, rows: Mapping[str, torch.Tensor], blob: bytes | None) -> int:
    """Write this rank's rows of every row key, and rank 0's ``blob``, as one DCP checkpoint in
    ``folder`` (one ``__<rank>_0.distcp`` file per rank, fsynced, and DCP's ``.metadata``).

    Args:
        ctx: The process context.
        folder: Where to write (created; the caller makes it visible atomically).
        rows: This rank's rows by row key, every rank the same keys, dtypes and trailing shapes.
            `[N, ...]` each (N may be 0).
        blob: Rank 0's opaque bytes (ignored on other ranks).

    Returns:
        Bytes of row data this rank wrote.

    Raises:
        RunFailure: on every rank when any rank's write failed (DCP gathers the failures and
            raises on every rank); nothing is then complete in ``folder``.

    **Collective:** world group, every rank in the same order: one all-gather of the row count,
    then DCP's plan gather, its write-result gather and the coordinator's ``.metadata`` write; it
    returns on every rank only after rank 0 finished the metadata. At ``world_size == 1`` it
    writes one file set without a process group. Rank 0 holding 3 rows and rank 1 holding 2:
    each global row tensor is `[5, ...]`, rank 0 writes rows 0..2, rank 1 rows 3..4.
    **Host sync:** device tensors are copied to the host by DCP's writer.
    """
    num = int(next(iter(rows.values())).shape[0]) if rows else 0
    counts = all_gather_counts(ctx, num)
    offset = sum(counts[: ctx.rank])
    state: dict[str, object] = {ROWS_PREFIX + k: v.detach() for k, v in rows.items()}
    state[BLOB_KEY] = blob if ctx.is_main and blob is not None else b""
    writer = dcp.FileSystemWriter(str(folder), sync_files=True, single_file_per_rank=True)
    try:
        dcp_save(
            state, storage_writer=writer, planner=_RowSavePlanner(offset, sum(counts)), no_dist=not ctx.is_distributed
        )
    except CheckpointException as err:
        failed = sorted(err.failures) if hasattr(err, "failures") else "?"
        raise RunFailure(f"writing checkpoint {folder} failed on rank(s) {failed}: {err}") from err
    return sum(t.numel() * t.element_size() for t in rows.values())


def read_row_layout(folder: Path) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """Each row key's dtype and global shape `[sum(N), ...]`, from DCP's metadata. Local (a file read)."""
    metadata: Metadata = dcp.FileSystemReader(str(folder)).read_metadata()
    out = {}
    for fqn, md in metadata.state_dict_metadata.items():
        if fqn.startswith(ROWS_PREFIX) and isinstance(md, TensorStorageMetadata):
            out[fqn[len(ROWS_PREFIX) :]] = (md.properties.dtype, tuple(md.size))
    return out


def load_rows(
    ctx: DistContext | None, folder: Path, keys: Sequence[str], row_range: tuple[int, int], with_blob: bool = True
) -> tuple[dict[str, torch.Tensor], bytes]:
    """Rows ``[lo, hi)`` of each global row tensor in ``keys``, and the blob (``b""`` unless
    ``with_blob``: a caller reading key by key reads it once), from ``folder``.

    Args:
        ctx: The process context, or None to read in this process alone (rank 0 consolidating).
        folder: A DCP checkpoint written by :func:`save_rows`.
        keys: Row keys to read (every rank the same).
        row_range: ``(lo, hi)``, rows of the global (rank-order) tensors; host tensors.

    **Collective:** with a distributed ``ctx``, world group: DCP's plan gather and its final
    barrier; every rank calls it (each with its own range). Without one, local. Only the files
    holding rows in the range are read.
    """
    layout = read_row_layout(folder)
    lo, hi = row_range
    state: dict[str, object] = {}
    for key in keys:
        dtype, shape = layout[key]
        if not 0 <= lo <= hi <= shape[0]:
            raise ValueError(f"load_rows: row range {row_range} outside {key}'s {shape[0]} rows in {folder}")
        state[ROWS_PREFIX + key] = torch.empty((hi - lo, *shape[1:]), dtype=dtype)
    if with_blob:
        state[BLOB_KEY] = b""
    no_dist = ctx is None or not ctx.is_distributed or not dist.is_initialized()
    with warnings.catch_warnings():
        # DCP warns that it reads in one process when no group is up: that is what ctx=None asks.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp_load(state, storage_reader=dcp.FileSystemReader(str(folder)), planner=_RowLoadPlanner(lo), no_dist=no_dist)
    blob = state.pop(BLOB_KEY, b"")
    return {k[len(ROWS_PREFIX) :]: v for k, v in state.items()}, bytes(blob)  # type: ignore[misc]
