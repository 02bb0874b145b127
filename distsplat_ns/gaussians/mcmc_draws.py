"""MCMC's draws "proportional to opacity" over every shard's Gaussians, the same however they are split.

gsplat's MCMC (``strategy/ops.py``: ``_multinomial_sample`` in ``relocate`` and ``sample_add``) draws
with ``torch.multinomial`` on the global generator over the rows one process holds: the result
depends on the row order and on how many processes hold the Gaussians. Here a draw is a function of
the multiset of (global id, opacity) over all shards, and of (seed, step, draw index), only:

1. Each Gaussian's weight is an integer, ``floor(opacity * 2^24)`` (at least 1; the relocation
   gives the dead weight 0), so sums are exact and do not depend on the order they are added in.
2. Every shard's (id, dead, weight) triples, packed into one int64 each (``id << 25 | dead << 24 |
   weight``), are
   gathered to every rank and sorted: the table in global-id order, its cumulative weights exact.
3. Draw ``j`` is the integer ``u_j = bits(seed, step, j) mod total`` (``utils/keyed_random.py``),
   resolved to the Gaussian whose cumulative range holds it (``searchsorted``).

Every rank then knows every draw's source id, and acts on the draws whose source it holds. Cost:
8 bytes per Gaussian per refine event (the gather; a separate (id, float) pair would be 12), plus
8 bytes per relocated source when an addition follows a relocation (``reweighted_after_relocation``).
Quantising the opacity changes each Gaussian's probability by < 2^-24 / opacity relative (< 1.2e-5 at
the 0.005 floor) -- far below the sampling noise of any event.

Shape letters: ``N`` Gaussians held here, ``n`` Gaussians on all ranks, ``J`` draws.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from distsplat_ns.gaussians.densifier import IdGather
from distsplat_ns.utils.keyed_random import keyed_bits_device

WEIGHT_BITS = 24
"""Bits of a packed weight: opacities in (0, 1] resolved to 2^-24 (float32's mantissa)."""
_DEAD_BIT = 1 << WEIGHT_BITS
_ID_SHIFT = WEIGHT_BITS + 1
ID_LIMIT = 1 << (63 - _ID_SHIFT)
"""Global ids must stay below 2^38 (2.7e11) to pack with a weight and a dead flag into a non-negative int64."""
_WEIGHT_MASK = (1 << WEIGHT_BITS) - 1

STREAM_RELOCATE = 2
"""keyed_random stream of the relocation draws (1 is the position noise, 0 the default strategy)."""
STREAM_ADD = 3
"""keyed_random stream of the addition draws."""


def opacities_of(opacity_logits: torch.Tensor) -> torch.Tensor:
    """``sigmoid`` as ``1 / (1 + exp(-x))``: on CPU ``torch.sigmoid``'s vectorised body and scalar tail
    round differently, so a Gaussian's opacity would depend on its row (gaussians/strategy.py:prune_mask).

    Args:
        opacity_logits: Any shape.

    **Differentiable:** with respect to ``opacity_logits``.
    """
    return 1.0 / (1.0 + torch.exp(-opacity_logits))


def opacity_weights(opacity_logits: torch.Tensor) -> torch.Tensor:
    """Integer draw weights: ``floor(opacity * 2^24)`` clamped to [1, 2^24 - 1].

    Args:
        opacity_logits: `[N]` or `[N, 1]`, any float dtype.

    Returns:
        `[N]`, int64 on the logits' device.
    """
    opacities = opacities_of(opacity_logits.detach().flatten())
    return torch.floor(opacities * float(1 << WEIGHT_BITS)).to(torch.int64).clamp(1, _WEIGHT_MASK)


class WeightTable(NamedTuple):
    """Every Gaussian of every shard, in global-id order, with its draw weight."""

    ids: torch.Tensor
    """Global ids, ascending. `[n]`, int64."""
    weights: torch.Tensor
    """``opacity_weights``. `[n]`, int64, >= 1."""
    dead: torch.Tensor
    """Opacity <= the event's ``min_opacity``. `[n]`, bool."""

    @property
    def num_gaussians(self) -> int:
        return int(self.ids.numel())


def _gather_sorted(packed: torch.Tensor, gather: IdGather) -> torch.Tensor:
    """Every rank's packed rows, sorted: in id order (the id is the top bits)."""
    return torch.sort(torch.cat([g.to(packed.device) for g in gather(packed)])).values


def _split_sorted(everything: torch.Tensor, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted packed rows (so in id order) as (ids, low bits); refuses a repeated id."""
    ids = everything >> _ID_SHIFT
    if bool((ids[1:] == ids[:-1]).any()):  # host sync: refine step
        raise RuntimeError(f"two shards hold the same global id ({what}): the shards overlap")
    return ids, everything & ((1 << _ID_SHIFT) - 1)


def gather_weight_table(
    gauss_ids: torch.Tensor, weights: torch.Tensor, dead: torch.Tensor, gather: IdGather
) -> WeightTable:
    """The ``WeightTable`` of all shards, identical on every rank.

    Args:
        gauss_ids: Global ids held here, each in [0, 2^38). `[N]`, int64.
        weights: Their ``opacity_weights``. `[N]`, int64.
        dead: Which are dead. `[N]`, bool.
        gather: Every rank's rows of a tensor, by rank (``gaussians/strategy.py:IdGather``):
            ``gather_local`` in one process or a replica, ``all_gather_rows`` over shards.

    Returns:
        The table, on ``gauss_ids``' device.

    Raises:
        ValueError: An id outside [0, 2^38).
        RuntimeError: Two shards hold the same id.

    **Collective:** one ``gather`` of `[N]` int64 (8 bytes per Gaussian). Rank 0 holding ids {4, 9}
    and rank 1 {2}: both get ids [2, 4, 9]. ``gather_local``: no communication.
    **Host sync:** the id range and duplicate checks, after the gather (refine steps only).
    """
    packed = (gauss_ids << _ID_SHIFT) | (dead.to(torch.int64) << WEIGHT_BITS) | weights
    # An id that cannot pack travels as -1, so every rank sees it and refuses together (no rank is
    # left waiting in a later collective).
    packed = torch.where((gauss_ids < 0) | (gauss_ids >= ID_LIMIT), torch.full_like(packed, -1), packed)
    everything = _gather_sorted(packed, gather)
    if everything.numel() and bool(everything[0] < 0):  # host sync: refine step
        raise ValueError(
            f"global ids must lie in [0, 2^{63 - _ID_SHIFT}) to pack with a weight; a shard holds one outside"
        )
    ids, low = _split_sorted(everything, "weights")
    return WeightTable(ids, low & _WEIGHT_MASK, (low & _DEAD_BIT) != 0)


class Draws(NamedTuple):
    """The outcome of ``J`` draws with replacement, in draw order."""

    source_ids: torch.Tensor
    """Global id drawn by each draw. `[J]`, int64."""
    ratios: torch.Tensor
    """How many of the ``J`` draws chose that source, plus one (gsplat's ``bincount(...) + 1``). `[J]`, int64."""


def draw_by_weight(
    ids: torch.Tensor, weights: torch.Tensor, num_draws: int, *, seed: int, step: int, stream: int
) -> Draws:
    """``num_draws`` Gaussians drawn with replacement, each with probability weight / total.

    Args:
        ids: A ``WeightTable``'s ids (ascending, identical on every rank). `[n]`, int64.
        weights: Their weights (0: never drawn). `[n]`, int64; positive total when ``J > 0``.
        num_draws: ``J >= 0``.
        seed, step: Key of the draws (with the draw index and ``stream``).
        stream: ``STREAM_RELOCATE`` or ``STREAM_ADD``.

    Returns:
        The ``Draws``: a function of (ids, weights), the key and ``J`` only, so the same on every
        rank and for every way of splitting the Gaussians.

    **Host sync:** none beyond ``num_draws`` (already on the host).
    """
    device = ids.device
    if num_draws == 0:
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        return Draws(empty, empty)
    cumulative = torch.cumsum(weights, 0)  # int64: exact, whatever the summation order
    bits = keyed_bits_device(seed, step, torch.arange(num_draws, dtype=torch.int64, device=device), 1, stream=stream)[
        :, 0
    ]
    non_negative = (bits >> 1) & ((1 << 63) - 1)  # the top 63 bits; the modulo bias is < total / 2^63
    u = torch.remainder(non_negative, cumulative[-1])  # [J], in [0, total)
    pos = torch.searchsorted(cumulative, u, right=True)  # first cumulative > u: its range holds u
    counts = torch.bincount(pos, minlength=int(ids.numel()))
    return Draws(ids[pos], counts[pos] + 1)


def reweighted_after_relocation(
    table: WeightTable,
    draws: Draws,
    first_copy_id: int,
    source_ids_here: torch.Tensor,
    source_weights_here: torch.Tensor,
    gather: IdGather,
) -> WeightTable:
    """The table after a relocation event, without gathering every Gaussian again.

    The dead leave; each drawn source takes its new weight; draw ``j``'s copy, id
    ``first_copy_id + j``, joins with its source's new weight (ids above every other, so the table
    stays sorted). ``dead`` is all False: the table is for the addition that follows, which draws
    from every Gaussian (gsplat's ``sample_add``).

    Args:
        table: The table the relocation drew from.
        draws: Its draws.
        first_copy_id: Id of draw 0's copy.
        source_ids_here: The distinct drawn sources this rank holds. `[S]`, int64.
        source_weights_here: Their ``opacity_weights`` after relocation. `[S]`, int64.
        gather: As ``gather_weight_table``'s.

    **Collective:** one ``gather`` of `[S]` int64 (8 bytes per relocated source).
    **Host sync:** the duplicate check.
    """
    packed = (source_ids_here << _ID_SHIFT) | source_weights_here
    source_ids, low = _split_sorted(_gather_sorted(packed, gather), "relocated sources")
    weights = table.weights.clone()
    weights[torch.searchsorted(table.ids, source_ids)] = low & _WEIGHT_MASK
    alive = ~table.dead
    ids, weights = table.ids[alive], weights[alive]
    copy_weights = weights[torch.searchsorted(ids, draws.source_ids)]
    copy_ids = first_copy_id + torch.arange(draws.source_ids.numel(), dtype=torch.int64, device=ids.device)
    all_ids = torch.cat([ids, copy_ids])
    return WeightTable(all_ids, torch.cat([weights, copy_weights]), torch.zeros_like(all_ids, dtype=torch.bool))


def rows_of(gauss_ids: torch.Tensor, wanted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Which of ``wanted`` this rank holds, and at which rows.

    Args:
        gauss_ids: Ids held here, unique. `[N]`, int64.
        wanted: Ids to find. `[J]`, int64.

    Returns:
        ``(held, rows)``: `[J]` bool, and the rows of the held ones, in ``wanted``'s order `[J_held]`.
    """
    if gauss_ids.numel() == 0:
        return torch.zeros_like(wanted, dtype=torch.bool), wanted.new_zeros(0)
    sorted_ids, order = torch.sort(gauss_ids)
    at = torch.searchsorted(sorted_ids, wanted).clamp_max(gauss_ids.numel() - 1)
    held = sorted_ids[at] == wanted
    return held, order[at[held]]
