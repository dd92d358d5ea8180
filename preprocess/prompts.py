"""Chat messages -> prompt text: normalising content parts, collecting media, rendering the chat template."""

from __future__ import annotations

import json
from typing import Any

from omnijax.common.errors import PromptError
from omnijax.preprocess.chat_template import render_chat_template
from omnijax.preprocess.user_text import mark, protected_pattern, spells_special_token, unmark
from omnijax.preprocess.video_source import check_video_part

MEDIA_TYPES = ("image", "audio", "video")
# The roles every family's chat template knows; a family's processor states its own set (``Processor.roles``).
DEFAULT_ROLES = ("system", "user", "assistant")
MAX_MESSAGES = 4096  # messages of one conversation
MAX_PARTS = 16384  # content parts of one conversation, all messages together


def _role(message: dict, i: int, roles: tuple[str, ...]) -> str:
    role = message["role"]
    if not isinstance(role, str) or role not in roles:
        shown = repr(role) if len(repr(role)) <= 60 else repr(role)[:57] + "..."
        raise PromptError(f"message {i} has role {shown}; this checkpoint's chat template takes the roles "
                          f"{', '.join(roles)}")
    return role


def normalize_messages(messages: Any, roles: tuple[str, ...] = DEFAULT_ROLES) -> list[dict]:
    """Validate transformers-style chat messages; string content becomes one text part.

    Every role must be one of ``roles`` (a role is written into the prompt as it is: anything else could forge a
    turn). Returns new message dicts whose content is a list of parts {"type": "text", "text": str} or
    {"type": "image"|"audio"|"video", ...}: a text part keeps only its text; video parts are checked by
    ``preprocess.video_source.check_video_part``.
    """
    if not isinstance(messages, (list, tuple)) or not messages:
        raise PromptError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    if len(messages) > MAX_MESSAGES:
        raise PromptError(f"the conversation has {len(messages)} messages; at most {MAX_MESSAGES} are accepted")
    out = []
    count = 0
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message and \
                not message.get("tool_calls"):
            raise PromptError(f"message {i} must be a dict with 'role' and 'content'")
        role = _role(message, i, roles)
        extras = _tool_fields(message, i)
        content = message.get("content")
        if content is None and extras.get("tool_calls"):
            content = []
        count += len(content) if isinstance(content, (list, tuple)) else 1
        if count > MAX_PARTS:
            raise PromptError(f"the conversation has more than {MAX_PARTS} content parts; at most {MAX_PARTS} are "
                              f"accepted")
        if isinstance(content, str):
            parts = [{"type": "text", "text": content}]
        elif isinstance(content, (list, tuple)):
            parts = []
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text":
                    if not isinstance(part.get("text"), str):
                        raise PromptError(f"message {i} part {j}: a text part needs a string 'text'")
                    parts.append({"type": "text", "text": part["text"]})
                    continue
                elif kind == "video":
                    check_video_part(part, f"message {i} part {j}")
                elif kind in MEDIA_TYPES:
                    if part.get(kind) is None and part.get("path") is None and part.get("url") is None:
                        raise PromptError(f"message {i} part {j}: an {kind} part needs its {kind!r} value")
                else:
                    raise PromptError(f"message {i} part {j}: unknown content type {kind!r} "
                                      f"(expected 'text', 'image', 'audio' or 'video')")
                parts.append(dict(part))
        else:
            raise PromptError(f"message {i}: content must be a string or a list of parts")
        out.append({"role": role, "content": parts, **extras})
    return out


def _tool_fields(message: dict, i: int) -> dict:
    """The tool fields of a message as chat templates read them: an assistant message's ``tool_calls`` (OpenAI's
    ``{"id", "type", "function": {"name", "arguments"}}``, arguments given as JSON text parsed into an object, as
    the templates write them), a tool message's ``tool_call_id`` and ``name``."""
    out: dict = {}
    calls = message.get("tool_calls")
    if calls:
        if not isinstance(calls, (list, tuple)):
            raise PromptError(f"message {i}: tool_calls must be a list")
        out["tool_calls"] = []
        for j, call in enumerate(calls):
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise PromptError(f"message {i} tool call {j}: needs 'function': {{'name': ..., 'arguments': ...}}")
            arguments = function.get("arguments", {})
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments) if arguments.strip() else {}
                except ValueError:
                    raise PromptError(f"message {i} tool call {j}: arguments are not valid JSON") from None
            if not isinstance(arguments, dict):
                raise PromptError(f"message {i} tool call {j}: arguments must be a JSON object")
            entry = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
            if isinstance(call.get("id"), str):
                entry["id"] = call["id"]
            out["tool_calls"].append(entry)
    for key in ("tool_call_id", "name"):
        if isinstance(message.get(key), str):
            out[key] = message[key]
    return out


def tool_texts(messages: list[dict], tools: list[dict] | None) -> list[str]:
    """The text of the tool declarations and calls that templates write as they are (not escaped): checked for
    special-token spellings by ``render_chat``."""
    texts: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            texts.append(value)
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(k)
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)

    walk(tools or [])
    for m in messages:
        walk([m.get(k) for k in ("tool_calls", "tool_call_id", "name") if k in m])
    return texts


def media_of(messages: list[dict], kind: str) -> list[Any]:
    """The media values of one kind in order of appearance (the part's value, or its 'path')."""
    found = []
    for message in messages:
        for part in message["content"]:
            if part["type"] == kind:
                found.append(part.get(kind) if part.get(kind) is not None else part.get("path", part.get("url")))
    return found


def template_messages(messages: list[dict], text=lambda t: t, flat: bool = False) -> list[dict]:
    """Messages as the chat template sees them: media parts reduced to their type (the template emits markers), text
    parts through ``text``; a tool message's text as one string (the templates write a tool result's content as
    given: Llama 4's as JSON), and with ``flat`` (a prompt with tools) every text-only message's (Llama 4's
    template writes the first user message's content as it is when it declares tools there)."""
    out = []
    for m in messages:
        parts = [dict(p, text=text(p["text"])) if p["type"] == "text" else {"type": p["type"]} for p in m["content"]]
        if (flat or m["role"] == "tool") and all(p["type"] == "text" for p in parts):
            out.append({**m, "content": "".join(p["text"] for p in parts)})
        else:
            out.append({**m, "content": parts})
    return out


NO_CHAT_TEMPLATE = ("this checkpoint has no chat template (a base model?): pass the prompt as plain text instead "
                    "of chat messages (pipe.generate(\"The capital of France is\"), or omnijax generate --raw)")


def render_chat(tokenizer, messages: list[dict], chat_template: str | None = None, tools: list[dict] | None = None
                ) -> str:
    """The prompt text for ``messages`` with the generation prompt appended, its user-supplied text marked so that
    it never becomes special tokens: tokenize it with ``preprocess.user_text.encode_prompt`` (which removes the
    marks; ``unmark`` gives the plain text). Raises PromptError when the tokenizer has no chat template (raw text
    is the way to prompt such a model), when the template rejects the messages, or when it changes user text in a
    way the marks cannot follow and that text spells a special token. ``tools``: OpenAI's tool dicts, given to the
    template as ``tools`` (their text, and that of tool calls, must not spell a special token)."""
    if not (chat_template or getattr(tokenizer, "chat_template", None)):
        raise PromptError(NO_CHAT_TEMPLATE)
    pattern = protected_pattern(tokenizer)
    found = next((f for t in tool_texts(messages, tools) if (f := spells_special_token([t], pattern))), None)
    if found is not None:
        raise PromptError(f"the tools or tool calls contain the special token text {found!r}; remove it")
    plain = _render(tokenizer, template_messages(messages, flat=bool(tools)), chat_template, tools)
    marked_messages = template_messages(messages, lambda t: mark(t, pattern), flat=bool(tools))
    try:
        marked = _render(tokenizer, marked_messages, chat_template, tools)
        if unmark(marked)[0] == plain:
            return marked
    except PromptError:
        pass
    for i, message in enumerate(messages):  # a template the marks cannot follow: refuse what they would escape
        found = spells_special_token([p["text"] for p in message["content"] if p["type"] == "text"], pattern)
        if found is not None:
            raise PromptError(f"message {i} contains the special token text {found!r}, which this checkpoint's "
                              f"chat template does not let omnijax escape; remove it")
    return plain


def _render(tokenizer, messages: list[dict], chat_template: str | None, tools: list[dict] | None = None) -> str:
    """The chat template rendered as ``tokenizer.apply_chat_template(messages, tools=tools,
    add_generation_prompt=True, tokenize=False)`` renders it (the same variables: the messages, the tokenizer's
    special tokens, the tools, no documents), in the bounded sandbox of preprocess/chat_template.py."""
    try:
        source = tokenizer.get_chat_template(chat_template)
    except ValueError as e:
        raise PromptError(f"no chat template to use: {e}") from e
    variables = {**tokenizer.special_tokens_map, "messages": messages, "tools": tools or None, "documents": None,
                 "add_generation_prompt": True}
    return render_chat_template(source, variables)
