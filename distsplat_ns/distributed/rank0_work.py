"""Rank 0's own work, waited for by the other ranks outside any collective (docs/distributed.md, "Faults").

Evaluation, checkpoint writing and the viewer run on rank 0 alone; the other ranks would wait in
their next collective, whose ``--collective-timeout-s`` that work would use up. :func:`rank0_work`
makes them wait in the store instead, under a bound of its own, while rank 0 proves it is alive.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch.distributed as dist

from distsplat_ns.distributed.context import DistContext
from distsplat_ns.distributed.store_access import (
    KEY_PREFIX,
    STORE_REPLY_S,
    StoreUnreachable,
    bounded,
    default_store,
    store_address,
)
from distsplat_ns.distributed.torch_compat import DIST_ERRORS, store_has_key, store_set
from distsplat_ns.utils.errors import RunFailure

#: Seconds between two heartbeats of rank 0 while it works alone (:func:`rank0_work`).
HEARTBEAT_S = 1.0


@contextmanager
def rank0_work(ctx: DistContext, what: str, active: bool = True, failure_told_later: bool = False) -> Iterator[None]:
    """The block is rank 0's own work (``what``, unique per call: "evaluation after step 40"); the
    other ranks wait here until rank 0 has finished it, however long it takes, up to
    ``ctx.rank0_work_timeout_s`` -- instead of waiting in their next collective, whose timeout it
    would exhaust (docs/distributed.md, "Faults": a 41 s evaluation failed a run at ``--collective-timeout-s 20``).

    Rank 0 writes a heartbeat to the store every :data:`HEARTBEAT_S` while it works; a waiting rank
    that sees none for ``ctx.timeout_s`` (rank 0 dead, its host lost) or cannot reach the store
    fails, naming rank 0 and the store's address. A rank stuck anywhere else is still found by the
    collective timeout: the others' collectives keep it.

    Raises:
        RunFailure: on a waiting rank, as above, or when rank 0's block raised (rank 0 reports why)
            unless ``failure_told_later`` (the caller's next collective tells the others why:
            :func:`agree_outcome`).

    **Collective:** through the store; every rank enters the same windows (``active`` from values
    every rank has) in the same order. No-op at ``world_size == 1`` or when not ``active``. Rank 0
    evaluating for 41 s at ``--collective-timeout-s 20``: rank 1 waits 41 s and trains on.
    """
    store = default_store() if (ctx.is_distributed and active) else None
    if store is None:
        yield
        return
    done_key = f"{KEY_PREFIX}rank0-work/{what}"
    beat_key = f"{KEY_PREFIX}rank0-beat"
    if ctx.is_main:
        stop = threading.Event()

        def beat() -> None:
            count = 0
            while not stop.wait(HEARTBEAT_S):
                count += 1
                try:
                    store_set(store, beat_key, str(count))
                except DIST_ERRORS:
                    return

        thread = threading.Thread(target=beat, name="distsplat-rank0-heartbeat", daemon=True)
        thread.start()
        outcome = "failed"
        try:
            yield
            outcome = "ok"
        finally:
            stop.set()
            try:
                bounded(lambda: store_set(store, done_key, outcome))
            except DIST_ERRORS:
                pass  # the waiting ranks find the store gone themselves
        return
    yield  # nothing to do on this rank; then wait for rank 0
    if _wait_for_rank0(ctx, store, what, done_key, beat_key) != "ok" and not failure_told_later:
        raise RunFailure(f"rank 0 failed while {what} (rank 0 reports why)")


def _wait_for_rank0(ctx: DistContext, store: dist.Store, what: str, done_key: str, beat_key: str) -> str:
    """Wait for rank 0's ``done_key``; returns its outcome ("ok" or "failed"). Polls with ``check``
    (``store.wait`` logs two c10d warnings at every timeout)."""
    started = last_change = time.monotonic()
    last_beat: bytes | None = None
    delay_s = 0.001  # doubling to 0.1 s: a short window (the viewer's, every step) costs ~ms, a long one few polls
    # A poll may wait for the store as long as a collective may wait for a rank: on a loaded host
    # (the viewer's browser beside two ranks on 2 cores) a live store's reply took over 5 s.
    reply_s = max(STORE_REPLY_S, ctx.timeout_s)
    while True:
        try:
            if bounded(lambda: store_has_key(store, done_key), reply_s):
                return bounded(lambda: store.get(done_key), reply_s).decode()
            beat = bounded(lambda: store.get(beat_key) if store_has_key(store, beat_key) else None, reply_s)
        except StoreUnreachable as lost:
            raise RunFailure(f"rank {ctx.rank}: lost rank 0 while it was {what}: {lost}") from lost
        except DIST_ERRORS as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise RunFailure(
                f"rank {ctx.rank}: lost rank 0 while it was {what}: the store at {store_address()} failed ({first})"
            ) from err
        now = time.monotonic()
        if beat != last_beat:
            last_beat, last_change = beat, now
        if now - last_change > ctx.timeout_s:
            raise RunFailure(
                f"rank {ctx.rank}: lost rank 0 while it was {what}: no heartbeat for {now - last_change:.0f} s "
                f"(--collective-timeout-s {ctx.timeout_s:g}; store at {store_address()})"
            )
        if now - started > ctx.rank0_work_timeout_s:
            raise RunFailure(
                f"rank {ctx.rank}: rank 0 still {what} after {now - started:.0f} s (--rank0-work-timeout-s {ctx.rank0_work_timeout_s:g})"
            )
        time.sleep(delay_s)
        delay_s = min(0.1, delay_s * 2)


def wait_for_rank0_frame() -> tuple:
    """(file, function) of the frame in which a rank waits for rank 0 (the phase watch counts it
    as waiting on other ranks, like a collective)."""
    return (__file__, "_wait_for_rank0")
