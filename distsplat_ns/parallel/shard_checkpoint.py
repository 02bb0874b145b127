"""The sharded mode's checkpoint: every rank writes its own rows (``step-N.dcp``, DCP), any world
size reads back the rows it owns, and rank 0 consolidates the last one into nerfstudio's file.

What is saved (docs/sharded.md, "Checkpoints"):

* Rows: every per-Gaussian tensor of ``gaussians/rows.py`` by row key (``param.<name>``,
  ``opt.<name>.<adam key>``, ``state.<key>``, ids ``state.gauss_ids`` included), each one global
  tensor in rank order (``distributed/dcp_rows.py`` says why). The ranks agree the row keys
  first (``agree_layout``), so a rank without a moment writes zeros, as a gathered save did.
* The rest, rank 0's: nerfstudio's checkpoint dictionary (``checkpoint.py:checkpoint_payload``)
  without the rows (``gaussians/checkpoint_keys.py:without_rows``) -- the pipeline's other entries, the
  model's extra state without its per-Gaussian statistics, each Gaussian optimizer's param groups
  and agreed Adam ``step``, schedulers, scalers, RNG.

Reading gives the same dictionary a whole-model single file gives after
``full_state.shard_loaded_checkpoint_``: each sharded rank reads a block of :func:`owned_block`
over the saved rows' rank order (one contiguous range per key, so DCP reads only the files that
hold it), then the rows move to the rank owning their id's block (one all-to-all per key), so a
rank ends with exactly the Gaussians, in id order, a single file would give it; the replicated
mode reads every row, in id order. Shape letters: N
Gaussians on this rank.
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from distsplat_ns.checkpoint import FILE_SUFFIX, register_numpy_safe_globals, write_payload_atomic
from distsplat_ns.distributed.collectives import all_gather_counts, all_gather_rows, all_to_all_counts, all_to_all_rows
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.distributed.dcp_rows import load_rows, read_row_layout, save_rows
from distsplat_ns.gaussians.checkpoint_keys import put_rows_, without_rows
from distsplat_ns.gaussians.ownership import owned_block
from distsplat_ns.gaussians.rows import IDS, PARAM_PREFIX, STATE_PREFIX, Optimizers
from distsplat_ns.parallel.shard_moves import agree_layout
from distsplat_ns.parallel.streamed_file import write_streamed
from distsplat_ns.utils.errors import UserError

if TYPE_CHECKING:
    from distsplat_ns.model.distsplat_model import DistSplatModel

#: The row key of the global ids (``model.gauss_ids``).
IDS_KEY = STATE_PREFIX + IDS
#: Saved rows read at once where one process reads a checkpoint alone (rank 0 consolidating): the
#: only rows held twice, 47 MB of ``features_rest`` (180 B a row).
ALONE_CHUNK_ROWS = 1 << 18


def write_shard_checkpoint(
    ctx: DistContext, folder: Path, model: DistSplatModel, optimizers: Optimizers, payload: dict[str, Any]
) -> int:
    """Write this rank's rows and rank 0's ``payload`` without its rows into ``folder`` (DCP).

    Args:
        ctx: The process context.
        folder: The (partial) checkpoint folder, ``checkpoint.py:save_sharded_checkpoint_atomic``'s.
        model: This rank's shard.
        optimizers: Optimizer per parameter name (nerfstudio's ``Optimizers.optimizers``).
        payload: ``checkpoint_payload`` of this rank's own state (only rank 0's is kept).

    Returns:
        Bytes of rows this rank wrote.

    **Collective:** world group: ``agree_layout``'s all-gather, then ``save_rows``'s (the count,
    DCP's plan and result gathers). At ``world_size == 1`` one rank writes one file set. Rank 0
    with 3 Gaussians and rank 1 with 2: ``rows/param.means`` is `[5, 3]`, rows 0..2 rank 0's.
    """
    rows = model.rows.bound(optimizers)
    layout = agree_layout(ctx, rows)
    flat = layout.filled(rows.tensors(), len(rows), rows.device)
    blob = None
    if ctx.is_main:
        rest = without_rows(payload, layout.step_tensors())
        rest["row_keys"] = {
            k: (str(dtype).replace("torch.", ""), list(trailing)) for k, (dtype, trailing) in layout.keys.items()
        }
        buffer = io.BytesIO()
        torch.save(rest, buffer)
        blob = buffer.getvalue()
    return save_rows(ctx, folder, flat, blob)


@dataclass
class _Head:
    """What a read knows before any row of a key but the ids: the keys to read with their dtype
    and shape, the range, the ids in id order with where each saved row goes, and the rest."""

    layout: dict[str, tuple[torch.dtype, tuple[int, ...]]]
    keys: list[str]
    row_range: tuple[int, int]
    ids: torch.Tensor | None
    place: torch.Tensor | None  # place[j]: where saved row lo + j goes in id order
    rest: dict[str, Any]


def _read_head(ctx: DistContext | None, folder: Path, row_range_of: Any, only_params: bool) -> _Head:
    """The layout, the ids of ``row_range_of(num_total)`` in id order and the rest of ``folder``.

    **Collective:** with a distributed ``ctx``, :func:`load_rows` once (the ids); without one, local.
    """
    if not Path(folder).is_dir():
        raise UserError(f"checkpoint {folder} does not exist")
    try:
        layout = read_row_layout(Path(folder))
    except Exception as err:
        raise UserError(f"checkpoint {folder} is not a complete DCP checkpoint ({type(err).__name__}: {err})") from err
    num_total = layout[IDS_KEY][1][0] if IDS_KEY in layout else 0
    keys = [k for k in layout if not only_params or k.startswith(PARAM_PREFIX) or k == IDS_KEY]
    row_range = row_range_of(num_total)
    place = None
    rows, blob = load_rows(ctx, Path(folder), [IDS_KEY] if IDS_KEY in keys else [], row_range)
    ids = rows.get(IDS_KEY)
    if ids is not None and ids.numel():
        order = torch.sort(ids, stable=True).indices
        ids = ids[order]
        place = torch.empty_like(order)
        place[order] = torch.arange(order.numel())
    register_numpy_safe_globals()
    rest = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    row_keys = rest.pop("row_keys", {})
    for key, (dtype, trailing) in row_keys.items():
        if key not in layout and (not only_params or key.startswith(PARAM_PREFIX) or key == IDS_KEY):
            layout[key] = (getattr(torch, dtype), (0, *trailing))  # no rank held any row
            keys.append(key)
    return _Head(layout, keys, row_range, ids, place, rest)


def _read(
    ctx: DistContext | None, folder: Path, row_range_of: Any, only_params: bool
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The rows ``row_range_of(num_total)`` of ``folder`` (id order) and its rest.

    The ids first; then each key into a tensor in id order, filled from reads of the saved rows
    (rank order) scattered to their ids' places: one read per key on a distributed ``ctx``, reads
    of :data:`ALONE_CHUNK_ROWS` rows in one process, so besides the rows kept only one chunk is
    held twice (docs/sharded.md, "nerfstudio's tools").

    **Collective:** with a distributed ``ctx``, :func:`load_rows` once for the ids and once per
    row key, every rank the same keys in the layout's order; without one, local.
    """
    head = _read_head(ctx, folder, row_range_of, only_params)
    rows = {}
    for key in head.keys:
        dtype, shape = head.layout[key]
        if shape[0] == 0:
            rows[key] = torch.empty(tuple(shape), dtype=dtype)
        elif key == IDS_KEY:
            rows[key] = head.ids
        else:
            rows[key] = _read_key_in_id_order(ctx, Path(folder), key, head.layout[key], head.row_range, head.place)
    return rows, head.rest


def _read_key_in_id_order(
    ctx: DistContext | None,
    folder: Path,
    key: str,
    dtype_shape: tuple,
    row_range: tuple[int, int],
    place: torch.Tensor | None,
) -> torch.Tensor:
    """Saved rows ``row_range`` of ``key``, each at ``place`` (its id's place; None: as saved).

    **Collective:** with a distributed ``ctx``, one :func:`load_rows` on every rank (the whole
    range at once); without one, local, in reads of :data:`ALONE_CHUNK_ROWS` rows.
    """
    lo, hi = row_range
    if place is None:
        return load_rows(ctx, folder, [key], row_range, with_blob=False)[0][key]
    dtype, shape = dtype_shape
    out = torch.empty((hi - lo, *shape[1:]), dtype=dtype)
    alone = ctx is None or not ctx.is_distributed
    chunk = ALONE_CHUNK_ROWS if alone else hi - lo  # place is set, so hi > lo
    for start in range(lo, hi, chunk):
        stop = min(start + chunk, hi)
        out[place[start - lo : stop - lo]] = load_rows(ctx, folder, [key], (start, stop), with_blob=False)[0][key]
    return out


def _assemble(rows: dict[str, torch.Tensor], rest: dict[str, Any]) -> dict[str, Any]:
    """``rest`` with the rows put back where nerfstudio's dictionary holds them (``put_rows_``)."""
    put_rows_(rest, rows)
    return rest


def read_shard_checkpoint(
    ctx: DistContext | None, folder: Path, rank: int, world: int, sharded: bool
) -> dict[str, Any]:
    """A ``step-N.dcp`` checkpoint as ``checkpoint.py:load_checkpoint_file`` gives a single file:
    the whole model (``sharded=False``), or this rank's block (``owned_block`` over the saved rank
    order), the rows in id order.

    Raises:
        UserError: naming the folder when it is missing or incomplete.

    **Collective:** with a distributed ``ctx``, world group (``load_rows``: DCP's plan gather and
    barrier); every rank calls it. With ``ctx=None``, local (tests, tools).
    """

    def row_range(num_total: int) -> tuple[int, int]:
        return owned_block(num_total, rank, world) if sharded else (0, num_total)

    rows, rest = _read(ctx, folder, row_range, only_params=False)
    if sharded and ctx is not None and ctx.is_distributed:
        rows = _route_to_id_blocks(ctx, rows)
    return _assemble(rows, rest)


def _route_to_id_blocks(ctx: DistContext, rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Move rows read as a block of the saved rank order to the rank owning their id's block
    (``owned_block`` of the id-ordered Gaussians), as a single file's load gives them: the
    ownership a fresh run starts with, whatever the saving ranks held. Returned in id order.

    **Collective:** world group: one all-gather of the ids (8 bytes per Gaussian on every rank,
    as a single file's id sort reads), one all-to-all of counts, one all-to-all per row key.
    Rank 0 reading ids ``[3, 0]`` and rank 1 ``[1, 2]`` (N = 4): rank 0 ends with ``[0, 1]``,
    rank 1 with ``[2, 3]``.
    """
    ids = rows[IDS_KEY]
    everyone = torch.cat(all_gather_rows(ctx, ids))
    position = torch.empty_like(everyone)
    position[torch.sort(everyone, stable=True).indices] = torch.arange(everyone.numel())
    offset = sum(all_gather_counts(ctx, int(ids.numel()))[: ctx.rank])
    bounds = torch.tensor([owned_block(everyone.numel(), r, ctx.world_size)[1] for r in range(ctx.world_size)])
    dest = torch.searchsorted(bounds, position[offset : offset + ids.numel()], right=True)
    order = torch.sort(dest, stable=True).indices
    send_counts = torch.bincount(dest, minlength=ctx.world_size).tolist()
    recv_counts = all_to_all_counts(ctx, send_counts)
    moved = {
        key: all_to_all_rows(ctx, value[order], send_counts, recv_counts)[0] for key, value in sorted(rows.items())
    }
    by_id = torch.sort(moved[IDS_KEY], stable=True).indices
    return {key: value[by_id] for key, value in moved.items()}


def consolidate_params(folder: Path, checkpoint_dir: Path, step: int) -> Path:
    """Write ``step-N.ckpt`` in nerfstudio's format from the DCP checkpoint ``folder``: the whole
    model's parameters and ids in id order, no Adam state (``ns-export``, ``ns-eval``,
    ``ns-render`` and ``ns-viewer --load-config`` read it).

    The parameters are never held whole: each is written into the file in reads of
    :data:`ALONE_CHUNK_ROWS` saved rows at their ids' places (``parallel/streamed_file.py``), so
    this process holds the ids (8 B per Gaussian), where each saved row goes (8 B) and one chunk
    beside its own shard, not every Gaussian's parameters (docs/sharded.md, "Capacity with W").

    Local: rank 0 calls it alone, inside the trainer's rank-0 window. Atomic, as every single file.
    """
    head = _read_head(None, folder, lambda n: (0, n), only_params=True)
    rows: dict[str, torch.Tensor] = {}
    fills: dict[int, Any] = {}
    for key in head.keys:
        dtype, shape = head.layout[key]
        if key == IDS_KEY and head.ids is not None:
            rows[key] = head.ids
            continue
        rows[key] = torch.empty(tuple(shape), dtype=dtype)  # a placeholder: no page of it is touched
        fills[id(rows[key])] = functools.partial(_fill_in_id_order, Path(folder), key, shape[0], head.place)
    payload = _assemble(rows, head.rest)
    payload["optimizers"] = {}
    payload["distsplat"] = {**payload.get("distsplat", {}), "params_only": True, "consolidated_from": Path(folder).name}
    path = write_payload_atomic(
        checkpoint_dir,
        step,
        payload,
        keep_only_latest=False,
        write=lambda fh_path, obj: write_streamed(fh_path, obj, fills),
    )
    assert path.name.endswith(FILE_SUFFIX)
    return path


def _fill_in_id_order(folder: Path, key: str, num_rows: int, place: torch.Tensor | None, write: Any) -> None:
    """``write`` every saved row of ``key`` with its id's place, :data:`ALONE_CHUNK_ROWS` at a time."""
    for start in range(0, num_rows, ALONE_CHUNK_ROWS):
        stop = min(start + ALONE_CHUNK_ROWS, num_rows)
        chunk = load_rows(None, folder, [key], (start, stop), with_blob=False)[0][key]
        write(chunk, torch.arange(start, stop) if place is None else place[start:stop])
