"""Log probabilities in the OpenAI API's shapes, from the engine's ``TokenLogprob`` records (app/token_logprobs.py).

Chat (``logprobs: true``, ``top_logprobs: 0..20``): ``choices[].logprobs = {"content": [{"token", "logprob", "bytes",
"top_logprobs": [{"token", "logprob", "bytes"}, ...]}, ...], "refusal": null}``. Completions (``logprobs: 0..5``):
``choices[].logprobs = {"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, each top entry a dict token ->
log probability holding the most likely ``logprobs`` tokens and the chosen one (so up to ``logprobs`` + 1), with
``echo``: the prompt's tokens first, each with its log probability and top entry given the tokens before it (the
first one's null).

Which tokens: every generated token except an end id that ended the answer (its text is not in the answer); the
tokens of a stop string are kept (the engine drew them). A stream sends each token's entry in the chunk that shows
its text, or, for a token that shows none (held back, or a special token), in a later chunk: the entries joined
are the ones a non-streamed answer holds. Log probabilities are natural logs of the model's distribution before
temperature, top-k and top-p (with the request's ``logprobs_mode`` "processed": of the distribution the token was
drawn from, after them); a value of -inf is written -9999.0, as OpenAI writes it.
"""

from __future__ import annotations

import math

from omnijax.app.token_logprobs import TokenLogprob
from omnijax.app.token_text import TextOffsets, TokenText

FLOOR = -9999.0  # what OpenAI writes for an impossible token


def _value(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else FLOOR


def answer_records(records: list[TokenLogprob] | None, finish_reason: str) -> list[TokenLogprob]:
    """The records an answer shows: all but an end id that ended it."""
    records = list(records or ())
    return records[:-1] if finish_reason == "eos" and records else records


def chat_content(records: list[TokenLogprob], top: int, text: TokenText) -> list[dict]:
    def entry(token_id: int, logprob: float) -> dict:
        return {"token": text.text_of(token_id), "logprob": _value(logprob), "bytes": list(text.bytes_of(token_id))}

    return [{**entry(r.token_id, r.logprob), "top_logprobs": [entry(i, lp) for i, lp in r.top[:top]]}
            for r in records]


def chat_logprobs(records: list[TokenLogprob], top: int, text: TokenText) -> dict:
    return {"content": chat_content(records, top, text), "refusal": None}


class CompletionLogprobs:
    """The completions shape for an answer's records, one part at a time (a stream's chunks): ``text_offset``
    counts on from ``start`` (the answer's place in the returned text: after the prompt with ``echo``)."""

    def __init__(self, text: TokenText, top: int, start: int = 0):
        self.text, self.top = text, top
        self.offsets = TextOffsets(text, start)

    def part(self, records: list[TokenLogprob]) -> dict:
        out = empty()
        for r in records:
            top = {self.text.text_of(i): _value(lp) for i, lp in r.top[:self.top]}
            top.setdefault(self.text.text_of(r.token_id), _value(r.logprob))
            out["tokens"].append(self.text.text_of(r.token_id))
            out["token_logprobs"].append(_value(r.logprob))
            out["top_logprobs"].append(top)
            out["text_offset"].append(self.offsets.push(r.token_id))
        return out


def empty() -> dict:
    return {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}


def prompt_part(token_ids, prompt_logprobs, prompt_top, top: int, text: TokenText) -> dict:
    """``echo``'s part: each prompt token, its log probability given the ones before it and its top entry (the
    ``top`` most likely tokens there, from ``prompt_top``, and itself: as an answer token's), and its offset in the
    prompt's text; the first token's log probability and top entry are null."""
    writer = CompletionLogprobs(text, top)
    first = int(token_ids[0])
    out = {"tokens": [text.text_of(first)], "token_logprobs": [None], "top_logprobs": [None],
           "text_offset": [writer.offsets.push(first)]}
    records = [TokenLogprob(int(t), float(v), prompt_top[i] if prompt_top else ())
               for i, (t, v) in enumerate(zip(token_ids[1:], prompt_logprobs))]
    return join(out, writer.part(records))


def join(a: dict, b: dict) -> dict:
    return {k: a[k] + b[k] for k in a}


class StreamedRecords:
    """A stream's records held until a chunk shows text: ``take(event)`` -> the records to send with that event's
    chunk (none while it shows no text); ``rest(finish_reason)`` -> those left at the end (an ending end id
    dropped)."""

    def __init__(self):
        self.held: list[TokenLogprob] = []

    def take(self, event) -> list[TokenLogprob]:
        if event.logprob is not None:
            self.held.append(event.logprob)
        if not event.text or event.token_id is None:  # the last piece of text comes before the end is known
            return []
        out, self.held = self.held, []
        return out

    def rest(self, finish_reason: str) -> list[TokenLogprob]:
        out, self.held = answer_records(self.held, finish_reason), []
        return out
