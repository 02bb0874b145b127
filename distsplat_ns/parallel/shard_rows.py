"""The per-Gaussian state of a shard, and moving it: out of the initial model (each rank keeps its
block) and between ranks (shard balance). Gathering it to rank 0 and cutting a loaded checkpoint
are in ``parallel/full_state.py``.

A Gaussian's state is one row of every per-Gaussian tensor: its six parameters, the moments of
its parameters' Adam optimizers (nerfstudio's ``Optimizers``: one ``torch.optim.Adam`` per
parameter name) and the densification statistics in the strategy state (``grad2d``, ``count``,
``radii`` and the global ``gauss_ids``). Every function here moves all of those together, so row
``i`` of each stays the same Gaussian. Rows are named by a flat key (:func:`export_rows`):
``param.<name>``, ``opt.<name>.<adam key>`` and ``state.<key>``.

Shape letters: N Gaussians on this rank, R ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from distsplat_ns.distributed.collectives import all_gather_counts, all_gather_object, all_to_all_rows
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.utils.logging import get_logger

if TYPE_CHECKING:
    from distsplat_ns.model.distsplat_model import DistSplatModel

LOGGER = get_logger(__name__)

#: Prefix of the model's entries in the pipeline's state dict (nerfstudio's ``VanillaPipeline._model``).
MODEL_PREFIX = "_model."
#: The model's extra state (``DistSplatModel.get_extra_state``) in the pipeline's state dict.
MODEL_EXTRA_KEY = MODEL_PREFIX + "_extra_state"

RowIndex = slice | torch.Tensor
Optimizers = Mapping[str, torch.optim.Optimizer] | None


# ---------------------------------------------------------------------- local row operations
def _take(t: torch.Tensor, index: RowIndex) -> torch.Tensor:
    """Rows ``index`` of ``t`` in their own storage (a slice view would keep the whole tensor alive)."""
    out = t[index]
    return out.clone() if isinstance(index, slice) else out


def _state_keys(model: DistSplatModel) -> list[str]:
    """Strategy-state entries that hold one row per Gaussian (tensors, or None before the first
    statistics update; ``scene_scale`` and other scalars are not rows)."""
    return sorted(k for k, v in model.strategy_state.items() if v is None or isinstance(v, torch.Tensor))


def _gauss_optimizer(model: DistSplatModel, optimizers: Optimizers, name: str) -> torch.optim.Optimizer | None:
    """The optimizer of Gaussian parameter ``name`` (None when there are none yet)."""
    if optimizers is None or name not in optimizers:
        return None
    opt = optimizers[name]
    groups = opt.param_groups
    if len(groups) != 1 or len(groups[0]["params"]) != 1 or groups[0]["params"][0] is not model.gauss_params[name]:
        raise ValueError(f"optimizer {name!r} must hold exactly the model's gauss_params[{name!r}] (one group, one parameter)")
    return opt


def adam_state(model: DistSplatModel, optimizers: Optimizers, name: str) -> dict[str, Any]:
    opt = _gauss_optimizer(model, optimizers, name)
    return {} if opt is None else opt.state.get(model.gauss_params[name], {})


def row_tensors(model: DistSplatModel, optimizers: Optimizers) -> dict[str, torch.Tensor | None]:
    """Every per-Gaussian tensor of this rank by row key, as references (no copy). Adam moments
    are absent before the parameter's first step; strategy entries not yet built are None."""
    rows: dict[str, torch.Tensor | None] = {}
    for name, p in model.gauss_params.items():
        rows[f"param.{name}"] = p.detach()
        for key, value in adam_state(model, optimizers, name).items():
            if key != "step" and isinstance(value, torch.Tensor) and value.dim() > 0:
                rows[f"opt.{name}.{key}"] = value
    for key in _state_keys(model):
        value = model.strategy_state[key]
        rows[f"state.{key}"] = None if value is None else value.detach()
    return rows


def export_rows(model: DistSplatModel, optimizers: Optimizers, index: RowIndex) -> dict[str, torch.Tensor | None]:
    """Copies of rows ``index`` of every per-Gaussian tensor, by row key.

    Args:
        model: The model (``gauss_params``, ``strategy_state``).
        optimizers: Optimizer per parameter name (nerfstudio's ``Optimizers.optimizers``), or None.
        index: Rows: a slice, int64 indices `[M]` or a bool mask `[N]`.

    Returns:
        ``param.<name>`` `[M, ...]` for each parameter; ``opt.<name>.<key>`` for each Adam moment
        that exists; ``state.<key>`` for each strategy entry (None where the entry is None).
    """
    return {k: None if v is None else _take(v, index) for k, v in row_tensors(model, optimizers).items()}


def _install(model: DistSplatModel, optimizers: Optimizers, name: str, data: torch.Tensor, adam_state: dict[str, Any]) -> None:
    """Make ``data`` the new ``gauss_params[name]``, in the model and in its optimizer, with
    ``adam_state`` re-keyed to it (the same move as gsplat's ``strategy/ops.py``)."""
    opt = _gauss_optimizer(model, optimizers, name)
    old = model.gauss_params[name]
    new = torch.nn.Parameter(data, requires_grad=old.requires_grad)
    model.gauss_params[name] = new
    if opt is not None:
        opt.state.pop(old, None)
        opt.param_groups[0]["params"] = [new]
        if adam_state:
            opt.state[new] = adam_state


@torch.no_grad()
def keep_rows_(model: DistSplatModel, optimizers: Optimizers, index: RowIndex) -> None:
    """Keep only rows ``index`` (in that order) of every per-Gaussian tensor, in place.

    Parameters become new ``nn.Parameter`` objects in ``model.gauss_params`` and in their
    optimizers, Adam's moments are sliced and its ``step`` kept; None strategy entries stay None.
    """
    for name in list(model.gauss_params.keys()):
        state = dict(adam_state(model, optimizers, name))
        for key, value in state.items():
            if key != "step" and isinstance(value, torch.Tensor) and value.dim() > 0:
                state[key] = _take(value, index)
        _install(model, optimizers, name, _take(model.gauss_params[name].detach(), index), state)
    for key in _state_keys(model):
        value = model.strategy_state[key]
        if value is not None:
            model.strategy_state[key] = _take(value, index)


def _cat(own: torch.Tensor | None, incoming: torch.Tensor | None, num_own: int, num_new: int) -> torch.Tensor | None:
    """``own`` then ``incoming``; a missing side counts as zeros (a moment or statistic not yet
    accumulated is zero); None when both are missing."""
    if own is None and incoming is None:
        return None
    like = own if own is not None else incoming
    assert like is not None
    if own is None:
        own = like.new_zeros((num_own, *like.shape[1:]))
    if incoming is None:
        incoming = like.new_zeros((num_new, *like.shape[1:]))
    return torch.cat([own, incoming.to(own.device, own.dtype)])


@torch.no_grad()
def append_rows_(
    model: DistSplatModel,
    optimizers: Optimizers,
    rows: Mapping[str, torch.Tensor | None],
    adam_steps: Mapping[str, torch.Tensor] | None = None,
) -> None:
    """Append Gaussians (rows as :func:`export_rows` returns them) after this rank's, in place.

    Args:
        model: The model.
        optimizers: Optimizer per parameter name, or None.
        rows: Every ``param.<name>`` `[M, ...]`; Adam moments and strategy entries where they
            exist (missing ones count as zeros, here and on this rank's side).
        adam_steps: Adam's ``step`` per parameter name, used only where this rank's optimizer has
            no state yet but moments arrive (otherwise this rank's ``step`` is kept).

    Raises:
        ValueError: a parameter is missing from ``rows`` or its trailing shape differs.
    """
    num_own = int(model.gauss_params["means"].shape[0])
    num_new = int(rows["param.means"].shape[0]) if "param.means" in rows else 0
    for name in list(model.gauss_params.keys()):
        p = model.gauss_params[name]
        incoming = rows.get(f"param.{name}")
        if incoming is None or incoming.shape[1:] != p.shape[1:] or incoming.shape[0] != num_new:
            raise ValueError(f"append_rows_: param.{name} missing or not [{num_new}, {tuple(p.shape[1:])}]")
        own_state = adam_state(model, optimizers, name)
        prefix = f"opt.{name}."
        keys = {k for k, v in own_state.items() if k != "step" and isinstance(v, torch.Tensor) and v.dim() > 0}
        keys |= {k[len(prefix):] for k, v in rows.items() if k.startswith(prefix) and v is not None}
        state: dict[str, Any] = dict(own_state)
        if keys and "step" not in state:
            if adam_steps is None or name not in adam_steps:
                raise ValueError(f"append_rows_: Adam moments of {name} arrive where none exist, and no step was given")
            state["step"] = adam_steps[name].clone()
        for key in keys:
            state[key] = _cat(own_state.get(key, torch.zeros_like(p.detach())), rows.get(prefix + key), num_own, num_new)
        _install(model, optimizers, name, torch.cat([p.detach(), incoming.to(p.device, p.dtype)]), state)
    for key in _state_keys(model):
        model.strategy_state[key] = _cat(model.strategy_state[key], rows.get(f"state.{key}"), num_own, num_new)


# ---------------------------------------------------------------------- shard balance
def plan_moves(sizes: Sequence[int], bound: float = 1.10) -> list[tuple[int, int, int]]:
    """Row moves ``(src, dst, count)`` that even out shard sizes; pure and deterministic.

    Nothing moves while ``max(sizes) / mean(sizes) <= bound``. Past it, every rank's target is the
    floor or the ceiling of the mean (the ceilings go to the largest shards, ties to the lower
    rank, so the fewest rows move), and ranks above their target send the surplus to ranks below
    theirs, both taken in rank order. A rank is never both a sender and a receiver.

    Args:
        sizes: Gaussians per rank. `[R]`.
        bound: Largest tolerated max/mean shard size (>= 1).

    Returns:
        The moves, sorted by ``(src, dst)``; empty when within the bound.
    """
    if bound < 1.0:
        raise ValueError(f"plan_moves: bound must be >= 1, got {bound}")
    if any(s < 0 for s in sizes):
        raise ValueError(f"plan_moves: sizes must be >= 0, got {list(sizes)}")
    world, total = len(sizes), sum(sizes)
    if world == 0 or total == 0 or max(sizes) * world <= bound * total:
        return []
    base, extra = divmod(total, world)
    by_size = sorted(range(world), key=lambda r: (-sizes[r], r))
    target = [base] * world
    for r in by_size[:extra]:
        target[r] += 1
    surplus = [(r, sizes[r] - target[r]) for r in range(world) if sizes[r] > target[r]]
    deficit = [[r, target[r] - sizes[r]] for r in range(world) if sizes[r] < target[r]]
    moves: list[tuple[int, int, int]] = []
    j = 0
    for src, amount in surplus:
        while amount > 0:
            dst, need = deficit[j]
            count = min(amount, need)
            moves.append((src, dst, count))
            amount -= count
            deficit[j][1] -= count
            if deficit[j][1] == 0:
                j += 1
    return moves


@dataclass(frozen=True)
class RowLayout:
    """What every rank holds, agreed by all: the row keys any rank has, each with its dtype and
    trailing shape (a rank without one fills zeros), and Adam's ``step`` per parameter name
    (the largest over ranks; ranks step together, so they are equal unless a rank skipped one)."""

    keys: dict[str, tuple[torch.dtype, tuple[int, ...]]]
    adam_steps: dict[str, float]

    def filled(self, rows: Mapping[str, torch.Tensor | None], num: int, device: torch.device) -> dict[str, torch.Tensor]:
        """``rows`` with every layout key present (zeros `[num, ...]` where missing)."""
        out = {}
        for key, (dtype, trailing) in self.keys.items():
            value = rows.get(key)
            out[key] = value if value is not None else torch.zeros((num, *trailing), dtype=dtype, device=device)
        return out

    def step_tensors(self) -> dict[str, torch.Tensor]:
        """Adam's ``step`` per name as torch stores it (a float32 scalar on the host)."""
        return {name: torch.tensor(step, dtype=torch.float32) for name, step in self.adam_steps.items()}


def agree_layout(ctx: DistContext, model: DistSplatModel, optimizers: Optimizers) -> RowLayout:
    """The :class:`RowLayout` of every rank's rows.

    **Collective:** world group, one ``all_gather_object`` of a small description (no rows).
    At ``world_size == 1`` it describes this rank. Rank 0 with Adam moments and rank 1 without
    (it never stepped) both get the moments' keys, and rank 0's step.
    """
    mine_keys = {k: (v.dtype, tuple(v.shape[1:])) for k, v in row_tensors(model, optimizers).items() if v is not None}
    mine_steps = {}
    for name in model.gauss_params:
        step = adam_state(model, optimizers, name).get("step")
        if step is not None:
            mine_steps[name] = float(step)
    keys: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
    steps: dict[str, float] = {}
    gathered = all_gather_object(ctx, (mine_keys, mine_steps))
    for rank_keys, rank_steps in gathered:
        for k, v in rank_keys.items():
            keys.setdefault(k, v)
        for name, s in rank_steps.items():
            steps[name] = max(steps.get(name, s), s)
    if any(set(s) != set(steps) or any(s[n] != steps[n] for n in s) for _, s in gathered):
        LOGGER.warning("Adam steps differ between ranks %s: the largest is kept for rows that move or are saved", [s for _, s in gathered])
    return RowLayout(keys=dict(sorted(keys.items())), adam_steps=steps)


def rebalance_shards_(ctx: DistContext, model: DistSplatModel, optimizers: Optimizers, bound: float = 1.10) -> int:
    """Move Gaussians with all their state until every shard is within floor/ceil of the mean,
    when the largest shard exceeds ``bound`` x the mean (:func:`plan_moves`).

    A donor sends its highest local indices: they are one contiguous tail, so the rows it keeps
    are a prefix (a slice, not a gather through an index) and stay in order; they are also the
    Gaussians densification appended last (gsplat's ops concatenate new rows at the end), whose
    Adam moments have had least time to accumulate. Where the rows land does not matter to the
    step: every rank projects all of its Gaussians for every camera. Received rows are appended.

    Args:
        ctx: The process context.
        model: This rank's shard.
        optimizers: Optimizer per parameter name (nerfstudio's ``Optimizers.optimizers``), or None.
        bound: Largest tolerated max/mean shard size.

    Returns:
        Payload bytes this rank sent (every row key of every row it gave away; 0 when it sent none).

    **Collective:** world group, on every rank at the same step: the shard sizes
    (``all_gather_counts``) always; when rows move, the layout (:func:`agree_layout`) and then one
    ``all_to_all_rows`` per row key, in sorted key order. At ``world_size == 1`` nothing moves.
    Rank 0 holding 300 and rank 1 holding 100 Gaussians: rank 0 sends its rows 200..299 to rank 1,
    which appends them after its own 100.
    **Host sync:** the sizes (this runs at refine steps only).
    """
    num = int(model.gauss_params["means"].shape[0])
    sizes = all_gather_counts(ctx, num)
    moves = plan_moves(sizes, bound)
    if not moves:
        return 0
    layout = agree_layout(ctx, model, optimizers)
    send_counts = [0] * ctx.world_size
    recv_counts = [0] * ctx.world_size
    for src, dst, count in moves:
        if src == ctx.rank:
            send_counts[dst] += count
        if dst == ctx.rank:
            recv_counts[src] += count
    num_send, num_recv = sum(send_counts), sum(recv_counts)
    device = model.gauss_params["means"].device
    send = layout.filled(export_rows(model, optimizers, slice(num - num_send, num)), num_send, device)
    received = {}
    for key in layout.keys:
        received[key], _ = all_to_all_rows(ctx, send[key], send_counts, recv_counts)
    bytes_sent = sum(t.numel() * t.element_size() for t in send.values())
    del send
    if num_send:
        keep_rows_(model, optimizers, slice(0, num - num_send))
    if num_recv:
        append_rows_(model, optimizers, received, layout.step_tensors())
    if ctx.is_main:
        LOGGER.info("shard balance: sizes %s, moves (src, dst, rows) %s", sizes, moves)
    return bytes_sent
