"""The reference rasterizer's find phase groups its per-block pair lists into chunks
(``rendering/reference.py:_group_pairs``): the same pairs in the same order, and each block released
once copied, so the pairs are held once plus one chunk (counted by the device stand-in's allocator,
tests/helpers/device_memory.py)."""

from __future__ import annotations

import gc

import pytest
import torch

from distsplat_ns.rendering.reference import _group_pairs, _PairChunk
from tests.helpers import device_memory
from tests.helpers.device_standin import installed

FIELDS = ("gauss", "pix", "px", "py")


def _parts(sizes: list[int], device: str = "cpu") -> list[_PairChunk]:
    gen = torch.Generator().manual_seed(0)
    parts = []
    for n in sizes:
        ids = torch.randint(0, 1000, (2, n), generator=gen)
        xy = torch.rand(2, n, generator=gen)
        parts.append(
            _PairChunk(
                ids[0].clone().to(device), ids[1].clone().to(device), xy[0].clone().to(device), xy[1].clone().to(device)
            )
        )
    return parts


@pytest.mark.parametrize("max_pairs", [1, 7, 10, 25, 1000])
def test_groups_keep_every_pair_in_order_and_empty_the_input(max_pairs: int) -> None:
    sizes = [5, 10, 3, 0, 12, 7]
    parts = _parts(sizes)
    whole = {k: torch.cat([getattr(p, k) for p in parts]) for k in FIELDS}
    chunks = _group_pairs(parts, max_pairs)
    assert parts == []
    for k in FIELDS:
        assert torch.equal(torch.cat([getattr(c, k) for c in chunks]), whole[k]), k
    # Whole blocks per chunk: a chunk passes max_pairs only when it is one block.
    for chunk in chunks:
        n = chunk.gauss.numel()
        assert n <= max_pairs or n in sizes, (n, max_pairs)


def test_the_pairs_are_held_once_plus_one_chunk() -> None:
    # 8 blocks of 1,000 pairs (24 B each: two int64, two float32), chunks of 2 blocks: the pairs
    # (192,000 B) plus one chunk (48,000 B) at most; holding every block and every chunk was 2x.
    with installed():
        parts = _parts([1000] * 8, "cuda:5")
        gc.collect()
        total = 8 * 1000 * 24
        before = torch.cuda.memory_allocated(5)
        torch.cuda.reset_peak_memory_stats(5)
        chunks = _group_pairs(parts, 2000)
        peak = torch.cuda.max_memory_allocated(5) - before + total
        assert len(chunks) == 4
        assert peak == total + total // 4, peak
        assert device_memory.memory_allocated(5) - before == 0  # the chunks replaced the blocks
        del chunks
