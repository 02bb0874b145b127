"""Rank-aware logging.

Every message is prefixed with the process's global rank so interleaved output from several
processes stays readable. The rank is read lazily from the environment (torchrun sets ``RANK``)
or set explicitly by ``dist.context`` once the process group exists; nothing is read at import.
"""

from __future__ import annotations

import logging
import os

_LOGGER_ROOT = "distsplat_ns"
_rank: int | None = None


def set_log_rank(rank: int) -> None:
    """Record this process's global rank for log prefixes (called by ``dist.context``)."""
    global _rank
    _rank = rank


def current_rank() -> int:
    """The global rank used for log prefixes: explicit, else ``$RANK``, else 0."""
    if _rank is not None:
        return _rank
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


class _RankFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = current_rank()
        return True


def _configure_package_logger() -> logging.Logger:
    logger = logging.getLogger(_LOGGER_ROOT)
    if not getattr(logger, "_distsplat_configured", False):
        handler = logging.StreamHandler()
        handler.addFilter(_RankFilter())
        handler.setFormatter(logging.Formatter("[distsplat rank %(rank)s] %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        # Our own handler: do not also print through the root logger (STYLE: leave root alone).
        logger.propagate = False
        logger._distsplat_configured = True  # type: ignore[attr-defined]
    return logger


def get_logger(name: str) -> logging.Logger:
    """A logger under the package's rank-prefixed handler."""
    _configure_package_logger()
    if not name.startswith(_LOGGER_ROOT):
        name = f"{_LOGGER_ROOT}.{name}"
    return logging.getLogger(name)


def log_rank0(logger: logging.Logger, msg: str, *args: object, level: int = logging.INFO) -> None:
    """Log ``msg`` on global rank 0 only."""
    if current_rank() == 0:
        logger.log(level, msg, *args)
