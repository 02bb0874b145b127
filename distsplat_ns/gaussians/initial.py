"""The initial Gaussians: splatfacto's initialisation, from a point cloud or at random.

Shape letters: N Gaussians, K SH bases.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from nerfstudio.models.splatfacto import RGB2SH, SplatfactoModelConfig, num_sh_bases, random_quat_tensor

from distsplat_ns.gaussians.ownership import owned_block


def unique_seed_points(seed_points: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The point cloud with each repeated position kept once: its first occurrence, in order.

    Two Gaussians seeded at one position have equal depths, so which one is in front depends on
    the last bits of their positions after a step, and those bits on how the gradient sums were
    split: runs on 1 and on 2 processes then composite the twins in different orders
    (docs/float64_exactness.md). The float64 mode seeds from unique positions.

    Args:
        seed_points: Positions `[N, 3]` float and colours `[N, 3]` uint8 (or `[0, 3]`: none).

    Returns:
        The rows whose position (as float32, the Gaussians' initial means) does not occur in an
        earlier row, in their original order. A pure function of the points: the same on every rank.
    """
    xyz = seed_points[0].float()
    if xyz.shape[0] == 0:
        return seed_points
    keep = first_occurrences(xyz)
    colours = seed_points[1][keep] if seed_points[1].shape[0] == xyz.shape[0] else seed_points[1]
    return seed_points[0][keep], colours


def first_occurrences(rows: torch.Tensor) -> torch.Tensor:
    """Indices of the rows of ``rows`` (``[N, D]``, N >= 1) that equal no earlier row, ascending."""
    _, inverse = torch.unique(rows, dim=0, return_inverse=True)
    first = torch.full((int(inverse.max()) + 1,), rows.shape[0], dtype=torch.int64)
    first.scatter_reduce_(0, inverse, torch.arange(rows.shape[0]), reduce="amin")
    return torch.sort(first).values


class InitialGaussians(NamedTuple):
    """What :func:`initial_gaussians` drew: the rows of ids ``first_id ..`` of ``num_total``."""

    params: torch.nn.ParameterDict
    first_id: int
    num_total: int


def initial_gaussians(
    config: SplatfactoModelConfig,
    seed_points: tuple[torch.Tensor, torch.Tensor] | None,
    shard: tuple[int, int] | None = None,
) -> InitialGaussians:
    """Splatfacto's initial Gaussians (same draws from the global generator, same order), or the
    ``owned_block`` of them that a sharded rank holds.

    A sharded rank draws every position (``N x 3`` floats: the neighbour distances need them all)
    and the small random streams whole, so the generator ends where one process's does, but builds
    the parameters, and queries the nearest neighbours, for its block only: the start-up's per-rank
    peak is about N x 76 B + N/W x 277 B rather than N x 328 B at SH degree 3 (measured:
    docs/sharded.md, "Start-up").

    Args:
        config: ``random_init``, ``num_random``, ``random_scale`` and ``sh_degree`` are read.
        seed_points: The dataset's point cloud: positions `[N, 3]` float and colours `[N, 3]`
            uint8, or None (random initialisation).
        shard: ``(rank, world)`` to keep rank's block of ``world``; None keeps all.

    Returns:
        ``means`` `[M, 3]`, ``scales`` (log) `[M, 3]`, ``quats`` `[M, 4]`, ``features_dc`` `[M, 3]`,
        ``features_rest`` `[M, K - 1, 3]` and ``opacities`` (logits) `[M, 1]`, float32, for the
        block's M Gaussians, with its first id and N.
    """
    from_points = seed_points is not None and not config.random_init
    if from_points:
        all_means = seed_points[0].float()
    else:
        all_means = (torch.rand((config.num_random, 3)) - 0.5) * config.random_scale
    num_total = int(all_means.shape[0])
    lo, hi = (0, num_total) if shard is None else owned_block(num_total, *shard)
    block = slice(lo, hi)
    means = torch.nn.Parameter(all_means[block].clone())
    distances = neighbour_distances(all_means, lo, hi, 3)
    del all_means
    avg_dist = torch.from_numpy(distances).mean(dim=-1, keepdim=True)
    scales = torch.nn.Parameter(torch.log(avg_dist.repeat(1, 3)))
    quats = torch.nn.Parameter(random_quat_tensor(num_total)[block].clone())
    num_points = hi - lo
    dim_sh = num_sh_bases(config.sh_degree)
    if from_points and seed_points[1].shape[0] > 0:
        colours = seed_points[1][block].float() / 255
        features_dc = torch.nn.Parameter(RGB2SH(colours) if config.sh_degree > 0 else torch.logit(colours, eps=1e-10))
    else:
        features_dc = torch.nn.Parameter(torch.rand(num_total, 3)[block].clone())
    features_rest = torch.nn.Parameter(torch.zeros((num_points, dim_sh - 1, 3)))
    opacities = torch.nn.Parameter(torch.logit(0.1 * torch.ones(num_points, 1)))
    params = torch.nn.ParameterDict(
        {
            "means": means,
            "scales": scales,
            "quats": quats,
            "features_dc": features_dc,
            "features_rest": features_rest,
            "opacities": opacities,
        }
    )
    return InitialGaussians(params, lo, num_total)


def neighbour_distances(points: torch.Tensor, lo: int, hi: int, k: int) -> np.ndarray:
    """Distances from points ``lo .. hi - 1`` to their ``k`` nearest other points of ``points``
    (``[N, 3]``), nearest first: rows ``lo .. hi - 1`` of splatfacto's ``k_nearest_sklearn``. `[hi - lo, k]`, float32.

    The same scikit-learn search, fitted on every point but asked only for the block: a KD-tree
    query answers each point alone, so a block's rows equal the whole query's
    (``tests/unit/test_initial_gaussians.py``).
    """
    from sklearn.neighbors import NearestNeighbors

    if hi == lo:  # an empty block (fewer Gaussians than ranks): scikit-learn refuses no queries
        return np.zeros((0, k), dtype=np.float32)
    points_np = points.cpu().numpy()
    search = NearestNeighbors(n_neighbors=k + 1, algorithm="auto", metric="euclidean").fit(points_np)
    distances, _ = search.kneighbors(points_np[lo:hi])
    return distances[:, 1:].astype(np.float32)
