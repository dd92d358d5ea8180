"""A request's tool calls: the checked ``ToolRequest`` (its tools, choice and call grammar), and the answer's text
split into its content and its calls, whole or as it streams.

    request = tool_request(body["tools"], body.get("tool_choice"), True, "hermes")  # ToolError naming the field
    content, calls = parse_calls("hermes", raw_text)    # raw: the answer decoded with its special tokens

Reading ``tools`` is app/tools.py's, each format's grammar app/tool_grammar.py's.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import warnings
from typing import Any, Iterable

from omnijax.app.tool_grammar import call_grammar
from omnijax.app.tools import (BARE_OPENERS, CALL_ENDS, FORMATS, G4_QUOTE, START, Tool, ToolCall, ToolChoice,
                               ToolError, check_schemas, read_tool_choice, read_tools)


@dataclasses.dataclass(frozen=True)
class ToolRequest:
    """The tools of one request, checked: what the model is offered (``tools``), how it may call them (``choice``,
    ``parallel``), in which format (``fmt``), and the grammar its answer follows (None: free text)."""

    tools: tuple[Tool, ...]
    choice: ToolChoice
    parallel: bool
    fmt: str
    grammar: str | None

    def template_tools(self) -> list[dict]:
        """The tools as the chat template takes them."""
        return [t.as_openai() for t in self.tools]

    @property
    def parses(self) -> bool:
        """Whether the answer is read for calls (tools offered and tool_choice not "none")."""
        return bool(self.tools) and self.choice.mode != "none"


def tool_request(tools: Any, tool_choice: Any = None, parallel_tool_calls: Any = True, fmt: str = "hermes",
                 special_ids: dict[str, int] | None = None) -> ToolRequest | None:
    """The checked ToolRequest of OpenAI's ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` for a model
    writing calls in ``fmt`` (None: no tools); ToolError naming the field."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown tool-call format {fmt!r} (one of {', '.join(FORMATS)})")
    if isinstance(tools, ToolRequest):
        return tools
    read = read_tools(tools)
    choice = read_tool_choice(tool_choice, read)
    if parallel_tool_calls is None:
        parallel_tool_calls = True
    if not isinstance(parallel_tool_calls, bool):
        raise ToolError("must be a boolean", "parallel_tool_calls")
    if not read:
        return None
    try:
        check_schemas(read)
        grammar_text = call_grammar(fmt, read, choice, parallel_tool_calls, special_ids)
    except RecursionError:
        raise ToolError("a function's parameters schema is too large or too deeply nested", "tools") from None
    return ToolRequest(tuple(read), choice, parallel_tool_calls, fmt, grammar_text)


# ---- text -> calls -------------------------------------------------------------------------------------------

def parse_calls(fmt: str, raw: str, specials: Iterable[str] = ()) -> tuple[str, list[ToolCall]]:
    """(content, calls) of an answer's ``raw`` text (decoded with its special tokens, its end token left out):
    content is the text before the first call (trailing white space removed), without the ``specials`` (the
    tokenizer's special tokens' text); text after the last call is dropped. Calls that do not parse are left in
    the content; no calls: the content is all of ``raw`` (without the specials)."""
    finder = {"hermes": _hermes_calls, "prompt": _hermes_calls, "gemma4": _gemma4_calls,
              "llama4": _llama4_calls}[fmt]
    found = finder(raw)
    if not found:
        return strip_specials(raw, specials), []
    start, calls = found
    return strip_specials(raw[:start], specials).rstrip(), calls


def strip_specials(text: str, specials: Iterable[str]) -> str:
    """``text`` without the special tokens' text ``specials`` (longest first)."""
    for s in sorted(set(specials), key=len, reverse=True):
        if s:
            text = text.replace(s, "")
    return text


def _arguments(value: Any) -> str | None:
    """Arguments as JSON text: an object as it is, a string holding an object parsed first."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict):
        return None
    return _json_text(value)


def _json_text(value: dict) -> str | None:
    """``value`` as JSON text (None when it is not JSON: a set, bytes, NaN or infinity, a lone surrogate)."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")
    except (TypeError, ValueError, RecursionError):  # UnicodeEncodeError is a ValueError
        return None
    return text


def _hermes_calls(raw: str) -> tuple[int, list[ToolCall]] | None:
    calls, first = [], None
    pos = 0
    decoder = json.JSONDecoder()
    while (start := raw.find("<tool_call>", pos)) >= 0:
        at = _skip_space(raw, start + len("<tool_call>"))
        try:  # the JSON object whole: a string in it may hold "</tool_call>"
            obj, at = decoder.raw_decode(raw, at)
        except (ValueError, RecursionError):
            break
        at = _skip_space(raw, at)
        if not raw.startswith("</tool_call>", at):
            break
        args = _arguments(obj.get("arguments", obj.get("parameters", {}))) if isinstance(obj, dict) else None
        if args is None or not isinstance(obj.get("name"), str):
            break
        calls.append(ToolCall(obj["name"], args))
        first = start if first is None else first
        pos = at + len("</tool_call>")
    return (first, calls) if calls else None


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


class _Gemma4Reader:
    """Gemma 4's argument syntax -> Python values (strings between ``<|"|>``, bare or quoted keys)."""

    def __init__(self, text: str):
        self.text, self.pos = text, 0

    def fail(self):
        raise ValueError(f"Gemma 4 arguments do not parse at {self.pos}")

    def value(self) -> Any:
        t = self.text
        if t.startswith(G4_QUOTE, self.pos):
            end = t.find(G4_QUOTE, self.pos + len(G4_QUOTE))
            if end < 0:
                self.fail()
            s = t[self.pos + len(G4_QUOTE):end]
            self.pos = end + len(G4_QUOTE)
            return s
        if t.startswith("{", self.pos):
            return self.obj()
        if t.startswith("[", self.pos):
            self.pos += 1
            out = []
            while not t.startswith("]", self.pos):
                out.append(self.value())
                if t.startswith(",", self.pos):
                    self.pos += 1
                elif not t.startswith("]", self.pos):
                    self.fail()
            self.pos += 1
            return out
        match = re.compile(r"[^,}\]]+").match(t, self.pos)
        if not match:
            self.fail()
        self.pos = match.end()
        word = match.group().strip()
        words = {"true": True, "false": False, "null": None}
        if word in words:
            return words[word]
        try:
            return json.loads(word)
        except ValueError:
            return word

    def obj(self) -> dict:
        t = self.text
        if not t.startswith("{", self.pos):
            self.fail()
        self.pos += 1
        out = {}
        while not t.startswith("}", self.pos):
            if t.startswith(G4_QUOTE, self.pos):
                key = self.value()
            else:
                match = re.compile(r"[^:{}\[\],]+").match(t, self.pos)
                if not match:
                    self.fail()
                key, self.pos = match.group().strip(), match.end()
            if not t.startswith(":", self.pos):
                self.fail()
            self.pos += 1
            out[key] = self.value()
            if t.startswith(",", self.pos):
                self.pos += 1
            elif not t.startswith("}", self.pos):
                self.fail()
        self.pos += 1
        return out


def _gemma4_calls(raw: str) -> tuple[int, list[ToolCall]] | None:
    calls, first, pos = [], None, 0
    while (start := raw.find("<|tool_call>", pos)) >= 0:
        match = re.compile(r"call:([A-Za-z_][A-Za-z0-9_.-]*)").match(raw, start + len("<|tool_call>"))
        if not match:
            break
        reader = _Gemma4Reader(raw)
        reader.pos = match.end()
        try:
            args = reader.obj()
        except ValueError:
            break
        end = reader.pos
        for closing in ("<tool_call|>", "<turn|>"):
            if raw.startswith(closing, end):
                end += len(closing)
                break
        text = _json_text(args)
        if text is None:
            break
        calls.append(ToolCall(match.group(1), text))
        first = start if first is None else first
        pos = end
    return (first, calls) if calls else None


_PY_WORDS = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


def _py_value(node: ast.AST) -> Any:
    """A literal of a pythonic call (Python's, or JSON's true / false / null)."""
    if isinstance(node, ast.Name) and node.id in _PY_WORDS:
        return _PY_WORDS[node.id]
    if isinstance(node, ast.List) or isinstance(node, ast.Tuple):
        return [_py_value(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("** in a dict")
        return {str(_py_value(k)): _py_value(v) for k, v in zip(node.keys, node.values)}
    value = ast.literal_eval(node)
    if value is not None and not isinstance(value, (str, int, float)):
        raise ValueError(f"{type(value).__name__} is not a JSON value")
    return value


def _keyword_value(source: str, node: ast.AST) -> Any:
    """A pythonic call's argument value: its text read as JSON (what the grammar writes: JSON's string escapes),
    else as a Python literal."""
    text = ast.get_source_segment(source, node)
    try:
        return json.loads(text)
    except (TypeError, ValueError, RecursionError):
        return _py_value(node)


def _pythonic(segment: str) -> list[ToolCall] | None:
    source = segment.strip()
    try:
        with warnings.catch_warnings():  # JSON's "\/" is an invalid escape to Python (its value is read as JSON)
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for call in tree.elts:
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name) or call.args \
                or any(k.arg is None for k in call.keywords):
            return None
        try:
            args = {k.arg: _keyword_value(source, k.value) for k in call.keywords}
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return None
        text = _json_text(args)
        if text is None:
            return None
        calls.append(ToolCall(call.func.id, text))
    return calls


def _json_calls(text: str) -> list[ToolCall] | None:
    """JSON calls ``{"name": ..., "parameters" | "arguments": {...}}`` making up all of ``text`` (separated by
    white space or ';')."""
    decoder, calls, pos = json.JSONDecoder(), [], 0
    while pos < len(text):
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError):
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or \
                not ("parameters" in obj or "arguments" in obj):
            return None
        args = _arguments(obj.get("parameters", obj.get("arguments")))
        if args is None:
            return None
        calls.append(ToolCall(obj["name"], args))
        while pos < len(text) and (text[pos].isspace() or text[pos] == ";"):
            pos += 1
    return calls or None


def _llama4_calls(raw: str) -> tuple[int, list[ToolCall]] | None:
    """Llama 4's calls: a pythonic list or JSON calls that are the whole answer, or all of what follows
    ``<|python_start|>`` (up to ``<|python_end|>``; text may come before the marker). A list or an object inside
    other text is text."""
    text = raw
    end_marker = text.find("<|python_end|>")
    if end_marker >= 0:
        text = text[:end_marker]
    marker = text.find("<|python_start|>")
    head = marker if marker >= 0 else len(text) - len(text.lstrip())
    body = text[marker + len("<|python_start|>"):].strip() if marker >= 0 else text.strip()
    if body.startswith("["):
        calls = _pythonic(body)
    elif body.startswith("{"):
        calls = _json_calls(body)
    else:
        calls = None
    return (head, calls) if calls else None


# ---- streaming -----------------------------------------------------------------------------------------------

class CallStream:
    """A streamed answer with tools, read as it grows: ``update(raw)`` with the whole raw text so far (special tokens
    included) gives (content delta, new calls): content is sent once it cannot turn into a call (a possible call
    start and trailing white space wait), each call once it is complete. ``finish(raw)`` gives the rest, read as
    ``parse_calls`` reads the whole answer (so the deltas join into the non-streamed answer)."""

    def __init__(self, fmt: str, specials: Iterable[str] = ()):
        self.fmt = fmt
        self.specials = tuple(specials)
        self.markers = [START[fmt]]
        self.openers = BARE_OPENERS.get(fmt, ())  # calls without a marker: the whole answer
        self.ends = CALL_ENDS.get(fmt)
        self.sent = ""
        self.calls: list[ToolCall] = []

    def _content(self, content: str) -> str:
        if not content.startswith(self.sent) or len(content) <= len(self.sent) or self.calls:
            return ""
        delta, self.sent = content[len(self.sent):], content
        return delta

    def _new_calls(self, calls: list[ToolCall]) -> list[ToolCall]:
        new = calls[len(self.calls):]
        self.calls += new
        return new

    def update(self, raw: str) -> tuple[str, list[ToolCall]]:
        cut = len(raw)
        for m in self.markers:
            i = raw.find(m)
            if i >= 0:
                cut = min(cut, i)
            for k in range(min(len(m) - 1, len(raw)), 0, -1):
                if raw.endswith(m[:k]):
                    cut = min(cut, len(raw) - k)
                    break
        lead = len(raw) - len(raw.lstrip())
        if raw[lead:lead + 1] in self.openers:
            cut = min(cut, lead)
        if cut == len(raw):
            return self._content(strip_specials(raw, self.specials).rstrip()), []
        tail = raw.rstrip()
        if self.ends and not tail.endswith(self.ends):
            return self._content(strip_specials(raw[:cut], self.specials).rstrip()), []
        content, calls = parse_calls(self.fmt, raw, self.specials)
        if not calls:
            return self._content(strip_specials(raw[:cut], self.specials).rstrip()), []
        return self._content(content), self._new_calls(calls)

    def finish(self, raw: str) -> tuple[str, list[ToolCall]]:
        content, calls = parse_calls(self.fmt, raw, self.specials)
        return self._content(content), self._new_calls(calls)
