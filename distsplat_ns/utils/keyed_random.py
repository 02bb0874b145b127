"""Random numbers keyed by (seed, step, id, draw): the same value whichever process draws it.

A counter-based generator (splitmix64, Box-Muller) in numpy, and the same bits in torch int64 on the
ids' device (``*_device``, no host sync); why neither torch's nor numpy's generators serve:
docs/architecture.md, "Keyed random numbers". Shape letters: ``n`` ids, ``D`` draws per id.
"""

from __future__ import annotations

import math

import numpy as np
import torch

_MASK64 = (1 << 64) - 1
_GOLDEN_INT = 0x9E3779B97F4A7C15  # splitmix64's increment (2^64 / golden ratio)
_GOLDEN = np.uint64(_GOLDEN_INT)
_MIX_MULTIPLIERS = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (numpy uint64 arithmetic wraps modulo 2^64, as it needs)."""
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


def _mix_int(x: int) -> int:
    """``_mix`` on one Python int (the per-(seed, step, stream) key, computed without a tensor)."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * _MIX_MULTIPLIERS[0]) & _MASK64
    x = ((x ^ (x >> 27)) * _MIX_MULTIPLIERS[1]) & _MASK64
    return x ^ (x >> 31)


def _base_key(seed: int, step: int, stream: int) -> int:
    """The key every id of (seed, step, stream) is mixed with; stream 0 is ``keyed_normal``'s."""
    base = _mix_int(_mix_int((seed & _MASK64) + _GOLDEN_INT) ^ (step & _MASK64))
    if stream:
        base = _mix_int(base ^ _mix_int((stream * _GOLDEN_INT) & _MASK64))
    return base


def _check_keys(ids: torch.Tensor, draws: int, stream: int) -> None:
    if ids.dim() != 1 or ids.dtype != torch.int64:
        raise ValueError(f"ids must be a 1-D int64 tensor, got shape {tuple(ids.shape)} and {ids.dtype}")
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 0:
        raise ValueError(f"draws must be an int >= 0, got {draws!r}")
    if isinstance(stream, bool) or not isinstance(stream, int) or stream < 0:
        raise ValueError(f"stream must be an int >= 0, got {stream!r}")


def keyed_bits(seed: int, step: int, ids: torch.Tensor, draws: int, *, stream: int = 0) -> np.ndarray:
    """64 random bits per (seed, step, stream, id, draw index): the numpy reference.

    Args:
        seed, step: As ``keyed_normal``'s (any int; taken modulo 2^64).
        ids: Keys. `[n]`, int64.
        draws: Words per id, ``D >= 0``.
        stream: Which use (0: ``keyed_normal``'s split offsets; MCMC uses its own numbers).

    Returns:
        `[n, D]`, uint64. ``keyed_normal(seed, step, ids, D)`` is built from
        ``keyed_bits(seed, step, ids, 2 D) >> 11``.

    **Host sync:** copies ``ids`` to host memory (tests and refine steps only).
    """
    _check_keys(ids, draws, stream)
    keys = ids.detach().cpu().numpy().astype(np.uint64)  # host sync: numpy arithmetic
    per_id = _mix(np.uint64(_base_key(seed, step, stream)) ^ keys)[:, None]  # [n, 1]
    counters = np.arange(1, draws + 1, dtype=np.uint64)[None, :] * _GOLDEN  # [1, D]
    return _mix(per_id + counters)


def _signed(x: int) -> int:
    """A uint64 value as the int64 with the same bits (torch has no usable uint64 arithmetic)."""
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


def _shift_right_logical(x: torch.Tensor, k: int) -> torch.Tensor:
    """``x >> k`` of the uint64 that int64 ``x`` holds: torch's ``>>`` on int64 copies the sign bit in,
    the mask clears those ``k`` top bits."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _mix_device(x: torch.Tensor) -> torch.Tensor:
    """``_mix`` in int64: xor and wrapping add/multiply give the uint64 bits unchanged."""
    x = (x ^ _shift_right_logical(x, 30)) * _signed(_MIX_MULTIPLIERS[0])
    x = (x ^ _shift_right_logical(x, 27)) * _signed(_MIX_MULTIPLIERS[1])
    return x ^ _shift_right_logical(x, 31)


def keyed_bits_device(seed: int, step: int, ids: torch.Tensor, draws: int, *, stream: int = 0) -> torch.Tensor:
    """``keyed_bits`` computed on ``ids``' device, without a host sync.

    Args:
        seed, step, ids, draws, stream: As ``keyed_bits``'.

    Returns:
        The same 64 bits as ``keyed_bits``, held as int64 (two's complement). `[n, D]`, on ``ids``' device.

    **Invariants:** bit for bit ``keyed_bits(...).view(np.int64)`` (tests/unit/test_keyed_random.py),
    on every device whose int64 multiply wraps modulo 2^64 (CPU and CUDA do).
    **Host sync:** none: the per-(seed, step, stream) key is a Python int, the rest is element-wise.
    """
    _check_keys(ids, draws, stream)
    per_id = _mix_device(ids ^ _signed(_base_key(seed, step, stream)))[:, None]  # [n, 1]
    counters = torch.arange(1, draws + 1, dtype=torch.int64, device=ids.device)[None, :] * _signed(
        _GOLDEN_INT
    )  # [1, D]
    return _mix_device(per_id + counters)


def keyed_uniform_device(seed: int, step: int, ids: torch.Tensor, draws: int, *, stream: int = 0) -> torch.Tensor:
    """Uniform samples in [0, 1) with 53 random bits each: ``keyed_bits_device`` >> 11, x 2^-53.

    Returns:
        `[n, D]`, float64 on ``ids``' device, exactly the float of the same 53 bits on every device.
    **Host sync:** none.
    """
    return (
        _shift_right_logical(keyed_bits_device(seed, step, ids, draws, stream=stream), 11).to(torch.float64) * 2.0**-53
    )


def keyed_normal_device(seed: int, step: int, ids: torch.Tensor, draws: int, *, stream: int = 0) -> torch.Tensor:
    """Standard normal samples keyed by (seed, step, stream, id, draw index), on ``ids``' device.

    At ``stream=0`` its uniforms are ``keyed_normal``'s bit for bit, its normals within a few ulp
    (docs/architecture.md, "Keyed random numbers").

    Returns:
        `[n, D]`, float64 on ``ids``' device; row ``i`` the same in any batch, in any order.

    **Host sync:** none.
    """
    bits = _shift_right_logical(keyed_bits_device(seed, step, ids, 2 * draws, stream=stream), 11).to(torch.float64)
    u1 = (bits[:, 0::2] + 1.0) * 2.0**-53  # (0, 1]: the log is finite
    u2 = bits[:, 1::2] * 2.0**-53  # [0, 1)
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)
