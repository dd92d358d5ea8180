"""Incremental detokenisation: the text each generated token adds, with O(1) host work per token.

``IncrementalDetokenizer.push(token)`` returns only text that no later token can change, so the pieces it returns,
joined, are always a prefix of ``decode(all tokens)``; ``decode(all tokens)`` minus that prefix is what is left to
show at the end (invalid bytes appear as U+FFFD exactly where ``decode`` puts them).

Text stays held back while it may still change:
  * after a byte-fallback token (``<0xE2>`` in SentencePiece-style vocabularies): the tokenizer decodes a whole run
    of byte tokens at once, and a later byte can turn the run from valid UTF-8 into one U+FFFD per byte;
  * a trailing U+FFFD: for byte-level vocabularies it may be the start of a character the next bytes complete.
Tokens the decoder skips (special tokens) are dropped first, as ``decode(skip_special_tokens=True)`` drops them.

Only a short window of recent tokens is decoded per step: the window starts one token before the last point where
the text is known to split (decoding ``window`` and ``window[:1]`` and taking the difference keeps tokenizers that
treat a leading token specially, e.g. by stripping a leading space, exact). A run of held tokens is decoded once
when it ends, so the work stays O(1) per token on average.
"""

from __future__ import annotations

from typing import Callable, Iterable

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """decode: token ids -> text (special tokens skipped). skip_ids: ids decode drops (special tokens).
    byte_ids: byte-fallback token ids (see preprocess.tokenizer.byte_fallback_ids)."""

    def __init__(self, decode: Callable[[list[int]], str], *, skip_ids: Iterable[int] = (),
                 byte_ids: Iterable[int] = ()):
        self.decode = decode
        self.skip_ids = frozenset(skip_ids)
        self.byte_ids = frozenset(byte_ids)
        self.ids: list[int] = []  # visible tokens (skipped ones dropped)
        self.start = 0  # window start in self.ids
        self.window_text = ""  # the part of decode(ids[start:]) already returned
        self.returned = 0  # characters returned in all
        self._last: tuple = (-1, -1, "")  # (start, stop, decode(ids[start:stop])) of the last window decoded

    @classmethod
    def for_tokenizer(cls, tokenizer, decode: Callable[[list[int]], str]) -> "IncrementalDetokenizer":
        """The detokenizer for a transformers tokenizer whose ``decode`` (skipping special tokens) is ``decode``."""
        from omnijax.preprocess.tokenizer import byte_fallback_ids, special_tokens

        if tokenizer is None:
            return cls(decode)
        return cls(decode, skip_ids=special_tokens(tokenizer).values(), byte_ids=byte_fallback_ids(tokenizer))

    def push(self, token_id: int) -> str:
        """The text ``token_id`` settles ("" while it is held back or the token shows nothing)."""
        if token_id in self.skip_ids:
            return ""
        self.ids.append(int(token_id))
        if token_id in self.byte_ids:
            return ""  # the byte run may go on
        window = self.decode(self.ids[self.start:])
        if not window.startswith(self.window_text):
            return ""  # cannot happen for the decoders above; holding back keeps what was shown a prefix
        end = len(window) - 1 if window.endswith(REPLACEMENT) else len(window)
        piece = window[len(self.window_text):end]
        if piece:
            self.window_text += piece
            self.returned += len(piece)
        self._narrow(window)
        return piece

    def _narrow(self, window: str) -> None:
        """Move the window start to the token before the last one when the text splits there for good: the token
        before the split is not a byte token, the text left of it was all returned, and decoding the two sides
        (the right one with one token of context) gives the window."""
        n = len(self.ids)
        split = n - 1
        last, self._last = self._last, (self.start, n, window)
        if split - 1 <= self.start or self.ids[split - 1] in self.byte_ids:
            return
        left = last[2] if last[:2] == (self.start, split) else self.decode(self.ids[self.start:split])
        if len(left) > len(self.window_text):
            return
        context = self.decode(self.ids[split - 1:split])
        right = self.decode(self.ids[split - 1:])
        if not right.startswith(context) or window != left + right[len(context):]:
            return
        self.start = split - 1
        self.window_text = context + self.window_text[len(left):]
        self._last = (self.start, n, right)

    def finish(self, final_text: str) -> str:
        """What is left to show once generation is over: ``final_text`` (the decode of every token) after the
        text already returned."""
        return final_text[self.returned:]
