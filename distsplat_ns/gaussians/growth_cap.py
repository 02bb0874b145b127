"""Caps on the Gaussians densification grows to: which grow candidates one event keeps.

Two caps, both optional (None: no cap), set on a densifier after it is built
(``Densifier.set_cap``, ``Densifier.set_max_held``; ``--pipeline.memory-budget`` drives them through
``gaussians/budget_measured.py``):

* ``max_gaussians``, global over all ranks. The default strategy's grow event counts the global
  number of Gaussians after growth and before pruning (the event's memory peak); where that would
  pass the cap it keeps only the candidates that fit, ranked by their grow score (the grow
  criterion's ``grad2d / count``), highest first, ties by lower global id. A duplication adds one
  Gaussian and a split one net (the parent replaced by two), so every candidate costs one and the
  ``max_gaussians - count`` best are kept. The ranking reads only per-Gaussian values that are the
  same bits on any number of ranks, so the same cap trains the same model on any W.
  MCMC's cap is ``min(max_gs_num, max_gaussians)`` (``gaussians/mcmc.py``: already global).
* ``max_held``, per rank, in sharded mode: after the global selection, a rank whose held count
  after growth would pass ``max_held`` keeps only its best selected candidates that fit. Which
  Gaussians a rank holds depends on W, so a run this cap trims depends on W: its refusals are
  counted apart (``RefusedCounts.shard_cap``).

Every rank computes the same selection from one gather (``select_candidates`` on the rows
``allocate_child_ids`` gathers: each rank's held count, its candidates' ids, kinds and scores),
so the ids are numbered from the kept parents as without a cap.

Shape letters: ``M`` candidates over all ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distsplat_ns.utils.validation import check_int

#: Row kinds of the gathered table: a duplicated parent, a split parent, a rank's held count.
KIND_DUP, KIND_SPLIT, KIND_HELD = 0, 1, 2


@dataclass(frozen=True)
class GrowthCaps:
    """The caps one event honours (see the module docstring)."""

    max_gaussians: int | None = None
    """Most Gaussians over all ranks after growth (before pruning); None: no cap."""
    max_held: int | None = None
    """Most Gaussians this rank, and every other, holds after growth; None: no cap."""

    def __post_init__(self) -> None:
        for name in ("max_gaussians", "max_held"):
            value = getattr(self, name)
            if value is not None:
                check_int(name, value, 0)

    @property
    def active(self) -> bool:
        return self.max_gaussians is not None or self.max_held is not None


@dataclass(frozen=True)
class RefusedCounts:
    """Grow candidates (each one Gaussian) the caps refused."""

    global_cap: int = 0
    """Refused by ``max_gaussians`` (the same on any number of ranks)."""
    shard_cap: int = 0
    """Refused by ``max_held`` after the global selection (depends on the number of ranks)."""

    def __add__(self, other: RefusedCounts) -> RefusedCounts:
        return RefusedCounts(self.global_cap + other.global_cap, self.shard_cap + other.shard_cap)


def candidate_table(
    dup_ids: torch.Tensor, split_ids: torch.Tensor, dup_scores: torch.Tensor, split_scores: torch.Tensor, num_held: int
) -> torch.Tensor:
    """This rank's rows of the gathered table: ``(id, kind, value)``, int64 `[1 + n_dup + n_split, 3]`.

    The first row is ``(-1, KIND_HELD, num_held)``; then one row per candidate with its score's
    float64 bits as ``value`` (exact for float32 and float64 scores).
    """
    scores = torch.cat([dup_scores, split_scores]).to(torch.float64).contiguous().view(torch.int64)
    kinds = torch.cat([torch.full_like(dup_ids, KIND_DUP), torch.full_like(split_ids, KIND_SPLIT)])
    rows = torch.stack([torch.cat([dup_ids, split_ids]), kinds, scores], dim=1)
    header = torch.tensor([[-1, KIND_HELD, num_held]], dtype=torch.int64, device=rows.device)
    return torch.cat([header, rows])


@dataclass(frozen=True)
class Selection:
    """The candidates one event keeps, the same on every rank."""

    kept: torch.Tensor
    """Kept candidate rows of all ranks: ``(id, kind)``. `[K, 2]`, int64."""
    refused: RefusedCounts
    num_before: int
    """Gaussians on all ranks before the event."""


def select_candidates(tables: list[torch.Tensor], caps: GrowthCaps) -> Selection:
    """Which candidates of all ranks one grow event keeps under ``caps`` (see the module docstring).

    Args:
        tables: Every rank's ``candidate_table``, by rank.
        caps: The caps.

    Returns:
        The kept candidates and the refusals; a pure function of ``tables``, so every rank that
        gathered the same tables selects the same.

    **Host sync:** the held counts and the cap arithmetic (refine steps only).
    """
    held = [int(t[0, 2]) for t in tables]  # host sync: refine step
    rows = torch.cat([t[1:] for t in tables])  # [M, 3]
    owner = torch.cat(
        [torch.full((len(t) - 1,), r, dtype=torch.int64, device=rows.device) for r, t in enumerate(tables)]
    )
    scores = rows[:, 2].contiguous().view(torch.float64)
    # Rank: score descending, then id ascending, then duplication before split; stable sorts from
    # the last key to the first.
    order = torch.argsort(rows[:, 1], stable=True)
    order = order[torch.argsort(rows[order, 0], stable=True)]
    order = order[torch.argsort(-scores[order], stable=True)]
    num_before, num = sum(held), len(order)
    keep = num if caps.max_gaussians is None else min(num, max(0, caps.max_gaussians - num_before))
    order = order[:keep]
    refused_global = num - keep
    refused_shard = 0
    if caps.max_held is not None:
        room = torch.tensor([max(0, caps.max_held - h) for h in held], dtype=torch.int64, device=rows.device)
        ranked_owner = owner[order]
        # Position of each kept candidate among its own rank's kept candidates, in rank order.
        one_hot = torch.nn.functional.one_hot(ranked_owner, len(tables))
        place = (one_hot.cumsum(dim=0) * one_hot).sum(dim=1) - 1
        fits = place < room[ranked_owner]
        refused_shard = int((~fits).sum())  # host sync: refine step
        order = order[fits]
    return Selection(rows[order, :2], RefusedCounts(refused_global, refused_shard), num_before)
