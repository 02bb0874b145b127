"""Densification: gsplat's DefaultStrategy driven by statistics reduced over the whole batch.

gsplat is imported lazily here (the layer rule of tests/unit/test_layers.py). Schedules are counted in images and converted
to optimizer steps once, so a batch of B images per step keeps what an epoch means (Grendel-GS
counts iterations in images; docs/README.md).

Densification gives the same result whatever the number of processes holding the Gaussians
(docs/sharded.md): every decision is per Gaussian, a split's offsets are keyed by (seed, step,
parent id) (utils/keyed_random.py), and new global ids are numbered from the parent ids of all
ranks, sorted (``allocate_child_ids``).

Shape letters: ``N`` Gaussians held here, ``R`` ranks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, get_args

import torch

from distsplat_ns.gaussians.rows import DEFAULT_STATISTICS, GaussianRows
from distsplat_ns.utils.keyed_random import keyed_normal
from distsplat_ns.utils.logging import get_logger
from distsplat_ns.utils.steps import images_to_steps

logger = get_logger(__name__)

IdGather = Callable[[torch.Tensor], list[torch.Tensor]]
"""Every rank's rows of a tensor, by rank: ``lambda t: [t]`` where one process (or every replica)
holds all Gaussians, ``functools.partial(all_gather_rows, ctx)`` where each rank holds a shard."""


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
    the rule: the strategy below and the sharded mode's rebalance (``parallel/sharded.py``) read it."""
    if not schedule.refine_start_iter < step < schedule.refine_stop_iter or step % schedule.refine_every:
        return False
    return schedule.reset_every == 0 or step % schedule.reset_every >= schedule.pause_refine_after_reset


def resets_opacity_at(schedule: StrategySchedule, step: int) -> bool:
    """Whether gsplat 1.4.0's DefaultStrategy resets the opacities at ``step`` (never when ``reset_every == 0``)."""
    return step < schedule.refine_stop_iter and schedule.reset_every > 0 and step % schedule.reset_every == 0


@dataclass(frozen=True)
class KeyedGrowth:
    """What a keyed grow event needs besides gsplat's arguments: the run seed (keys the split
    offsets) and the id allocator (``DistSplatModel.allocate_gauss_ids`` bound to the mode's gather).
    Passed in the strategy state under :data:`KEYED_GROWTH_KEY` for one ``step_post_backward`` call,
    so the strategy keeps gsplat's signature."""

    seed: int
    allocate: Callable[[torch.Tensor, torch.Tensor], ChildIds]


#: Strategy-state key of the :class:`KeyedGrowth` of the current call (never saved: not a tensor).
KEYED_GROWTH_KEY = "keyed_growth"


PauseRule = Literal["bounded", "splatfacto"]
"""``--pipeline.model.pause-after-reset``: how long growth pauses after each opacity reset
(``pause_after_reset_images``)."""
PAUSE_RULES: tuple[PauseRule, ...] = get_args(PauseRule)


def pause_after_reset_images(rule: PauseRule, *, num_train_images: int, warmup_images: int, refine_every_images: int) -> int:
    """Images after each opacity reset during which no Gaussian grows.

    ``"splatfacto"``: splatfacto's ``num_train_images + refine_every``. gsplat applies the pause
    from step 0 on (``step % reset_every >= pause``), so a capture of 2900 or more images at the
    default 3000-image reset never grows at all (nerfstudio issues #2927 and #3743).
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
        pause_rule, num_train_images=num_train_images, warmup_images=warmup_images, refine_every_images=refine_every_images
    )
    return StrategySchedule(
        refine_start_iter=images_to_steps(warmup_images, batch_size),
        refine_stop_iter=images_to_steps(stop_split_images, batch_size),
        reset_every=images_to_steps(reset_alpha_every_refines * refine_every_images, batch_size),
        refine_every=refine_every,
        pause_refine_after_reset=images_to_steps(pause_images, batch_size),
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

    Replaced, with gsplat 1.4.0's decisions kept:
    * the statistics update: gsplat writes the per-Gaussian maximum screen radius with
      ``state["radii"][ids] = ...``, which keeps an arbitrary one of the values when a Gaussian is
      seen by several cameras of the batch (its own comment: "should be ideally using scatter
      max"); the parallel CPU/GPU writes make that choice vary from run to run, and so do the
      pruning decisions. Here the maximum is taken over cameras, deterministically;
    * ``step_post_backward`` (gsplat's signature; the run seed and the id allocator in the state,
      :class:`KeyedGrowth`) grows with ``refine_keyed``: split offsets keyed by global id, new Gaussians numbered independently of
      the number of processes; pruning with ``prune_mask``.
    """
    from gsplat.strategy import DefaultStrategy

    class BatchDefaultStrategy(DefaultStrategy):
        def _update_state(self, params, state, info, packed=False):
            if packed:
                raise ValueError("distsplat renders with packed=False only")
            update_batch_statistics(self, params, state, info)

        def step_post_backward(self, params, optimizers, state, step, info, packed=False):
            # gsplat 1.4.0's signature and schedule (grows_at), with the grow/prune of this module;
            # the seed and id allocator come in state[KEYED_GROWTH_KEY].
            if step >= self.refine_stop_iter:
                return
            self._update_state(params, state, info, packed=packed)
            if grows_at(schedule, step):
                growth: KeyedGrowth = state[KEYED_GROWTH_KEY]
                refine_keyed(self, params, optimizers, state, step, growth.seed, growth.allocate)
            if resets_opacity_at(schedule, step):
                rows = GaussianRows.over(params, state, optimizers, DEFAULT_STATISTICS)
                reset_opacities(rows, self.prune_opa * 2.0)

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
            `[C, N]`, width, height (ints, or per camera `[C, 1]` tensors: each camera's gradients
            are normalised by its own size), n_cameras.
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
    if visible.shape[0] == 1:
        state["grad2d"] += norms[0]
    else:  # camera after camera, in one operator: as gsplat's index_add_ over (c, n) pairs (the same sums on the CPU)
        state["grad2d"][None].index_add_(0, torch.zeros(visible.shape[0], dtype=torch.int64, device=norms.device), norms)
    # Counts are small integers, exact in float32 in any order: one sum, not one add per camera.
    state["count"] += visible.sum(dim=0, dtype=state["count"].dtype)
    if strategy.refine_scale2d_stop_iter > 0:
        width, height = info["width"], info["height"]
        scale = torch.maximum(width, height) if isinstance(width, torch.Tensor) else float(max(width, height))
        radii = torch.where(visible, info["radii"].to(grads.dtype) / scale, torch.zeros((), device=grads.device))
        state["radii"] = torch.maximum(state["radii"], radii.amax(dim=0))


class ChildIds(NamedTuple):
    """Global ids of the Gaussians this rank's grow event creates, and the event's global size."""

    dup: torch.Tensor
    """Ids of the copies of this rank's duplicated parents, in the parents' order. `[n_dup]`, int64."""
    split: torch.Tensor
    """Ids of the first (row 0) and second (row 1) child of each split parent. `[2, n_split]`, int64."""
    num_dup_total: int
    """Duplicated parents on all ranks."""
    num_split_total: int
    """Split parents on all ranks."""
    num_ranks: int
    """How many tensors the gather returned (1 where this process holds every Gaussian)."""


def allocate_child_ids(next_id: int, dup_parent_ids: torch.Tensor, split_parent_ids: torch.Tensor, gather_ids: IdGather) -> ChildIds:
    """Number the Gaussians one grow event creates, the same whatever the number of ranks.

    The parent ids of all ranks are sorted: the copy of the k-th duplicated parent gets
    ``next_id + k``, the children of the k-th split parent ``next_id + n_dup_total + 2k`` and
    ``+ 2k + 1``; the caller advances ``next_id`` by ``n_dup_total + 2 n_split_total``. A
    duplicated original keeps its id; a split parent's id is retired.

    Args:
        next_id: First unused global id (the same on every rank).
        dup_parent_ids: This rank's duplicated parents. `[n_dup]`, int64.
        split_parent_ids: This rank's split parents. `[n_split]`, int64.
        gather_ids: Every rank's rows of an int64 `[n, 2]` tensor (see ``IdGather``).

    Returns:
        The new ids (``ChildIds``), on the parents' device.

    Raises:
        RuntimeError: Two ranks hold the same parent id (broken sharding).

    **Collective:** one call of ``gather_ids`` (rows ``(id, 0)`` for duplicated and ``(id, 1)``
    for split parents); every rank calls it once per grow event, also with no parents. Rank 0
    duplicating id 7 and rank 1 duplicating id 3, at ``next_id`` 100: id 3's copy is 100, id 7's 101.
    With ``gather_local`` (one process, or replicated mode) no communication.
    **Host sync:** the global counts (refine steps only).
    """
    kinds = torch.cat([torch.zeros_like(dup_parent_ids), torch.ones_like(split_parent_ids)])
    rows = torch.stack([torch.cat([dup_parent_ids, split_parent_ids]), kinds], dim=1)  # [n_dup + n_split, 2]
    gathered = gather_ids(rows)
    everything = torch.cat([g.to(rows.device) for g in gathered])
    all_dup = torch.sort(everything[everything[:, 1] == 0, 0]).values
    all_split = torch.sort(everything[everything[:, 1] == 1, 0]).values
    for name, ids in (("duplicated", all_dup), ("split", all_split)):
        if bool((ids[1:] == ids[:-1]).any()):  # host sync: refine step
            raise RuntimeError(f"two {name} parents share a global id: the shards overlap")
    num_dup, num_split = int(all_dup.numel()), int(all_split.numel())
    dup = next_id + torch.searchsorted(all_dup, dup_parent_ids)
    first = next_id + num_dup + 2 * torch.searchsorted(all_split, split_parent_ids)
    return ChildIds(dup, torch.stack([first, first + 1]), num_dup, num_split, len(gathered))


def grow_masks(strategy: Any, params: Any, state: dict, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which Gaussians to duplicate and to split: gsplat 1.4.0's ``DefaultStrategy._grow_gs`` rule.

    Returns:
        ``(is_dupli, is_split)``. `[N]` bool each; both can hold for one Gaussian (large on
        screen while small in 3D): the original is split and its copy is not.
    """
    grads = state["grad2d"] / state["count"].clamp_min(1)
    is_grad_high = grads > strategy.grow_grad2d
    is_small = torch.exp(params["scales"]).max(dim=-1).values <= strategy.grow_scale3d * state["scene_scale"]
    is_split = is_grad_high & ~is_small
    if step < strategy.refine_scale2d_stop_iter:
        is_split |= state["radii"] > strategy.grow_scale2d
    return is_grad_high & is_small, is_split


def prune_mask(strategy: Any, params: Any, state: dict, step: int) -> torch.Tensor:
    """Which Gaussians to remove: gsplat 1.4.0's ``DefaultStrategy._prune_gs`` rule. `[N]` bool.

    The opacity is ``1 / (1 + exp(-x))`` in three element-wise ops rather than ``torch.sigmoid``:
    on CPU, torch.sigmoid's vectorised body and scalar tail differ in the last bit, so the same
    Gaussian's opacity would depend on its position in the shard (tests/unit/test_keyed_strategy.py).
    """
    opacities = 1.0 / (1.0 + torch.exp(-params["opacities"].flatten()))
    is_prune = opacities < strategy.prune_opa
    if step > strategy.reset_every:
        is_too_big = torch.exp(params["scales"]).max(dim=-1).values > strategy.prune_scale3d * state["scene_scale"]
        if step < strategy.refine_scale2d_stop_iter:
            is_too_big |= state["radii"] > strategy.prune_scale2d
        is_prune = is_prune | is_too_big
    return is_prune


@torch.no_grad()
def split_keyed(rows: GaussianRows, mask: torch.Tensor, unit_offsets: torch.Tensor, child_ids: torch.Tensor, revised_opacity: bool) -> None:
    """gsplat 1.4.0's ``split`` with given unit-normal offsets and child ids, in place.

    Each selected Gaussian becomes two, at ``mean + R(q) diag(s) z`` with scales ``s / 1.6``;
    layout ``[rest, first children, second children]``; the children's optimizer state is zero,
    their statistics their parent's (``GaussianRows.grow_``).
    The rotation is written element-wise (no einsum/matmul), so a child's bits do not depend on
    how many Gaussians are split with it.

    Args:
        rows: The Gaussians (``means``, ``scales`` as logs, ``quats``, ``opacities``, ...) with
            their optimizers and statistics.
        mask: Gaussians to split. `[N]` bool.
        unit_offsets: Standard normal offsets of the two children. `[2, n_split, 3]`.
        child_ids: Global ids of the two children. `[2, n_split]`, int64.
        revised_opacity: gsplat's arXiv:2404.06109 opacity option.
    """
    from gsplat.utils import normalized_quat_to_rotmat

    params = rows.params
    sel = torch.where(mask)[0]
    rest = torch.where(~mask)[0]
    scales = torch.exp(params["scales"][sel])  # [n, 3]
    q = params["quats"][sel]
    norm = torch.sqrt(q[:, 0] * q[:, 0] + q[:, 1] * q[:, 1] + q[:, 2] * q[:, 2] + q[:, 3] * q[:, 3])
    rotmats = normalized_quat_to_rotmat(q / norm.clamp_min(1e-12)[:, None])  # [n, 3, 3]
    local = unit_offsets.to(scales.dtype) * scales  # [2, n, 3]
    offsets = rotmats[None, :, :, 0] * local[..., 0:1] + rotmats[None, :, :, 1] * local[..., 1:2] + rotmats[None, :, :, 2] * local[..., 2:3]
    values = {
        "means": (params["means"][sel] + offsets).reshape(-1, 3),  # [2n, 3]
        "scales": torch.log(scales / 1.6).repeat(2, 1),
    }
    if revised_opacity:
        values["opacities"] = torch.logit(1.0 - torch.sqrt(1.0 - torch.sigmoid(params["opacities"][sel]))).repeat(2, 1)
    rows.grow_(torch.cat([sel, sel]), child_ids.reshape(-1), keep=rest, values=values, statistics="parent")


@torch.no_grad()
def reset_opacities(rows: GaussianRows, value: float) -> None:
    """gsplat 1.4.0's ``reset_opa``: opacity logits clamped to ``logit(value)``, their Adam
    moments zeroed (in the default dtype, as gsplat computes the bound)."""
    bound = torch.logit(torch.tensor(value)).item()
    rows.update_(None, {"opacities": torch.clamp(rows.params["opacities"].detach(), max=bound)}, zero_moments=("opacities",))


@torch.no_grad()
def refine_keyed(
    strategy: Any, params: Any, optimizers: dict, state: dict, step: int, seed: int, allocate: Callable[[torch.Tensor, torch.Tensor], ChildIds]
) -> tuple[int, int, int]:
    """One refine event: duplicate, split (keyed offsets), prune, then zero the running statistics.

    Args:
        strategy: The DefaultStrategy (thresholds, ``verbose``).
        params, optimizers, state: As gsplat's strategy takes them; ``state["gauss_ids"]`` `[N]`.
            Their rows change through ``GaussianRows`` (``DEFAULT_STATISTICS`` declared).
        step: Optimizer step (keys the offsets).
        seed: Run seed (keys the offsets).
        allocate: ``(dup_parent_ids, split_parent_ids) -> ChildIds`` (``allocate_child_ids``
            bound to the model's ``next_gauss_id`` and a gather).

    Returns:
        Duplicated and split parents on all ranks, Gaussians pruned here.

    **Collective:** ``allocate``'s gather, once, on every rank (also with nothing to grow).
    **Host sync:** counts (refine steps only).
    """
    rows = GaussianRows.over(params, state, optimizers, DEFAULT_STATISTICS)
    is_dupli, is_split = grow_masks(strategy, params, state, step)
    ids = state["gauss_ids"]
    new = allocate(ids[is_dupli], ids[is_split])
    num_held = len(rows)
    if new.dup.numel() > 0:
        rows.grow_(torch.where(is_dupli)[0], new.dup, statistics="parent")  # gsplat's duplicate: copies appended
    if new.split.numel() > 0:
        unit = keyed_normal(seed, step, ids[is_split], 6).reshape(-1, 2, 3).transpose(0, 1)  # [2, n_split, 3]
        is_split = torch.cat([is_split, is_split.new_zeros(len(rows) - num_held)])  # copies are not split
        split_keyed(rows, is_split, unit, new.split, strategy.revised_opacity)
    is_prune = prune_mask(strategy, params, state, step)
    num_pruned = int(is_prune.sum())  # host sync: refine step
    if num_pruned > 0:
        rows.select_(torch.where(~is_prune)[0])  # gsplat's remove
    if strategy.verbose:
        where = "" if new.num_ranks == 1 else f" (duplicated, split: all {new.num_ranks} ranks; pruned, count: this rank)"
        logger.info(
            "Step %d: %d GSs duplicated, %d GSs split, %d GSs pruned. Now having %d GSs%s.",
            step,
            new.num_dup_total,
            new.num_split_total,
            num_pruned,
            len(rows),
            where,
        )
    state["grad2d"].zero_()
    state["count"].zero_()
    if strategy.refine_scale2d_stop_iter > 0:
        state["radii"].zero_()
    return new.num_dup_total, new.num_split_total, num_pruned


def batch_info(grads2d: torch.Tensor, absgrads2d: torch.Tensor, radii: torch.Tensor, width: Any, height: Any) -> dict[str, Any]:
    """The ``info`` dict DefaultStrategy reads, built from statistics of the WHOLE global batch.

    Args:
        grads2d: d loss / d means2d summed over every band of every rank. ``[B, N, 2]``.
        absgrads2d: gsplat's absgrad, likewise summed. ``[B, N, 2]``.
        radii: Screen radii, max over ranks (0 where culled). ``[B, N]`` int32, px.
        width: Rendered width this step, px: an int, or per camera `[B, 1]` where the batch's
            cameras differ in size.
        height: Rendered height this step, px (likewise).

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


def gather_local(rows: torch.Tensor) -> list[torch.Tensor]:
    """The ``IdGather`` where this process holds every Gaussian (one process, or a replica)."""
    return [rows]


def sqrt_batch_scaling(lr: float, eps: float, betas: tuple[float, float], batch_size: int) -> tuple[float, float, tuple[float, float]]:
    """Grendel-GS's "sqrt" rule: lr x sqrt(B), eps / sqrt(B), betas -> beta^B (docs/distributed.md)."""
    s = math.sqrt(batch_size)
    return lr * s, eps / s, (betas[0] ** batch_size, betas[1] ** batch_size)
