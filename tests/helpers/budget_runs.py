"""Memory budgets for the tests: the ``--pipeline.memory-budget`` value that implies a given cap on
the Gaussians for a run's mode, number of ranks, batch and dtype (``gaussians/budget_caps.py``)."""

from __future__ import annotations

from distsplat_ns.gaussians.budget_caps import GIB, caps_from_budget, gaussian_bytes
from distsplat_ns.gaussians.rows import DEFAULT_STATISTICS, gaussian_schema, parameter_fields
from distsplat_ns.parallel.shard_moves import SHARD_BOUND


def bytes_per_gaussian(
    *, world_size: int, sharded: bool, batch_size: int, item_bytes: int, default_strategy: bool, sh_degree: int = 3
) -> int:
    """``GaussianBytes.total`` of such a run."""
    statistics = DEFAULT_STATISTICS if default_strategy else ()
    schema = gaussian_schema(parameter_fields(sh_degree), statistics)
    return gaussian_bytes(
        schema,
        item_bytes,
        sharded=sharded,
        batch_size=batch_size,
        world_size=world_size,
        reads_statistics=default_strategy,
    ).total


def held_for_total(total: int, world_size: int, sharded: bool) -> int | None:
    """The per-rank cap whose total over ranks is exactly ``total`` (None where none is)."""
    if not sharded or world_size == 1:
        return total
    held = -(-int(total * SHARD_BOUND) // world_size) - 2
    while int(world_size * held / SHARD_BOUND) < total:
        held += 1
    return held if int(world_size * held / SHARD_BOUND) == total else None


def budget_for_cap(
    total: int, *, world_size: int, sharded: bool, batch_size: int, item_bytes: int, default_strategy: bool
) -> str:
    """The flag's value (GiB) whose caps on a CPU run (nothing fixed) total exactly ``total``.

    Raises:
        ValueError: No per-rank cap gives that total at this ``world_size`` (pick another total).
    """
    held = held_for_total(total, world_size, sharded)
    if held is None:
        raise ValueError(f"no per-rank cap totals {total} over {world_size} sharded ranks")
    per = bytes_per_gaussian(
        world_size=world_size,
        sharded=sharded,
        batch_size=batch_size,
        item_bytes=item_bytes,
        default_strategy=default_strategy,
    )
    value = f"{(held * per + per // 2) / GIB:.15f}"  # half a Gaussian's bytes of margin for the float's rounding
    caps = caps_from_budget(
        int(float(value) * GIB), 0, per, world_size=world_size, sharded=sharded, headroom=SHARD_BOUND
    )
    assert caps.total == total and caps.held == held, (caps, total, held)
    return value
