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
    for i in range(40):  # alone: every position of numpy's SIMD body and tail
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


# ---------------------------------------------------------------------- the device generator
_IDS = torch.cat(
    [
        torch.randperm(50_000, generator=torch.Generator().manual_seed(1))[:4000] * 7919,
        torch.tensor([0, 1, (1 << 38) - 1, (1 << 62) + 3]),
    ]
)


@pytest.mark.parametrize("stream", [0, 1, 2, 3])
@pytest.mark.parametrize("seed, step", [(42, 300), (0, 0), (-5, 1 << 40)])
def test_device_bits_equal_numpys_bitwise(seed: int, step: int, stream: int) -> None:
    import numpy as np

    from distsplat_ns.utils.keyed_random import keyed_bits, keyed_bits_device

    want = keyed_bits(seed, step, _IDS, 5, stream=stream).view(np.int64)
    assert np.array_equal(keyed_bits_device(seed, step, _IDS, 5, stream=stream).numpy(), want)


def test_keyed_normal_is_built_from_keyed_bits() -> None:
    import numpy as np

    from distsplat_ns.utils.keyed_random import keyed_bits

    bits = keyed_bits(42, 300, _IDS, 6) >> np.uint64(11)
    u1 = (bits[:, 0::2].astype(np.float64) + 1.0) * 2.0**-53
    u2 = bits[:, 1::2].astype(np.float64) * 2.0**-53
    assert torch.equal(
        keyed_normal(42, 300, _IDS, 3), torch.from_numpy(np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2))
    )


def test_device_uniforms_equal_numpys_bitwise() -> None:
    import numpy as np

    from distsplat_ns.utils.keyed_random import keyed_bits, keyed_uniform_device

    want = (keyed_bits(7, 9, _IDS, 4, stream=2) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    assert torch.equal(keyed_uniform_device(7, 9, _IDS, 4, stream=2), torch.from_numpy(want))


def test_device_normals_equal_numpys_to_the_last_bits() -> None:
    from distsplat_ns.utils.keyed_random import keyed_normal_device

    # Same uniforms (above); numpy's and torch's log/cos differ in the last bit on ~10% of inputs.
    z, want = keyed_normal_device(42, 300, _IDS, 3), keyed_normal(42, 300, _IDS, 3)
    assert torch.allclose(z, want, rtol=4 * 2.0**-52, atol=4 * 2.0**-52)


def test_streams_are_independent() -> None:
    from distsplat_ns.utils.keyed_random import keyed_normal_device

    draws = [keyed_normal_device(42, 300, _IDS, 2, stream=s) for s in range(4)]
    for a in range(4):
        for b in range(a + 1, 4):
            assert not torch.any(draws[a] == draws[b]), (a, b)


def test_a_device_draw_does_not_depend_on_the_batch_it_is_drawn_in() -> None:
    from distsplat_ns.utils.keyed_random import keyed_normal_device

    whole = keyed_normal_device(5, 1200, _IDS, 3, stream=1)
    for i in range(40):  # alone and in short runs: every position of a vectorised body and tail
        assert torch.equal(keyed_normal_device(5, 1200, _IDS[i : i + 1], 3, stream=1), whole[i : i + 1])
        assert torch.equal(keyed_normal_device(5, 1200, _IDS[i : i + 7], 3, stream=1), whole[i : i + 7])
    order = torch.randperm(len(_IDS), generator=torch.Generator().manual_seed(2))
    assert torch.equal(keyed_normal_device(5, 1200, _IDS[order], 3, stream=1), whole[order])


def test_device_draws_never_read_a_value_back() -> None:
    """On the meta device any host read raises: the draw makes none."""
    from distsplat_ns.utils.keyed_random import keyed_normal_device

    assert keyed_normal_device(1, 2, _IDS.to("meta"), 3, stream=1).shape == (len(_IDS), 3)


@pytest.mark.parametrize(
    "kwargs, match", [({"draws": -1}, "draws"), ({"stream": -2}, "stream"), ({"draws": 2.0}, "draws")]
)
def test_device_generator_refuses_bad_arguments(kwargs: dict, match: str) -> None:
    from distsplat_ns.utils.keyed_random import keyed_bits_device

    args = {"seed": 1, "step": 2, "ids": _IDS, "draws": 3} | kwargs
    with pytest.raises(ValueError, match=match):
        keyed_bits_device(**args)
