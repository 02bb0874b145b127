"""The interface every densification strategy implements, and the gather it is given.

A ``Densifier`` owns what densification keeps between steps besides the rows: its schedule and
thresholds (frozen, built from the model config by ``from_config``), the run seed that keys its
draws and the global id counter (``next_id``: the first id no Gaussian of any rank has had). The
pipeline calls it after each optimizer step with what it reads -- this rank's rows bound to their
optimizers (``GaussianRows``), the step, the step's statistics and the mode's gather -- and never
with the model. The strategies: ``gaussians/strategy.py:DefaultDensifier`` and
``gaussians/mcmc.py:MCMCDensifier``; ``gaussians/strategy_choices.py`` maps ``--pipeline.model.strategy`` to
them.

Shape letters: ``N`` Gaussians held here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch

from distsplat_ns.gaussians.growth_cap import GrowthCaps, RefusedCounts
from distsplat_ns.gaussians.rows import GaussianRows, RowField
from distsplat_ns.utils.logging import get_logger

LOGGER = get_logger(__name__)

IdGather = Callable[[torch.Tensor], list[torch.Tensor]]
"""Every rank's rows of a tensor, by rank: ``lambda t: [t]`` where one process (or every replica)
holds all Gaussians, ``functools.partial(all_gather_rows, ctx)`` where each rank holds a shard."""


def gather_local(rows: torch.Tensor) -> list[torch.Tensor]:
    """The ``IdGather`` where this process holds every Gaussian (one process, or a replica)."""
    return [rows]


class Densifier(ABC):
    """One densification strategy, driven by the pipeline after each optimizer step.

    Its per-Gaussian statistics are declared in :attr:`statistics` (``gaussians/rows.py``): they
    become rows of the model's ``GaussianRows``, so shard moves, gathers and every checkpoint format
    carry them, and its row changes go through those rows too.

    Args:
        seed: Run seed (``--machine.seed``), the same on every rank: keys every draw.
        next_id: First unused global id, the same on every rank (the initial Gaussians' count;
            a checkpoint's ``next_gauss_id`` on resume).
        log_events: Whether this rank logs each event (the main rank).

    The caps on growth (``gaussians/growth_cap.py``) start unset and are set with :meth:`set_cap`
    and :meth:`set_max_held`, to the same values on every rank; :attr:`refused_total` counts what
    they refused over the run, :attr:`last_refused` at the last event.

    **Invariants:** ``next_id`` is the same on every rank after every call, and greater than every
    id any rank holds.
    """

    #: What ``--pipeline.model.strategy``'s help says of this strategy (``strategy_choices.py:strategy_help``).
    help: str = ""
    #: The strategy's per-Gaussian statistics, kept in the strategy state (none by default).
    statistics: tuple[RowField, ...] = ()
    #: Whether :meth:`set_max_held` can cap each rank's Gaussians (MCMC cannot: an addition lands
    #: on its source's owner).
    caps_each_rank: bool = True

    def __init__(self, *, seed: int, next_id: int, log_events: bool) -> None:
        self.seed = int(seed)
        self.next_id = int(next_id)
        self.log_events = bool(log_events)
        self.caps = GrowthCaps()
        self.refused_total = RefusedCounts()
        self.last_refused = RefusedCounts()
        self._logged_caps: set[str] = set()
        self._cap_reasons: dict[str, str] = {}

    def set_cap(self, max_gaussians: int | None, reason: str = "") -> None:
        """Cap the Gaussians over all ranks that growth reaches (None: no cap); every rank the same.
        ``reason`` (e.g. the memory budget that implies it) is named in the line logged when the
        cap first refuses growth.

        Raises:
            ValueError, TypeError: not None or an int >= 0.
        """
        self.caps = GrowthCaps(max_gaussians, self.caps.max_held)
        self._cap_reasons["max_gaussians"] = reason

    def set_max_held(self, max_held: int | None, reason: str = "") -> None:
        """Cap the Gaussians each rank holds after growth (sharded mode; None: no cap); every rank
        the same. A trim by this cap depends on the number of ranks (``gaussians/growth_cap.py``).
        ``reason`` as for :meth:`set_cap`.

        Raises:
            ValueError, TypeError: not None or an int >= 0.
        """
        self.caps = GrowthCaps(self.caps.max_gaussians, max_held)
        self._cap_reasons["max_held"] = reason

    def _record_refused(self, step: int, refused: RefusedCounts) -> None:
        """Add one event's refusals to the totals; the first event each cap limits logs one line
        on the main rank."""
        self.last_refused = refused
        self.refused_total = self.refused_total + refused
        for name, count, cap in (
            ("max_gaussians", refused.global_cap, self.caps.max_gaussians),
            ("max_held", refused.shard_cap, self.caps.max_held),
        ):
            if count > 0 and name not in self._logged_caps:
                self._logged_caps.add(name)
                if self.log_events:
                    why = f" ({self._cap_reasons[name]})" if self._cap_reasons.get(name) else ""
                    LOGGER.warning(
                        "step %d: densification reached its cap %s = %s%s: %d Gaussians not grown",
                        step,
                        name,
                        cap,
                        why,
                        count,
                    )

    @classmethod
    @abstractmethod
    def from_config(
        cls, config: Any, *, batch_size: int, num_train_images: int, seed: int, next_id: int, log_events: bool
    ) -> Densifier:
        """The strategy with its schedule (counted in images by ``config``, converted to steps of
        ``batch_size`` images) and thresholds read from ``config``, a ``DistSplatModelConfig``
        (``model/distsplat_model.py``; not imported: it imports this package).

        Raises:
            ValueError, TypeError: a field it reads is out of range.
        """

    def initial_state(self) -> dict[str, Any]:
        """The strategy state's entries before the first step (each statistic None until first
        accumulated); the model adds the ids."""
        return {f.name: None for f in self.statistics}

    @abstractmethod
    def needs_statistics(self, step: int) -> bool:
        """Whether ``step`` needs the mode's densification statistics (``ParallelMode.statistics``).
        A pure function of the step: every rank agrees."""

    @abstractmethod
    def changes_shards_at(self, step: int) -> bool:
        """Whether ``step``'s ``after_optimizer`` may add or remove Gaussians. Pure, as above."""

    @abstractmethod
    def after_optimizer(self, rows: GaussianRows, step: int, info: dict[str, Any] | None, gather: IdGather) -> None:
        """Run after ``optimizer_step_all`` and ``scheduler_step_all``.

        Args:
            rows: This rank's Gaussians, bound to their optimizers (``rows.bound(optimizers)``);
                changed in place.
            step: Optimizer step.
            info: The mode's statistics (``needs_statistics``), None on steps that need none.
            gather: The mode's ``gather_ids``.

        **Collective:** ``gather`` on event steps only, the same number of times on every rank.
        """
