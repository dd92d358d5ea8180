"""Ctrl-C (and SIGTERM, as a service manager or ``kill`` sends it) during a long run: every such signal is recorded,
so none is lost, and it stops the work where it is, cleaning up as on Ctrl-C.

Inside ``CtrlC()``, SIGINT and SIGTERM raise KeyboardInterrupt (as Python does by default for SIGINT) unless the code
is inside ``shielded()`` (writing a batch's rows, closing up, printing the summary): there it is only recorded, and
the run checks ``requested`` at its next step. A KeyboardInterrupt swallowed by a library cannot lose the request
either. ``terminate_as_interrupt()`` alone makes SIGTERM raise KeyboardInterrupt (a server's ``finally`` then
removes what it made). Only the main thread can install handlers; elsewhere both record nothing and change nothing.
"""

from __future__ import annotations

import contextlib
import signal
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def terminate_as_interrupt():
    """A block in which SIGTERM raises KeyboardInterrupt in the main thread, as Ctrl-C does."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class CtrlC:
    def __init__(self):
        self.requested = False
        self._shielded = 0
        self._previous: dict = {}

    def __enter__(self) -> "CtrlC":
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        self.requested = True
        if not self._shielded:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def shielded(self):
        """A block that SIGINT / SIGTERM do not interrupt (they are recorded in ``requested``)."""
        self._shielded += 1
        try:
            yield
        finally:
            self._shielded -= 1
