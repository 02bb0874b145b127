"""utils/keyed_random.py: draws that depend on (seed, step, id, draw index) only."""

from __future__ import annotations

import pytest
import torch

from distsplat_ns.utils.keyed_random import keyed_normal

N_MOMENTS = 100_000


def test_same_key_gives_the_same_draws() -> None:
    ids = torch.arange(50)
    assert torch.equal(keyed_normal(42, 300, ids, 6), keyed_normal(42, 300, ids, 6))


@pytest.mark.parametrize("change", ["seed", "step", "id"])
def test_every_part_of_the_key_changes_every_draw(change: str) -> None:
    ids = torch.arange(200)
    base = keyed_normal(42, 300, ids, 6)
    other = {
        "seed": lambda: keyed_normal(43, 300, ids, 6),
        "step": lambda: keyed_normal(42, 301, ids, 6),
        "id": lambda: keyed_normal(42, 300, ids + 1000, 6),
    }[change]()
    assert not torch.any(base == other)


def test_draw_indices_are_distinct_streams() -> None:
    z = keyed_normal(42, 300, torch.arange(200), 6)
    for j in range(6):
        for k in range(j + 1, 6):
            assert not torch.any(z[:, j] == z[:, k]), (j, k)


def test_more_draws_extend_fewer() -> None:
    ids = torch.arange(30)
    assert torch.equal(keyed_normal(1, 2, ids, 6)[:, :3], keyed_normal(1, 2, ids, 3))


def test_a_draw_does_not_depend_on_the_batch_it_is_drawn_in() -> None:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randperm(5000, generator=gen)[:1003] * 7919  # sparse, unordered global ids
    whole = keyed_normal(5, 1200, ids, 6)
    for i in range(0, 40):  # alone: every position of numpy's SIMD body and tail
        assert torch.equal(keyed_normal(5, 1200, ids[i : i + 1], 6), whole[i : i + 1])
    for start, length in [(0, 2), (1, 3), (3, 5), (7, 9), (10, 17), (100, 333), (500, 503)]:
        assert torch.equal(keyed_normal(5, 1200, ids[start : start + length], 6), whole[start : start + length])
    order = torch.randperm(len(ids), generator=gen)
    assert torch.equal(keyed_normal(5, 1200, ids[order], 6), whole[order])


def test_moments_are_standard_normal() -> None:
    z = keyed_normal(42, 1000, torch.arange(N_MOMENTS), 2)
    # 5 standard errors: mean SE = 1/sqrt(n), std SE ~ 1/sqrt(2n), correlation SE ~ 1/sqrt(n).
    bound = 5.0 / N_MOMENTS**0.5
    for j in range(2):
        assert abs(z[:, j].mean().item()) < bound
        assert abs(z[:, j].std().item() - 1.0) < bound / 2**0.5
    corr_draws = torch.corrcoef(z.T)[0, 1].item()
    corr_ids = torch.corrcoef(torch.stack([z[:-1, 0], z[1:, 0]]))[0, 1].item()  # neighbouring ids
    assert abs(corr_draws) < bound and abs(corr_ids) < bound
    # Tail mass beyond 3 sigma: p = 0.0027, binomial SE sqrt(p (1 - p) / n); 5 SE.
    p = 0.0026998
    tail = (z[:, 0].abs() > 3.0).double().mean().item()
    assert abs(tail - p) < 5 * (p * (1 - p) / N_MOMENTS) ** 0.5


def test_draws_are_finite_for_extreme_keys() -> None:
    ids = torch.cat([torch.arange(N_MOMENTS), torch.tensor([0, 2**63 - 1, -(2**63), -1])])
    for seed, step in [(0, 0), (-1, -1), (2**64 - 1, 2**70), (42, 7)]:
        assert torch.isfinite(keyed_normal(seed, step, ids, 6)).all()


def test_rejects_non_int64_ids() -> None:
    with pytest.raises(ValueError, match="int64"):
        keyed_normal(0, 0, torch.arange(3, dtype=torch.int32), 6)
