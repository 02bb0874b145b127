"""How ``ns-train distsplat`` reports a failure: bad input and run failures as their whole message,
once when every rank fails alike; internal errors with their traceback.

Used by ``trainer.py`` around the trainer's entry points (here, beside the collectives it uses to
print once; it does not import torch.distributed itself).
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

from distsplat_ns.distributed.collectives import NonFiniteGradientError, ReplicaDriftError
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.distributed.lifecycle import explain_comm_failure, first_report, stop_watching
from distsplat_ns.utils.errors import RunFailure, UserError

#: Errors reported as their message alone: bad input, and run failures whose message says why.
#: Everything else is an internal error and keeps its traceback.
REPORTED_ERRORS = (UserError, RunFailure, FileNotFoundError, NotADirectoryError, PermissionError,
                   NonFiniteGradientError, ReplicaDriftError)


def report_user_errors(method):
    """Report bad input and run failures as their whole message and a non-zero exit.

    When every rank fails with the same message, rank 0 alone prints it; a rank whose message
    differs (or whose rank 0 did not fail) prints its own. A failed collective is reported with
    where each rank was last seen. Whatever the error, a run folder this command created and left
    holding only its ``config.yml`` is removed (rank 0).
    """

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except BaseException as err:
            stop_watching()
            ctx = getattr(self, "ctx", None) or DistContext()
            if ctx.is_main:
                remove_unused_run_dir(getattr(self, "base_dir", None))
            if isinstance(err, REPORTED_ERRORS):
                message = str(err).strip() or type(err).__name__
            elif isinstance(err, Exception) and explain_comm_failure(ctx, err) is not None:
                message = f"rank {ctx.rank}: {explain_comm_failure(ctx, err)}"
            else:
                raise
            if first_report(ctx, message):
                raise SystemExit(f"distsplat error (rank {ctx.rank}): {message}") from err
            raise SystemExit(1) from err

    return wrapper


def remove_unused_run_dir(base_dir: Path | None) -> None:
    """Remove ``base_dir`` when it holds nothing but ``config.yml`` (ns-train writes it before the
    trainer starts): a run that failed before doing anything leaves no empty run folder."""
    if base_dir is not None and base_dir.is_dir() and {p.name for p in base_dir.iterdir()} <= {"config.yml"}:
        shutil.rmtree(base_dir, ignore_errors=True)
