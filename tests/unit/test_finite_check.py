"""The NaN/Inf check on gradients (one process; the multi-process stop is in tests/multiproc)."""

from __future__ import annotations

import pytest
import torch

from distsplat_ns.distributed.collectives import (
    NonFiniteGradientError,
    gradients_finite,
    nonfinite_verdict,
    raise_if_nonfinite,
)


def _params(*grads):
    params = []
    for g in grads:
        p = torch.nn.Parameter(torch.zeros_like(g) if g is not None else torch.zeros(2))
        p.grad = g
        params.append(p)
    return params


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_any_non_finite_element_is_found(bad: float) -> None:
    assert not bool(gradients_finite(_params(torch.ones(5), torch.tensor([1.0, bad, 2.0]), None)))


def test_large_finite_gradients_are_finite() -> None:
    # A sum of these would overflow float32 to inf; the max-abs check must not.
    assert bool(gradients_finite(_params(torch.full((1000,), 3e38), torch.full((3,), -3e38))))


def test_no_gradient_at_all_is_finite() -> None:
    assert bool(gradients_finite(_params(None, None)))


def test_empty_gradients_are_skipped() -> None:
    # A disabled camera optimizer has a 0-element parameter; the inf-norm of it is undefined.
    assert bool(gradients_finite(_params(torch.zeros(0, 6), torch.ones(3))))
    assert not bool(gradients_finite(_params(torch.zeros(0, 6), torch.tensor([float("nan")]))))


def test_verdict_and_error_name_the_step_and_parameter() -> None:
    named = list(zip(["means", "scales"], _params(torch.ones(2), torch.tensor([float("nan")])), strict=True))
    verdict = nonfinite_verdict(named)
    assert verdict.tolist() == [1] and verdict.dtype == torch.int32
    with pytest.raises(NonFiniteGradientError, match=r"step 7 \(parameters scales\)"):
        raise_if_nonfinite(bool(verdict.item()), named, 7)


def test_finite_verdict_is_zero_and_raises_nothing() -> None:
    named = list(zip(["means"], _params(torch.ones(2)), strict=True))
    assert nonfinite_verdict(named).tolist() == [0]
    raise_if_nonfinite(False, named, 3)


def test_a_verdict_from_another_rank_says_so() -> None:
    # The cost gather carried another rank's flag; this rank's gradients are finite.
    named = list(zip(["means"], _params(torch.ones(2)), strict=True))
    with pytest.raises(NonFiniteGradientError, match=r"step 4 \(on another rank\)"):
        raise_if_nonfinite(True, named, 4)
