"""Densification: gsplat's DefaultStrategy driven by statistics reduced over the whole batch.

gsplat is imported lazily here (the layer rule of tests/unit/test_layers.py). Schedules are counted in images and converted
to optimizer steps once, so a batch of B images per step keeps what an epoch means (Grendel-GS
counts iterations in images; docs/README.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

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


def schedule_in_steps(
    *,
    warmup_images: int,
    stop_split_images: int,
    refine_every_images: int,
    reset_alpha_every_refines: int,
    stop_screen_size_images: int,
    num_train_images: int,
    batch_size: int,
) -> StrategySchedule:
    """Convert splatfacto's image-counted densification schedule to steps of ``batch_size`` images."""
    refine_every = images_to_steps(refine_every_images, batch_size)
    return StrategySchedule(
        refine_start_iter=images_to_steps(warmup_images, batch_size),
        refine_stop_iter=images_to_steps(stop_split_images, batch_size),
        reset_every=reset_alpha_every_refines * refine_every,
        refine_every=refine_every,
        pause_refine_after_reset=images_to_steps(num_train_images + refine_every_images, batch_size),
        refine_scale2d_stop_iter=images_to_steps(stop_screen_size_images, batch_size),
    )


def build_default_strategy(
    schedule: StrategySchedule,
    *,
    prune_opa: float,
    grow_grad2d: float,
    grow_scale3d: float,
    grow_scale2d: float,
    prune_scale3d: float,
    prune_scale2d: float,
    absgrad: bool,
    verbose: bool,
) -> Any:
    """gsplat's DefaultStrategy with splatfacto's thresholds and a step-counted schedule.

    One method is replaced: gsplat 1.4.0's statistics update writes the per-Gaussian maximum
    screen radius with ``state["radii"][ids] = ...``, which keeps an arbitrary one of the values
    when a Gaussian is seen by several cameras of the batch (its own comment: "should be ideally
    using scatter max"); the parallel CPU/GPU writes make that choice vary from run to run, and so
    do the pruning decisions. Here the maximum is taken over cameras, deterministically.
    """
    from gsplat.strategy import DefaultStrategy

    class BatchDefaultStrategy(DefaultStrategy):
        def _update_state(self, params, state, info, packed=False):  # noqa: ANN001, ANN202
            if packed:
                raise ValueError("distsplat renders with packed=False only")
            update_batch_statistics(self, params, state, info)

    return BatchDefaultStrategy(
        prune_opa=prune_opa,
        grow_grad2d=grow_grad2d,
        grow_scale3d=grow_scale3d,
        grow_scale2d=grow_scale2d,
        prune_scale3d=prune_scale3d,
        prune_scale2d=prune_scale2d,
        refine_scale2d_stop_iter=schedule.refine_scale2d_stop_iter,
        refine_start_iter=schedule.refine_start_iter,
        refine_stop_iter=schedule.refine_stop_iter,
        reset_every=schedule.reset_every,
        refine_every=schedule.refine_every,
        pause_refine_after_reset=schedule.pause_refine_after_reset,
        absgrad=absgrad,
        revised_opacity=False,
        verbose=verbose,
    )


def update_batch_statistics(strategy: Any, params: Any, state: dict, info: dict) -> None:
    """DefaultStrategy's running statistics from a whole batch, deterministically.

    Same values as gsplat 1.4.0's ``DefaultStrategy._update_state`` (normalised screen-space
    gradient norms and visibility counts summed camera by camera, in camera order), except that the
    screen radius is the maximum over every camera that sees the Gaussian.

    Args:
        strategy: The DefaultStrategy (its ``absgrad`` and ``refine_scale2d_stop_iter``).
        params: Gaussian parameters (for N).
        state: The strategy state, updated in place.
        info: ``batch_info``'s dict: ``means2d`` with ``.grad``/``.absgrad`` `[C, N, 2]`, ``radii``
            `[C, N]`, width, height, n_cameras.
    """
    grads = (info["means2d"].absgrad if strategy.absgrad else info["means2d"].grad).clone()
    grads[..., 0] *= info["width"] / 2.0 * info["n_cameras"]
    grads[..., 1] *= info["height"] / 2.0 * info["n_cameras"]
    n = len(params["means"])
    if state["grad2d"] is None:
        state["grad2d"] = torch.zeros(n, device=grads.device, dtype=grads.dtype)
    if state["count"] is None:
        state["count"] = torch.zeros(n, device=grads.device)
    if strategy.refine_scale2d_stop_iter > 0 and state["radii"] is None:
        state["radii"] = torch.zeros(n, device=grads.device, dtype=grads.dtype)
    visible = info["radii"] > 0  # [C, N]
    norms = torch.where(visible, grads.norm(dim=-1), torch.zeros((), device=grads.device))
    for c in range(visible.shape[0]):  # camera order, as gsplat's index_add_ over (c, n) pairs
        state["grad2d"] += norms[c]
        state["count"] += visible[c].to(state["count"].dtype)
    if strategy.refine_scale2d_stop_iter > 0:
        scale = float(max(info["width"], info["height"]))
        radii = torch.where(visible, info["radii"].to(grads.dtype) / scale, torch.zeros((), device=grads.device))
        state["radii"] = torch.maximum(state["radii"], radii.amax(dim=0))


def batch_info(
    grads2d: torch.Tensor, absgrads2d: torch.Tensor, radii: torch.Tensor, width: int, height: int
) -> dict[str, Any]:
    """The ``info`` dict DefaultStrategy reads, built from statistics of the WHOLE global batch.

    Args:
        grads2d: d loss / d means2d summed over every band of every rank. ``[B, N, 2]``.
        absgrads2d: gsplat's absgrad, likewise summed. ``[B, N, 2]``.
        radii: Screen radii, max over ranks (0 where culled). ``[B, N]`` int32, px.
        width: Rendered width this step, px.
        height: Rendered height this step, px.

    Returns:
        The dict gsplat's ``DefaultStrategy._update_state`` consumes; its ``means2d`` is a stand-in
        leaf tensor carrying ``.grad`` and ``.absgrad``, exactly what a single process rendering the
        whole batch in one call would have produced.
    """
    holder = torch.zeros_like(grads2d, requires_grad=True)
    holder.grad = grads2d
    holder.absgrad = absgrads2d  # type: ignore[attr-defined]
    return {
        "means2d": holder,
        "radii": radii,
        "width": width,
        "height": height,
        "n_cameras": int(grads2d.shape[0]),
        "gaussian_ids": None,
    }


def refine_seed(seed: int, step: int) -> int:
    """The global-RNG seed used for densification at ``step``: identical on every rank.

    gsplat's split samples new positions with the global generator; reseeding it from (seed, step)
    right before the strategy runs makes every rank draw the same samples whatever else used the
    generator since (data workers, viewer).
    """
    return (seed * 1_000_003 + step * 7919 + 17) % (2**63 - 1)


def sqrt_batch_scaling(lr: float, eps: float, betas: tuple[float, float], batch_size: int) -> tuple[float, float, tuple[float, float]]:
    """Grendel-GS's "sqrt" rule: lr x sqrt(B), eps / sqrt(B), betas -> beta^B (docs/distributed.md)."""
    s = math.sqrt(batch_size)
    return lr * s, eps / s, (betas[0] ** batch_size, betas[1] ** batch_size)
