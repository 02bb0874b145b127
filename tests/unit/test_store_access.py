"""distributed/store_access.bounded: late replies, and which of them mark the store lost."""

from __future__ import annotations

import threading

import pytest

from distsplat_ns.distributed import store_access
from distsplat_ns.distributed.store_access import StoreUnreachable, bounded


@pytest.fixture(autouse=True)
def fresh_store_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_access, "_LOST_STORE", [])


def _late_reply(release: threading.Event):
    def call() -> str:
        release.wait(5.0)
        return "late"

    return call


def test_a_reply_late_for_an_error_path_marks_the_store_lost_for_every_later_call() -> None:
    release = threading.Event()
    with pytest.raises(StoreUnreachable, match="did not answer within 0.05 s"):
        bounded(_late_reply(release), 0.05)
    release.set()
    with pytest.raises(StoreUnreachable):  # at once, without calling the store again
        bounded(lambda: "answered", 5.0)


def test_a_poll_that_judges_the_store_itself_leaves_later_calls_free() -> None:
    # The abort watch's poll under load (tests/integration/test_viewer.py, sharded): one late reply
    # must not make rank 1's wait for rank 0 fail at once.
    release = threading.Event()
    with pytest.raises(StoreUnreachable, match="did not answer within 0.05 s"):
        bounded(_late_reply(release), 0.05, remember_loss=False)
    release.set()
    assert bounded(lambda: "answered", 5.0) == "answered"
