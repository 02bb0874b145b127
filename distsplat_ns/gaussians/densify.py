"""The densification strategy a model trains with, as one object the pipeline calls the same way.

``--pipeline.model.strategy`` picks it when the model is built: ``default`` (gsplat's
DefaultStrategy with keyed growth, ``gaussians/strategy.py``) or ``mcmc`` (``gaussians/mcmc.py``). The
pipeline's step asks it three things and never which it is:

* ``needs_statistics(step)``: whether the step gathers screen-space statistics (the replicated
  mode's reduction of them costs ``B x N x 20`` bytes; MCMC reads none);
* ``after_optimizer(...)``: what follows the optimizer and scheduler steps (a refine event, and for
  MCMC the position noise on every step);
* ``changes_shards_at(step)``: whether the step may change the shards' sizes (the sharded mode
  rebalances then).

Shape letters: ``N`` Gaussians held here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Literal, get_args

import torch

from distsplat_ns.gaussians.mcmc import MCMCConfig, MCMCSchedule, mcmc_step_post_backward
from distsplat_ns.gaussians.rows import DEFAULT_STATISTICS, RowField
from distsplat_ns.gaussians.strategy import IdGather, StrategySchedule, grows_at
from distsplat_ns.utils.logging import get_logger

LOGGER = get_logger(__name__)

StrategyName = Literal["default", "mcmc"]
"""``--pipeline.model.strategy``: ``DefaultDensifier`` or ``MCMCDensifier`` (see the module docstring)."""
STRATEGIES: tuple[StrategyName, ...] = get_args(StrategyName)


class Densifier(ABC):
    """One densification strategy, driven by the pipeline after each optimizer step.

    Its per-Gaussian statistics are declared in :attr:`statistics` (``gaussians/rows.py``): they become
    rows of the model's ``GaussianRows``, so shard moves, gathers and every checkpoint format carry
    them, and its row changes go through ``GaussianRows`` too.
    """

    #: The strategy's per-Gaussian statistics, kept in the strategy state (none by default).
    statistics: tuple[RowField, ...] = ()

    @abstractmethod
    def needs_statistics(self, step: int) -> bool:
        """Whether ``step`` needs the mode's densification statistics (``ParallelMode.statistics``).
        A pure function of the step: every rank agrees."""

    @abstractmethod
    def changes_shards_at(self, step: int) -> bool:
        """Whether ``step``'s ``after_optimizer`` may add or remove Gaussians. Pure, as above."""

    @abstractmethod
    def after_optimizer(
        self, model: Any, step: int, optimizers: dict[str, torch.optim.Optimizer], info: dict[str, Any] | None, gather: IdGather
    ) -> None:
        """Run after ``optimizer_step_all`` and ``scheduler_step_all``.

        Args:
            model: The ``DistSplatModel`` whose Gaussians (this rank's) change (not imported:
                it imports this module).
            step: Optimizer step.
            optimizers: One optimizer per parameter group (the Gaussians' among them).
            info: The mode's statistics (``needs_statistics``), None on steps that need none.
            gather: The mode's ``gather_ids``.

        **Collective:** ``gather`` on event steps only, the same number of times on every rank.
        """


class DefaultDensifier(Densifier):
    """gsplat's DefaultStrategy through ``DistSplatModel.refine`` (keyed splits, global ids)."""

    statistics = DEFAULT_STATISTICS

    def __init__(self, schedule: StrategySchedule) -> None:
        self.schedule = schedule

    def needs_statistics(self, step: int) -> bool:
        """While densification runs: the strategy accumulates statistics on every step before the stop."""
        return step < self.schedule.refine_stop_iter

    def changes_shards_at(self, step: int) -> bool:
        return grows_at(self.schedule, step)

    def after_optimizer(self, model, step, optimizers, info, gather) -> None:
        if info is not None:
            model.refine(step, optimizers, info, gather_ids=gather)


class MCMCDensifier(Densifier):
    """MCMC (``gaussians/mcmc.py``): an event on the schedule's steps, position noise on every step.

    The noise's scale is the means' learning rate of the step, read from the optimizer after the
    scheduler stepped (what ``get_last_lr()[0]`` of a means scheduler returns, and the constant
    rate where the means have no scheduler).
    """

    def __init__(self, config: MCMCConfig, schedule: MCMCSchedule) -> None:
        self.config = config
        self.schedule = schedule

    def needs_statistics(self, step: int) -> bool:
        """Never: relocation and addition draw by opacity, not by screen-space gradients."""
        return False

    def changes_shards_at(self, step: int) -> bool:
        return self.schedule.is_event(step)

    def after_optimizer(self, model, step, optimizers, info, gather) -> None:
        """``mcmc_step_post_backward`` on this rank's Gaussians; ``model.next_gauss_id`` advances.

        **Collective:** ``mcmc_event``'s gathers on event steps. **Host sync:** event steps only
        (the global counts); the noise is computed on the device.
        """
        means_lr = float(optimizers["means"].param_groups[0]["lr"])
        done = mcmc_step_post_backward(
            model.gauss_params,
            optimizers,
            model.strategy_state,
            step=step,
            seed=model.seed,
            means_lr=means_lr,
            next_id=model.next_gauss_id,
            config=self.config,
            schedule=self.schedule,
            gather=gather,
        )
        model.next_gauss_id = done.next_id
        if done.event is not None and model.is_main_rank:
            LOGGER.info(
                "step %d: MCMC relocated %d, added %d: %d Gaussians over all ranks (cap %d)",
                step,
                done.event.num_relocated,
                done.event.num_added,
                done.event.num_gaussians,
                self.config.max_gs_num,
            )
