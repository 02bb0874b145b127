"""Viewer frames of a sharded run: the viewer thread posts a camera, the training thread renders it.

nerfstudio's viewer renders from its own thread on rank 0 (``get_outputs_for_camera``). In sharded
mode a frame is a collective (``parallel/view_render.py``), and a collective entered by one thread
of one rank would interleave with the training step's. So the viewer thread only posts its camera
here and waits; every rank learns of the request from a flag in the step's cost all-gather, rank 0
then broadcasts it and all ranks render it right after that gather, before the optimizer step
(``pipeline/step_balance.py:StepBalance.measure``), and rank 0 hands the image to the waiting thread.
One request is pending at a time (a newer camera replaces the camera of one not yet taken), so a
slow browser costs training at most one frame's render per step.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch

#: How long the viewer thread waits for a step boundary before showing nothing new: training may be
#: paused or finished. Long enough for a slow step on a large scene, short enough to keep the viewer
#: responsive to its controls.
DEFAULT_WAIT_S = 30.0


@dataclass
class _Request:
    camera: Any
    crop_box: Any
    background: Any
    done: threading.Event = field(default_factory=threading.Event)
    outputs: dict[str, torch.Tensor] | None = None


class ViewRequests:
    """The pending viewer frame (at most one) between rank 0's viewer thread and its training thread.

    Args:
        wait_s: How long :meth:`post_and_wait` waits for the frame, s.
    """

    def __init__(self, wait_s: float = DEFAULT_WAIT_S) -> None:
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._pending: _Request | None = None
        self._taken: _Request | None = None
        self._closed = False
        self.num_served = 0

    def close(self) -> None:
        """No more step boundaries: a waiting request and every later one get None at once. Local."""
        with self._lock:
            self._closed = True
            if self._pending is not None:
                self._pending.done.set()
                self._pending = None

    def post_and_wait(self, camera: Any, crop_box: Any, background: Any = None) -> dict[str, torch.Tensor] | None:
        """Viewer thread: post ``camera`` (host-side), with the crop box and the background the
        viewer set on rank 0's model, and wait for its frame; None when no step boundary came
        within ``wait_s`` or the requests are closed. A request not yet taken is updated to the
        newest camera (its waiters get that frame). Local: the training thread does the collective."""
        with self._lock:
            if self._closed:
                return None
            if self._pending is None:
                self._pending = _Request(camera=camera, crop_box=crop_box, background=background)
            else:  # not taken yet: the newest camera wins, and every waiter gets its frame
                self._pending.camera, self._pending.crop_box, self._pending.background = camera, crop_box, background
            request = self._pending
        request.done.wait(self.wait_s)
        with self._lock:
            if self._pending is request:
                self._pending = None
        return request.outputs

    def take(self) -> Any | None:
        """Training thread: the pending request's ``(camera, crop_box, background)`` to share with
        every rank (None when there is none); it stays owed an answer (:meth:`answer`). Local."""
        with self._lock:
            request, self._pending = self._pending, None
            self._taken = request
        return None if request is None else (request.camera, request.crop_box, request.background)

    def answer(self, outputs: dict[str, torch.Tensor] | None) -> None:
        """Training thread: hand the frame rendered for the last :meth:`take` to its waiter. Local."""
        with self._lock:
            request, self._taken = self._taken, None
        if request is not None:
            request.outputs = outputs
            request.done.set()
            self.num_served += 1
