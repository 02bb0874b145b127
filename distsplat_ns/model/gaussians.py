"""The initial Gaussians: splatfacto's initialisation, from a point cloud or at random.

Shape letters: N Gaussians, K SH bases.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from nerfstudio.models.splatfacto import RGB2SH, SplatfactoModelConfig, num_sh_bases, random_quat_tensor


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


def initial_gaussians(
    config: SplatfactoModelConfig,
    seed_points: tuple[torch.Tensor, torch.Tensor] | None,
    k_nearest: Callable[[torch.Tensor, int], tuple[np.ndarray, np.ndarray]],
) -> torch.nn.ParameterDict:
    """Splatfacto's initial Gaussians (same draws from the global generator, same order).

    Args:
        config: ``random_init``, ``num_random``, ``random_scale`` and ``sh_degree`` are read.
        seed_points: The dataset's point cloud: positions `[N, 3]` float and colours `[N, 3]`
            uint8, or None (random initialisation).
        k_nearest: Distances to and indices of each point's k nearest neighbours
            (splatfacto's ``k_nearest_sklearn``).

    Returns:
        ``means`` `[N, 3]`, ``scales`` (log) `[N, 3]`, ``quats`` `[N, 4]`, ``features_dc`` `[N, 3]`,
        ``features_rest`` `[N, K - 1, 3]` and ``opacities`` (logits) `[N, 1]`, float32.
    """
    if seed_points is not None and not config.random_init:
        means = torch.nn.Parameter(seed_points[0].float())
    else:
        means = torch.nn.Parameter((torch.rand((config.num_random, 3)) - 0.5) * config.random_scale)
    distances, _ = k_nearest(means.data, 3)
    avg_dist = torch.from_numpy(distances).mean(dim=-1, keepdim=True)
    scales = torch.nn.Parameter(torch.log(avg_dist.repeat(1, 3)))
    num_points = means.shape[0]
    quats = torch.nn.Parameter(random_quat_tensor(num_points))
    dim_sh = num_sh_bases(config.sh_degree)
    if seed_points is not None and not config.random_init and seed_points[1].shape[0] > 0:
        shs = torch.zeros((seed_points[1].shape[0], dim_sh, 3), dtype=torch.float32)
        if config.sh_degree > 0:
            shs[:, 0, :3] = RGB2SH(seed_points[1].float() / 255)
        else:
            shs[:, 0, :3] = torch.logit(seed_points[1].float() / 255, eps=1e-10)
        features_dc = torch.nn.Parameter(shs[:, 0, :])
        features_rest = torch.nn.Parameter(shs[:, 1:, :])
    else:
        features_dc = torch.nn.Parameter(torch.rand(num_points, 3))
        features_rest = torch.nn.Parameter(torch.zeros((num_points, dim_sh - 1, 3)))
    opacities = torch.nn.Parameter(torch.logit(0.1 * torch.ones(num_points, 1)))
    return torch.nn.ParameterDict(
        {
            "means": means,
            "scales": scales,
            "quats": quats,
            "features_dc": features_dc,
            "features_rest": features_rest,
            "opacities": opacities,
        }
    )
