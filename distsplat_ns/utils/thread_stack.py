"""Another thread's Python stack, read without touching its frame objects.

``sys._current_frames()`` hands out frame objects of a thread that keeps running; walking their
``f_back`` from another thread is a use-after-free on CPython 3.11 (segfaults of sampling
profilers: getsentry/sentry-python#2386, DataDog/dd-trace-py#13567). ``faulthandler`` instead reads
every thread's frames in C while the caller holds the GIL, and writes them as text: this module
parses that text. Pure: the standard library.
"""

from __future__ import annotations

import faulthandler
import re
import tempfile
import traceback

_HEADER = re.compile(r"^(?:Current thread|Thread) 0x([0-9a-fA-F]+)\b")
_FRAME = re.compile(r'^  File "(.*)", line (\d+|\?\?\?) in (.*)$')


def thread_stack(ident: int) -> traceback.StackSummary | None:
    """The stack of thread ``ident`` (``threading.Thread.ident``), outermost frame first as
    ``traceback.extract_stack`` gives it; None when no such thread runs Python code. faulthandler
    keeps the innermost 100 frames of a deeper stack."""
    with tempfile.TemporaryFile() as dump:
        faulthandler.dump_traceback(dump, all_threads=True)
        dump.seek(0)
        text = dump.read().decode("utf-8", "backslashreplace")
    return parse_thread_stack(text, ident)


def parse_thread_stack(text: str, ident: int) -> traceback.StackSummary | None:
    """Thread ``ident``'s frames in a ``faulthandler`` dump (innermost first there), outermost first."""
    frames: list[tuple[str, int, str, None]] | None = None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header is not None:
            if frames is not None:
                break  # the next thread's block
            if int(header.group(1), 16) == ident:
                frames = []
            continue
        frame = _FRAME.match(line) if frames is not None else None
        if frame is not None:
            filename, lineno, name = frame.groups()
            frames.append((filename, int(lineno) if lineno.isdigit() else 0, name, None))
    if not frames:
        return None
    return traceback.StackSummary.from_list(frames[::-1])
