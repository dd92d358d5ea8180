"""User text never becomes control tokens: text typed by a user (or taken from a file, a manifest, a chat history)
that spells a special token (``<end_of_turn>``, ``<|im_start|>``, ``<bos>``, an image marker ...) is tokenized as
the plain characters it is, so it cannot forge a turn, a system message or a media placeholder.

How: ``render_chat`` (preprocess/prompts.py) renders the chat template with every text part wrapped in marks
(private-use characters) and every special-token string inside it escaped, and checks that removing the marks
gives exactly the template's normal rendering. Processors split and expand the rendered text as before (an escaped
marker is not a marker) and call ``encode_prompt``, which removes the marks and tokenizes the text as a whole, the
way transformers does. If a special token of the result overlaps text a user supplied, that text is tokenized on
its own with special tokens split into ordinary pieces (``split_special_tokens``) instead.

A chat template that changes user text beyond trimming whitespace cannot be followed; then text that spells a
special token is refused with a PromptError.
"""

from __future__ import annotations

import bisect
import re

import numpy as np

from omnijax.common.errors import PromptError
from omnijax.preprocess.encode_text import encode
from omnijax.preprocess.tokenizer import added_tokens

OPEN, CLOSE, ESCAPE, ESCAPE_END = "\ue000", "\ue001", "\ue002", "\ue003"
_MARK_CHARS = OPEN + CLOSE + ESCAPE + ESCAPE_END
_ESCAPED = re.compile(f"{ESCAPE}([0-9a-f]*){ESCAPE_END}")


def protected_pattern(tokenizer) -> re.Pattern:
    """A regex matching the tokenizer's special-token strings and its other added tokens' (``added_tokens``; longest
    first) and the mark characters."""
    cached = getattr(tokenizer, "_omnijax_protected_pattern", None)
    if cached is not None:
        return cached
    trie = _trie_regex(list(added_tokens(tokenizer)))
    pattern = re.compile("|".join(([trie] if trie else []) + [f"[{_MARK_CHARS}]"]))
    try:
        tokenizer._omnijax_protected_pattern = pattern
    except AttributeError:
        pass
    return pattern


def _trie_regex(strings: list[str]) -> str:
    """A regex matching any of ``strings`` (the longest where several match) that tries each character once per
    position: a checkpoint can have thousands of special tokens."""
    trie: dict = {}
    for text in strings:
        if text:
            node = trie
            for ch in text:
                node = node.setdefault(ch, {})
            node[""] = {}

    def build(node: dict) -> str:
        ends = "" in node
        branches = [re.escape(ch) + build(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if ends else body

    return build(trie)


def _escape(match: re.Match) -> str:
    return ESCAPE + match.group().encode("utf-8", "surrogatepass").hex() + ESCAPE_END


def mark(text: str, pattern: re.Pattern) -> str:
    """``text`` wrapped in marks (leading and trailing whitespace left outside, so a template's ``trim`` acts as
    before), its special-token strings escaped. Whitespace-only text is returned as it is."""
    core = text.strip()
    if not core:
        return text
    lead = text[:len(text) - len(text.lstrip())]
    trail = text[len(text.rstrip()):]
    return lead + OPEN + pattern.sub(_escape, core) + CLOSE + trail


def _unescape(match: re.Match) -> str:
    return bytes.fromhex(match.group(1)).decode("utf-8", "surrogatepass")


def unmark(marked: str) -> tuple[str, list[tuple[int, int]]]:
    """(text without marks, escapes undone; the [start, end) character spans of the marked user text in it)."""
    plain: list[str] = []
    spans: list[tuple[int, int]] = []
    length = 0
    pos = 0
    while True:
        start = marked.find(OPEN, pos)
        if start < 0:
            rest = marked[pos:]
            break
        end = marked.find(CLOSE, start)
        if end < 0:
            raise PromptError("the rendered prompt has an unterminated user-text mark")
        before, raw = marked[pos:start], marked[start + 1:end]
        if any(c in before for c in _MARK_CHARS) or OPEN in raw:
            raise PromptError("the rendered prompt has stray user-text marks")
        inside = _ESCAPED.sub(_unescape, raw)
        plain += [before, inside]
        length += len(before)
        if inside:
            if spans and spans[-1][1] == length:  # adjacent parts: one span
                spans[-1] = (spans[-1][0], length + len(inside))
            else:
                spans.append((length, length + len(inside)))
        length += len(inside)
        pos = end + 1
    if any(c in rest for c in _MARK_CHARS):
        raise PromptError("the rendered prompt has stray user-text marks")
    plain.append(rest)
    return "".join(plain), spans


def _overlaps(spans: list[tuple[int, int]], start: int, end: int) -> bool:
    i = bisect.bisect_right(spans, (start, float("inf"))) - 1
    for s, e in spans[max(i, 0):i + 2]:
        if s < end and start < e:
            return True
    return False


def encode_prompt(tokenizer, marked: str) -> np.ndarray:
    """Token ids int32 [n] of a rendered prompt (marks from ``render_chat`` removed), with no special token drawn
    from user text. Prompts without special-token strings in user text get exactly ``tokenizer(text)``'s ids."""
    text, spans = unmark(marked)
    if not spans:
        return np.asarray(encode(tokenizer, text, add_special_tokens=False)["input_ids"], np.int32)
    specials = set(added_tokens(tokenizer).values())
    try:
        enc = encode(tokenizer, text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        forged = any(t in specials and _overlaps(spans, a, b) for t, (a, b) in zip(ids, offsets))
    except (NotImplementedError, ValueError, KeyError):  # a tokenizer without offsets: take the safe path
        forged = True
    if not forged:
        return np.asarray(ids, np.int32)
    out: list[int] = []
    pos = 0
    for start, end in spans + [(len(text), len(text))]:
        if start > pos:
            out += encode(tokenizer, text[pos:start], add_special_tokens=False)["input_ids"]
        if end > start:
            user = encode(tokenizer, text[start:end], add_special_tokens=False, split_special_tokens=True)["input_ids"]
            if any(t in specials for t in user):
                raise PromptError("user text could not be tokenized without special tokens")
            out += user
        pos = end
    return np.asarray(out, np.int32)


def spells_special_token(texts: list[str], pattern: re.Pattern) -> str | None:
    """The first special-token string in one of ``texts`` or in their concatenation, if any."""
    for text in [*texts, "".join(texts)]:
        match = pattern.search(text)
        if match:
            return match.group()
    return None
