"""When the default densification acts: gsplat 1.4.0 DefaultStrategy's schedule, in optimizer steps.

splatfacto counts its schedule in images; ``schedule_in_steps`` converts it once to steps of B images,
so a batch keeps what an epoch means (docs/README.md). Each rule is a pure function of the step, so
every rank agrees on it without a collective. The decisions themselves are gaussians/strategy.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from distsplat_ns.utils.steps import images_to_steps


@dataclass(frozen=True)
class StrategySchedule:
    """The DefaultStrategy knobs that are counted in time, in optimizer steps."""

    refine_start_iter: int
    refine_stop_iter: int
    reset_every: int
    refine_every: int
    pause_refine_after_reset: int
    refine_scale2d_stop_iter: int


def grows_at(schedule: StrategySchedule, step: int) -> bool:
    """Whether densification grows and prunes at ``step``: gsplat 1.4.0 DefaultStrategy's
    condition (``step_post_backward``), with ``reset_every == 0`` meaning opacity is never reset
    (gsplat would divide by it). A pure function of the step: every rank agrees. The one copy of
    the rule: ``gaussians/strategy.py:DefaultDensifier`` and the sharded mode's rebalance
    (``parallel/sharded.py``) read it."""
    if not schedule.refine_start_iter < step < schedule.refine_stop_iter or step % schedule.refine_every:
        return False
    return schedule.reset_every == 0 or step % schedule.reset_every >= schedule.pause_refine_after_reset


def resets_opacity_at(schedule: StrategySchedule, step: int) -> bool:
    """Whether gsplat 1.4.0's DefaultStrategy resets the opacities at ``step`` (never when ``reset_every == 0``)."""
    return step < schedule.refine_stop_iter and schedule.reset_every > 0 and step % schedule.reset_every == 0


PauseRule = Literal["bounded", "splatfacto"]
"""``--pipeline.model.pause-after-reset``: how long growth pauses after each opacity reset
(``pause_after_reset_images``)."""
PAUSE_RULES: tuple[PauseRule, ...] = get_args(PauseRule)


def pause_after_reset_images(
    rule: PauseRule, *, num_train_images: int, warmup_images: int, refine_every_images: int
) -> int:
    """Images after each opacity reset during which no Gaussian grows.

    ``"splatfacto"``: splatfacto's ``num_train_images + refine_every``. gsplat applies the pause
    from step 0 on (``step % reset_every >= pause``), so a capture of 2900 or more images at the
    default 3000-image reset never grows at all (docs/densification.md; nerfstudio's tracker, #2927 and #3743).
    ``"bounded"``: the same, but never longer than the warm-up plus one refine interval, so growth
    resumes after every reset as it started after the warm-up, whatever the capture size. Captures
    of at most ``warmup_images`` images get splatfacto's schedule unchanged (docs/densification.md).
    """
    splatfacto = num_train_images + refine_every_images
    if rule == "splatfacto":
        return splatfacto
    if rule == "bounded":
        return min(splatfacto, warmup_images + refine_every_images)
    raise ValueError(f"pause rule must be one of {PAUSE_RULES}, got {rule!r}")


def schedule_in_steps(
    *,
    warmup_images: int,
    stop_split_images: int,
    refine_every_images: int,
    reset_alpha_every_refines: int,
    stop_screen_size_images: int,
    num_train_images: int,
    batch_size: int,
    pause_rule: PauseRule = "bounded",
) -> StrategySchedule:
    """Convert splatfacto's image-counted densification schedule to steps of ``batch_size`` images.

    Each point is the step nearest its image count, the opacity reset included: counted as
    refines x steps per refine, it would drift with the refine interval's rounding (at B = 16,
    every 96 images, so a reset every 2880 images instead of 3000). The pause after a reset
    follows ``pause_rule`` (``pause_after_reset_images``)."""
    refine_every = images_to_steps(refine_every_images, batch_size)
    pause_images = pause_after_reset_images(
        pause_rule,
        num_train_images=num_train_images,
        warmup_images=warmup_images,
        refine_every_images=refine_every_images,
    )
    return StrategySchedule(
        refine_start_iter=images_to_steps(warmup_images, batch_size),
        refine_stop_iter=images_to_steps(stop_split_images, batch_size),
        reset_every=images_to_steps(reset_alpha_every_refines * refine_every_images, batch_size),
        refine_every=refine_every,
        pause_refine_after_reset=images_to_steps(pause_images, batch_size),
        refine_scale2d_stop_iter=images_to_steps(stop_screen_size_images, batch_size),
    )
