"""Sizes written for people: the one byte formatter of log lines and error messages."""

from __future__ import annotations


def format_bytes(num_bytes: float) -> str:
    """``num_bytes`` in the largest binary unit below it, two decimals (``'1.50 GiB'``, ``'104.86 KiB'``; bytes whole)."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024.0 or unit == "TiB":
            return f"{value:.2f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024.0
    raise AssertionError("unreachable")
