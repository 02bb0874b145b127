"""Argument validators shared by the pure layers: one message format for every integer and
non-negative float check, and an option list written as a sentence."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np


def check_int(name: str, value: object, minimum: int) -> int:
    """``value`` as an int; TypeError unless it is an int, ValueError unless it is ``>= minimum``.

    Both errors name ``name``, what was expected and what was given. bool is refused (it is an int
    subclass, but ``True`` passed as a count is a bug at the call site).
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return int(value)


def check_nonnegative_float(name: str, value: object) -> float:
    """``value`` as a float; TypeError unless it is a real number (bool refused, as in
    :func:`check_int`), ValueError unless it is finite and ``>= 0``. Both errors name ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a float, got {type(value).__name__}")
    value = float(value)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name}: expected a finite float >= 0, got {value}")
    return value


def one_of(options: Sequence[str]) -> str:
    """``options`` as an error message lists them: ``"a"``, ``"a or b"``, ``"a, b or c"``."""
    if len(options) < 2:
        return "".join(options)
    return f"{', '.join(options[:-1])} or {options[-1]}"
