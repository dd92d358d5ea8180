"""One answer's text as its tokens arrive: what to show after each token, where the answer ends (an end-of-turn id
or a stop string) and its final text. ``Pipeline.generate`` and ``Pipeline.stream`` both build answers here, so the
streamed pieces joined are always the final text.

Per token the work is O(1): the detokenizer decodes a short window (app/detokenize.py) and the stop checker looks at
the last few characters (app/stops.py). The whole answer is decoded once, at the end.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

from omnijax.app.detokenize import IncrementalDetokenizer
from omnijax.app.stops import StopChecker


class AnswerText:
    """push(token) -> the text to show now ("" if none); ``done`` once an end id, a stop string or ``end()`` (a
    constraint complete) ends the answer; then (or when tokens run out) ``finish()`` -> the rest to show. After
    ``finish``: ``text`` (cut before a stop string), ``token_ids`` (up to the token that ended the answer, an end id
    included) and ``finish_reason`` ("eos", "stop" or "length")."""

    def __init__(self, decode: Callable[[list[int]], str], detokenizer: IncrementalDetokenizer,
                 stops: Sequence[str] | str | None, eos_ids: Iterable[int]):
        self.decode = decode
        self.detok = detokenizer
        self.stops = StopChecker(stops)
        self.eos_ids = frozenset(eos_ids)
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.text: str | None = None
        self._pieces: list[str] = []  # settled text
        self._unshown = ""  # settled text not shown yet (a possible stop-string beginning)
        self._shown = 0
        self._cut: int | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def push(self, token_id: int) -> str:
        token_id = int(token_id)
        self.token_ids.append(token_id)
        if token_id in self.eos_ids:
            self.finish_reason = "eos"
            return ""
        piece = self.detok.push(token_id)
        return self._settled(piece) if piece else ""

    def end(self) -> None:
        """End the answer after the last token pushed (finish_reason "stop"; its text is the decode of every token):
        what a structured output's constraint does once it is complete."""
        if self.finish_reason is None:
            self.finish_reason = "stop"

    def _settled(self, piece: str) -> str:
        self._pieces.append(piece)
        cut = self.stops.push(piece)
        self._unshown += piece
        if cut is not None:
            self.finish_reason, self._cut = "stop", cut
            visible = cut
        else:
            visible = self.stops.length - self.stops.held()
        out, self._unshown = self._unshown[:visible - self._shown], self._unshown[visible - self._shown:]
        self._shown = visible
        return out

    def finish(self) -> str:
        """The text not shown yet; sets ``text`` and ``finish_reason``."""
        if self._cut is not None:  # a stop string
            self.text = "".join(self._pieces)[:self._cut]
            return ""
        answer = self.token_ids[:-1] if self.finish_reason == "eos" else self.token_ids
        final = self.decode(answer)
        rest = self.detok.finish(final)
        cut = self.stops.push(rest)
        if cut is not None:
            self.finish_reason = "stop"
            final = final[:cut]
        self.finish_reason = self.finish_reason or "length"
        self.text = final
        return final[self._shown:]


def answer_for(processor, stops, eos_ids) -> AnswerText:
    """An AnswerText decoding with ``processor.decode`` (its tokenizer, when it has one, names the special and
    byte-fallback tokens)."""
    detok = IncrementalDetokenizer.for_tokenizer(getattr(processor, "tokenizer", None), processor.decode)
    return AnswerText(processor.decode, detok, stops, eos_ids)
