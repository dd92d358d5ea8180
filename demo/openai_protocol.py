"""The OpenAI HTTP API's request and response shapes, as plain functions over JSON objects.

Requests are checked field by field; anything this server does not do (the deprecated ``functions`` /
``function_call``, ``echo`` on chat) or a value out of range raises ``RequestError`` naming the field, which the
server answers with a 400 and OpenAI's error object.
Structured outputs: ``response_format`` (``json_object``, ``json_schema``, and the extensions ``regex``,
``choice`` and ``grammar``: app/grammar.py), or vLLM's ``guided_json`` / ``guided_regex`` / ``guided_choice`` /
``guided_grammar``; one whose grammar llguidance refuses is a 400 naming the field, before any work. Log
probabilities (chat: ``logprobs`` true and ``top_logprobs`` 0..20; completions: ``logprobs`` 0..5 and ``echo``; the
extension ``logprobs_mode``: "raw", the default, or "processed") and ``n`` (1..8 choices) are taken; their shapes
are demo/openai_logprobs.py's. Tool calls (chat): ``tools``, ``tool_choice`` and ``parallel_tool_calls`` are read
by app/tools.py (a bad tool, a schema llguidance refuses, an unknown function: a 400 naming the field);
``tool`` messages and assistant messages with ``tool_calls`` go to the chat template; an answer's calls come back as
``message.tool_calls`` with ``finish_reason`` "tool_calls".
Media parts arrive inline: ``image_url`` / ``video_url`` with a ``data:`` URL (remote ``http(s)`` URLs only when
the server allows them, never ``file:`` or another scheme) and ``input_audio`` with base64 data; ``media_parts``
turns them into the chat messages' media parts by writing each payload to a file of the request's own folder (the
media loaders then apply every size and format check they apply to files).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import math
import pathlib
import os
import re
import time
import urllib.parse
import uuid
from typing import Any, Callable

from omnijax.app import grammar
from omnijax.app import tools as tool_specs
from omnijax.app.token_logprobs import MODES
from omnijax.common.errors import ConstraintError, OmnijaxError

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
AUDIO_FORMATS = {"wav": ".wav", "mp3": ".mp3", "flac": ".flac", "ogg": ".ogg"}
IMAGE_TYPES = {"image/png": ".png", "image/jpeg": ".jpg", "image/jpg": ".jpg", "image/webp": ".webp",
               "image/gif": ".gif", "image/bmp": ".bmp"}
VIDEO_TYPES = {"video/mp4": ".mp4", "video/webm": ".webm", "video/quicktime": ".mov", "video/x-matroska": ".mkv",
               "video/x-msvideo": ".avi"}
UNSUPPORTED_FIELDS = ("functions", "function_call", "logit_bias", "best_of", "suffix", "prediction")
TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls")
GUIDED_FIELDS = {"guided_json": "json_schema", "guided_regex": "regex", "guided_choice": "choice",
                 "guided_grammar": "grammar"}  # vLLM's extensions -> the response_format type they mean
MAX_TOP_LOGPROBS = 20  # chat's top_logprobs, as OpenAI bounds it (the engine computes 20 per token)
MAX_COMPLETION_LOGPROBS = 5  # completions' logprobs, as OpenAI bounds it
LOGPROBS_MODES = MODES  # the ``logprobs_mode`` extension: the model's distribution ("raw", the default) or the one
# the token is drawn from, after temperature, top-k and top-p ("processed")
MAX_CHOICES = 8  # n
MAX_MESSAGES = 1024
MAX_PARTS = 256
MAX_STOPS = 32
DATA_URL = re.compile(r"data:([\w.+-]+/[\w.+-]+)?((?:;[\w-]+=[\w.+-]+)*)(;base64)?,", re.ASCII)


class RequestError(OmnijaxError, ValueError):
    """A request the API refuses: ``status`` (400, 404, 413, ...), ``param`` (the field) and OpenAI's error
    ``type`` / ``code``."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400,
                 type_: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.type, self.code = status, param, type_, code


def error_body(message: str, *, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a request asks of generation (checked by ``omnijax.app.sampling`` when the request is made)."""

    max_new_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    ignore_eos: bool = False  # an extension (as vLLM's): generate max_tokens tokens whatever the end ids
    logprobs: int | None = None  # None: none; else the alternatives shown per token
    logprobs_mode: str = "raw"  # an extension (as vLLM's --logprobs-mode, per request): "raw" or "processed"
    n: int = 1  # choices
    echo: bool = False  # completions: the prompt comes back before the answer (with logprobs: its tokens' too)
    constraint: grammar.Constraint | None = None  # response_format (or a guided_* field): a structured output
    tools: dict | None = None  # chat: {"tools", "tool_choice", "parallel_tool_calls"} as given (checked by
    # ``tools_of``), or None without tools


@dataclasses.dataclass(frozen=True)
class MediaRef:
    """One media payload: ``kind`` ("image", "audio", "video"), the bytes (or a remote URL, or a local ``file``
    inside the caller's media folder) and the file suffix its loader expects; ``path`` says where in the request it
    was (for errors)."""

    kind: str
    data: bytes | None
    url: str | None
    suffix: str
    path: str
    file: str | None = None


def _field(body: dict, name: str, kinds, default=None, *, where: str = ""):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise RequestError(f"'{where}{name}' must be {_kind_names(kinds)}, got a boolean", param=where + name)
    if not isinstance(value, kinds):
        raise RequestError(f"'{where}{name}' must be {_kind_names(kinds)}, got {type(value).__name__}",
                           param=where + name)
    return value


def _kind_names(kinds) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "a list",
             dict: "an object"}
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    return " or ".join(dict.fromkeys(names.get(k, k.__name__) for k in kinds))


def _number(body: dict, name: str, default: float) -> float:
    value = _field(body, name, (int, float), default)
    try:
        value = float(value)  # an integer beyond float's range (10**400 written out) overflows
    except OverflowError:
        value = math.inf
    if not math.isfinite(value):
        raise RequestError(f"'{name}' must be a finite number", param=name)
    return value


def settings_of(body: dict, *, chat: bool) -> Settings:
    """The generation settings of a chat or completions request body (ranges are checked when the request is
    made into sampling parameters)."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    for name in UNSUPPORTED_FIELDS:
        if body.get(name) not in (None, False, [], {}):
            raise RequestError(f"'{name}' is not supported by this server", param=name)
    constraint = constraint_of(body)
    n = _field(body, "n", int, 1)
    if not 1 <= n <= MAX_CHOICES:
        raise RequestError(f"'n' must be an integer in [1, {MAX_CHOICES}], got {n}", param="n")
    logprobs, echo = _logprobs_of(body, chat=chat)
    logprobs_mode = _field(body, "logprobs_mode", str, "raw")
    if logprobs_mode not in LOGPROBS_MODES:
        raise RequestError(f"'logprobs_mode' must be one of {', '.join(map(repr, LOGPROBS_MODES))}, got "
                           f"{logprobs_mode!r}"[:300], param="logprobs_mode")
    limit_name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_new = _field(body, limit_name, int)
    if max_new == 0 and not echo:  # echo with max_tokens 0: the prompt's log probabilities only
        raise RequestError(f"'{limit_name}' must be at least 1 (0 only with 'echo': true)", param=limit_name)
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        if len(stop) > MAX_STOPS:
            raise RequestError(f"'stop' takes at most {MAX_STOPS} strings", param="stop")
        stops = tuple(stop)
    else:
        raise RequestError("'stop' must be a string or a list of strings", param="stop")
    options = _field(body, "stream_options", dict, {})
    stream = _field(body, "stream", bool, False)
    if options and not stream:
        raise RequestError("'stream_options' is only allowed with 'stream': true", param="stream_options")
    seed = _field(body, "seed", int)
    tools = tools_of(body, chat=chat)
    if tools is not None and constraint is not None and tools["tool_choice"] != "none":
        raise RequestError("'response_format' and tool calls cannot both constrain an answer (use 'tool_choice': "
                           "'none' with a response_format)", param="response_format")
    return Settings(max_new_tokens=max_new, temperature=_number(body, "temperature", 1.0),
                    top_p=_number(body, "top_p", 1.0), top_k=_field(body, "top_k", int, 0), seed=seed,
                    stop=stops, stream=stream,
                    include_usage=bool(_field(options, "include_usage", bool, False, where="stream_options.")),
                    ignore_eos=_field(body, "ignore_eos", bool, False), logprobs=logprobs,
                    logprobs_mode=logprobs_mode, n=n, echo=echo, constraint=constraint, tools=tools)


def tools_of(body: dict, *, chat: bool) -> dict | None:
    """A chat body's ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` checked (app/tools.py: every tool
    named, its parameters a schema llguidance compiles, the choice one of them) before any work, or None without
    tools; RequestError naming the field."""
    given = {name: body.get(name) for name in TOOL_FIELDS if body.get(name) not in (None, [], {})}
    if not given:
        return None
    if not chat:
        raise RequestError(f"'{next(iter(given))}' is a chat parameter", param=next(iter(given)))
    try:
        read = tool_specs.read_tools(given.get("tools"))
        choice = tool_specs.read_tool_choice(given.get("tool_choice"), read)
        if not isinstance(given.get("parallel_tool_calls", True), bool):
            raise tool_specs.ToolError("must be a boolean", "parallel_tool_calls")
        tool_specs.check_schemas(read)
    except tool_specs.ToolError as e:
        raise RequestError(str(e), param=e.param) from None
    if not read:
        return None
    return {"tools": given["tools"], "tool_choice": given.get("tool_choice"),
            "parallel_tool_calls": given.get("parallel_tool_calls", True), "mode": choice.mode}


def constraint_of(body: dict) -> grammar.Constraint | None:
    """The structured output a body asks for: ``response_format``, or one of vLLM's ``guided_*`` fields (one at
    most); RequestError naming the field when it is malformed or llguidance refuses its grammar."""
    asked = [name for name in ("response_format", *GUIDED_FIELDS) if body.get(name) is not None]
    if len(asked) > 1:
        raise RequestError(f"ask for one structured output at most, got {', '.join(map(repr, asked))}",
                           param=asked[1])
    if not asked:
        return None
    name = asked[0]
    if name == "response_format":
        value = body[name]
    elif name == "guided_json":  # a schema (an object, or its JSON text)
        value = {"type": "json_schema", "json_schema": {"schema": body[name]}}
    else:
        value = {"type": GUIDED_FIELDS[name], GUIDED_FIELDS[name]: body[name]}
    try:
        return grammar.from_response_format(value, where=name)
    except ConstraintError as e:
        raise RequestError(str(e), param=name) from None


def _logprobs_of(body: dict, *, chat: bool) -> tuple[int | None, bool]:
    """(the alternatives shown per token, or None for no log probabilities; echo). Chat: ``logprobs`` a boolean,
    ``top_logprobs`` 0..20 with it. Completions: ``logprobs`` 0..5, ``echo`` a boolean."""
    if chat:
        if body.get("echo") not in (None, False):
            raise RequestError("'echo' is a /v1/completions parameter", param="echo")
        wanted = _field(body, "logprobs", bool, False)
        top = _field(body, "top_logprobs", int)
        if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
            raise RequestError(f"'top_logprobs' must be an integer in [0, {MAX_TOP_LOGPROBS}], got {top}",
                               param="top_logprobs")
        if top is not None and not wanted:
            raise RequestError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        return (top or 0) if wanted else None, False
    if body.get("top_logprobs") is not None:
        raise RequestError(f"'top_logprobs' is a chat parameter; /v1/completions takes 'logprobs' (an integer in [0, "
                           f"{MAX_COMPLETION_LOGPROBS}])", param="top_logprobs")
    logprobs = _field(body, "logprobs", int)
    if logprobs is not None and not 0 <= logprobs <= MAX_COMPLETION_LOGPROBS:
        raise RequestError(f"'logprobs' must be an integer in [0, {MAX_COMPLETION_LOGPROBS}], got {logprobs}",
                           param="logprobs")
    return logprobs, _field(body, "echo", bool, False)


def _decode_data_url(url: str, path: str) -> tuple[str, bytes]:
    """(media type, bytes) of a ``data:`` URL; RequestError when it is not one."""
    match = DATA_URL.match(url)
    if not match:
        raise RequestError(f"{path}: not a data: URL", param=path)
    payload = url[match.end():]
    if not match.group(3):
        raise RequestError(f"{path}: data: URLs must be base64-encoded (';base64,')", param=path)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(f"{path}: the data: URL's base64 payload is not valid base64", param=path) from None
    return (match.group(1) or "").lower(), data


def _local_media(kind: str, url: str, path: str, root: pathlib.Path) -> MediaRef:
    """A local path (relative ones from ``root``) or ``file:`` URL naming a file inside ``root``: links are
    followed before the check, so none leads out of it. RequestError (code ``media_outside_root``) otherwise."""
    name = url
    if url[:5].lower() == "file:":
        parsed = urllib.parse.urlparse(url)
        if parsed.netloc not in ("", "localhost"):
            raise RequestError(f"{path}: a file: URL names a file of this machine (file:///path), not of "
                               f"{parsed.netloc!r}", param=path)
        name = urllib.parse.unquote(parsed.path)
    try:
        real = os.path.realpath(root / name)
        real_root = os.path.realpath(root)
        outside = os.path.commonpath([real, real_root]) != real_root
    except ValueError:  # a NUL byte
        raise RequestError(f"{path}: {url[:200]!r} is not a usable file path", param=path) from None
    if outside:
        raise RequestError(f"{path}: {url[:200]!r} is outside the media folder {str(root)!r}; only files inside it "
                           f"are read", param=path, code="media_outside_root")
    return MediaRef(kind, None, None, pathlib.PurePath(real).suffix.lower(), path, file=real)


def _url_media(kind: str, url: Any, path: str, types: dict[str, str], allow_remote: bool,
               media_root: pathlib.Path | None = None) -> MediaRef:
    if not isinstance(url, str) or not url:
        raise RequestError(f"{path} must be a non-empty string", param=path)
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if media_root is not None and scheme in ("", "file"):
        return _local_media(kind, url, path, media_root)
    if scheme == "data":
        media_type, data = _decode_data_url(url, path)
        if media_type not in types:
            raise RequestError(f"{path}: media type {media_type or '(none)'!r} is not a supported {kind} type "
                               f"({', '.join(sorted(types))})", param=path)
        return MediaRef(kind, data, None, types[media_type], path)
    if scheme in ("http", "https"):
        if not allow_remote:
            raise RequestError(f"{path}: remote URLs are not fetched by this server (send the {kind} inline as a "
                               f"data: URL, or start the server with --allow-remote-media)", param=path)
        suffix = pathlib.PurePosixPath(url.split("?", 1)[0]).suffix.lower()
        return MediaRef(kind, None, url, suffix if suffix in types.values() else next(iter(types.values())),
                        path)
    others = (" and http(s) URLs" if allow_remote else "") + (" and local paths" if media_root is not None else "")
    raise RequestError(f"{path}: only data: URLs{others} are accepted, not {scheme + ':' if scheme else 'a bare path'}",
                       param=path)


def _part(part: Any, path: str, allow_remote: bool, media_root: pathlib.Path | None) -> dict | MediaRef:
    if not isinstance(part, dict):
        raise RequestError(f"{path} must be an object", param=path)
    kind = part.get("type")
    if kind == "text":
        text = part.get("text")
        if not isinstance(text, str):
            raise RequestError(f"{path}.text must be a string", param=f"{path}.text")
        return {"type": "text", "text": text}
    if kind in ("image_url", "video_url"):
        inner = part.get(kind)
        url = inner.get("url") if isinstance(inner, dict) else inner
        media = "image" if kind == "image_url" else "video"
        return _url_media(media, url, f"{path}.{kind}.url", IMAGE_TYPES if media == "image" else VIDEO_TYPES,
                          allow_remote, media_root)
    if kind == "input_audio":
        inner = part.get("input_audio")
        if not isinstance(inner, dict):
            raise RequestError(f"{path}.input_audio must be an object with 'data' and 'format'",
                               param=f"{path}.input_audio")
        fmt = inner.get("format")
        if fmt not in AUDIO_FORMATS:
            raise RequestError(f"{path}.input_audio.format must be one of {sorted(AUDIO_FORMATS)}",
                               param=f"{path}.input_audio.format")
        data = inner.get("data")
        if not isinstance(data, str):
            raise RequestError(f"{path}.input_audio.data must be a base64 string", param=f"{path}.input_audio.data")
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise RequestError(f"{path}.input_audio.data is not valid base64",
                               param=f"{path}.input_audio.data") from None
        return MediaRef("audio", raw, None, AUDIO_FORMATS[fmt], f"{path}.input_audio.data")
    raise RequestError(f"{path}.type {kind!r} is not supported (text, image_url, input_audio, video_url)",
                       param=f"{path}.type")


def chat_messages(body: dict, *, allow_remote: bool = False, media_root: str | os.PathLike | None = None
                  ) -> list[dict]:
    """The request's ``messages`` as chat messages whose media parts are ``MediaRef`` placeholders (see
    ``resolve_media``); roles as the chat templates know them (``developer`` is a system message).
    media_root: a folder whose files image / video URLs may name as local paths (relative ones from it) or
    ``file:`` URLs; None: no local files."""
    media_root = None if media_root is None else pathlib.Path(media_root)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list", param="messages")
    if len(messages) > MAX_MESSAGES:
        raise RequestError(f"'messages' holds {len(messages)} messages; at most {MAX_MESSAGES} are accepted",
                           param="messages")
    out = []
    for i, message in enumerate(messages):
        path = f"messages[{i}]"
        if not isinstance(message, dict):
            raise RequestError(f"{path} must be an object", param=path)
        role = message.get("role")
        if role not in ROLES:
            raise RequestError(f"{path}.role {role!r} is not supported (system, developer, user, assistant, tool)",
                               param=f"{path}.role")
        if message.get("function_call"):
            raise RequestError(f"{path}: 'function_call' is deprecated and not supported; use 'tool_calls'",
                               param=f"{path}.function_call")
        extras = _tool_fields(message, path, role)
        content = message.get("content")
        if content is None and extras.get("tool_calls"):
            parts: list = []
        elif isinstance(content, str):
            parts: list = [{"type": "text", "text": content}]
        elif isinstance(content, list):
            if len(content) > MAX_PARTS:
                raise RequestError(f"{path}.content holds {len(content)} parts; at most {MAX_PARTS} are accepted",
                                   param=f"{path}.content")
            parts = [_part(p, f"{path}.content[{j}]", allow_remote, media_root) for j, p in enumerate(content)]
        else:
            raise RequestError(f"{path}.content must be a string or a list of parts", param=f"{path}.content")
        if role != "user" and any(isinstance(p, MediaRef) for p in parts):
            raise RequestError(f"{path}: media parts are accepted in user messages only", param=f"{path}.content")
        out.append({"role": ROLES[role], "content": parts, **extras})
    return out


def _tool_fields(message: dict, path: str, role: str) -> dict:
    """An assistant message's ``tool_calls`` (each ``{"id", "type": "function", "function": {"name", "arguments":
    JSON text}}``) and a tool message's ``tool_call_id``, checked; RequestError naming the field."""
    out: dict = {}
    calls = message.get("tool_calls")
    if calls:
        if role != "assistant":
            raise RequestError(f"{path}: only assistant messages carry 'tool_calls'", param=f"{path}.tool_calls")
        if not isinstance(calls, list):
            raise RequestError(f"{path}.tool_calls must be a list", param=f"{path}.tool_calls")
        for j, call in enumerate(calls):
            where = f"{path}.tool_calls[{j}]"
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise RequestError(f"{where} needs 'function': {{'name': ..., 'arguments': ...}}",
                                   param=f"{where}.function")
            arguments = function.get("arguments", "{}")
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments) if arguments.strip() else {}
                except ValueError:
                    raise RequestError(f"{where}.function.arguments is not valid JSON",
                                       param=f"{where}.function.arguments") from None
            if not isinstance(arguments, dict):
                raise RequestError(f"{where}.function.arguments must be a JSON object",
                                   param=f"{where}.function.arguments")
        out["tool_calls"] = calls
    for key in ("tool_call_id", "name"):
        value = message.get(key)
        if value is not None and role in ("tool", "assistant"):
            if not isinstance(value, str):
                raise RequestError(f"{path}.{key} must be a string", param=f"{path}.{key}")
            out[key] = value
    return out


def resolve_media(messages: list[dict], folder: pathlib.Path, fetch: Callable[[MediaRef], bytes] | None = None
                  ) -> list[dict]:
    """``messages`` with each ``MediaRef`` written to a file in ``folder`` (remote ones through ``fetch``) and
    replaced by a media part naming it (a local file is named as it is)."""
    out, n = [], 0
    for message in messages:
        parts = []
        for part in message["content"]:
            if isinstance(part, MediaRef) and part.file is not None:
                parts.append({"type": part.kind, part.kind: part.file})
            elif isinstance(part, MediaRef):
                data = part.data if part.data is not None else fetch(part)
                file = folder / f"{n:03d}-{part.kind}{part.suffix}"
                file.write_bytes(data)
                n += 1
                parts.append({"type": part.kind, part.kind: str(file)})
            else:
                parts.append(part)
        out.append({**message, "content": parts})
    return out


def completion_prompt(body: dict) -> str:
    """The raw prompt of a completions request (a string, or a list holding one string)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise RequestError("'prompt' must be a string (one prompt per request)", param="prompt")
    return prompt


# ---- responses -----------------------------------------------------------------------------------------------

def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop"}


def chat_choice(text: str, finish_reason: str, index: int = 0, logprobs: dict | None = None,
                audio: dict | None = None, tool_calls: list | None = None) -> dict:
    """One choice of a ``chat.completion``; with ``tool_calls`` (app/tools.py's ToolCall) its message carries
    them (``content`` the text before them, null when there is none) and ``finish_reason`` is "tool_calls"."""
    message: dict = {"role": "assistant", "content": text}
    if audio is not None:
        message["audio"] = audio
    reason = FINISH_REASONS.get(finish_reason, finish_reason)
    if tool_calls:
        message["content"] = text or None
        message["tool_calls"] = [c.as_openai() for c in tool_calls]
        reason = "tool_calls"
    return {"index": index, "message": message, "finish_reason": reason, "logprobs": logprobs}


def chat_completion(request_id: str, model: str, text: str, finish_reason: str, use: dict,
                    created: int | None = None, audio: dict | None = None, *, choices: list[dict] | None = None
                    ) -> dict:
    """A ``chat.completion``: one choice of ``text``, or ``choices`` (``chat_choice``)."""
    return {"id": request_id, "object": "chat.completion", "created": created or int(time.time()), "model": model,
            "choices": choices if choices is not None else [chat_choice(text, finish_reason, audio=audio)],
            "usage": use}


def chat_chunk(request_id: str, model: str, created: int, delta: dict | None, finish_reason: str | None = None,
               use: dict | None = None, *, index: int = 0, logprobs: dict | None = None) -> dict:
    """A ``chat.completion.chunk``: one delta of choice ``index`` (None: the usage-only chunk, with no choices)."""
    chunk: dict = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model}
    if delta is None:
        chunk["choices"] = []
    else:
        chunk["choices"] = [{"index": index, "delta": delta, "logprobs": logprobs,
                             "finish_reason": FINISH_REASONS.get(finish_reason, finish_reason)
                             if finish_reason else None}]
    if use is not None:
        chunk["usage"] = use
    return chunk


def completion_choice(text: str, finish_reason: str | None, index: int = 0, logprobs: dict | None = None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs,
            "finish_reason": FINISH_REASONS.get(finish_reason, finish_reason) if finish_reason else None}


def completion(request_id: str, model: str, text: str, finish_reason: str | None, use: dict | None,
               created: int | None = None, *, chunk: bool = False, index: int = 0, logprobs: dict | None = None,
               choices: list[dict] | None = None) -> dict:
    """A ``text_completion`` (or one streamed piece of it): one choice of ``text``, or ``choices``
    (``completion_choice``)."""
    out = {"id": request_id, "object": "text_completion", "created": created or int(time.time()), "model": model,
           "choices": choices if choices is not None else [completion_choice(text, finish_reason, index, logprobs)]}
    if use is not None or not chunk:
        out["usage"] = use
    return out


def sse(obj: dict | str) -> bytes:
    """One server-sent event: ``data: <json>\\n\\n`` (``"[DONE]"`` ends a stream)."""
    import json

    payload = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()
