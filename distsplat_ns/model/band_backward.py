"""The two-phase backward of band rendering: exact per-pixel gradients across band edges.

A band's loss reads SSIM halo rows that belong to the next band, possibly on another rank. So the
loss sees a detached copy of the rendered pixels (``link_pixels``); ``backward_bands`` takes its
gradient w.r.t. every rendered pixel first, sends the halo rows' part to the band that owns them
(an all-gather through ``exchange``), and only then runs the rasterizer backward from the own rows.
gsplat's absgrad then equals the single-process value (docs/README.md, "Two-phase backward").

Shape letters: h rows a band rendered (own rows plus halo), W pixels per row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

HaloMessage = tuple[int, int, torch.Tensor]
"""(batch position, first image row (px), loss gradient of the rendered rows from there) `[h, W, 3]`."""


@dataclass(frozen=True)
class PixelLink:
    """One band's rendered pixels and the detached copy the loss was computed on.

    Attributes:
        position: The band's batch position.
        first_row_px: First pixel row the band owns.
        end_row_px: One past the last pixel row it owns; rendered rows after it are halo.
        pred: Rendered RGB of the owned rows plus halo, in the rasterizer's graph. `[h, W, 3]`.
        leaf: ``pred`` detached; the loss's gradient w.r.t. it lands in ``leaf.grad``. `[h, W, 3]`.
    """

    position: int
    first_row_px: int
    end_row_px: int
    pred: torch.Tensor
    leaf: torch.Tensor

    @property
    def num_rows_px(self) -> int:
        return self.end_row_px - self.first_row_px


def link_pixels(pred: torch.Tensor, position: int, first_row_px: int, end_row_px: int) -> PixelLink:
    """Phase 1: the detached copy of a band's rendered pixels that its loss is computed on.

    Args:
        pred: Rendered RGB of rows ``[first_row_px, end of halo)``. `[h, W, 3]`.
        position: The band's batch position.
        first_row_px: First pixel row the band owns.
        end_row_px: One past the last pixel row it owns.

    Returns:
        The link; compute the loss on ``link.leaf`` and pass the link to :func:`backward_bands`.
    """
    return PixelLink(position, first_row_px, end_row_px, pred, pred.detach().requires_grad_(True))


def backward_bands(
    loss: torch.Tensor,
    links: Sequence[PixelLink],
    exchange: Callable[[list[HaloMessage]], list[list[HaloMessage]]],
    anchors: Sequence[torch.Tensor] = (),
    last_backward: AbstractContextManager | None = None,
) -> None:
    """Phase 2: backpropagate a rank's band loss with exact per-pixel gradients.

    Args:
        loss: This rank's loss share, computed on the links' leaves (and directly on parameters,
            for the regularisers). 0-d.
        links: Every band this rank rendered, from :func:`link_pixels`.
        exchange: Delivers every rank's list of halo messages to every rank (an all-gather,
            ``parallel/halo_cost_gathers.py:exchange_halo_rows``); each band with halo rows sends one.
        anchors: Tensors whose backward must run on every rank even where this rank's loss does
            not reach them (the sharded exchange's token: its backward is a collective); they
            join phase 2's roots with a zero gradient (an empty anchor is its own).
        last_backward: Entered around phase 2's autograd call (not entered when this rank has
            nothing to backpropagate there): the last accumulation into the parameters' gradients
            of this backward, where the gradient sum may start its buckets
            (``distributed/gradient_sum.py``). Phase 1's ``loss.backward()`` also accumulates
            (the regularisers), so a gradient is not final before phase 2 ends.

    **Collective:** ``exchange`` is called exactly once on every rank, even with no bands.
    **Host sync:** none of its own (the halo rows stay on the device; see ``exchange``'s).
    **Differentiable:** runs autograd; the gradients land in the parameters' ``.grad`` and in the
    projected means' ``.grad``/``.absgrad``.
    """
    if loss.requires_grad:
        loss.backward()
    outgoing: list[HaloMessage] = []
    for link in links:
        own = link.num_rows_px
        if link.leaf.shape[0] > own:  # every band with halo rows sends them: the plan sizes the exchange
            rows = link.leaf.grad[own:] if link.leaf.grad is not None else torch.zeros_like(link.leaf[own:])
            outgoing.append((link.position, link.end_row_px, rows.detach()))
    incoming = exchange(outgoing)
    roots, grads = [], []
    for link in links:
        own = link.num_rows_px
        grad = link.leaf.grad[:own].clone() if link.leaf.grad is not None else torch.zeros_like(link.leaf[:own])
        for messages in incoming:
            for position, start, rows in messages:
                if position != link.position:
                    continue
                lo, hi = max(start, link.first_row_px), min(start + rows.shape[0], link.end_row_px)
                if lo < hi:
                    grad[lo - link.first_row_px : hi - link.first_row_px] += rows[lo - start : hi - start].to(
                        grad.device
                    )
        roots.append(link.pred[:own])
        grads.append(grad)
    for anchor in (a for a in anchors if a.requires_grad):
        roots.append(anchor)
        grads.append(
            anchor if anchor.numel() == 0 else torch.zeros_like(anchor)
        )  # an empty anchor is its own zero: nothing to make
    if roots:
        with last_backward if last_backward is not None else nullcontext():
            torch.autograd.backward(roots, grads)
