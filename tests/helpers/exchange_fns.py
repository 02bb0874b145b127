"""A projection to exchange, and the per-rank function of tests/multiproc/test_exchange_ids.py
(spawned processes pickle it)."""

from __future__ import annotations

import torch

from distsplat_ns.balance.bands import Band
from distsplat_ns.parallel.exchange import exchange_screen_terms
from distsplat_ns.rendering import project

WIDTH, HEIGHT = 64, 96  # px: 6 tile rows

#: Per rank, global ids whose bytes read as special floats: NaN with a payload, signalling NaN,
#: infinity, -0.0 and a denormal in either 32-bit half (float32 payloads) or as a whole (float64).
#: A copy keeps their bits; arithmetic would not. Unique, positive, unsorted.
ODD_IDS = (
    [0x7FC00001_80000000, 0x00000001_7F800001, 5, 0x7F800000_FFC00000, 0x7FF80000_00000001],
    [0x7FF00000_00000001, 0x00000000_7FA00000, 0x7FFFFFFF_FFFFFFFF, 2**53 + 1, 1],
)


def projection_near_row(row_px: float, num: int = 5, dtype: torch.dtype = torch.float32):
    """``num`` small Gaussians projecting around pixel ``(32, row_px)`` (all in one tile row)."""
    gen = torch.Generator().manual_seed(0)
    means = torch.tensor([[0.0, (row_px - HEIGHT / 2) / 50 * 5, 5.0]]) + 0.01 * torch.randn(num, 3, generator=gen)
    return project(
        *(t.to(dtype) for t in (
            means, torch.tensor([[1.0, 0, 0, 0]]).expand(num, 4), torch.full((num, 3), 0.01), torch.full((num,), 0.9),
            torch.rand(num, 3, generator=gen), torch.eye(4)[None],
            torch.tensor([[[50.0, 0, WIDTH / 2], [0, 50.0, HEIGHT / 2], [0, 0, 1]]]),
        )),
        WIDTH, HEIGHT, backend="reference",
    )  # fmt: skip


def exchanged_ids(ctx, dtype_name: str) -> tuple[torch.Tensor, torch.dtype]:
    """This rank's shard of five Gaussians (ids ``ODD_IDS[rank]``), all in tile row 5, exchanged
    for one image cut into tile rows [0, 3) for rank 0 and [3, 6) for rank 1: the ids of the
    rows this rank renders, in the order it renders them, and the received terms' dtype."""
    proj = projection_near_row(88.0, dtype=getattr(torch, dtype_name))
    bands = [[Band(0, 0, 3)], [Band(0, 3, 6)]]
    received = exchange_screen_terms(ctx, [([0], proj)], torch.tensor(ODD_IDS[ctx.rank]), bands, 1)
    return received.ids[received.route.rows_of_position[0]], received.leaf.dtype
