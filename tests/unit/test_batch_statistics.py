"""``parallel/mode.py:batch_statistics``: a rank's projection calls assembled into batch-shaped
densification statistics, by stacking views where each position is projected once, by indexed
sums where one is projected twice. Both must equal the statistics written out position by position."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from distsplat_ns.parallel.mode import batch_statistics

N = 5


def _model() -> SimpleNamespace:
    return SimpleNamespace(num_points=N, means=torch.zeros(N, 3), compute_dtype=torch.float32)


def _call(positions: list[int], seed: int, *, grad: bool = True, absgrad: bool = True):
    gen = torch.Generator().manual_seed(seed)
    means2d = torch.zeros(len(positions), N, 2, requires_grad=True)
    if grad:
        means2d.grad = torch.randn(len(positions), N, 2, generator=gen)
    if absgrad:
        means2d.absgrad = torch.rand(len(positions), N, 2, generator=gen)
    radii = torch.randint(0, 9, (len(positions), N), generator=gen, dtype=torch.int32)
    return positions, means2d, radii


def _expected(calls, batch_size: int):
    grads = torch.zeros(batch_size, N, 2)
    absgrads = torch.zeros(batch_size, N, 2)
    radii = torch.zeros(batch_size, N, dtype=torch.int32)
    for positions, means2d, proj_radii in calls:
        for j, p in enumerate(positions):
            if means2d.grad is not None:
                grads[p] += means2d.grad[j]
            if getattr(means2d, "absgrad", None) is not None:
                absgrads[p] += means2d.absgrad[j]
            radii[p] = torch.maximum(radii[p], proj_radii[j])
    return grads, absgrads, radii


def _assert_equal(got, want) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert torch.equal(g, w)  # a copy or a sum with zeros: exact


def test_disjoint_calls_with_missing_positions_stack_into_batch_order() -> None:
    # Position 1 projected by no call (no band of that image on this rank), calls out of order,
    # one call without an absgrad (absgrad off for it).
    calls = [_call([3, 2], 1), _call([0], 2, absgrad=False)]
    _assert_equal(batch_statistics(_model(), calls, 4), _expected(calls, 4))


def test_a_call_without_gradient_gives_zeros_at_its_positions() -> None:
    calls = [_call([0], 3, grad=False, absgrad=False), _call([1], 4)]
    got = batch_statistics(_model(), calls, 2)
    _assert_equal(got, _expected(calls, 2))
    assert not got[0][0].any() and got[2][0].any()


def test_a_position_projected_twice_sums_gradients_and_keeps_the_larger_radius() -> None:
    calls = [_call([0, 1], 5), _call([1], 6)]
    _assert_equal(batch_statistics(_model(), calls, 2), _expected(calls, 2))


def test_one_call_over_the_whole_batch_is_returned_as_is() -> None:
    calls = [_call([0, 1, 2], 7)]
    _assert_equal(batch_statistics(_model(), calls, 3), _expected(calls, 3))
