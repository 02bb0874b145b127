"""The whole model from its shards, and shards from the whole model: the gathers to rank 0
(checkpoints, eval and the viewer) and the cut of a loaded checkpoint to this rank's block.

Rows and their keys are ``gaussians/rows.py``'s (``GaussianRows``), their places in a checkpoint
``gaussians/checkpoint_keys.py``'s. Shape letters: N Gaussians on this
rank, R ranks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from distsplat_ns.distributed.collectives import gather_rows
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.gaussians.checkpoint_keys import (
    MODEL_EXTRA_KEY,
    checkpoint_rows,
    cut_rows_,
    model_extra_state,
    parameter_names,
    put_rows_,
    step_only_states,
)
from distsplat_ns.gaussians.ownership import owned_block
from distsplat_ns.gaussians.rows import IDS, PARAM_PREFIX, STATE_PREFIX, Optimizers
from distsplat_ns.parallel.shard_moves import agree_layout

if TYPE_CHECKING:
    from distsplat_ns.model.distsplat_model import DistSplatModel


# ---------------------------------------------------------------------- gathering to rank 0
@dataclass
class GatheredState:
    """The whole model in id order, as one process holding it would save it.

    Attributes:
        pipeline_entries: ``_model.gauss_params.<name>`` and ``_model._extra_state`` (strategy
            state and ids in id order, ``next_gauss_id``, step), to replace a shard's entries of
            the pipeline's ``state_dict()``.
        optimizers: Every optimizer's ``state_dict()`` (moments in id order, ``step``, param groups).
    """

    pipeline_entries: dict[str, Any]
    optimizers: dict[str, dict[str, Any]]

    def merged_into(self, pipeline_state: Mapping[str, Any]) -> dict[str, Any]:
        """``pipeline_state`` (a shard's ``state_dict()``) with its model entries replaced by the whole model's."""
        return {**pipeline_state, **self.pipeline_entries}


def _gather_in_id_order(ctx: DistContext, tensor: torch.Tensor, order: torch.Tensor | None) -> torch.Tensor | None:
    """Every rank's rows of ``tensor`` on rank 0, in id order (None elsewhere).

    **Collective:** world group, one :func:`gather_rows` (its row counts, then one gather).
    """
    parts = gather_rows(ctx, tensor, dst=0)
    if parts is None:
        return None
    assert order is not None
    return torch.cat([p.detach().cpu() for p in parts])[order]


def _id_order(ctx: DistContext, model: DistSplatModel) -> torch.Tensor | None:
    """On rank 0, the permutation that puts the concatenation of every rank's rows (rank order)
    in id order; a stable sort, so equal ids keep rank then local order. None elsewhere.

    **Collective:** world group, one :func:`gather_rows` of the ids.
    """
    ids = gather_rows(ctx, model.gauss_ids, dst=0)
    if ids is None:
        return None
    return torch.sort(torch.cat([i.cpu() for i in ids]), stable=True).indices


def gather_full_params(ctx: DistContext, model: DistSplatModel) -> dict[str, torch.Tensor] | None:
    """The whole model's raw parameters (``gauss_params`` names, no optimizer state), in id
    order, on rank 0 (host memory); None elsewhere. For rendering (eval, viewer).

    **Collective:** world group, one :func:`gather_rows` for the ids then one per parameter (one
    tensor's rows in flight at a time). At ``world_size == 1`` it copies this rank's parameters.
    """
    order = _id_order(ctx, model)
    out = {name: _gather_in_id_order(ctx, p.detach(), order) for name, p in model.rows.parameters()}
    return None if order is None else out  # type: ignore[return-value]


def gather_full_state(ctx: DistContext, model: DistSplatModel, optimizers: Optimizers) -> GatheredState | None:
    """The whole model and its optimizer state on rank 0, in id order (None on other ranks).

    What a single process training the same Gaussians would hold, bitwise: the Gaussians' entries
    of the pipeline state dict and the model's extra state (strategy state, ids, ``next_gauss_id``,
    step), and every optimizer's ``state_dict()`` (moments in id order; ``step`` and param groups
    are rank 0's, the same on every rank). Optimizers of other parameters (camera adjustments)
    are rank 0's as they are (every rank holds the same).

    **Collective:** world group, on every rank in the same order: the layout
    (:func:`agree_layout`), the ids, then one :func:`gather_rows` per row key in sorted key order,
    so only one tensor's rows are in flight (rank 0 holds the gathered model plus one tensor). At
    ``world_size == 1`` it returns this rank's state, in id order. Rank 0 holding ids ``[0, 2]``
    and rank 1 ``[1]``: rank 0 gets rows ``[0, 1, 2]``.
    **Host sync:** everything lands in rank 0's host memory.
    """
    rows = model.rows.bound(optimizers)
    layout = agree_layout(ctx, rows)
    order = _id_order(ctx, model)
    flat = layout.filled(rows.tensors(), len(rows), rows.device)
    full = {key: _gather_in_id_order(ctx, flat[key], order) for key in layout.keys}
    if order is None:
        return None
    steps = layout.step_tensors()
    steps.update(
        {name: step.detach().clone() for name, _ in rows.parameters() if (step := rows.adam_step(name)) is not None}
    )
    opt_states = {name: opt.state_dict() for name, opt in (optimizers or {}).items()}
    gathered = {
        "pipeline": {MODEL_EXTRA_KEY: dict(model.get_extra_state())},
        "optimizers": step_only_states(opt_states, rows.schema.parameters, steps),
    }
    put_rows_(gathered, full)
    return GatheredState(pipeline_entries=gathered["pipeline"], optimizers=gathered["optimizers"])


# ---------------------------------------------------------------------- checkpoints
def shard_loaded_checkpoint_(loaded: dict[str, Any], rank: int, world: int) -> None:
    """Cut a whole-model checkpoint down to this rank's :func:`owned_block` of its id-ordered
    Gaussians, in place, before nerfstudio's ``load_pipeline`` / ``load_optimizers`` read it.

    Sliced: every row the checkpoint holds (``gaussians/checkpoint_keys.py``: the Gaussian parameters, the
    statistics and ids of the model's extra state, the parameters' Adam moments). A
    checkpoint without ids (older, or splatfacto's) counts as ids ``0..N-1``. The owned rows stay
    in id order. Load the file with ``mmap=True`` so that only the owned rows are read into memory.

    Args:
        loaded: A checkpoint as ``torch.load`` returns it (``pipeline``, ``optimizers``).
        rank: This rank.
        world: The number of ranks.

    Raises:
        ValueError: the checkpoint holds no ``_model.gauss_params.means``.
    """
    if "means" not in parameter_names(loaded["pipeline"]):
        raise ValueError("checkpoint has no _model.gauss_params.means entry: not a splat checkpoint")
    rows = checkpoint_rows(loaded)
    num = int(rows[PARAM_PREFIX + "means"].shape[0])
    ids = rows.get(STATE_PREFIX + IDS)
    order = torch.arange(num) if ids is None else torch.sort(ids, stable=True).indices
    lo, hi = owned_block(num, rank, world)
    index = order[lo:hi]
    cut_rows_(loaded, index)
    if ids is None:  # a checkpoint from before global ids (or splatfacto's): ids in row order
        extra = model_extra_state(loaded)
        extra["strategy_state"][IDS] = index.clone()
        extra.setdefault("next_gauss_id", num)
