"""How ``ns-train distsplat`` reports a failure: bad input and run failures as their whole message,
once when every rank fails alike; internal errors with their traceback.

Used by ``trainer/distsplat_trainer.py`` around the trainer's entry points (here, beside the collectives it uses to
print once; it does not import torch.distributed itself).
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import threading
from pathlib import Path

from distsplat_ns.distributed.collectives import NonFiniteGradientError, ReplicaDriftError
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.distributed.lifecycle import announce_failure, explain_comm_failure, first_report, stop_watching
from distsplat_ns.utils.errors import RunFailure, UserError
from distsplat_ns.utils.shm import remove_orphan_semaphores

#: Errors reported as their message alone: bad input, and run failures whose message says why.
#: Everything else is an internal error and keeps its traceback.
REPORTED_ERRORS = (
    UserError,
    RunFailure,
    FileNotFoundError,
    NotADirectoryError,
    PermissionError,
    NonFiniteGradientError,
    ReplicaDriftError,
)


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
            # First, before any store call: a rank of this host SIGKILLed (often what this failure
            # is) left its semaphores, and torchrun's SIGTERM may end this rank any moment now.
            remove_orphan_semaphores()
            ctx = getattr(self, "ctx", None)
            if ctx is None:  # the process group was never joined: this rank's own folder, if unused
                remove_unused_run_dir(getattr(self, "base_dir", None) or _own_run_dir(self, args))
                ctx = DistContext()
            elif ctx.is_main:
                remove_unused_run_dir(getattr(self, "base_dir", None))
            many = ctx.is_distributed or os.environ.get("WORLD_SIZE", "1") not in ("", "1")
            explained = (
                explain_comm_failure(ctx, err)
                if isinstance(err, Exception) and not isinstance(err, REPORTED_ERRORS)
                else None
            )
            if isinstance(err, REPORTED_ERRORS):
                message = str(err).strip() or type(err).__name__
            elif explained is not None:
                message = f"rank {ctx.rank}: {explained}"
            else:
                _record_end(self, f"internal error: {type(err).__name__}: {err}"[:500])
                if not isinstance(err, SystemExit):
                    announce_failure(ctx, f"internal error: {type(err).__name__}")
                if many and not isinstance(err, SystemExit):
                    force_exit_after(EXIT_GRACE_S)
                raise
            _record_end(self, f"failed: {message}"[:500])
            announce_failure(ctx, message)
            printed = first_report(ctx, message)
            if many:
                force_exit_after(EXIT_GRACE_S)
            if printed:
                raise SystemExit(f"distsplat error (rank {ctx.rank}): {message}") from err
            raise SystemExit(1) from err

    return wrapper


#: Seconds a failed rank may take from its report to its exit (flushing logs, ending DataLoader
#: workers, destroying the process group) before it is ended with ``os._exit(1)``: a teardown that
#: talks to a lost host must not keep the rank alive (docs/distributed.md, "Faults across hosts"). The bound of a failure is then
#: ``--collective-timeout-s`` (the collective that notices it) + this + the store's
#: ``lifecycle.STORE_REPLY_S`` per report.
EXIT_GRACE_S = 15.0


def force_exit_after(seconds: float) -> None:
    """End this process with status 1 if it is still alive ``seconds`` from now (a daemon timer)."""

    def deadline() -> None:
        sys.stderr.write(
            f"distsplat: rank still exiting {seconds:g} s after its failure was reported: ending it (exit 1)\n"
        )
        sys.stderr.flush()
        os._exit(1)

    timer = threading.Timer(seconds, deadline)
    timer.daemon = True
    timer.start()


def _record_end(trainer, cause: str) -> None:
    """Record the failure in the run's attempt log (rank 0; ``distributed/restart.py``)."""
    attempts = getattr(trainer, "attempts", None)
    if attempts is not None:
        attempts.end(getattr(trainer, "step", None), cause)


def _own_run_dir(trainer, args: tuple) -> Path | None:
    """The run folder ns-train created for this rank's config, when the trainer failed before
    agreeing on one (e.g. in ``init_process_group``): the config is the first argument."""
    config = getattr(trainer, "config", None) or (args[0] if args else None)
    get_base_dir = getattr(config, "get_base_dir", None)
    try:
        return Path(get_base_dir()) if callable(get_base_dir) else None
    except (TypeError, ValueError, AttributeError):
        return None


def remove_unused_run_dir(base_dir: Path | None) -> None:
    """Remove ``base_dir`` when it holds nothing but ``config.yml`` (ns-train writes it before the
    trainer starts): a run that failed before doing anything leaves no empty run folder."""
    if base_dir is not None and base_dir.is_dir() and {p.name for p in base_dir.iterdir()} <= {"config.yml"}:
        shutil.rmtree(base_dir, ignore_errors=True)
