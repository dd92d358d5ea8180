"""Waits in the main thread end on a signal the kernel delivered to another thread (common/interruptible.py)."""

from __future__ import annotations

import queue
import signal
import sys
import threading
import time

import pytest

from omnijax.common.interruptible import get_item, wait_event


class Interrupted(Exception):
    pass


def _raise(signum, frame):
    raise Interrupted


def _event():
    """(wait, release, the function whose frame is innermost while the wait blocks)."""
    event = threading.Event()
    return (lambda: wait_event(event)), event.set, threading.Condition.wait.__code__


def _queue():
    q = queue.SimpleQueue()
    return (lambda: get_item(q)), (lambda: q.put(1)), get_item.__code__


def _where(thread_id: int):
    frame = sys._current_frames().get(thread_id)
    return None if frame is None else (frame.f_code, frame.f_lasti)


def _blocked_in(thread_id: int, code) -> bool:
    """Whether the thread sits in ``code`` at one instruction while this one lets it run (sleeps, holding no
    GIL): blocked in a call there."""
    before = _where(thread_id)
    if before is None or before[0] is not code:
        return False
    time.sleep(0.01)
    return _where(thread_id) == before


@pytest.mark.parametrize("make", [_event, _queue], ids=["event", "queue"])
def test_a_signal_delivered_to_another_thread_ends_a_main_thread_wait(make):
    """The signal goes to a helper thread (as the kernel may send Ctrl-C to any thread); a plain untimed wait in the
    main thread would sleep through it until the helper releases the wait 30 s later."""
    assert threading.current_thread() is threading.main_thread()
    wait, release, blocked_in = make()
    stop, released = threading.Event(), threading.Event()
    previous = signal.signal(signal.SIGUSR1, _raise)
    main = threading.get_ident()

    def helper():
        while not _blocked_in(main, blocked_in) and not stop.is_set():
            pass
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
        if not stop.wait(30):
            released.set()
            release()

    thread = threading.Thread(target=helper)
    try:
        with pytest.raises(Interrupted):
            thread.start()
            wait()
        assert not released.is_set(), "the wait slept through the signal until the helper released it"
    finally:
        stop.set()
        thread.join()
        signal.signal(signal.SIGUSR1, previous)


def test_timeouts_still_end_the_waits():
    assert not wait_event(threading.Event(), 0.25)
    with pytest.raises(queue.Empty):
        get_item(queue.SimpleQueue(), 0.25)
    q = queue.SimpleQueue()
    q.put(7)
    assert get_item(q, 5) == 7
    done = threading.Event()
    done.set()
    assert wait_event(done, 0)
