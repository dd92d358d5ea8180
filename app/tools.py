"""The functions a request offers the model: OpenAI's ``tools`` / ``tool_choice`` read and checked (small pure
functions; ToolError names the bad field), and the facts of each family's call format that the grammar
(app/tool_grammar.py) and the parser (app/tool_calls.py) share.

    tools = read_tools(body["tools"])                            # [Tool]; ToolError (param: the field) when bad
    choice = read_tool_choice(body.get("tool_choice"), tools)    # ToolChoice("auto" | "none" | "required" | "function")

A format is the name a family's processor states (``Processor.tool_format``, chosen by the checkpoint's family):

- ``hermes`` (Qwen3-Omni): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, calls one a line;
- ``prompt`` (Gemma 3 and any template without tool support): the same markup written as plain text, taught by a
  system message (preprocess/tool_prompt.py);
- ``gemma4``: ``<|tool_call>call:name{key:<|"|>text<|"|>,n:42}<tool_call|>`` (bare keys, ``<|"|>`` around
  strings, keys in sorted order as the chat template writes them);
- ``llama4``: pythonic ``[f(a=1), g(b="x")]`` (in ``auto`` inside ``<|python_start|>`` .. ``<|python_end|>``); the
  parser also takes JSON calls ``{"name": ..., "parameters": {...}}`` (what Llama 4's template asks for).
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from typing import Any

from omnijax.common.errors import ConstraintError

FORMATS = ("hermes", "prompt", "gemma4", "llama4")
CHOICES = ("auto", "none", "required")
MAX_TOOLS = 128
MAX_NAME = 64
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}\Z")
PY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
G4_QUOTE = '<|"|>'
START = {"hermes": "<tool_call>", "prompt": "<tool_call>", "gemma4": "<|tool_call>", "llama4": "<|python_start|>"}
# Formats whose calls may also be the whole answer without the start marker: the characters such an answer opens with.
BARE_OPENERS = {"llama4": ("[", "{")}
# Formats whose calls end without a closing marker of their own: what a complete call's text ends with (a streamed
# answer is read for calls only when it ends so).
CALL_ENDS = {"llama4": ("]", "}", "<|python_end|>")}


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
