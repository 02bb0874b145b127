"""utils/thread_stack.py: another thread's stack from faulthandler's dump."""

from __future__ import annotations

import threading

from distsplat_ns.utils.thread_stack import parse_thread_stack, thread_stack

DUMP = """Current thread 0x00007faa59f3b6c0 (most recent call first):
  File "/a/watch.py", line 5 in watch
  File "/py/threading.py", line 982 in run

Thread 0x00007faa5ac9eb80 (most recent call first):
  File "/a/inner.py", line 12 in inner
  File "/a/gen.py", line ??? in <genexpr>
  File "/a/main.py", line 3 in <module>
"""


def test_parse_gives_that_threads_frames_outermost_first() -> None:
    stack = parse_thread_stack(DUMP, 0x00007FAA5AC9EB80)
    assert [(f.filename, f.lineno, f.name) for f in stack] == [
        ("/a/main.py", 3, "<module>"),
        ("/a/gen.py", 0, "<genexpr>"),
        ("/a/inner.py", 12, "inner"),
    ]
    watch = parse_thread_stack(DUMP, 0x00007FAA59F3B6C0)
    assert [f.name for f in watch] == ["run", "watch"]  # stops at the next thread's block
    assert parse_thread_stack(DUMP, 0x1234) is None


def _parked(entered: threading.Event, release: threading.Event) -> None:
    entered.set()
    release.wait(30)


def test_a_live_thread_is_seen_where_it_waits() -> None:
    entered, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=_parked, args=(entered, release), daemon=True)
    thread.start()
    try:
        assert entered.wait(10)
        stack = thread_stack(thread.ident)
    finally:
        release.set()
        thread.join(10)
    assert stack is not None
    names = [f.name for f in stack]
    assert "_parked" in names and names.index("_parked") < names.index("wait"), names
    parked = stack[names.index("_parked")]
    assert parked.filename == __file__ and parked.line == "release.wait(30)"  # source read lazily, as traceback does
    assert thread_stack(1) is None  # no thread has that id
