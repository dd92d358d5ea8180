"""Ctrl-C during a long run: every SIGINT is recorded, so none is lost, and it stops the work where it is.

Inside ``CtrlC()``, SIGINT raises KeyboardInterrupt (as Python does by default) unless the code is inside
``shielded()`` (writing a batch's rows, closing up, printing the summary): there it is only recorded, and the run
checks ``requested`` at its next step. A KeyboardInterrupt swallowed by a library cannot lose the request either.
Only the main thread can install the handler; elsewhere ``CtrlC`` records nothing and changes nothing.
"""

from __future__ import annotations

import contextlib
import signal
import threading


class CtrlC:
    def __init__(self):
        self.requested = False
        self._shielded = 0
        self._previous = None
        self._installed = False

    def __enter__(self) -> "CtrlC":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.getsignal(signal.SIGINT)
            signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    def _handle(self, signum, frame) -> None:
        self.requested = True
        if not self._shielded:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def shielded(self):
        """A block that SIGINT does not interrupt (it is recorded in ``requested``)."""
        self._shielded += 1
        try:
            yield
        finally:
            self._shielded -= 1
