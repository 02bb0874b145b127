"""Random numbers keyed by (seed, step, id, draw): the same value whichever process draws it.

torch and numpy generators give one stream per generator object: a value depends on how many were
drawn before it, so a Gaussian's split offsets would depend on how many Gaussians the same process
split first, i.e. on the number of processes. Neither offers a vectorised draw keyed per element,
hence this counter-based generator (splitmix64 mixing, Box-Muller), a few lines of numpy.

Shape letters: ``n`` ids, ``D`` draws per id.
"""

from __future__ import annotations

import numpy as np
import torch

_MASK64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # splitmix64's increment (2^64 / golden ratio)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection of uint64 whose outputs look independent for nearby inputs.

    numpy uint64 array arithmetic wraps modulo 2^64 by definition, as the finaliser needs.
    """
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def keyed_normal(seed: int, step: int, ids: torch.Tensor, draws: int) -> torch.Tensor:
    """Standard normal samples, each a function of (seed, step, id, draw index) only.

    Args:
        seed: Run seed (any int; taken modulo 2^64).
        step: Optimizer step (any int; taken modulo 2^64).
        ids: Keys, e.g. global Gaussian ids. `[n]`, int64.
        draws: Samples per id, ``D >= 0``.

    Returns:
        Samples. `[n, D]`, float64 on ``ids``' device; row ``i`` is the same whether ``ids[i]``
        is passed alone or inside any batch, in any order.

    **Invariants:** finite (the log's argument lies in (0, 1]). Bitwise reproducible on one CPU
    type; numpy's libm/SIMD ``log``/``cos`` may differ in the last bit between CPU types.
    **Host sync:** copies ``ids`` to host memory (called on refine steps only).
    """
    if ids.dim() != 1 or ids.dtype != torch.int64:
        raise ValueError(f"ids must be a 1-D int64 tensor, got shape {tuple(ids.shape)} and {ids.dtype}")
    if draws < 0:
        raise ValueError(f"draws must be >= 0, got {draws}")
    keys = ids.detach().cpu().numpy().astype(np.uint64)  # host sync: numpy arithmetic (two's complement wrap)
    base = _mix(np.array([seed & _MASK64], dtype=np.uint64) + _GOLDEN)
    base = _mix(base ^ np.uint64(step & _MASK64))
    per_id = _mix(base ^ keys)[:, None]  # [n, 1]
    counters = np.arange(1, 2 * draws + 1, dtype=np.uint64)[None, :] * _GOLDEN  # [1, 2D], distinct multiples
    bits = _mix(per_id + counters) >> np.uint64(11)  # [n, 2D], 53 random bits each
    scale = 2.0**-53
    u1 = (bits[:, 0::2].astype(np.float64) + 1.0) * scale  # (0, 1]: the log is finite
    u2 = bits[:, 1::2].astype(np.float64) * scale  # [0, 1)
    z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
    return torch.from_numpy(np.ascontiguousarray(z)).to(ids.device)
