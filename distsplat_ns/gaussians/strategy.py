"""The default densification: gsplat 1.4.0's DefaultStrategy's decisions, on statistics reduced over
the whole batch, as a ``Densifier`` (``DefaultDensifier``; not a gsplat strategy object).

gsplat is imported lazily here (the layer rule of tests/unit/test_layers.py). Schedules are counted in images and converted
to optimizer steps once, so a batch of B images per step keeps what an epoch means (Grendel-GS
counts iterations in images; docs/README.md).

Densification gives the same result whatever the number of processes holding the Gaussians
(docs/sharded.md): every decision is per Gaussian, a split's offsets are keyed by (seed, step,
parent id) (utils/keyed_random.py), and new global ids are numbered from the parent ids of all
ranks, sorted (``allocate_child_ids``).

What gsplat's ``DefaultStrategy`` does is kept, each rule a function here: the statistics update
(``update_batch_statistics``), which Gaussians grow (``grow_masks``) and are pruned
(``prune_mask``), the split (``split_keyed``) and the opacity reset (``reset_opacities``); when each
happens is gaussians/strategy_schedule.py; the thresholds are ``DefaultThresholds``.

Shape letters: ``N`` Gaussians held here, ``R`` ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from distsplat_ns.gaussians.densifier import Densifier, IdGather
from distsplat_ns.gaussians.growth_cap import (
    KIND_DUP,
    KIND_SPLIT,
    GrowthCaps,
    RefusedCounts,
    candidate_table,
    select_candidates,
)
from distsplat_ns.gaussians.rows import DEFAULT_STATISTICS, GaussianRows
from distsplat_ns.gaussians.strategy_schedule import StrategySchedule, grows_at, resets_opacity_at, schedule_in_steps
from distsplat_ns.utils.dtype import default_dtype
from distsplat_ns.utils.keyed_random import keyed_normal
from distsplat_ns.utils.logging import get_logger

logger = get_logger(__name__)


@dataclass(frozen=True)
class DefaultThresholds:
    """gsplat 1.4.0 DefaultStrategy's knobs that are not counted in time (its names), with
    splatfacto's values from the model config (``from_config``)."""

    prune_opa: float
    """Pruned below this opacity (``cull_alpha_thresh``)."""
    grow_grad2d: float
    """Grown above this mean screen-space gradient norm (``densify_grad_thresh``)."""
    grow_scale3d: float
    """Duplicated at or below, split above this largest scale x ``scene_scale`` (``densify_size_thresh``)."""
    grow_scale2d: float
    """Split above this screen radius over the image size (``split_screen_size``)."""
    prune_scale3d: float
    """Pruned above this largest scale x ``scene_scale`` (``cull_scale_thresh``)."""
    prune_scale2d: float
    """Pruned above this screen radius over the image size (``cull_screen_size``)."""
    absgrad: bool
    """Grow on gsplat's absgrad instead of the gradient (``use_absgrad``)."""
    revised_opacity: bool = False
    """gsplat's arXiv:2404.06109 split opacity (splatfacto: off)."""
    scene_scale: float = 1.0
    """The 3D thresholds' unit (splatfacto: 1)."""

    @classmethod
    def from_config(cls, config: Any) -> DefaultThresholds:
        """Splatfacto's fields of ``config`` (a ``DistSplatModelConfig``)."""
        return cls(
            prune_opa=config.cull_alpha_thresh,
            grow_grad2d=config.densify_grad_thresh,
            grow_scale3d=config.densify_size_thresh,
            grow_scale2d=config.split_screen_size,
            prune_scale3d=config.cull_scale_thresh,
            prune_scale2d=config.cull_screen_size,
            absgrad=config.use_absgrad,
        )


def update_batch_statistics(state: dict, info: dict, num_gaussians: int, *, absgrad: bool, keep_radii: bool) -> None:
    """DefaultStrategy's running statistics from a whole batch, deterministically.

    Same values as gsplat 1.4.0's ``DefaultStrategy._update_state`` (normalised screen-space
    gradient norms and visibility counts summed camera by camera, in camera order), except that the
    screen radius is the maximum over every camera that sees the Gaussian.

    Args:
        state: The strategy state, updated in place.
        info: ``batch_info``'s dict: ``means2d`` with ``.grad``/``.absgrad`` `[C, N, 2]`, ``radii``
            `[C, N]`, width, height (ints, or per camera `[C, 1]` tensors: each camera's gradients
            are normalised by its own size), n_cameras.
        num_gaussians: N, the Gaussians held here.
        absgrad: Accumulate gsplat's absgrad (``DefaultThresholds.absgrad``).
        keep_radii: Keep the screen radii (gsplat: ``refine_scale2d_stop_iter > 0``).
    """
    grads = (info["means2d"].absgrad if absgrad else info["means2d"].grad).clone()
    grads[..., 0] *= info["width"] / 2.0 * info["n_cameras"]
    grads[..., 1] *= info["height"] / 2.0 * info["n_cameras"]
    n = num_gaussians
    if state["grad2d"] is None:
        state["grad2d"] = torch.zeros(n, device=grads.device, dtype=grads.dtype)
    if state["count"] is None:
        state["count"] = torch.zeros(n, device=grads.device)
    if keep_radii and state["radii"] is None:
        state["radii"] = torch.zeros(n, device=grads.device, dtype=grads.dtype)
    visible = info["radii"] > 0  # [C, N]
    norms = torch.where(visible, grads.norm(dim=-1), torch.zeros((), device=grads.device))
    if visible.shape[0] == 1:
        state["grad2d"] += norms[0]
    else:  # camera after camera, in one operator: as gsplat's index_add_ over (c, n) pairs (the same sums on the CPU)
        state["grad2d"][None].index_add_(
            0, torch.zeros(visible.shape[0], dtype=torch.int64, device=norms.device), norms
        )
    # Counts are small integers, exact in float32 in any order: one sum, not one add per camera.
    state["count"] += visible.sum(dim=0, dtype=state["count"].dtype)
    if keep_radii:
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
    dup_kept: torch.Tensor | None = None
    """Which of this rank's duplicated parents the caps kept (``dup`` numbers those). `[n_dup]`
    bool; None: all (no cap)."""
    split_kept: torch.Tensor | None = None
    """Likewise for the split parents. `[n_split]` bool; None: all."""
    refused: RefusedCounts = RefusedCounts()
    """Candidates the caps refused, over all ranks."""
    num_before: int | None = None
    """Gaussians on all ranks before the event (known only where a cap is set)."""


def allocate_child_ids(
    next_id: int,
    dup_parent_ids: torch.Tensor,
    split_parent_ids: torch.Tensor,
    gather_ids: IdGather,
    *,
    caps: GrowthCaps | None = None,
    dup_scores: torch.Tensor | None = None,
    split_scores: torch.Tensor | None = None,
    num_held: int = 0,
) -> ChildIds:
    """Number the Gaussians one grow event creates, the same whatever the number of ranks.

    The parent ids of all ranks are sorted: the copy of the k-th duplicated parent gets
    ``next_id + k``, the children of the k-th split parent ``next_id + n_dup_total + 2k`` and
    ``+ 2k + 1``; the caller advances ``next_id`` by ``n_dup_total + 2 n_split_total``. A
    duplicated original keeps its id; a split parent's id is retired.

    Args:
        next_id: First unused global id (the same on every rank).
        dup_parent_ids: This rank's duplicated parents. `[n_dup]`, int64.
        split_parent_ids: This rank's split parents. `[n_split]`, int64.
        gather_ids: Every rank's rows of an int64 tensor (see ``IdGather``).
        caps: The caps (``gaussians/growth_cap.py``); None or inactive: every parent grows. Every
            rank must pass the same caps (they decide the gathered rows' width).
        dup_scores, split_scores: The parents' grow scores (``grad2d / count``), `[n_dup]` and
            `[n_split]`; needed with active caps.
        num_held: Gaussians this rank holds before the event; needed with active caps.

    Returns:
        The new ids (``ChildIds``) of the kept parents, on the parents' device.

    Raises:
        RuntimeError: Two ranks hold the same parent id (broken sharding).

    **Collective:** one call of ``gather_ids`` (rows ``(id, 0)`` for duplicated and ``(id, 1)``
    for split parents; with active caps ``growth_cap.candidate_table``'s rows, which add each
    rank's held count and the scores, so the caps need no collective of their own); every rank
    calls it once per grow event, also with no parents. Rank 0
    duplicating id 7 and rank 1 duplicating id 3, at ``next_id`` 100: id 3's copy is 100, id 7's 101.
    With ``gather_local`` (one process, or replicated mode) no communication.
    **Host sync:** the global counts (refine steps only).
    """
    capped = caps is not None and caps.active
    if capped:
        if dup_scores is None or split_scores is None:
            raise ValueError("allocate_child_ids: caps need the parents' dup_scores and split_scores")
        rows = candidate_table(dup_parent_ids, split_parent_ids, dup_scores, split_scores, num_held)
    else:
        kinds = torch.cat([torch.zeros_like(dup_parent_ids), torch.ones_like(split_parent_ids)])
        rows = torch.stack([torch.cat([dup_parent_ids, split_parent_ids]), kinds], dim=1)  # [n_dup + n_split, 2]
    gathered = [g.to(rows.device) for g in gather_ids(rows)]
    everything = torch.cat(gathered)
    for name, kind in (("duplicated", KIND_DUP), ("split", KIND_SPLIT)):
        ids = torch.sort(everything[everything[:, 1] == kind, 0]).values
        if bool((ids[1:] == ids[:-1]).any()):  # host sync: refine step
            raise RuntimeError(f"two {name} parents share a global id: the shards overlap")
    dup_kept = split_kept = None
    refused, num_before = RefusedCounts(), None
    if capped:
        assert caps is not None
        selection = select_candidates(gathered, caps)
        everything, refused, num_before = selection.kept, selection.refused, selection.num_before
    all_dup = torch.sort(everything[everything[:, 1] == KIND_DUP, 0]).values
    all_split = torch.sort(everything[everything[:, 1] == KIND_SPLIT, 0]).values
    if capped:
        dup_kept, split_kept = torch.isin(dup_parent_ids, all_dup), torch.isin(split_parent_ids, all_split)
        dup_parent_ids, split_parent_ids = dup_parent_ids[dup_kept], split_parent_ids[split_kept]
    num_dup, num_split = int(all_dup.numel()), int(all_split.numel())
    dup = next_id + torch.searchsorted(all_dup, dup_parent_ids)
    first = next_id + num_dup + 2 * torch.searchsorted(all_split, split_parent_ids)
    return ChildIds(
        dup,
        torch.stack([first, first + 1]),
        num_dup,
        num_split,
        len(gathered),
        dup_kept,
        split_kept,
        refused,
        num_before,
    )


def grow_masks(
    thresholds: DefaultThresholds, schedule: StrategySchedule, params: Any, state: dict, step: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which Gaussians to duplicate and to split: gsplat 1.4.0's ``DefaultStrategy._grow_gs`` rule.

    Returns:
        ``(is_dupli, is_split)``. `[N]` bool each; both can hold for one Gaussian (large on
        screen while small in 3D): the original is split and its copy is not.
    """
    grads = state["grad2d"] / state["count"].clamp_min(1)
    is_grad_high = grads > thresholds.grow_grad2d
    is_small = torch.exp(params["scales"]).max(dim=-1).values <= thresholds.grow_scale3d * thresholds.scene_scale
    is_split = is_grad_high & ~is_small
    if step < schedule.refine_scale2d_stop_iter:
        is_split |= state["radii"] > thresholds.grow_scale2d
    return is_grad_high & is_small, is_split


def prune_mask(
    thresholds: DefaultThresholds, schedule: StrategySchedule, params: Any, state: dict, step: int
) -> torch.Tensor:
    """Which Gaussians to remove: gsplat 1.4.0's ``DefaultStrategy._prune_gs`` rule. `[N]` bool.

    The opacity is ``1 / (1 + exp(-x))`` in three element-wise ops rather than ``torch.sigmoid``:
    on CPU, torch.sigmoid's vectorised body and scalar tail differ in the last bit, so the same
    Gaussian's opacity would depend on its position in the shard (tests/unit/test_keyed_strategy.py).
    """
    opacities = 1.0 / (1.0 + torch.exp(-params["opacities"].flatten()))
    is_prune = opacities < thresholds.prune_opa
    if step > schedule.reset_every:
        is_too_big = torch.exp(params["scales"]).max(dim=-1).values > thresholds.prune_scale3d * thresholds.scene_scale
        if step < schedule.refine_scale2d_stop_iter:
            is_too_big |= state["radii"] > thresholds.prune_scale2d
        is_prune = is_prune | is_too_big
    return is_prune


@torch.no_grad()
def split_keyed(
    rows: GaussianRows, mask: torch.Tensor, unit_offsets: torch.Tensor, child_ids: torch.Tensor, revised_opacity: bool
) -> None:
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
    offsets = (
        rotmats[None, :, :, 0] * local[..., 0:1]
        + rotmats[None, :, :, 1] * local[..., 1:2]
        + rotmats[None, :, :, 2] * local[..., 2:3]
    )
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
    rows.update_(
        None, {"opacities": torch.clamp(rows.params["opacities"].detach(), max=bound)}, zero_moments=("opacities",)
    )


class GrowEvent(NamedTuple):
    """What one grow-and-prune event did."""

    num_dup: int
    """Duplicated parents on all ranks."""
    num_split: int
    """Split parents on all ranks."""
    num_pruned: int
    """Gaussians pruned on this rank."""
    next_id: int
    """First unused global id after the event (the same on every rank)."""
    refused: RefusedCounts = RefusedCounts()
    """Grow candidates the caps refused (over all ranks)."""
    num_before: int | None = None
    """Gaussians on all ranks before the event (known only where a cap is set)."""


@torch.no_grad()
def grow_and_prune(
    rows: GaussianRows,
    thresholds: DefaultThresholds,
    schedule: StrategySchedule,
    step: int,
    *,
    seed: int,
    next_id: int,
    gather: IdGather,
    log: bool = False,
    caps: GrowthCaps | None = None,
) -> GrowEvent:
    """One refine event: duplicate, split (keyed offsets), prune, then zero the running statistics.

    Args:
        rows: This rank's Gaussians with the default strategy's statistics (accumulated) and their
            optimizers; changed in place.
        thresholds, schedule: The rules (gsplat 1.4.0's).
        step: Optimizer step (keys the offsets).
        seed: Run seed (keys the offsets).
        next_id: First unused global id (the same on every rank).
        gather: The mode's ``IdGather`` (``allocate_child_ids``).
        log: Log the event's counts (gsplat's ``verbose`` line).
        caps: Caps on the growth (``gaussians/growth_cap.py``); None: none. The same on every rank.

    Returns:
        The counts and the next free id.

    **Collective:** ``gather``, once, on every rank (also with nothing to grow).
    **Host sync:** counts (refine steps only).
    """
    params, state = rows.params, rows.state
    is_dupli, is_split = grow_masks(thresholds, schedule, params, state, step)
    ids = state["gauss_ids"]
    num_held = len(rows)
    if caps is not None and caps.active:
        scores = state["grad2d"] / state["count"].clamp_min(1)  # grow_masks' criterion
        new = allocate_child_ids(
            next_id,
            ids[is_dupli],
            ids[is_split],
            gather,
            caps=caps,
            dup_scores=scores[is_dupli],
            split_scores=scores[is_split],
            num_held=num_held,
        )
        assert new.dup_kept is not None and new.split_kept is not None
        kept_dup_rows = torch.where(is_dupli)[0][new.dup_kept]
        is_dupli = torch.zeros_like(is_dupli).index_fill_(0, kept_dup_rows, True)
        kept_split_rows = torch.where(is_split)[0][new.split_kept]
        is_split = torch.zeros_like(is_split).index_fill_(0, kept_split_rows, True)
    else:
        new = allocate_child_ids(next_id, ids[is_dupli], ids[is_split], gather)
    if new.dup.numel() > 0:
        rows.grow_(torch.where(is_dupli)[0], new.dup, statistics="parent")  # gsplat's duplicate: copies appended
    if new.split.numel() > 0:
        unit = keyed_normal(seed, step, ids[is_split], 6).reshape(-1, 2, 3).transpose(0, 1)  # [2, n_split, 3]
        is_split = torch.cat([is_split, is_split.new_zeros(len(rows) - num_held)])  # copies are not split
        split_keyed(rows, is_split, unit, new.split, thresholds.revised_opacity)
    is_prune = prune_mask(thresholds, schedule, params, state, step)
    num_pruned = int(is_prune.sum())  # host sync: refine step
    if num_pruned > 0:
        rows.select_(torch.where(~is_prune)[0])  # gsplat's remove
    if log:
        where = (
            "" if new.num_ranks == 1 else f" (duplicated, split: all {new.num_ranks} ranks; pruned, count: this rank)"
        )
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
    if schedule.refine_scale2d_stop_iter > 0:
        state["radii"].zero_()
    next_free = next_id + new.num_dup_total + 2 * new.num_split_total
    return GrowEvent(new.num_dup_total, new.num_split_total, num_pruned, next_free, new.refused, new.num_before)


class DefaultDensifier(Densifier):
    """gsplat 1.4.0 DefaultStrategy's densification (``step_post_backward``'s order: statistics,
    grow and prune on ``grows_at``, opacity reset on ``resets_opacity_at``), with keyed splits and
    global ids (the module docstring).

    Args:
        schedule: When it refines, in optimizer steps (``schedule_in_steps``).
        thresholds: Its rules' knobs.
        seed, next_id, log_events: As ``Densifier``'s.
    """

    help = "gsplat's DefaultStrategy: split, duplicate, prune by screen-space gradients"
    statistics = DEFAULT_STATISTICS

    def __init__(
        self, schedule: StrategySchedule, thresholds: DefaultThresholds, *, seed: int, next_id: int, log_events: bool
    ) -> None:
        super().__init__(seed=seed, next_id=next_id, log_events=log_events)
        self.schedule = schedule
        self.thresholds = thresholds

    @classmethod
    def from_config(
        cls, config: Any, *, batch_size: int, num_train_images: int, seed: int, next_id: int, log_events: bool
    ) -> DefaultDensifier:
        schedule = schedule_in_steps(
            warmup_images=config.warmup_length,
            stop_split_images=config.stop_split_at,
            refine_every_images=config.refine_every,
            reset_alpha_every_refines=config.reset_alpha_every,
            stop_screen_size_images=config.stop_screen_size_at,
            num_train_images=num_train_images,
            batch_size=batch_size,
            pause_rule=config.pause_after_reset,
        )
        return cls(schedule, DefaultThresholds.from_config(config), seed=seed, next_id=next_id, log_events=log_events)

    def initial_state(self) -> dict[str, Any]:
        """gsplat's ``initialize_state``: no ``radii`` when the screen-size rule is off."""
        state = super().initial_state()
        if self.schedule.refine_scale2d_stop_iter <= 0:
            del state["radii"]
        return state

    def needs_statistics(self, step: int) -> bool:
        """While densification runs: the strategy accumulates statistics on every step before the stop."""
        return step < self.schedule.refine_stop_iter

    def changes_shards_at(self, step: int) -> bool:
        return grows_at(self.schedule, step)

    def update_statistics(self, state: dict, info: dict, num_gaussians: int) -> None:
        """``update_batch_statistics`` with this strategy's settings."""
        update_batch_statistics(
            state,
            info,
            num_gaussians,
            absgrad=self.thresholds.absgrad,
            keep_radii=self.schedule.refine_scale2d_stop_iter > 0,
        )

    def grow_and_prune(self, rows: GaussianRows, step: int, gather: IdGather) -> GrowEvent:
        """``grow_and_prune`` on the accumulated statistics under :attr:`caps`; ``next_id``
        advances past the new ids and the refusals are counted (``refused_total``).
        **Collective:** one ``gather``."""
        event = grow_and_prune(
            rows,
            self.thresholds,
            self.schedule,
            step,
            seed=self.seed,
            next_id=self.next_id,
            gather=gather,
            log=self.log_events,
            caps=self.caps,
        )
        self.next_id = event.next_id
        self._record_refused(step, event.refused)
        return event

    def after_optimizer(self, rows: GaussianRows, step: int, info: dict[str, Any] | None, gather: IdGather) -> None:
        """Statistics, then a grow-and-prune event and the opacity reset on their steps.

        **Collective:** one ``gather`` on ``grows_at`` steps. **Host sync:** those steps only.
        """
        if info is None or step >= self.schedule.refine_stop_iter:
            return
        # gsplat's rules build some tensors in the default dtype (the statistics' count, the reset
        # bound): the Gaussians' dtype, as gsplat's strategy run on them would.
        with default_dtype(rows.params["means"].dtype):
            self.update_statistics(rows.state, info, len(rows))
            if grows_at(self.schedule, step):
                self.grow_and_prune(rows, step, gather)
            if resets_opacity_at(self.schedule, step):
                reset_opacities(rows, self.thresholds.prune_opa * 2.0)


def batch_info(
    grads2d: torch.Tensor, absgrads2d: torch.Tensor, radii: torch.Tensor, width: Any, height: Any
) -> dict[str, Any]:
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


def sqrt_batch_scaling(
    lr: float, eps: float, betas: tuple[float, float], batch_size: int
) -> tuple[float, float, tuple[float, float]]:
    """Grendel-GS's "sqrt" rule: lr x sqrt(B), eps / sqrt(B), betas -> beta^B (docs/distributed.md)."""
    s = math.sqrt(batch_size)
    return lr * s, eps / s, (betas[0] ** batch_size, betas[1] ** batch_size)
