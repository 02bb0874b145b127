"""What one training step reports (``DistSplatPipeline.train_step``'s ``StepReport``): the rank's
loss shares, Gaussian count, phase times, bytes moved and the balance figures, which the trainer
logs (``trainer/distsplat_trainer.py:DistSplatTrainer.train_iteration``) and the run record sums (``trainer/run_record.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from distsplat_ns.model.band_depth import BandDepth
from distsplat_ns.utils.timing import PhaseClock


@dataclass(frozen=True)
class StepTimings:
    """Seconds spent in each phase of one step on this rank."""

    data_wait: float
    forward: float
    backward: float
    all_reduce: float
    optimizer: float
    densify: float
    exposed_comm: float = 0.0
    """Seconds the step was blocked in communication: the SSIM-halo all-gather, the sharded
    exchange, the part of the gradient sum the backward did not hide, the statistics' reductions
    (with their small computation) and the cost all-gather (docs/overlap.md, "Fewer small collectives")."""

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)

    @classmethod
    def from_clock(cls, clock: PhaseClock) -> StepTimings:
        return cls(**{name: clock[name] for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class StepReport:
    """What one training step did on this rank (for logging and the run summary).

    Attributes:
        loss: This rank's share of the batch loss (sum over ranks = batch loss), detached. 0-d.
        l1: This rank's share of the batch's mean L1, detached. 0-d.
        dssim: This rank's share of the batch's mean ``1 - SSIM``, detached. 0-d.
        loss_terms: This rank's shares of the named terms inside ``loss``
            (``BandRenderResult.loss_terms``: the same keys on every rank), detached.
        num_gaussians: Gaussians rendered this step (before densification).
        timings: Seconds per phase.
        bytes_communicated: Payload bytes this rank sent or reduced: gradients and statistics;
            sharded, the exchange's rows and gradients and the rows a shard rebalance moved.
        measured_imbalance: Max over mean of the ranks' measured tile costs.
        predicted_imbalance: Max over mean of the ranks' costs the plan predicted
            (``StepPlan.predicted_imbalance``).
        time_imbalance: Max over mean of the ranks' render times (forward + backward).
        band_depths: With ``output_depth_during_training``, this rank's bands' rows of splatfacto's
            training depth (``model/band_depth.py``), filled over every rank's bands; else empty.
    """

    loss: torch.Tensor
    l1: torch.Tensor
    dssim: torch.Tensor
    loss_terms: dict[str, torch.Tensor]
    num_gaussians: int
    timings: StepTimings
    bytes_communicated: int
    measured_imbalance: float
    predicted_imbalance: float
    time_imbalance: float
    band_depths: list[BandDepth] = field(default_factory=list)
