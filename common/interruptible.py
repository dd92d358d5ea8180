"""Blocking waits that Ctrl-C ends promptly.

A signal is handled by Python in the main thread, but the kernel may deliver it to any thread (XLA's, a loader's,
the engine's): a main thread blocked in an untimed wait is then not woken, and the handler (KeyboardInterrupt) runs
only when the wait ends, which for a long answer may be minutes. In the main thread these waits block in slices of
``SLICE`` seconds, so pending handlers run between them; elsewhere they are the plain waits.
"""

from __future__ import annotations

import queue
import threading
import time

SLICE = 0.1  # seconds: the longest a pending Ctrl-C waits in the main thread


def _slices(timeout: float | None):
    """Timeouts of successive waits: ``timeout`` (None: unbounded) cut into slices of at most SLICE seconds in the
    main thread; the whole of it elsewhere."""
    if threading.current_thread() is not threading.main_thread():
        yield timeout
        return
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = SLICE if deadline is None else min(SLICE, deadline - time.monotonic())
        yield max(left, 0.0)
        if deadline is not None and time.monotonic() >= deadline:
            return


def wait_event(event: threading.Event, timeout: float | None = None) -> bool:
    """``event.wait(timeout)``: whether the event is set."""
    for part in _slices(timeout):
        if event.wait(part):
            return True
    return event.is_set()


def get_item(q, timeout: float | None = None):
    """``q.get(timeout=timeout)`` (``queue.Empty`` when nothing came in time)."""
    for part in _slices(timeout):
        try:
            return q.get(timeout=part)
        except queue.Empty:
            pass
    raise queue.Empty
