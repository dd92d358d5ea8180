"""Stop strings: find where generated text first contains one, and the tokens that reach it."""

from __future__ import annotations

from typing import Callable, Sequence


class StopChecker:
    """Feed generated token ids one at a time; ``push`` returns True once the text contains a stop string.

    After a stop, ``ids`` are the tokens up to and including the one that completed the stop string and
    ``text(ids)`` is the decoded text cut just before the stop string.
    """

    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str] | None):
        if isinstance(stops, str):
            stops = [stops]
        self.decode = decode
        self.stops = [s for s in (stops or []) if s]
        self.ids: list[int] = []

    def push(self, token_id: int) -> bool:
        self.ids.append(token_id)
        if not self.stops:
            return False
        text = self.decode(self.ids)
        return any(s in text for s in self.stops)

    def holdback(self, text: str) -> str:
        """``text`` less any ending that could still grow into a stop string (safe to show while streaming)."""
        keep = len(text)
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    keep = min(keep, len(text) - n)
                    break
        return text[:keep]

    def text(self, ids: list[int]) -> str:
        text = self.decode(ids)
        cut = min((text.find(s) for s in self.stops if s in text), default=len(text))
        return text[:cut]
