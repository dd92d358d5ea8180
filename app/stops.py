"""Stop strings, found in the answer text as it grows, with work bounded by the stop strings' length per step.

The checker sees the settled text piece by piece (see app/detokenize.py) and keeps only the last
``longest stop - 1`` characters between pieces: an occurrence that ends in a new piece starts at most that far back.
"""

from __future__ import annotations

from typing import Sequence

from omnijax.app.sampling import check_stops


class StopChecker:
    """``push(piece)`` returns the position in the whole text where the earliest stop string starts, once the text
    contains one (None before). ``held()`` is how many trailing characters could still grow into a stop string
    (safe to show while streaming: the text without them)."""

    def __init__(self, stops: Sequence[str] | str | None):
        self.stops = check_stops(stops)
        self.keep = max((len(s) for s in self.stops), default=1) - 1
        self.length = 0  # characters pushed so far
        self.tail = ""  # the last ``keep`` of them

    def push(self, piece: str) -> int | None:
        if not piece:
            return None
        window = self.tail + piece
        base = self.length - len(self.tail)
        self.length += len(piece)
        self.tail = window[max(0, len(window) - self.keep):] if self.keep else ""
        starts = [window.find(s) for s in self.stops]
        found = [i for i in starts if i >= 0]
        return base + min(found) if found else None

    def held(self) -> int:
        """The length of the longest ending of the text that is a proper beginning of a stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.tail)), best, -1):
                if self.tail.endswith(s[:n]):
                    best = n
                    break
        return best
