"""Agreement on the run's lifecycle: named start-up phases, stop requests, rank-0 outcomes, errors.

The collectives that keep every rank doing the same thing at the edges of training:
:func:`startup_phase` (a named barrier: a rank that does not finish is named), :func:`any_rank_true`
(the per-step stop flag), :func:`agree_outcome` (every rank learns whether rank 0's own action
worked), :func:`first_report` (a failure printed once) and :func:`rank0_work`. The phase and error
keys travel through the process group's key-value store, not collectives, so they work while a rank
is stuck (docs/distributed.md, "Faults").
"""

from __future__ import annotations

import datetime
import functools
import os
import re
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import torch
import torch.distributed as dist

from distsplat_ns.distributed.context import DistContext
from distsplat_ns.distributed.interfaces import route_source_address
from distsplat_ns.distributed.rank0_work import rank0_work, wait_for_rank0_frame
from distsplat_ns.distributed.store_access import KEY_PREFIX, StoreUnreachable, bounded, default_store
from distsplat_ns.distributed.torch_compat import DIST_ERRORS, is_dist_error, store_has_key, store_set, store_set_first
from distsplat_ns.utils.errors import RunFailure
from distsplat_ns.utils.logging import get_logger
from distsplat_ns.utils.thread_stack import thread_stack

LOGGER = get_logger(__name__)

T = TypeVar("T")

_control_groups: dict = {}


def _control_group(ctx: DistContext) -> dist.ProcessGroup | None:
    """A gloo group for host-side flags: the default group under gloo, a gloo twin under NCCL (so
    the per-step stop flag never synchronises the GPU). Created on first use, which every rank
    reaches at the same step."""
    if ctx.backend != "nccl":
        return None
    if "gloo" not in _control_groups:
        _control_groups["gloo"] = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=ctx.timeout_s))
    return _control_groups["gloo"]


def any_rank_true(ctx: DistContext, flag: bool) -> bool:
    """True on every rank when ``flag`` is True on at least one rank.

    **Collective:** world group (gloo on host memory); every rank calls it at the same step. At
    ``world_size == 1`` it returns ``flag``. Rank 0 passing False and rank 1 True: both get True.

    **Host sync:** none on the GPU -- a one-element CPU tensor over gloo. Cost measured by
    ``benchmarks/bench_stop_flag.py`` (figure in the README).
    """
    if not ctx.is_distributed:
        return flag
    value = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=_control_group(ctx))
    return bool(value.item())  # host sync: CPU tensor, nothing on the device waits


def agree_outcome(ctx: DistContext, what: str, fn: Callable[[], T]) -> T | None:
    """Run ``fn`` on rank 0 only and tell every rank whether it worked.

    Args:
        what: What ``fn`` does, for the message ("writing checkpoint step-000000010.ckpt").
        fn: Called on rank 0; an ``OSError`` (full or read-only disk, permissions) is a failure
            of the run, anything else an internal error.

    Returns:
        ``fn()``'s value on rank 0, None elsewhere.

    Raises:
        RunFailure: on every rank, with rank 0's reason, when ``fn`` raised ``OSError``.
        RuntimeError: on the other ranks when ``fn`` raised anything else (rank 0 re-raises it
            with its traceback).

    **Collective:** world group (one broadcast); it replaces a barrier after rank-0-only work, so
    the other ranks never see a broken collective when rank 0 fails. At ``world_size == 1`` it
    just calls ``fn``.
    """
    result: T | None = None
    failure: BaseException | None = None
    outcome = "ok"
    if ctx.is_main:
        try:
            with rank0_work(ctx, what, failure_told_later=True):
                result = fn()
        except OSError as err:
            failure = err
            reason = f"{err.strerror} ({err.filename})" if err.strerror and err.filename else (err.strerror or str(err))
            outcome = f"{what} failed: {reason}"
        except Exception as err:  # noqa: BLE001 -- told to the other ranks, then re-raised as is
            failure = err
            outcome = f"internal error on rank 0 while {what}"
    else:
        with rank0_work(ctx, what, failure_told_later=True):
            pass
    if ctx.is_distributed:
        outcome = _broadcast_text(ctx, outcome)
    if outcome == "ok":
        return result
    if failure is not None and not isinstance(failure, OSError):
        raise failure
    if failure is None and outcome.startswith("internal error"):
        raise RuntimeError(f"{outcome}: see rank 0's traceback")
    raise RunFailure(outcome) from failure


def _broadcast_text(ctx: DistContext, text: str) -> str:
    holder = [text if ctx.is_main else None]
    dist.broadcast_object_list(holder, src=0, group=_control_group(ctx))
    return str(holder[0])


def enter_phase(ctx: DistContext, name: str, timeout_s: float | None = None, watch: bool = True) -> None:
    """Record that this rank entered start-up phase ``name`` (read by error reports).

    With ``watch``, a rank that stays in the phase for half of ``timeout_s`` (default: the
    collective timeout) outside any collective names itself (:class:`_PhaseWatch`): one line and
    its main thread's stack on stderr, and "outside any collective" in its store record, so the
    rank that gives up waiting for it reports which rank it waited for.

    **Collective:** none (one store write); no-op at ``world_size == 1``.
    """
    store = default_store() if ctx.is_distributed else None
    if store is not None:
        if ctx.rank not in _HOSTS_TOLD:
            _HOSTS_TOLD.add(ctx.rank)
            store_set(store, f"{KEY_PREFIX}host/{ctx.rank}", _this_host())
            _ABORT_WATCH.start(ctx, store)
        store_set(store, f"{KEY_PREFIX}where/{ctx.rank}", f"in '{name}'")
        if watch:
            _WATCH.enter(ctx, store, name, (ctx.timeout_s if timeout_s is None else timeout_s) / 2)
        else:
            _WATCH.stop()


def finish_phase(ctx: DistContext, name: str, timeout_s: float | None = None) -> None:
    """Wait until every rank has finished start-up phase ``name``.

    Raises:
        RunFailure: on every waiting rank when a rank has not finished within ``timeout_s``
            (default: the collective timeout), naming the phase, the missing ranks and where each
            rank was last seen.

    **Collective:** through the store; every rank finishes the same phases in the same order.
    No-op at ``world_size == 1``. Rank 1 sleeping in phase "model ready" past the timeout: rank 0
    raises "start-up phase 'model ready': rank(s) [1] did not finish within 5 s ...".
    """
    store = default_store() if ctx.is_distributed else None
    if store is None:
        return
    timeout_s = ctx.timeout_s if timeout_s is None else timeout_s
    _WATCH.stop()
    store_set(store, f"{KEY_PREFIX}done/{name}/{ctx.rank}", "1")
    store_set(store, f"{KEY_PREFIX}where/{ctx.rank}", f"done with '{name}'")
    keys = [f"{KEY_PREFIX}done/{name}/{r}" for r in range(ctx.world_size)]
    try:
        store.wait(keys, datetime.timedelta(seconds=timeout_s))
    except RuntimeError as err:  # DistStoreError: the wait timed out
        try:
            missing = bounded(lambda: [r for r, key in enumerate(keys) if not store_has_key(store, key)])
        except StoreUnreachable as lost:
            raise RunFailure(f"start-up phase '{name}' on rank {ctx.rank}: {lost}") from err
        if not missing:  # arrived between the timeout and the check
            return
        raise RunFailure(
            f"start-up phase '{name}': rank(s) {missing} did not finish within {timeout_s:g} s (--collective-timeout-s); {_whereabouts(ctx, store)}"
        ) from err


@contextmanager
def startup_phase(ctx: DistContext, name: str, timeout_s: float | None = None) -> Iterator[None]:
    """Run the block as start-up phase ``name`` (:func:`enter_phase`, then :func:`finish_phase`).

    A collective that fails inside the block (a rank stuck before it, a dead rank) is re-raised as
    :class:`RunFailure` naming the phase and where each rank was last seen.

    **Collective:** as :func:`finish_phase`.
    """
    enter_phase(ctx, name, timeout_s)
    try:
        yield
    except RuntimeError as err:
        where = explain_comm_failure(ctx, err)
        if where is None:
            raise
        raise RunFailure(f"start-up phase '{name}' on rank {ctx.rank}: {where}") from err
    finish_phase(ctx, name, timeout_s)


class _PhaseWatch:
    """One daemon thread per rank: while a watched start-up phase lasts longer than its threshold
    and the main thread is outside any collective (no frame of ``torch.distributed`` or of
    :func:`finish_phase` on its stack), this rank is the one the others wait for. It says so once
    per phase: on stderr with its main thread's stack, and in its store record (the thread's store
    write is serialised with the main thread's by the store client)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phase: tuple | None = None  # (ctx, store, name, threshold_s, entered_at)
        self._thread: threading.Thread | None = None

    def enter(self, ctx: DistContext, store: dist.Store, name: str, threshold_s: float) -> None:
        with self._lock:
            self._phase = (ctx, store, name, threshold_s, time.monotonic())
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, args=(threading.main_thread().ident,), name="distsplat-phase-watch", daemon=True
                )
                self._thread.start()

    def stop(self) -> None:
        """Watch nothing more (the run is ending: its stack no longer says where a phase is)."""
        with self._lock:
            self._phase = None

    def _run(self, main_ident: int) -> None:
        reported: tuple | None = None
        while True:
            time.sleep(0.2)
            with self._lock:
                phase = self._phase
            if phase is None or phase is reported or time.monotonic() - phase[4] < phase[3]:
                continue
            stack = _main_stack_outside_collectives(main_ident)
            if stack is None:
                continue
            reported = phase
            ctx, store, name, _, entered_at = phase
            where = stack[-1]
            note = (
                f"in '{name}', outside any collective for {time.monotonic() - entered_at:.0f} s "
                f"(at {os.path.basename(where.filename)}:{where.lineno} {where.name})"
            )
            sys.stderr.write(
                f"distsplat: rank {ctx.rank} is {note}: the other ranks are waiting for it "
                f"(they give up after --collective-timeout-s {ctx.timeout_s:g}). Its main thread:\n"
                + "".join(traceback.format_list(stack[-12:]))
            )
            sys.stderr.flush()
            try:
                bounded(functools.partial(store_set, store, f"{KEY_PREFIX}where/{ctx.rank}", note))
            except DIST_ERRORS:  # the store's host is gone: stderr has it
                pass


_WATCH = _PhaseWatch()

#: Seconds a rank lets its own failure path run after another rank announced a failure (or after
#: it lost the store past the collective timeout) before its abort watch ends it: enough for a
#: rank blocked in a collective to fail and report itself, which it does within the timeout.
ABORT_GRACE_S = 20.0
_ABORT_KEY = f"{KEY_PREFIX}abort"


class _AbortWatch:
    """One daemon thread per rank, from its first phase to the end of the run: a rank that never
    reaches a collective again (stuck in a loop, a hung file system, a deadlock) on a host whose
    torchrun sees nothing wrong would otherwise run for ever after the others failed. Every
    2 s it checks the store for :func:`announce_failure`'s key; once that key has been there for
    :data:`ABORT_GRACE_S`, or the store has been unreachable for ``--collective-timeout-s`` plus
    that grace, it prints one line and ends the process (``os._exit(1)``)."""

    def __init__(self) -> None:
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, ctx: DistContext, store: dist.Store) -> None:
        if self._thread is None:
            self._stopped.clear()
            self._thread = threading.Thread(
                target=self._run, args=(ctx, store), name="distsplat-abort-watch", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self, ctx: DistContext, store: dist.Store) -> None:
        seen_at: float | None = None
        lost_at: float | None = None
        message = ""
        while not self._stopped.wait(2.0):
            if not dist.is_initialized():
                return  # the run ended (shutdown_distributed): its store may go away now
            now = time.monotonic()
            try:
                # A late reply counts as lost here (lost_at) without marking the store lost for the rank's other calls.
                if seen_at is None and bounded(lambda: store_has_key(store, _ABORT_KEY), remember_loss=False):
                    seen_at, message = now, bounded(lambda: store.get(_ABORT_KEY), remember_loss=False).decode()
                lost_at = None
            except DIST_ERRORS as err:
                if lost_at is None:
                    lost_at, message = now, comm_error_summary(err)
            if self._stopped.is_set():
                return
            if seen_at is not None and now - seen_at > ABORT_GRACE_S:
                self._end(ctx, f"another rank failed ({message}) and this rank did not stop within {ABORT_GRACE_S:g} s")
            if lost_at is not None and now - lost_at > ctx.timeout_s + ABORT_GRACE_S:
                self._end(
                    ctx,
                    f"{message}, for {now - lost_at:.0f} s (--collective-timeout-s {ctx.timeout_s:g} + {ABORT_GRACE_S:g} s)",
                )

    @staticmethod
    def _end(ctx: DistContext, why: str) -> None:
        sys.stderr.write(f"distsplat error (rank {ctx.rank}): ending this rank: {why}\n")
        sys.stderr.flush()
        os._exit(1)


_ABORT_WATCH = _AbortWatch()


def announce_failure(ctx: DistContext, message: str) -> None:
    """Tell every rank's abort watch that this rank failed (bounded store write; a lost store is
    found by the watches themselves)."""
    store = default_store() if ctx.is_distributed else None
    if store is None:
        return
    try:
        told = message if message.startswith(f"rank {ctx.rank}:") else f"rank {ctx.rank}: {message}"
        bounded(lambda: store_set_first(store, _ABORT_KEY, told[:400]))
    except DIST_ERRORS:
        pass


def stop_watching() -> None:
    """End this rank's phase watch (:func:`enter_phase`): called when the run fails or ends."""
    _WATCH.stop()


def _main_stack_outside_collectives(main_ident: int) -> traceback.StackSummary | None:
    """The main thread's stack when it is not waiting on other ranks (inside ``torch.distributed``
    or in :func:`finish_phase`'s barrier or :func:`rank0_work`'s wait), else None. Read through
    ``utils/thread_stack.py``: no frame object of the running main thread is touched."""
    stack = thread_stack(main_ident)
    if stack is None:
        return None
    waiting = ((__file__, "finish_phase"), wait_for_rank0_frame())
    for frame in stack:
        if f"{os.sep}torch{os.sep}distributed{os.sep}" in frame.filename or (frame.filename, frame.name) in waiting:
            return None  # waiting for other ranks, as in a collective
    return stack


def is_comm_failure(err: BaseException) -> bool:
    """Whether ``err`` is a failed or timed-out collective (gloo raises plain RuntimeErrors; an
    async one's ``wait()`` past the timeout says "Application timeout caused pair closure")."""
    if is_dist_error(err):
        return True
    text = str(err)
    markers = ("gloo", "Timed out", "timed out", "Connection closed by peer", "Application timeout caused pair closure")
    return isinstance(err, RuntimeError) and any(s in text for s in markers)


def explain_comm_failure(ctx: DistContext, err: BaseException) -> str | None:
    """One line for a failed collective: its first line and where every rank was last seen; None
    when ``err`` is not a communication failure."""
    if not ctx.is_distributed or not is_comm_failure(err):
        return None
    first = comm_error_summary(err)
    store = default_store()
    where = ""
    if store is not None:
        try:
            where = "; " + bounded(lambda: _whereabouts(ctx, store))
        except StoreUnreachable as lost:
            where = f"; {lost}"
        except DIST_ERRORS:
            where = ""
    return f"a collective failed ({first}){where} (--collective-timeout-s {ctx.timeout_s:g})"


_GLOO_SOURCE = re.compile(r"^\[[^\]]*\.(cc|cpp|h):\d+\]\s*")
_GLOO_HINT = re.compile(r"\s*This is typically caused by.*$")


def comm_error_summary(err: BaseException) -> str:
    """A failed collective's first line without gloo's source location and generic advice:
    "Read error [10.77.0.1]:41234: Connection reset by peer" (the peer's address kept)."""
    text = str(err).strip()
    first = text.splitlines()[0] if text else type(err).__name__
    return _GLOO_HINT.sub("", _GLOO_SOURCE.sub("", first)).rstrip(". ") or type(err).__name__


_HOSTS_TOLD: set = set()


def _this_host() -> str:
    """This rank's host for messages: the address its traffic to the store leaves from."""
    master = os.environ.get("MASTER_ADDR")
    address = route_source_address(master, int(os.environ.get("MASTER_PORT", "29500") or 29500)) if master else None
    return address or socket.gethostname()


def _whereabouts(ctx: DistContext, store: dist.Store) -> str:
    """Where every rank was last seen, and on which host (store reads: call it through :func:`bounded`)."""
    parts = []
    for r in range(ctx.world_size):
        key, host_key = f"{KEY_PREFIX}where/{r}", f"{KEY_PREFIX}host/{r}"
        host = f" (on {store.get(host_key).decode()})" if store_has_key(store, host_key) else ""
        parts.append(f"rank {r} {store.get(key).decode() if store_has_key(store, key) else 'not started'}{host}")
    return "last seen: " + ", ".join(parts)


def first_report(ctx: DistContext, message: str, wait_s: float = 3.0) -> bool:
    """Whether this rank should print ``message``: rank 0 always; another rank only when rank 0
    did not report the same message within ``wait_s`` seconds. So a failure every rank shares is
    printed once, and one only some ranks hit is still printed by them.

    **Collective:** through the store, never blocking longer than ``wait_s``; safe to call while
    other ranks are stuck or gone. Always True at ``world_size == 1`` or without a store.
    """
    store = default_store() if ctx.is_distributed else None
    if store is None:
        return True
    key = f"{KEY_PREFIX}error/0"
    try:
        if ctx.is_main:
            bounded(lambda: store_set(store, key, message))
            return True
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if bounded(lambda: store_has_key(store, key)):
                return bounded(lambda: store.get(key)).decode() != message
            time.sleep(0.05)
    except DIST_ERRORS:  # the store lived in a launcher or host that is gone
        pass
    return True
