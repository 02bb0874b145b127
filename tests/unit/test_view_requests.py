"""The viewer thread's requests (parallel/view_requests.py): one pending at a time, the newest
camera wins, the waiter gets the frame the training thread renders, and nothing waits after close."""

from __future__ import annotations

import threading
import time

from distsplat_ns.parallel.view_requests import ViewRequests


def _post_in_thread(requests: ViewRequests, camera: str, got: dict) -> threading.Thread:
    thread = threading.Thread(target=lambda: got.update({camera: requests.post_and_wait(camera, None)}))
    thread.start()
    return thread


def _wait_pending(requests: ViewRequests) -> None:
    while requests._pending is None:
        time.sleep(0.001)


def test_two_posts_before_a_step_boundary_get_one_frame_of_the_newest_camera() -> None:
    requests, got = ViewRequests(wait_s=10), {}
    first = _post_in_thread(requests, "old", got)
    _wait_pending(requests)
    second = _post_in_thread(requests, "new", got)
    while requests._pending.camera != "new":
        time.sleep(0.001)
    assert requests.take() == ("new", None, None)
    requests.answer({"rgb": "frame of new"})
    first.join(5)
    second.join(5)
    assert got == {"old": {"rgb": "frame of new"}, "new": {"rgb": "frame of new"}} and requests.num_served == 1
    assert requests.take() is None


def test_no_step_boundary_in_time_gives_none() -> None:
    assert ViewRequests(wait_s=0.05).post_and_wait("camera", None) is None


def test_closed_requests_return_at_once() -> None:
    requests = ViewRequests(wait_s=30)
    requests.close()
    start = time.perf_counter()
    assert requests.post_and_wait("camera", None) is None and time.perf_counter() - start < 1
