"""The optimizer configuration a run really uses: splatfacto's, adapted to the batch size and the dtype.

* ``scaled_optimizer_configs``: Grendel-GS's "sqrt" rule for ``B`` images per step (lr x sqrt(B),
  Adam eps / sqrt(B), betas -> beta^B, scheduler lengths counted in images).
* ``float64_optimizer_configs``: the float64 mode's least Adam eps for the Gaussians' parameters
  (docs/float64_exactness.md), applied before the batch-size rule.

Both return copies of nerfstudio optimizer/scheduler configuration dicts; the trainer builds its
``Optimizers`` from the result.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
from nerfstudio.engine.optimizers import AdamOptimizerConfig
from nerfstudio.engine.schedulers import ExponentialDecaySchedulerConfig

from distsplat_ns.gaussians.rows import GAUSSIAN_PARAMETER_NAMES
from distsplat_ns.gaussians.strategy import sqrt_batch_scaling
from distsplat_ns.utils.logging import get_logger
from distsplat_ns.utils.steps import images_to_steps

LOGGER = get_logger(__name__)


@dataclass
class AdamWithBetasConfig(AdamOptimizerConfig):
    """nerfstudio's Adam configuration with explicit betas (scaled with the batch size)."""

    _target: type = torch.optim.Adam
    betas: tuple[float, float] = (0.9, 0.999)


FLOAT64_ADAM_EPS = 1e-8
"""The float64 mode's least Adam eps for the Gaussians' parameters (docs/float64_exactness.md)."""

GAUSSIAN_PARAM_GROUPS = GAUSSIAN_PARAMETER_NAMES
"""The optimizer groups of the Gaussians' own parameters (one per trained field of ``gaussians/rows.py``)."""


def float64_optimizer_configs(configs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The optimizers of the float64 mode: every Gaussian parameter group's Adam eps raised to at
    least 1e-8.

    Gradients that are 0 in exact arithmetic come out as rounding (1e-22 to 1e-15) that differs
    between 1 and W processes: the quaternions of Gaussians with equal scales, and every parameter
    of a Gaussian born at a refinement that no pixel has touched yet. With splatfacto's eps of
    1e-15 Adam turns that noise into steps of up to the learning rate, different in each run; at
    1e-8 they are ~1e-7 of the noise. On bird (B = 4, 900 images) 1 and 2 processes then take the
    same decisions over the whole run (docs/float64_exactness.md). Other groups, and float32
    training, keep splatfacto's values. Returns a copy; applied before
    ``scaled_optimizer_configs`` (whose eps / sqrt(B) follows).
    """
    out = copy.deepcopy(configs)
    for name in GAUSSIAN_PARAM_GROUPS:
        opt = out.get(name, {}).get("optimizer")
        if isinstance(opt, AdamOptimizerConfig) and opt.eps < FLOAT64_ADAM_EPS:
            opt.eps = FLOAT64_ADAM_EPS
    LOGGER.info(
        "float64: Adam eps of the Gaussian parameters raised to >= %g (docs/float64_exactness.md)", FLOAT64_ADAM_EPS
    )
    return out


def scaled_optimizer_configs(configs: dict[str, dict[str, Any]], batch_size: int) -> dict[str, dict[str, Any]]:
    """Optimizer and scheduler configurations for ``batch_size`` images per step.

    Grendel-GS's "sqrt" rule (docs/distributed.md, batch size): lr x sqrt(B), Adam eps / sqrt(B), betas -> beta^B,
    with the batch's gradients averaged (the loss is a mean over the batch). Scheduler lengths are
    counted in images, so ``max_steps`` and ``warmup_steps`` are divided by B. At B = 1 the
    configurations are returned unchanged (copied).
    """
    out = copy.deepcopy(configs)
    if batch_size == 1:
        return out
    root = math.sqrt(batch_size)
    for name, group in out.items():
        opt = group.get("optimizer")
        if isinstance(opt, AdamOptimizerConfig):
            lr, eps, betas = sqrt_batch_scaling(opt.lr, opt.eps, getattr(opt, "betas", (0.9, 0.999)), batch_size)
            group["optimizer"] = AdamWithBetasConfig(
                lr=lr, eps=eps, max_norm=opt.max_norm, weight_decay=opt.weight_decay, betas=betas
            )
        elif opt is not None:
            LOGGER.warning(
                "optimizer of group %s is %s: batch-size scaling applies to Adam only", name, type(opt).__name__
            )
        sched = group.get("scheduler")
        if isinstance(sched, ExponentialDecaySchedulerConfig):
            group["scheduler"] = ExponentialDecaySchedulerConfig(
                lr_pre_warmup=sched.lr_pre_warmup * root,
                lr_final=None if sched.lr_final is None else sched.lr_final * root,
                warmup_steps=images_to_steps(sched.warmup_steps, batch_size, minimum=0),
                max_steps=images_to_steps(sched.max_steps, batch_size),
                ramp=sched.ramp,
            )
    return out
