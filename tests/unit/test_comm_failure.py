"""Which errors ``ns-train distsplat`` reports as a failed collective (``distributed/lifecycle.py``):
those get the one-line report with where every rank was last seen, the rest a traceback."""

from __future__ import annotations

import pytest

from distsplat_ns.distributed.lifecycle import is_comm_failure


@pytest.mark.parametrize(
    "message",
    [
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [10.77.0.1]:41234: Connection reset by peer",
        "[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 30000ms for recv operation to complete",
        "Connection closed by peer [10.77.0.2]:23456",
        # An async all-reduce's wait() past the timeout (the replicated gradient buckets, distributed/gradient_sum.py).
        "Application timeout caused pair closure",
    ],
)
def test_gloo_failures_are_communication_failures(message: str) -> None:
    assert is_comm_failure(RuntimeError(message))


def test_other_errors_are_not() -> None:
    assert not is_comm_failure(RuntimeError("injected internal error at step 12"))
    assert not is_comm_failure(ValueError("Application timeout caused pair closure"))
