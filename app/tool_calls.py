"""Tool calls: OpenAI's ``tools`` / ``tool_choice`` read and checked, each family's call format as an llguidance
grammar, and the answer's text split into its content and its calls. Small pure functions, each usable alone:

    tools = read_tools(body["tools"])                            # [Tool]; ToolError (param: the field) when bad
    choice = read_tool_choice(body.get("tool_choice"), tools)    # ToolChoice("auto" | "none" | "required" | "function")
    text = call_grammar("hermes", tools, choice, parallel=True)  # the Lark grammar of the answer (None: no constraint)
    content, calls = parse_calls("hermes", raw_text)             # raw: the answer decoded with its special tokens

A format is the name a family's processor states (``Processor.tool_format``, chosen by the checkpoint's family):

- ``hermes`` (Qwen3-Omni): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, calls one a line;
- ``prompt`` (Gemma 3 and any template without tool support): the same markup written as plain text, taught by a
  system message (preprocess/tool_prompt.py);
- ``gemma4``: ``<|tool_call>call:name{key:<|"|>text<|"|>,n:42}<tool_call|>`` (bare keys, ``<|"|>`` around
  strings, keys in sorted order as the chat template writes them);
- ``llama4``: pythonic ``[f(a=1), g(b="x")]`` (in ``auto`` inside ``<|python_start|>`` .. ``<|python_end|>``); the
  parser also takes JSON calls ``{"name": ..., "parameters": {...}}`` (what Llama 4's template asks for).

``required`` and a named function constrain the whole answer to calls; ``auto`` allows free text, then calls
constrained once their start marker is written (a Lark grammar: text that cannot hold the marker, then optional
calls); ``none`` constrains nothing. Arguments follow each function's ``parameters`` schema (llguidance's JSON
schema for JSON and pythonic values; Gemma 4's own syntax through ``gemma4_value``, which supports the common
keywords and refuses others).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import uuid
from typing import Any, Iterable

from omnijax.common.errors import ConstraintError

FORMATS = ("hermes", "prompt", "gemma4", "llama4")
CHOICES = ("auto", "none", "required")
MAX_TOOLS = 128
MAX_NAME = 64
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}\Z")
PY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
G4_QUOTE = '<|"|>'
# The keywords a Gemma 4 argument schema may use (its syntax is not JSON: omnijax writes its grammar itself).
G4_KEYWORDS = frozenset({"type", "properties", "required", "items", "enum", "const", "anyOf", "oneOf", "description",
                         "title", "default", "additionalProperties", "nullable", "examples", "$schema", "minItems",
                         "maxItems", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
                         "exclusiveMaximum", "multipleOf"})
NUMBER_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
START = {"hermes": "<tool_call>", "prompt": "<tool_call>", "gemma4": "<|tool_call>", "llama4": "<|python_start|>"}


class ToolError(ConstraintError):
    """Bad ``tools`` / ``tool_choice``: ``param`` names the field."""

    def __init__(self, message: str, param: str):
        super().__init__(f"{param}: {message}")
        self.param = param


@dataclasses.dataclass(frozen=True)
class Tool:
    """One function the model may call: its name, description and parameters' JSON schema (an object schema)."""

    name: str
    description: str
    parameters: dict

    def as_openai(self) -> dict:
        """The tool as chat templates take it (OpenAI's shape)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclasses.dataclass(frozen=True)
class ToolChoice:
    """``mode``: "auto", "none", "required" or "function" (then ``name``: the function that must be called)."""

    mode: str
    name: str | None = None


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """A call the model wrote: the function's name and its arguments as JSON text."""

    name: str
    arguments: str
    id: str = dataclasses.field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


# ---- the request ---------------------------------------------------------------------------------------------

def read_tools(value: Any, where: str = "tools") -> list[Tool]:
    """OpenAI's ``tools`` (a list of ``{"type": "function", "function": {"name", "description", "parameters"}}``)
    checked; ToolError naming the first bad field. A schema llguidance cannot compile is refused by
    ``call_grammar``'s caller (``Grammars.check``)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ToolError(f"must be a list of tools, got {type(value).__name__}", where)
    if len(value) > MAX_TOOLS:
        raise ToolError(f"holds {len(value)} tools; at most {MAX_TOOLS} are accepted", where)
    tools, seen = [], set()
    for i, tool in enumerate(value):
        path = f"{where}[{i}]"
        if not isinstance(tool, dict):
            raise ToolError("must be an object", path)
        if tool.get("type", "function") != "function":
            raise ToolError(f"type must be 'function', got {str(tool.get('type'))[:50]!r}", f"{path}.type")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise ToolError("needs 'function': {'name': ..., 'parameters': {...}}", f"{path}.function")
        name = function.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise ToolError(f"a function needs a name of letters, digits, '_', '.' or '-' (at most {MAX_NAME}, "
                            f"starting with a letter or '_'), got {str(name)[:80]!r}", f"{path}.function.name")
        if name in seen:
            raise ToolError(f"the function {name!r} is declared twice", f"{path}.function.name")
        seen.add(name)
        description = function.get("description", "")
        if description is None:
            description = ""
        if not isinstance(description, str):
            raise ToolError("must be a string", f"{path}.function.description")
        parameters = function.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
            raise ToolError("must be a JSON schema of type 'object'", f"{path}.function.parameters")
        if function.get("strict") not in (None, True, False):
            raise ToolError("must be a boolean", f"{path}.function.strict")
        tools.append(Tool(name, description, parameters))
    return tools


def read_tool_choice(value: Any, tools: list[Tool], where: str = "tool_choice") -> ToolChoice:
    """OpenAI's ``tool_choice``: "auto" (the default with tools), "none" (the default without), "required", or
    ``{"type": "function", "function": {"name": ...}}``; ToolError when malformed or naming an unknown function."""
    if value is None:
        return ToolChoice("auto" if tools else "none")
    if isinstance(value, str):
        if value not in CHOICES:
            raise ToolError(f"must be one of {', '.join(CHOICES)} or a function, got {value[:50]!r}", where)
        if value == "required" and not tools:
            raise ToolError("'required' needs 'tools'", where)
        return ToolChoice(value)
    if not isinstance(value, dict) or value.get("type") != "function" or not isinstance(value.get("function"), dict):
        raise ToolError("must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}",
                        where)
    name = value["function"].get("name")
    if not any(t.name == name for t in tools):
        raise ToolError(f"names the function {str(name)[:80]!r}, which 'tools' does not declare",
                        f"{where}.function.name")
    return ToolChoice("function", name)


def check_schemas(tools: list[Tool]) -> None:
    """ToolError naming ``tools[i].function.parameters`` when llguidance cannot compile a tool's schema."""
    from omnijax.app import grammar

    for i, tool in enumerate(tools):
        where = f"tools[{i}].function.parameters"
        try:
            grammar.validate(grammar.json_schema(tool.parameters, tool.name, where=where), where)
        except ToolError:
            raise
        except ConstraintError as e:
            raise ToolError(str(e).split(": ", 1)[-1], where) from None


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
    check_schemas(read)
    grammar_text = call_grammar(fmt, read, choice, parallel_tool_calls, special_ids)
    return ToolRequest(tuple(read), choice, parallel_tool_calls, fmt, grammar_text)


# ---- format -> grammar ---------------------------------------------------------------------------------------

def _lit(text: str) -> str:
    return json.dumps(text)


def _marker(text: str, special_ids: dict[str, int]) -> str:
    """A marker in a grammar: the special token by id where the tokenizer has it as one, else its text."""
    return f"<[{special_ids[text]}]>" if text in special_ids else _lit(text)


def _json_rule(schema: Any) -> str:
    """``%json`` of ``schema`` with the one-line layout of app/grammar.py."""
    schema = dict(schema) if isinstance(schema, dict) else {}
    schema.setdefault("x-guidance", JSON_OPTIONS)
    return "%json " + json.dumps(schema)


class _Rules:
    """Named Lark rules under construction."""

    def __init__(self):
        self.lines: list[str] = []
        self.count = 0

    def add(self, body: str, prefix: str = "r") -> str:
        self.count += 1
        name = f"{prefix}_{self.count}"
        self.lines.append(f"{name}: {body}")
        return name


def _members(rules: _Rules, items: list[tuple[str, bool]], sep: str) -> str | None:
    """The expression of ``items`` (expression, required) in order, separated by ``sep``, the optional ones may be
    left out: a rule per (position, whether one was written). None: an empty sequence."""
    memo: dict[tuple[int, bool], str | None] = {}

    def rest(i: int, first: bool) -> str | None:
        if i == len(items):
            return None
        if (i, first) in memo:
            return memo[(i, first)]
        expr, required = items[i]
        item = expr if first else f"{sep} {expr}"
        after = rest(i + 1, False)
        taken = item if after is None else f"{item} {after}"
        if required:
            body = taken
        else:
            skipped = rest(i + 1, first)
            body = f"({taken})?" if skipped is None else f"({taken}) | {skipped}"
        memo[(i, first)] = rules.add(body, "m")
        return memo[(i, first)]

    return rest(0, True)


def _g4_any(rules: _Rules, quote: str) -> str:
    """The rules every Gemma 4 grammar shares: any value (``g4_any``), a string, numbers, keys. String text can
    never hold the quote when it is a token of its own; written as text, it is excluded."""
    if not any(line.startswith("g4_any:") for line in rules.lines):
        text = "/(?s:.+)/" if quote.startswith("<[") else f"/(?s:.+)/ & ~/(?s:.*){re.escape(G4_QUOTE)}(?s:.*)/"
        rules.lines += [
            f"g4_any: g4_str | G4_NUM | \"true\" | \"false\" | \"null\" | \"[\" (g4_any (\",\" g4_any)*)? \"]\" "
            f"| \"{{\" (G4_KEY \":\" g4_any (\",\" G4_KEY \":\" g4_any)*)? \"}}\"",
            f"g4_str: {quote} G4_TEXT? {quote}",
            f"G4_TEXT: {text}",
            "G4_NUM: /-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?/",
            "G4_INT: /-?(0|[1-9][0-9]*)/",
            "G4_KEY: /[A-Za-z_][A-Za-z0-9_]*/",
        ]
    return "g4_any"


def gemma4_value(schema: Any, rules: _Rules, quote: str, where: str) -> str:
    """A grammar expression for a value of ``schema`` written as Gemma 4's chat template writes arguments (strings
    between ``quote``, bare keys in sorted order, no spaces); ToolError (naming ``where``) for a keyword it does
    not support."""
    _g4_any(rules, quote)
    if schema is True or schema == {}:
        return "g4_any"
    if not isinstance(schema, dict):
        raise ToolError("a schema must be an object", where)
    unknown = sorted(set(schema) - G4_KEYWORDS)
    if unknown:
        raise ToolError(f"the keyword {unknown[0]!r} is not supported in Gemma 4's tool-call syntax (supported: "
                        f"{', '.join(sorted(G4_KEYWORDS))})", where)
    if "const" in schema or "enum" in schema:
        options = [schema["const"]] if "const" in schema else schema["enum"]
        if not isinstance(options, list) or not options:
            raise ToolError("'enum' must be a non-empty list", where)
        return "(" + " | ".join(_g4_literal(v, quote) for v in options) + ")"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            if not isinstance(schema[key], list) or not schema[key]:
                raise ToolError(f"'{key}' must be a non-empty list", where)
            return "(" + " | ".join(gemma4_value(s, rules, quote, f"{where}.{key}[{i}]")
                                    for i, s in enumerate(schema[key])) + ")"
    kind = schema.get("type")
    if isinstance(kind, list):
        return "(" + " | ".join(gemma4_value({**schema, "type": k}, rules, quote, where) for k in kind) + ")"
    expr = {"string": "g4_str", "integer": "G4_INT", "number": "G4_NUM", "boolean": '("true" | "false")',
            "null": '"null"'}.get(kind)
    if kind in ("integer", "number") and any(k in schema for k in NUMBER_KEYWORDS):
        expr = rules.add(_json_rule({k: schema[k] for k in ("type", *NUMBER_KEYWORDS) if k in schema}), "g4")
    if kind == "string" and ("minLength" in schema or "maxLength" in schema):
        low, high = _bounds(schema, "minLength", "maxLength", where)
        if high == 0:
            return f"{quote} {quote}"
        bounded = f"/(?s:.{{{max(low, 1)},{'' if high is None else high}}})/"
        if not quote.startswith("<["):  # the quote written as text: not inside a string
            bounded += f" & ~/(?s:.*){re.escape(G4_QUOTE)}(?s:.*)/"
        text = rules.add(bounded, "G4_TEXT")  # a terminal (an upper-case name)
        expr = rules.add(f"{quote} {text} {quote}" if low > 0 else f"{quote} {text}? {quote}", "g4")
    if expr is None and kind == "array":
        item = gemma4_value(schema.get("items", {}), rules, quote, f"{where}.items")
        low, high = _bounds(schema, "minItems", "maxItems", where)
        if high == 0:
            expr = '"[" "]"'
        else:
            rest = f'("," {item}){{{max(low - 1, 0)},{"" if high is None else high - 1}}}'
            body = f"{item} {rest}"
            expr = rules.add(f'"[" {body} "]"' if low > 0 else f'"[" ({body})? "]"', "g4")
    elif expr is None and kind == "object":
        props = schema.get("properties", {})
        required = schema.get("required", [])
        if not isinstance(props, dict) or not isinstance(required, list):
            raise ToolError("'properties' must be an object and 'required' a list", where)
        if not props and schema.get("additionalProperties") is not False:
            return "g4_any"
        for key in props:
            if not PY_NAME.match(key):
                raise ToolError(f"the property name {key[:60]!r} cannot be written as a bare key", where)
        items = [(f'"{key}:" {gemma4_value(props[key], rules, quote, f"{where}.properties.{key}")}', key in required)
                 for key in sorted(props)]
        inner = _members(rules, items, '","')
        expr = rules.add(f'"{{" {inner or ""} "}}"', "g4")
    elif expr is None:
        if kind is not None:
            raise ToolError(f"type {str(kind)[:40]!r} is not a JSON schema type", where)
        return "g4_any"
    if schema.get("nullable"):
        expr = f'({expr} | "null")'
    return expr


def _bounds(schema: dict, low_key: str, high_key: str, where: str) -> tuple[int, int | None]:
    low, high = schema.get(low_key, 0), schema.get(high_key)
    if not isinstance(low, int) or isinstance(low, bool) or low < 0 or high is not None and (
            not isinstance(high, int) or isinstance(high, bool) or high < low):
        raise ToolError(f"'{low_key}' / '{high_key}' must be integers with {low_key} <= {high_key}", where)
    return low, high


def _g4_literal(value: Any, quote: str) -> str:
    """A constant in Gemma 4's syntax, as a grammar expression."""
    if isinstance(value, str):
        return f"{quote} {_lit(value)} {quote}" if value else f"{quote} {quote}"
    return _lit(gemma4_text(value, quote_text=""))


def gemma4_text(value: Any, quote_text: str = G4_QUOTE) -> str:
    """``value`` written as Gemma 4's chat template writes an argument (``format_argument`` with bare keys)."""
    if isinstance(value, str):
        return quote_text + value + quote_text
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{gemma4_text(v, quote_text)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(gemma4_text(v, quote_text) for v in value) + "]"
    return json.dumps(value)


def _pythonic_args(tool: Tool, rules: _Rules, where: str) -> str | None:
    """Keyword arguments ``a=<json>, b=<json>`` of ``tool`` in its properties' order, the required ones present."""
    props = tool.parameters.get("properties") or {}
    required = tool.parameters.get("required") or []
    if not isinstance(props, dict) or not isinstance(required, list):
        raise ToolError("'properties' must be an object and 'required' a list", where)
    if not props:
        return None
    for key in props:
        if not PY_NAME.match(key):
            raise ToolError(f"the property name {key[:60]!r} cannot be a Python keyword argument", where)
    items = [(f'"{key}=" {rules.add(_json_rule(props[key]), "v")}', key in required) for key in props]
    return _members(rules, items, '", "')


def _call_body(fmt: str, tool: Tool, rules: _Rules, special_ids: dict[str, int], where: str) -> str:
    """The grammar rule of one call of ``tool`` in ``fmt``, after its start marker (hermes, prompt, gemma4) or the
    whole call (llama4: ``name(a=1)``)."""
    if fmt in ("hermes", "prompt"):
        args = rules.add(_json_rule(tool.parameters), "args")
        head = "\n{" + json.dumps("name") + ": " + json.dumps(tool.name) + ", " + json.dumps("arguments") + ": "
        return rules.add(f'{_lit(head)} {args} {_lit("}" + chr(10))} {_marker("</tool_call>", special_ids)}', "call")
    if fmt == "gemma4":
        quote = _marker(G4_QUOTE, special_ids)
        args = gemma4_value(tool.parameters, rules, quote, f"{where}.function.parameters")
        return rules.add(f'{_lit("call:" + tool.name)} {args} {_marker("<tool_call|>", special_ids)}', "call")
    if fmt == "llama4":
        if not PY_NAME.match(tool.name):
            raise ToolError(f"{tool.name!r} cannot be called in Llama 4's pythonic calls (letters, digits and '_')",
                            f"{where}.function.name")
        args = _pythonic_args(tool, rules, f"{where}.function.parameters")
        return rules.add(f'{_lit(tool.name + "(")} {args or ""} ")"', "call")
    raise ValueError(f"unknown tool-call format {fmt!r}")


def call_grammar(fmt: str, tools: list[Tool], choice: ToolChoice, parallel: bool = True,
                 special_ids: dict[str, int] | None = None) -> str | None:
    """The Lark grammar (llguidance's dialect) an answer with tools follows in ``fmt``, or None (``none``: free).
    ``required``: one call or more (one with ``parallel`` false); a named function: one call of it; ``auto``: free
    text that does not hold the call's start marker, then optional calls (once the marker is written, the call
    follows the grammar). ``special_ids``: marker text -> token id for the markers the tokenizer has as tokens of
    their own (added tokens): those are written by id (free text can never hold them)."""
    if choice.mode == "none" or not tools:
        return None
    special_ids = special_ids or {}
    offered = [(i, t) for i, t in enumerate(tools) if choice.mode != "function" or t.name == choice.name]
    rules = _Rules()
    bodies = rules.add(" | ".join(_call_body(fmt, t, rules, special_ids, f"tools[{i}]") for i, t in offered), "one")
    many = parallel and choice.mode != "function"
    auto = choice.mode == "auto"
    start = START[fmt]
    if fmt == "llama4":
        block = rules.add(f'"[" {bodies} ("," " " {bodies})* "]"' if many else f'"[" {bodies} "]"', "block")
        if auto:
            block = rules.add(f'{_marker(start, special_ids)} {block} {_marker("<|python_end|>", special_ids)}',
                              "block")
        lead = None
    else:
        one = rules.add(f"{_marker(start, special_ids)} {bodies}", "call")
        sep = "" if fmt == "gemma4" else f"{_lit(chr(10))} "
        more = f" ({sep}{one})*" if many else ""
        block = rules.add(f"{one}{more}", "block")
        lead = None if start in special_ids else rules.add(f"{bodies}{more}", "rest")
    if not auto:
        return "\n".join([f"start: {block}", *rules.lines])
    if start in special_ids:  # free text can never hold a token of its own
        return "\n".join([f"start: FREE | FREE? {block}", "FREE: /(?s:.+)/", *rules.lines])
    escaped = re.escape(start)
    if lead is None:  # a text marker that is not the first thing of the call
        raise ValueError(f"{fmt}: the start marker {start!r} must be a token of its own")
    return "\n".join([f"start: FREE | head {lead}", f"FREE: /(?s:.*)/ & ~/(?s:.*){escaped}(?s:.*)/",
                       f"head[lazy]: /(?s:.*){escaped}/", *rules.lines])


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
    return json.dumps(value, ensure_ascii=False)


def _hermes_calls(raw: str) -> tuple[int, list[ToolCall]] | None:
    calls, first = [], None
    pos = 0
    while (start := raw.find("<tool_call>", pos)) >= 0:
        end = raw.find("</tool_call>", start)
        if end < 0:
            break
        try:
            obj = json.loads(raw[start + len("<tool_call>"):end].strip())
        except ValueError:
            break
        args = _arguments(obj.get("arguments", obj.get("parameters", {}))) if isinstance(obj, dict) else None
        if args is None or not isinstance(obj.get("name"), str):
            break
        calls.append(ToolCall(obj["name"], args))
        first = start if first is None else first
        pos = end + len("</tool_call>")
    return (first, calls) if calls else None


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
        calls.append(ToolCall(match.group(1), json.dumps(args, ensure_ascii=False)))
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
    return ast.literal_eval(node)


def _pythonic(segment: str) -> list[ToolCall] | None:
    try:
        tree = ast.parse(segment.strip(), mode="eval").body
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
            args = {k.arg: _py_value(k.value) for k in call.keywords}
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return None
        calls.append(ToolCall(call.func.id, json.dumps(args, ensure_ascii=False)))
    return calls


def _json_calls(raw: str, start: int) -> list[ToolCall] | None:
    """JSON calls ``{"name": ..., "parameters" | "arguments": {...}}`` from ``start`` on (separated by white space
    or ';'; what follows the last one is not read)."""
    decoder, calls, pos = json.JSONDecoder(), [], start
    while pos < len(raw):
        try:
            obj, pos = decoder.raw_decode(raw, pos)
        except (ValueError, RecursionError):
            break
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            break
        args = _arguments(obj.get("parameters", obj.get("arguments", {})))
        if args is None:
            break
        calls.append(ToolCall(obj["name"], args))
        while pos < len(raw) and (raw[pos].isspace() or raw[pos] == ";"):
            pos += 1
    return calls or None


def _llama4_calls(raw: str) -> tuple[int, list[ToolCall]] | None:
    text = raw
    end_marker = text.find("<|python_end|>")
    if end_marker >= 0:
        text = text[:end_marker]
    marker = text.find("<|python_start|>")
    ends = [i for i, c in enumerate(text) if c == "]"][::-1][:64]
    for start in [i for i, c in enumerate(text) if c in "[{"][:64]:
        if text[start] == "{":
            calls = _json_calls(text, start)
        else:
            calls = next((c for end in ends if end > start and (c := _pythonic(text[start:end + 1]))), None)
        if calls:
            head = marker if 0 <= marker < start and not text[marker + 16:start].strip() else start
            return head, calls
    return None


# ---- streaming -----------------------------------------------------------------------------------------------

class CallStream:
    """A streamed answer with tools, read as it grows: ``update(raw)`` with the whole raw text so far (special tokens
    included) gives (content delta, new calls): content is sent once it cannot turn into a call (a possible call
    start and trailing white space wait), each call once it is complete. ``finish(raw)`` gives the rest, read as
    ``parse_calls`` reads the whole answer (so the deltas join into the non-streamed answer)."""

    def __init__(self, fmt: str, specials: Iterable[str] = ()):
        self.fmt = fmt
        self.specials = tuple(specials)
        self.markers = [START[fmt]] + (["[", "{"] if fmt == "llama4" else [])
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
        if cut == len(raw):
            return self._content(strip_specials(raw, self.specials).rstrip()), []
        tail = raw.rstrip()
        if self.fmt == "llama4" and not tail.endswith(("]", "}", "<|python_end|>")):
            return self._content(strip_specials(raw[:cut], self.specials).rstrip()), []
        content, calls = parse_calls(self.fmt, raw, self.specials)
        if not calls:
            return self._content(strip_specials(raw[:cut], self.specials).rstrip()), []
        return self._content(content), self._new_calls(calls)

    def finish(self, raw: str) -> tuple[str, list[ToolCall]]:
        content, calls = parse_calls(self.fmt, raw, self.specials)
        return self._content(content), self._new_calls(calls)
