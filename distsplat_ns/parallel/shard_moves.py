"""Moving Gaussians between ranks (shard balance): the move plan, the ranks' agreement on what a row
holds, and the moves themselves. The rows and every operation on them are ``gaussians/rows.py``'s
(``GaussianRows``: parameters, Adam moments and strategy statistics together, so row ``i`` of each
stays the same Gaussian); gathering them to rank 0 and cutting a loaded checkpoint are in
``parallel/full_state.py``.

Shape letters: N Gaussians on this rank, R ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from distsplat_ns.distributed.collectives import all_gather_counts, all_gather_object, all_to_all_rows
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.gaussians.rows import GaussianRows
from distsplat_ns.utils.logging import get_logger

LOGGER = get_logger(__name__)

SHARD_BOUND = 1.10
"""Largest tolerated max/mean shard size before rows move. Every rank projects all of its
Gaussians for every camera, so a larger shard costs its rank per-Gaussian time; on bird at W = 2,
B = 2 a 1.01 bound measured no faster than 1.10 (rank 0's render-time excess at equal tile work
about 3% at both, over six runs; docs/sharded.md, "Shard balance and step time"), so rows move
only past 1.10."""


# ---------------------------------------------------------------------- shard balance
def plan_moves(sizes: Sequence[int], bound: float = SHARD_BOUND) -> list[tuple[int, int, int]]:
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

    def filled(
        self, rows: Mapping[str, torch.Tensor | None], num: int, device: torch.device
    ) -> dict[str, torch.Tensor]:
        """``rows`` with every layout key present (zeros `[num, ...]` where missing)."""
        out = {}
        for key, (dtype, trailing) in self.keys.items():
            value = rows.get(key)
            out[key] = value if value is not None else torch.zeros((num, *trailing), dtype=dtype, device=device)
        return out

    def step_tensors(self) -> dict[str, torch.Tensor]:
        """Adam's ``step`` per name as torch stores it (a float32 scalar on the host)."""
        return {name: torch.tensor(step, dtype=torch.float32) for name, step in self.adam_steps.items()}


def agree_layout(ctx: DistContext, rows: GaussianRows) -> RowLayout:
    """The :class:`RowLayout` of every rank's rows (``GaussianRows.describe``).

    **Collective:** world group, one ``all_gather_object`` of a small description (no rows).
    At ``world_size == 1`` it describes this rank. Rank 0 with Adam moments and rank 1 without
    (it never stepped) both get the moments' keys, and rank 0's step.
    """
    keys: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
    steps: dict[str, float] = {}
    gathered = all_gather_object(ctx, rows.describe())
    for rank_keys, rank_steps in gathered:
        for k, v in rank_keys.items():
            keys.setdefault(k, v)
        for name, s in rank_steps.items():
            steps[name] = max(steps.get(name, s), s)
    if any(set(s) != set(steps) or any(s[n] != steps[n] for n in s) for _, s in gathered):
        LOGGER.warning(
            "Adam steps differ between ranks %s: the largest is kept for rows that move or are saved",
            [s for _, s in gathered],
        )
    return RowLayout(keys=dict(sorted(keys.items())), adam_steps=steps)


def rebalance_shards_(ctx: DistContext, rows: GaussianRows, bound: float = SHARD_BOUND) -> int:
    """Move Gaussians with all their state until every shard is within floor/ceil of the mean,
    when the largest shard exceeds ``bound`` x the mean (:func:`plan_moves`).

    A donor sends its highest local indices: they are one contiguous tail, so the rows it keeps
    are a prefix (a slice, not a gather through an index) and stay in order; they are also the
    Gaussians densification appended last (gsplat's ops concatenate new rows at the end), whose
    Adam moments have had least time to accumulate. Where the rows land does not matter to the
    step: every rank projects all of its Gaussians for every camera. Received rows are appended.

    Args:
        ctx: The process context.
        rows: This rank's shard, bound to its optimizers (``DistSplatModel.rows.bound``).
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
    num = len(rows)
    sizes = all_gather_counts(ctx, num)
    moves = plan_moves(sizes, bound)
    if not moves:
        return 0
    layout = agree_layout(ctx, rows)
    send_counts = [0] * ctx.world_size
    recv_counts = [0] * ctx.world_size
    for src, dst, count in moves:
        if src == ctx.rank:
            send_counts[dst] += count
        if dst == ctx.rank:
            recv_counts[src] += count
    num_send, num_recv = sum(send_counts), sum(recv_counts)
    device = rows.device
    send = layout.filled(rows.export(slice(num - num_send, num)), num_send, device)
    received = {}
    for key in layout.keys:
        received[key], _ = all_to_all_rows(ctx, send[key], send_counts, recv_counts)
    bytes_sent = sum(t.numel() * t.element_size() for t in send.values())
    del send
    if num_send:
        rows.select_(slice(0, num - num_send))
    if num_recv:
        rows.append_(received, layout.step_tensors())
    if ctx.is_main:
        LOGGER.info("shard balance: sizes %s, moves (src, dst, rows) %s", sizes, moves)
    return bytes_sent
