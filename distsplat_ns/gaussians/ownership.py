"""Which ids a sharded rank owns: the contiguous block of an id-ordered list (docs/sharded.md,
"Ownership and identity"). A pure planner: the initial draw (``gaussians/initial.py``), the
checkpoint reads and the tests use it."""

from __future__ import annotations


def owned_block(num: int, rank: int, world: int) -> tuple[int, int]:
    """The block ``[lo, hi)`` of an id-ordered list of ``num`` Gaussians that ``rank`` owns.

    Blocks are contiguous, disjoint, cover ``[0, num)`` in rank order, and differ in size by at most
    one (the first ``num % world`` ranks hold one more).
    """
    if world < 1 or not 0 <= rank < world or num < 0:
        raise ValueError(f"owned_block: need num >= 0 and 0 <= rank < world, got num={num}, rank={rank}, world={world}")
    base, extra = divmod(num, world)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)
