"""The two kinds of failure the command line reports without a traceback.

* :class:`UserError` -- bad input: a flag, a file, a path. Raise it with the whole message naming
  the flag or file; it subclasses ``ValueError`` so callers that catch ``ValueError`` still work.
* :class:`RunFailure` -- the run cannot go on for a reason the message explains (a rank that did
  not arrive, a checkpoint that could not be written).

Every other exception is an internal error and keeps its traceback (``trainer/distsplat_trainer.py`` reports both
kinds once, from rank 0, when every rank fails the same way).
"""

from __future__ import annotations


class UserError(ValueError):
    """Bad input named in the message (flag, file or path); reported as the message alone."""


class RunFailure(RuntimeError):
    """The run stopped for an external reason named in the message; reported as the message alone."""
