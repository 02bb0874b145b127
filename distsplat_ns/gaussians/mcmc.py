"""MCMC densification (Kheradmand et al. 2024, "3D Gaussian Splatting as Markov Chain Monte Carlo"),
giving the same model whether one process holds the Gaussians or any number of shards do.

gsplat 1.4.0's ``MCMCStrategy`` every ``refine_every`` steps relocates the dead Gaussians (opacity
<= ``min_opacity``) onto live ones drawn by opacity, then adds 5% more drawn the same way (never
past ``cap_max``), and on every step nudges every position by noise scaled by its covariance and by
how transparent it is. Its draws use the global generator over one process's rows; here:

* draws are keyed by (seed, step, draw index) and resolved over every shard's (id, opacity) in
  global-id order (``gaussians/mcmc_draws.py``);
* a relocation removes the dead rows on their owner and appends the relocated copies on the
  source's owner, so no parameter moves between ranks. Draw ``j``'s copy gets id ``next_id + j``
  (draw indices are global, so the number is the same on any number of ranks), the same rule for
  additions;
* the cap holds over all shards: the count it is compared with is the global one;
* the position noise is keyed by (seed, step, global id), computed on the device (no host sync).

Adam state as gsplat's ops leave it: a relocation zeroes its sources' moments, an addition keeps
them; new rows start at zero. One deviation: gsplat writes a relocated copy over a dead row in place,
and the copy inherits that dead Gaussian's stale moments. Here the dead Gaussian's rows (moments
included) leave with it, and its copy -- a new Gaussian, with a new id -- starts at zero like its
source and like an added Gaussian; keeping the dead's moments would move them between ranks.

``MCMCDensifier`` is this strategy as the pipeline calls it (``gaussians/densifier.py``); the
relocation's Eq. 9 is ``gaussians/mcmc_relocation.py``.

Collectives are injected (``gaussians/densifier.py:IdGather``), so this module never imports
``torch.distributed``: ``gather_local`` in one process or a replica, ``all_gather_rows`` over shards.

Shape letters: ``N`` Gaussians held here, ``J`` draws.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from distsplat_ns.gaussians.densifier import Densifier, IdGather
from distsplat_ns.gaussians.growth_cap import RefusedCounts
from distsplat_ns.gaussians.mcmc_draws import (
    ID_LIMIT,
    STREAM_ADD,
    STREAM_RELOCATE,
    Draws,
    draw_by_weight,
    gather_weight_table,
    opacities_of,
    opacity_weights,
    reweighted_after_relocation,
    rows_of,
)
from distsplat_ns.gaussians.mcmc_relocation import relocation_opacity_scale
from distsplat_ns.gaussians.rows import GaussianRows
from distsplat_ns.utils.keyed_random import keyed_normal_device
from distsplat_ns.utils.logging import get_logger
from distsplat_ns.utils.steps import images_to_steps
from distsplat_ns.utils.validation import check_int

LOGGER = get_logger(__name__)

STREAM_NOISE = 1
"""keyed_random stream of the position noise."""
GROWTH = 1.05
"""Each event grows the count to ``int(1.05 n)`` (gsplat's ``_add_new_gs``; the paper's 5%)."""


@dataclass(frozen=True)
class MCMCConfig:
    """nerfstudio main's splatfacto MCMC fields, with ``splatfacto-mcmc``'s values of the two it overrides.

    Schedules count training images (as DistSplatModelConfig's), so at B = 1 they equal main's steps.
    """

    max_gs_num: int = 1_000_000
    """Cap on the number of Gaussians over all ranks (main's default). Additions stop at it."""
    noise_lr: float = 5e5
    """Position-noise scale, multiplied by the means' current learning rate (main's and gsplat's 5e5)."""
    mcmc_opacity_reg: float = 0.01
    """Weight of the mean opacity in the loss (the paper's 0.01): pushes unused Gaussians towards death."""
    mcmc_scale_reg: float = 0.01
    """Weight of the mean scale in the loss (the paper's 0.01)."""
    cull_alpha_thresh: float = 0.005
    """Opacity at or below which a Gaussian is dead and relocated (splatfacto-mcmc's 0.005)."""
    stop_split_at: int = 25000
    """Images after which relocation and addition stop (splatfacto-mcmc's 25000); the noise goes on."""

    def __post_init__(self) -> None:
        check_int("max_gs_num", self.max_gs_num, 1)
        if self.max_gs_num >= ID_LIMIT:
            raise ValueError(f"max_gs_num: expected an int < 2^38, got {self.max_gs_num}")
        check_int("stop_split_at", self.stop_split_at, 0)
        for name in ("noise_lr", "mcmc_opacity_reg", "mcmc_scale_reg"):
            _check_float(name, getattr(self, name), 0.0, math.inf)
        _check_float("cull_alpha_thresh", self.cull_alpha_thresh, 0.0, 1.0, high_open=True)

    @classmethod
    def from_config(cls, config: Any) -> MCMCConfig:
        """The MCMC fields of ``config`` (a ``DistSplatModelConfig``), validated.

        Raises:
            ValueError, TypeError: a field is out of range.
        """
        return cls(
            max_gs_num=config.max_gs_num,
            noise_lr=config.noise_lr,
            mcmc_opacity_reg=config.mcmc_opacity_reg,
            mcmc_scale_reg=config.mcmc_scale_reg,
            cull_alpha_thresh=config.cull_alpha_thresh,
            stop_split_at=config.stop_split_at,
        )


def _check_float(name: str, value: object, low: float, high: float, high_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a float, got {type(value).__name__} ({value!r})")
    bound = f"in [{low}, {high})" if high_open else f">= {low}, finite"
    if not math.isfinite(value) or value < low or (value >= high if high_open else value > high):
        raise ValueError(f"{name}: expected a float {bound}, got {value}")


@dataclass(frozen=True)
class MCMCSchedule:
    """When MCMC events happen, in optimizer steps (gsplat's ``MCMCStrategy`` fields)."""

    refine_start_iter: int
    refine_stop_iter: int
    refine_every: int

    def is_event(self, step: int) -> bool:
        """gsplat 1.4.0's test: strictly between start and stop, on a multiple of ``refine_every``."""
        return self.refine_start_iter < step < self.refine_stop_iter and step % self.refine_every == 0


def mcmc_schedule_in_steps(
    *, warmup_images: int, stop_split_images: int, refine_every_images: int, batch_size: int
) -> MCMCSchedule:
    """Main's MCMC schedule (warm-up, ``stop_split_at``, ``refine_every``; images) in steps of ``batch_size``.

    As ``gaussians/strategy_schedule.py:schedule_in_steps``: each point is the step nearest its image count,
    so B images per step relocate and grow as often per image as splatfacto at B = 1.
    """
    return MCMCSchedule(
        refine_start_iter=images_to_steps(warmup_images, batch_size, minimum=0),
        refine_stop_iter=images_to_steps(stop_split_images, batch_size, minimum=0),
        refine_every=images_to_steps(refine_every_images, batch_size),
    )


class MCMCEvent(NamedTuple):
    """What one event did, counted over all ranks."""

    num_relocated: int
    num_added: int
    num_gaussians: int
    """Gaussians on all ranks after the event."""
    next_id: int
    """First unused global id after the event."""


def _rewrite_rows(
    rows: GaussianRows,
    *,
    keep: torch.Tensor | None,
    source_rows: torch.Tensor,
    new_opacity_logits: torch.Tensor,
    new_log_scales: torch.Tensor,
    zero_source_moments: bool,
    copy_ids: torch.Tensor,
) -> None:
    """Sources take their new opacity and scales; the ``keep`` rows stay, then a copy per draw.

    Layout ``[kept rows in order, copies in draw order]``; ``source_rows`` (one per draw, possibly
    repeated) index the rows before ``keep``. New rows' Adam moments and statistics are zero;
    ``gauss_ids`` gets ``copy_ids``. Both steps are ``GaussianRows``' (``update_``, ``grow_``).
    """
    values = {"opacities": new_opacity_logits, "scales": new_log_scales}
    zeroed = rows.schema.parameters if zero_source_moments else ()
    rows.update_(source_rows, values, zero_moments=zeroed, zero_statistics=zero_source_moments)
    rows.grow_(source_rows, copy_ids, keep=keep, statistics="zero")


def _relocated_values(
    params: Any, rows: torch.Tensor, ratios: torch.Tensor, min_opacity: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """New opacity logits `[J]` and log-scales `[J, 3]` of sources at ``rows`` drawn ``ratios - 1`` times."""
    opacities = opacities_of(params["opacities"].detach().flatten()[rows])
    new_opacities, new_scales = relocation_opacity_scale(opacities, torch.exp(params["scales"].detach()[rows]), ratios)
    eps = torch.finfo(torch.float32).eps  # gsplat's clamp, in every dtype
    new_opacities = torch.clamp(new_opacities, max=1.0 - eps, min=min_opacity)
    return torch.logit(new_opacities), torch.log(new_scales)


def _apply_draws(
    gaussians: GaussianRows, draws: Draws, first_id: int, min_opacity: float, dead_here: torch.Tensor | None
) -> torch.Tensor:
    """Act on the draws whose source this rank holds; returns the distinct sources' ids held here."""
    held, rows = rows_of(gaussians.ids, draws.source_ids)
    logits, log_scales = _relocated_values(gaussians.params, rows, draws.ratios[held], min_opacity)
    copy_ids = first_id + torch.nonzero(held).flatten()
    keep = None if dead_here is None else ~dead_here
    _rewrite_rows(
        gaussians,
        keep=keep,
        source_rows=rows,
        new_opacity_logits=logits,
        new_log_scales=log_scales,
        zero_source_moments=dead_here is not None,
        copy_ids=copy_ids,
    )
    return torch.unique(draws.source_ids[held])


@torch.no_grad()
def mcmc_event(
    gaussians: GaussianRows,
    *,
    step: int,
    seed: int,
    next_id: int,
    cap_max: int,
    min_opacity: float,
    gather: IdGather,
) -> MCMCEvent:
    """One MCMC event on this rank's Gaussians: relocate the dead, then add up to 5% (under the cap).

    gsplat 1.4.0's ``MCMCStrategy._relocate_gs`` then ``_add_new_gs``, with the draws of
    ``gaussians/mcmc_draws.py`` and the row changes of the module docstring. Relocation is skipped when
    no Gaussian is alive (the paper's code does the same; gsplat would fail in ``torch.multinomial``).

    Args:
        gaussians: This rank's Gaussians (``means``, ``scales`` as logs, ``quats``, ``opacities`` as
            logits, ...) bound to their optimizers (Adam moments carried as described above), with
            ``gauss_ids`` `[N]` int64 (MCMC keeps no statistics); changed in place.
        step: Optimizer step (keys the draws).
        seed: Run seed (keys the draws), the same on every rank.
        next_id: First unused global id, the same on every rank.
        cap_max: Most Gaussians over all ranks (``max_gs_num``).
        min_opacity: Dead at or below this opacity (``cull_alpha_thresh``).
        gather: ``gather_local`` where this process holds every Gaussian (one process, or a
            replica), ``functools.partial(all_gather_rows, ctx)`` over shards.

    Returns:
        The global counts and the new ``next_id`` (the caller keeps it).

    Raises:
        ValueError: ``next_id`` or ``cap_max`` out of range, ``gauss_ids`` missing or of another length.

    **Collective:** ``gather`` once (8 bytes per Gaussian) and, when an addition follows a relocation,
    once more (8 bytes per relocated source); every rank calls it the same number of times, also
    with no Gaussians, as the counts that decide are global. Rank 0 holding ids {0, 1}, rank 1
    {2} with id 2 dead: both see the same draw, say id 0; rank 1 removes id 2, rank 0 appends id 0's
    copy as ``next_id``.
    **Host sync:** the global counts and checks (refine steps only).
    """
    params, state = gaussians.params, gaussians.state
    ids = state.get("gauss_ids")
    if not isinstance(ids, torch.Tensor) or ids.shape != (params["means"].shape[0],):
        raise ValueError("state['gauss_ids'] must hold one int64 id per Gaussian")
    check_int("next_id", next_id, 0)
    check_int("cap_max", cap_max, 1)
    dead_here = opacities_of(params["opacities"].detach().flatten()) <= min_opacity
    table = gather_weight_table(ids, opacity_weights(params["opacities"]), dead_here, gather)
    num_total = table.num_gaussians
    num_dead = int(table.dead.sum())  # host sync: refine step
    num_relocated = num_dead if num_dead < num_total else 0
    num_added = max(0, min(cap_max, int(GROWTH * num_total)) - num_total)
    if next_id + num_relocated + num_added >= ID_LIMIT:
        raise ValueError(f"next_id: the event's new ids would pass 2^38 (next_id {next_id})")
    if num_relocated:
        live_weights = torch.where(table.dead, torch.zeros_like(table.weights), table.weights)
        draws = draw_by_weight(table.ids, live_weights, num_relocated, seed=seed, step=step, stream=STREAM_RELOCATE)
        sources_here = _apply_draws(gaussians, draws, next_id, min_opacity, dead_here)
        if num_added:
            _, rows = rows_of(state["gauss_ids"], sources_here)
            table = reweighted_after_relocation(
                table,
                draws,
                next_id,
                sources_here,
                opacity_weights(params["opacities"].detach().flatten()[rows]),
                gather,
            )
        next_id += num_relocated
    if num_added:
        draws = draw_by_weight(table.ids, table.weights, num_added, seed=seed, step=step, stream=STREAM_ADD)
        _apply_draws(gaussians, draws, next_id, min_opacity, None)
        next_id += num_added
    return MCMCEvent(num_relocated, num_added, num_total + num_added, next_id)


# ---------------------------------------------------------------------- position noise
@torch.no_grad()
def inject_keyed_position_noise(params: Any, gauss_ids: torch.Tensor, *, seed: int, step: int, scaler: float) -> None:
    """gsplat 1.4.0's ``inject_noise_to_position`` with the noise keyed by (seed, step, global id).

    ``means += Sigma (z * gate(1 - opacity) * scaler)``, ``Sigma = R diag(s^2) R^T`` the Gaussian's
    covariance and ``gate(x) = 1 / (1 + exp(-100 (x - 0.995)))``, so only nearly transparent
    Gaussians move. The covariance product is written element-wise (no einsum/bmm), so a Gaussian's
    bits do not depend on its row.

    Args:
        params: Gaussian parameters; ``means`` is updated in place.
        gauss_ids: Global ids of the rows. `[N]`, int64, on the parameters' device.
        seed, step: Key of the noise (with the id).
        scaler: ``lr * noise_lr``, ``lr`` the means' learning rate of this step. At B images per
            step that learning rate is sqrt(B) x splatfacto's (``checkpoint.py:scaled_optimizer_configs``),
            so the noise's variance per image is splatfacto's at B = 1.

    **Host sync:** none (``keyed_normal_device``; every other operation stays on the device).
    """
    from gsplat.utils import normalized_quat_to_rotmat

    means = params["means"]
    q = params["quats"].detach()
    norm = torch.sqrt(q[:, 0] * q[:, 0] + q[:, 1] * q[:, 1] + q[:, 2] * q[:, 2] + q[:, 3] * q[:, 3])
    rot = normalized_quat_to_rotmat(q / norm.clamp_min(1e-12)[:, None])  # [N, 3, 3]
    scales = torch.exp(params["scales"].detach())
    variances = scales * scales  # [N, 3]
    opacities = opacities_of(params["opacities"].detach().flatten())
    gate = 1.0 / (1.0 + torch.exp(-100.0 * ((1.0 - opacities) - 0.995)))
    z = (
        keyed_normal_device(seed, step, gauss_ids, 3, stream=STREAM_NOISE).to(means.dtype) * gate[:, None] * scaler
    )  # [N, 3]
    local = (
        rot[:, 0, :] * z[:, 0:1] + rot[:, 1, :] * z[:, 1:2] + rot[:, 2, :] * z[:, 2:3]
    ) * variances  # diag(s^2) R^T z
    means.add_(rot[:, :, 0] * local[:, 0:1] + rot[:, :, 1] * local[:, 1:2] + rot[:, :, 2] * local[:, 2:3])


# ---------------------------------------------------------------------- loss terms
class MCMCRegularizers(NamedTuple):
    """This rank's parts of main's two MCMC loss terms (0-d each)."""

    opacity: torch.Tensor
    scale: torch.Tensor


def mcmc_regularizers(
    opacity_logits: torch.Tensor,
    log_scales: torch.Tensor,
    num_gaussians_total: int,
    *,
    opacity_reg: float,
    scale_reg: float,
) -> MCMCRegularizers:
    """nerfstudio main's ``mcmc_opacity_reg * mean(opacity)`` and ``mcmc_scale_reg * mean(scale)``,
    as this rank's exact share: its sum divided by the global count.

    Summed over the shards this is main's mean; each Gaussian's gradient, ``reg / n`` times its
    activation's derivative, is the same bits whichever shard holds it and however many there are.
    (main takes ``abs`` of the activations, which are positive: the same value and gradient.)

    Args:
        opacity_logits: This rank's. `[N]` or `[N, 1]`.
        log_scales: This rank's. `[N, 3]`.
        num_gaussians_total: Gaussians on all ranks (``N`` in one process or a replica).
        opacity_reg, scale_reg: ``MCMCConfig``'s weights.

    Returns:
        The two terms, on the parameters' device and dtype. In replicated mode add them on ONE
        rank (the replicas' gradients are summed); in sharded mode on every rank.

    **Differentiable:** with respect to ``opacity_logits`` and ``log_scales``.
    """
    check_int("num_gaussians_total", num_gaussians_total, 0)
    count = max(num_gaussians_total, 1)
    opacity = opacity_reg * (opacities_of(opacity_logits).sum() / count)
    scale = scale_reg * (torch.exp(log_scales).sum() / (count * log_scales.shape[-1]))
    return MCMCRegularizers(opacity, scale)


# ---------------------------------------------------------------------- one step
class MCMCStep(NamedTuple):
    """What ``mcmc_step_post_backward`` did."""

    next_id: int
    event: MCMCEvent | None
    """None on steps without an event."""


def mcmc_step_post_backward(
    gaussians: GaussianRows,
    *,
    step: int,
    seed: int,
    means_lr: float,
    next_id: int,
    config: MCMCConfig,
    schedule: MCMCSchedule,
    gather: IdGather,
) -> MCMCStep:
    """gsplat 1.4.0's ``MCMCStrategy.step_post_backward``: the event when scheduled, then the noise.

    Call it after the optimizer and scheduler steps (nerfstudio main's AFTER_TRAIN_ITERATION
    callback), with ``means_lr`` the means' learning rate then (``get_last_lr()[0]``).

    Args:
        gaussians: As ``mcmc_event``'s.
        step: Optimizer step.
        seed: Run seed (the same on every rank).
        means_lr: The means' learning rate.
        next_id: First unused global id (the same on every rank).
        config: The MCMC fields.
        schedule: ``mcmc_schedule_in_steps``'.
        gather: As ``mcmc_event``'s.

    Returns:
        The new ``next_id`` and the event's counts.

    **Collective:** ``mcmc_event``'s, on event steps only (every rank knows which: the schedule).
    **Host sync:** on event steps only.
    """
    event = None
    if schedule.is_event(step):
        event = mcmc_event(
            gaussians,
            step=step,
            seed=seed,
            next_id=next_id,
            cap_max=config.max_gs_num,
            min_opacity=config.cull_alpha_thresh,
            gather=gather,
        )
        next_id = event.next_id
    inject_keyed_position_noise(
        gaussians.params, gaussians.ids, seed=seed, step=step, scaler=means_lr * config.noise_lr
    )
    return MCMCStep(next_id, event)


class MCMCDensifier(Densifier):
    """MCMC as the pipeline calls it: an event on the schedule's steps, position noise on every step.

    The noise's scale is the means' learning rate of the step, read from the optimizer after the
    scheduler stepped (what ``get_last_lr()[0]`` of a means scheduler returns, and the constant
    rate where the means have no scheduler).

    Args:
        config: The MCMC fields.
        schedule: When events happen, in optimizer steps.
        seed, next_id, log_events: As ``Densifier``'s.
    """

    help = (
        "Kheradmand et al. 2024: relocate dead Gaussians, add 5% per event up to max_gs_num, position noise; the same model on any number "
        "of ranks: docs/mcmc.md. The DefaultStrategy's fields (densify_*, cull_scale_thresh, cull_screen_size, split_screen_size, "
        "reset_alpha_every, stop_screen_size_at, use_absgrad) are not read, as in main's splatfacto"
    )

    def __init__(
        self, config: MCMCConfig, schedule: MCMCSchedule, *, seed: int, next_id: int, log_events: bool
    ) -> None:
        super().__init__(seed=seed, next_id=next_id, log_events=log_events)
        self.config = config
        self.schedule = schedule

    @classmethod
    def from_config(
        cls, config: Any, *, batch_size: int, num_train_images: int, seed: int, next_id: int, log_events: bool
    ) -> MCMCDensifier:
        mcmc = MCMCConfig.from_config(config)
        schedule = mcmc_schedule_in_steps(
            warmup_images=config.warmup_length,
            stop_split_images=config.stop_split_at,
            refine_every_images=config.refine_every,
            batch_size=batch_size,
        )
        return cls(mcmc, schedule, seed=seed, next_id=next_id, log_events=log_events)

    caps_each_rank = False

    def set_max_held(self, max_held: int | None, reason: str = "") -> None:
        """MCMC honours no per-rank cap: an addition lands on its source's owner and the sharded
        mode's rebalance evens the shards after each event.

        Raises:
            ValueError: ``max_held`` is not None.
        """
        if max_held is not None:
            raise ValueError(
                f"max_held: MCMC densification has no per-rank cap (got {max_held}); cap the whole with set_cap"
            )

    def needs_statistics(self, step: int) -> bool:
        """Never: relocation and addition draw by opacity, not by screen-space gradients."""
        return False

    def changes_shards_at(self, step: int) -> bool:
        return self.schedule.is_event(step)

    def after_optimizer(self, rows: GaussianRows, step: int, info: dict[str, Any] | None, gather: IdGather) -> None:
        """``mcmc_step_post_backward`` on this rank's Gaussians; ``next_id`` advances.

        **Collective:** ``mcmc_event``'s gathers on event steps. **Host sync:** event steps only
        (the global counts); the noise is computed on the device.
        """
        means_optimizer = rows.optimizer("means")
        if means_optimizer is None:
            raise ValueError(
                "MCMCDensifier.after_optimizer: the rows must be bound to the optimizers (rows.bound(optimizers))"
            )
        means_lr = float(means_optimizer.param_groups[0]["lr"])
        config = self.config
        if self.caps.max_gaussians is not None:  # the effective cap (gaussians/growth_cap.py); 0 adds as 1 does
            config = dataclasses.replace(config, max_gs_num=max(1, min(config.max_gs_num, self.caps.max_gaussians)))
        done = mcmc_step_post_backward(
            rows,
            step=step,
            seed=self.seed,
            means_lr=means_lr,
            next_id=self.next_id,
            config=config,
            schedule=self.schedule,
            gather=gather,
        )
        self.next_id = done.next_id
        if done.event is not None:
            num_before = done.event.num_gaussians - done.event.num_added
            uncapped = max(0, min(self.config.max_gs_num, int(GROWTH * num_before)) - num_before)
            self._record_refused(step, RefusedCounts(global_cap=uncapped - done.event.num_added))
        if done.event is not None and self.log_events:
            LOGGER.info(
                "step %d: MCMC relocated %d, added %d: %d Gaussians over all ranks (cap %d)",
                step,
                done.event.num_relocated,
                done.event.num_added,
                done.event.num_gaussians,
                self.config.max_gs_num,
            )


__all__ = [
    "MCMCConfig",
    "MCMCDensifier",
    "MCMCEvent",
    "MCMCRegularizers",
    "MCMCSchedule",
    "MCMCStep",
    "inject_keyed_position_noise",
    "mcmc_event",
    "mcmc_regularizers",
    "mcmc_schedule_in_steps",
    "mcmc_step_post_backward",
]
