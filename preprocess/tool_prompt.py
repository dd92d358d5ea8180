"""The prompt format for tools on a chat template without tool support (Gemma 3): the conversation is rewritten
into plain messages before the template renders it.

- the tools go into the system message (after its own text, which the Gemma 3 template puts at the head of the
  first user turn): ``TOOLS_HEADER``, each function (name, description, parameters) as one line of compact JSON
  within ``<tools></tools>``, then how to call (``TOOLS_FOOTER``);
- an assistant message's ``tool_calls`` become text after its content, one call per line:
  ``<tool_call>\\n{"name": "get_weather", "arguments": {"city": "Paris"}}\\n</tool_call>``
  (the format the answer is constrained to: app/tools.py's ``prompt``);
- ``tool`` messages become a user message (consecutive ones one message), each result as
  ``<tool_response>\\n{content}\\n</tool_response>``.

All of it is text the model reads as text (user text is escaped as always: it cannot spell a special token).
"""

from __future__ import annotations

import json
from typing import Any

TOOLS_HEADER = "You may call these functions (one JSON object a line):\n<tools>\n"
TOOLS_FOOTER = ("\n</tools>\nTo call them, answer with one call per block:\n<tool_call>\n{\"name\": <function-name>, "
                "\"arguments\": <arguments-json-object>}\n</tool_call>\nResults come back in <tool_response> blocks.")


def tools_text(tools: list[dict]) -> str:
    """The system text declaring ``tools`` (OpenAI's tool dicts; each function's object, compact JSON)."""
    lines = [json.dumps(t.get("function", t) if isinstance(t, dict) else t, ensure_ascii=False,
                        separators=(",", ":")) for t in tools]
    return TOOLS_HEADER + "\n".join(lines) + TOOLS_FOOTER


def call_text(call: dict) -> str:
    """One ``tool_calls`` entry as the text the model writes for it."""
    function = call.get("function", call) if isinstance(call, dict) else {}
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    return ("<tool_call>\n" + json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)
            + "\n</tool_call>")


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return json.dumps(content, ensure_ascii=False)


def rewrite(messages: list, tools: list[dict] | None) -> list:
    """``messages`` in the prompt format: tools declared in the system message, calls and results as text."""
    if not isinstance(messages, (list, tuple)):
        return messages
    out: list = []
    if tools:
        declared = tools_text(tools)
        first = messages[0] if messages else None
        if isinstance(first, dict) and first.get("role") == "system":
            own = _text(first.get("content"))
            out.append({"role": "system", "content": (own + "\n\n" if own else "") + declared})
            messages = messages[1:]
        else:
            out.append({"role": "system", "content": declared})
    for message in messages:
        if not isinstance(message, dict):
            out.append(message)
            continue
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            calls = message["tool_calls"] if isinstance(message["tool_calls"], list) else []
            own = _text(message.get("content"))
            text = "\n".join(([own] if own else []) + [call_text(c) for c in calls])
            out.append({"role": "assistant", "content": text})
        elif role == "tool":
            result = "<tool_response>\n" + _text(message.get("content")) + "\n</tool_response>"
            if out and out[-1].get("role") == "user" and out[-1].get("_tool"):
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + result}
            else:
                out.append({"role": "user", "content": result, "_tool": True})
        else:
            out.append(message)
    return [{k: v for k, v in m.items() if k != "_tool"} if isinstance(m, dict) else m for m in out]
