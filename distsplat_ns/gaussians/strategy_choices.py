"""The densification strategies a model can train with: ``--pipeline.model.strategy``'s choices.

Each choice names a ``Densifier`` class (``gaussians/densifier.py``); the model builds whichever
``DENSIFIERS`` maps its config's name to (``build_densifier``) and never asks which it is. The
pipeline's step asks the densifier three things:

* ``needs_statistics(step)``: whether the step gathers screen-space statistics (the replicated
  mode's reduction of them costs ``B x N x 20`` bytes; MCMC reads none);
* ``after_optimizer(rows, step, info, gather)``: what follows the optimizer and scheduler steps (a
  refine event, and for MCMC the position noise on every step);
* ``changes_shards_at(step)``: whether the step may change the shards' sizes (the sharded mode
  rebalances then).

A third strategy is its own module (a ``Densifier`` subclass with ``from_config`` and its ``help``)
and one entry in ``StrategyName`` and ``DENSIFIERS`` here: the flag's choices, its help
(``strategy_help``) and the refusal of other values follow from them.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from distsplat_ns.gaussians.densifier import Densifier
from distsplat_ns.gaussians.mcmc import MCMCDensifier
from distsplat_ns.gaussians.strategy import DefaultDensifier
from distsplat_ns.utils.validation import one_of

StrategyName = Literal["default", "mcmc"]
"""``--pipeline.model.strategy``: ``DefaultDensifier`` (gsplat's DefaultStrategy: split, duplicate,
prune by screen-space gradients) or ``MCMCDensifier`` (``gaussians/mcmc.py``)."""
STRATEGIES: tuple[StrategyName, ...] = get_args(StrategyName)

DENSIFIERS: dict[StrategyName, type[Densifier]] = {"default": DefaultDensifier, "mcmc": MCMCDensifier}
"""The class of each choice."""


def strategy_help() -> str:
    """``--pipeline.model.strategy``'s help: each choice with its class's ``help``."""
    described = "; ".join(f'"{name}" ({DENSIFIERS[name].help})' for name in STRATEGIES)
    return f"Densification (nerfstudio main's field): {described}."


def build_densifier(
    name: StrategyName,
    config: Any,
    *,
    batch_size: int,
    num_train_images: int,
    seed: int,
    next_id: int,
    log_events: bool,
) -> Densifier:
    """The densifier ``name`` names, from ``config`` (``Densifier.from_config``).

    Raises:
        ValueError: ``name`` is not a choice (``--pipeline.model.strategy``), or a field it reads is
            out of range.
    """
    if name not in DENSIFIERS:
        raise ValueError(f"--pipeline.model.strategy must be {one_of(STRATEGIES)}, got {name!r}")
    return DENSIFIERS[name].from_config(
        config,
        batch_size=batch_size,
        num_train_images=num_train_images,
        seed=seed,
        next_id=next_id,
        log_events=log_events,
    )
