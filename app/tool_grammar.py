"""Each family's tool-call format as an llguidance grammar (Lark with inline JSON schemas):

    text = call_grammar("hermes", tools, choice, parallel=True)  # the Lark grammar of the answer (None: no constraint)

``required`` and a named function constrain the whole answer to calls; ``auto`` allows free text, then calls
constrained once their start marker is written (a Lark grammar: text that cannot hold the marker, then optional
calls); ``none`` constrains nothing. Arguments follow each function's ``parameters`` schema (llguidance's JSON
schema for JSON and pythonic values; Gemma 4's own syntax through ``gemma4_value``, which supports the common
keywords and refuses others). The formats are app/tools.py's.
"""

from __future__ import annotations

import json
import re
from typing import Any

from omnijax.app.tools import G4_QUOTE, PY_NAME, START, Tool, ToolChoice, ToolError

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# The keywords a Gemma 4 argument schema may use (its syntax is not JSON: omnijax writes its grammar itself).
G4_KEYWORDS = frozenset({"type", "properties", "required", "items", "enum", "const", "anyOf", "oneOf", "description",
                         "title", "default", "additionalProperties", "nullable", "examples", "$schema", "minItems",
                         "maxItems", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
                         "exclusiveMaximum", "multipleOf"})
NUMBER_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


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
            "g4_any: g4_str | G4_NUM | \"true\" | \"false\" | \"null\" | \"[\" (g4_any (\",\" g4_any)*)? \"]\" "
            "| \"{\" (G4_KEY \":\" g4_any (\",\" G4_KEY \":\" g4_any)*)? \"}\"",
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
        if any(isinstance(v, (list, dict)) for v in options):
            raise ToolError("Gemma 4's tool-call syntax takes 'enum' / 'const' values that are strings, numbers, "
                            "booleans or null", where)
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
