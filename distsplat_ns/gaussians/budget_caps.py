"""The memory budget of a rank, and the caps on the Gaussians it implies (docs/densification.md).

A budget is the bytes one rank may use. What grows with the Gaussians is counted per Gaussian
(``GaussianBytes``): the rows a rank holds (parameters, their gradients and Adam moments, the
strategy's statistics, the id) and the step's working memory per Gaussian held (the projections
with what autograd keeps of them, and in replicated mode the statistics' reduction). The budget
minus what the rank already uses besides (``fixed_bytes``: on CUDA measured, on the CPU nothing)
divided by the bytes per Gaussian is the most one rank may hold; the cap over all ranks is that in
replicated mode and about W times it in sharded mode, less the headroom that shard imbalance needs.
Densification grows only up to the caps (``gaussians/strategy.py``, ``gaussians/mcmc.py``).

Everything here is pure: every rank computes the same caps from the same inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from distsplat_ns.gaussians.rows import RowSchema
from distsplat_ns.utils.errors import UserError
from distsplat_ns.utils.units import format_bytes

FLAG = "--pipeline.memory-budget"
GIB = 1 << 30

#: Bytes live per (camera, Gaussian) of a projection at its backward's peak, in units of the
#: parameters' item size: the projection's outputs with what autograd saves to differentiate them,
#: counted on the reference backend by ``benchmarks/projection_live_bytes.py`` (528 B, 132 items,
#: at SH degree 3, the most splatfacto trains; 380 B at degree 0), times 2 because the backward's
#: gradients of those tensors (each of its tensor's shape) exist beside the ones not yet freed
#: (README.md, "Memory per rank"). gsplat's fused projection saves less: on CUDA this errs
#: large. ``parallel/camera_groups.py`` sizes the sharded camera groups with it.
LIVE_ITEMS_PER_CAMERA_GAUSSIAN = 2 * 132

AUTO_DEVICE_FRACTION = 0.9
"""Share of a CUDA device's total memory the "auto" budget takes (Grendel-GS stops densifying at
90% of GPU memory: ``densify_memory_limit_percentage``). The other 10% is for what the count does
not hold: the rasterizer's intersection lists, the rows received from other ranks, the allocator's
slack (docs/densification.md, "What the budget counts")."""

STATISTICS_REDUCTION_ITEMS = 5
"""Items per (batch camera, Gaussian) of the replicated mode's statistics reduction: the screen
gradients and absgrads stacked, ``[2, B, N, 2]``, and the radii, ``[B, N]``
(``parallel/replicated.py:ReplicatedMode.statistics``)."""


@dataclass(frozen=True)
class MemoryBudget:
    """A rank's budget in bytes (None: no budget), and how it was chosen (for the log and the summary)."""

    bytes: int | None
    source: str


def parse_memory_budget(value: str) -> float | None:
    """``--pipeline.memory-budget``'s value: GiB as a float, None for "auto" and "off" (``resolve_memory_budget``).

    Raises:
        UserError: Not "auto", "off" or a finite number of GiB above zero; the message names the flag.
    """
    text = str(value).strip().lower()
    if text in ("auto", "off"):
        return None
    try:
        gib = float(text)
    except ValueError:
        raise UserError(f"{FLAG} must be a number of GiB, 'auto' or 'off', got {value!r}") from None
    if not math.isfinite(gib) or gib <= 0:
        raise UserError(f"{FLAG} must be a number of GiB above zero, 'auto' or 'off', got {value!r}")
    return gib


def resolve_memory_budget(value: str, device: torch.device) -> MemoryBudget:
    """The budget a rank on ``device`` gets from ``--pipeline.memory-budget``.

    "auto": on CUDA ``AUTO_DEVICE_FRACTION`` of the device's total memory as torch reports it; on
    the CPU none (host memory is shared with the other ranks and processes of the host: give GiB).
    "off": none. A number: that many GiB, on any device.
    """
    gib = parse_memory_budget(value)
    text = str(value).strip().lower()
    if gib is not None:
        return MemoryBudget(int(gib * GIB), f"{FLAG} {value}")
    if text == "auto" and device.type == "cuda":
        total = int(torch.cuda.get_device_properties(device).total_memory)
        return MemoryBudget(
            int(AUTO_DEVICE_FRACTION * total), f"auto: {AUTO_DEVICE_FRACTION:.0%} of {device}'s {total / GIB:.1f} GiB"
        )
    return MemoryBudget(
        None, f"{FLAG} {text}" + (" (no budget on the CPU: give a number of GiB)" if text == "auto" else "")
    )


@dataclass(frozen=True)
class GaussianBytes:
    """Bytes that one Gaussian held by a rank costs that rank."""

    held: int
    """Its rows: parameters, their gradients and two Adam moments, the statistics, the id."""
    working: int
    """The step's working memory per Gaussian held: projections live at once, statistics reduced."""

    @property
    def total(self) -> int:
        return self.held + self.working


def held_bytes(schema: RowSchema, item_bytes: int) -> int:
    """Bytes of one Gaussian's rows: 4 copies of each parameter item (value, gradient -- kept from
    backward to the next ``zero_grad`` -- and Adam's ``exp_avg`` and ``exp_avg_sq``), one of each
    statistic item, 8 for an int64 id. 964 B at SH degree 3 in float32 with the default
    strategy's statistics (README.md, "Memory per rank")."""
    total = 0
    for f in schema.fields:
        items = math.prod(f.row_shape)
        size = 8 if f.dtype == "int64" else item_bytes
        total += items * size * (4 if f.role == "parameter" else 1)
    return total


def cameras_projected_at_once(*, sharded: bool, batch_size: int, world_size: int) -> int:
    """Cameras whose projections of a rank's Gaussians are live at once: replicated, the rank's own
    images of the batch (``ceil(B / W)``, one projection call); sharded, one -- its camera groups
    shrink to one camera as the shard grows (``parallel/camera_groups.py``), and with a budget they
    are sized from what the budget leaves (``projection_budget_bytes``)."""
    return 1 if sharded else -(-batch_size // world_size)


def gaussian_bytes(
    schema: RowSchema, item_bytes: int, *, sharded: bool, batch_size: int, world_size: int, reads_statistics: bool
) -> GaussianBytes:
    """``GaussianBytes`` of a run: ``held_bytes`` and the working memory per Gaussian held.

    The working memory: ``LIVE_ITEMS_PER_CAMERA_GAUSSIAN`` items per camera projected at once (the
    reference backend's count; gsplat's fused projection keeps less, so on CUDA this errs large),
    and in replicated mode with a strategy that reads screen statistics their reduction
    (``STATISTICS_REDUCTION_ITEMS`` per batch camera).
    """
    cameras = cameras_projected_at_once(sharded=sharded, batch_size=batch_size, world_size=world_size)
    working = cameras * LIVE_ITEMS_PER_CAMERA_GAUSSIAN * item_bytes
    if reads_statistics and not sharded and world_size > 1:
        working += STATISTICS_REDUCTION_ITEMS * batch_size * item_bytes
    return GaussianBytes(held_bytes(schema, item_bytes), working)


@dataclass(frozen=True)
class GaussianCaps:
    """The most Gaussians densification may grow to."""

    held: int
    """On one rank."""
    total: int
    """Over all ranks."""


def caps_from_budget(
    budget_bytes: int, fixed_bytes: int, per_gaussian: int, *, world_size: int, sharded: bool, headroom: float
) -> GaussianCaps:
    """The caps a budget implies. Pure.

    Args:
        budget_bytes: The rank's budget.
        fixed_bytes: What the rank uses besides its Gaussians (0 on the CPU, where the budget counts
            only what grows with them).
        per_gaussian: ``GaussianBytes.total``.
        world_size: Ranks.
        sharded: Whether each rank holds a shard (else every rank holds every Gaussian).
        headroom: Sharded: the largest shard over the mean that the shards may reach before rows
            move (``parallel/shard_moves.py:SHARD_BOUND``); the total leaves that room.

    Returns:
        ``held = (budget - fixed) // per_gaussian`` (0 when negative); ``total = held`` replicated
        or at one rank, ``floor(W x held / headroom)`` sharded.
    """
    if per_gaussian <= 0:
        raise ValueError(f"per_gaussian: expected bytes > 0, got {per_gaussian}")
    held = max(0, (budget_bytes - fixed_bytes) // per_gaussian)
    total = int(world_size * held / headroom) if sharded and world_size > 1 else held
    return GaussianCaps(held, total)


def smallest_sharded_world_size(
    num_gaussians: int, budget_bytes: int, fixed_bytes: int, per_gaussian: int, headroom: float
) -> int | None:
    """The fewest sharded ranks whose caps hold ``num_gaussians`` (None where a rank holds none)."""
    held = max(0, (budget_bytes - fixed_bytes) // per_gaussian)
    if held <= 0:
        return None
    if num_gaussians <= held:
        return 1
    return max(2, math.ceil(num_gaussians * headroom / held))


def check_initial_fit(
    num_initial: int,
    budget: MemoryBudget,
    fixed_bytes: int,
    per_gaussian: GaussianBytes,
    sharded_per_gaussian: GaussianBytes,
    *,
    world_size: int,
    sharded: bool,
    headroom: float,
) -> GaussianCaps | None:
    """The run's caps, or a refusal at set-up when the initial Gaussians alone pass them.

    Args:
        num_initial: Initial Gaussians over all ranks (seed points or ``num_random``).
        budget: The rank's budget (none: no caps, None returned).
        fixed_bytes: As ``caps_from_budget``.
        per_gaussian: This run's bytes per Gaussian.
        sharded_per_gaussian: The bytes per Gaussian the same run would cost in sharded mode (for
            the smallest W the refusal names).
        world_size, sharded, headroom: As ``caps_from_budget``.

    Raises:
        UserError: One line: the bytes the initial Gaussians need per rank, the budget, and the
            smallest number of sharded ranks that would hold them.
    """
    if budget.bytes is None:
        return None
    caps = caps_from_budget(
        budget.bytes, fixed_bytes, per_gaussian.total, world_size=world_size, sharded=sharded, headroom=headroom
    )
    if num_initial <= caps.total:
        return caps
    per_rank = num_initial if not sharded else -(-num_initial // world_size)
    need = fixed_bytes + per_rank * per_gaussian.total
    smallest = smallest_sharded_world_size(num_initial, budget.bytes, fixed_bytes, sharded_per_gaussian.total, headroom)
    where = (
        "no number of sharded ranks holds them"
        if smallest is None
        else f"sharded mode holds them on {smallest} or more ranks (--pipeline.parallel sharded)"
    )
    mode = "sharded" if sharded else "replicated"
    raise UserError(
        f"{FLAG}: the {num_initial:,} initial Gaussians need {format_bytes(need)} per rank ({per_gaussian.total:,} B each, {mode}, "
        f"{world_size} rank{'s' if world_size > 1 else ''}), more than the budget of {format_bytes(budget.bytes)} ({budget.source}); {where}"
    )


def projection_budget_bytes(budget_bytes: int, fixed_bytes: int, held_rows: int, per_gaussian: GaussianBytes) -> int:
    """What a budget leaves a sharded rank's live projections: the budget less what it uses
    besides and its rows (``parallel/camera_groups.py`` sizes the camera groups from it; at least
    one camera's worth whatever it gives)."""
    return max(0, budget_bytes - fixed_bytes - held_rows * per_gaussian.held)
