"""The web demo's state as plain data: gradio chat history -> pipeline chat messages, upload checks, answer stats.

Gradio's ``Chatbot`` keeps the conversation in the OpenAI-style "messages" format; after preprocessing every
message is ``{"role": ..., "content": [part, ...], "metadata": {...}}`` with parts ``{"type": "text", "text": ...}``
or ``{"type": "file", "file": {"path": ..., "mime_type": ...}}``. The pipeline takes the transformers chat format:
``{"role": ..., "content": [{"type": "text" | "image" | "audio" | "video", ...}]}``. Nothing here imports gradio.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import os
import pathlib
from typing import Any, Iterable, Sequence

import numpy as np

from omnijax.common.errors import MediaError, PromptError
from omnijax.preprocess.video_source import VIDEO_EXTENSIONS

IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".tif", ".tiff"})
AUDIO_EXTENSIONS = frozenset({".wav", ".mp3", ".flac", ".ogg", ".oga", ".opus", ".m4a", ".aac"})
IMAGE_MIME_TYPES = frozenset({"image/png", "image/jpeg", "image/webp", "image/gif", "image/bmp", "image/tiff"})
AUDIO_MIME_TYPES = frozenset({"audio/wav", "audio/x-wav", "audio/wave", "audio/mpeg", "audio/mp3", "audio/flac",
                              "audio/x-flac", "audio/ogg", "audio/opus", "audio/mp4", "audio/x-m4a", "audio/aac"})
VIDEO_MIME_TYPES = frozenset({"video/mp4", "video/quicktime", "video/x-matroska", "video/webm", "video/x-msvideo",
                              "video/mpeg", "video/mp2t", "video/3gpp"})
MEDIA_KINDS = ("image", "audio", "video")
DEFAULT_MAX_UPLOAD_MB = 20.0

# The metadata title that marks an assistant message as an error report (not an answer the model gave).
ERROR_TITLE = "⚠️ Error"


def media_kind(path: str | os.PathLike, mime_type: str | None = None) -> str | None:
    """The kind of media file at ``path`` ("image", "audio" or "video"; None for others), from its name's extension.

    ``mime_type`` (as the browser or gradio reported it) only decides when the extension is unknown, and only
    for types whose every variant the decoders read (``image/png``, ``audio/wav``, ... not ``image/svg+xml``).
    """
    ext = pathlib.PurePath(os.fspath(path)).suffix.lower()
    if ext in IMAGE_EXTENSIONS:
        return "image"
    if ext in AUDIO_EXTENSIONS:
        return "audio"
    if ext in VIDEO_EXTENSIONS:
        return "video"
    if ext:
        return None
    mime = (mime_type or "").split(";")[0].strip().lower()
    return "image" if mime in IMAGE_MIME_TYPES else "audio" if mime in AUDIO_MIME_TYPES else \
        "video" if mime in VIDEO_MIME_TYPES else None


def _accepted_text(modalities: Sequence[str]) -> str:
    kinds = [k for k in MEDIA_KINDS if k in modalities]
    return " or ".join(kinds) + " files" if kinds else "no files (text only)"


def validate_upload(path: str | os.PathLike, *, max_bytes: int, modalities: Sequence[str],
                    mime_type: str | None = None) -> str:
    """Check one uploaded file; returns its kind ("image" / "audio" / "video").

    Raises MediaError naming the file when it is missing, not an image / audio / video file, of a kind the model does not
    take (``modalities``: the model's, e.g. ``("image",)``), empty, or larger than ``max_bytes``.
    """
    name = pathlib.PurePath(os.fspath(path)).name
    kind = media_kind(path, mime_type)
    if kind is None:
        raise MediaError(f"{name}: unsupported file type; this model takes {_accepted_text(modalities)}")
    if kind not in modalities:
        raise MediaError(f"{name}: this model takes no {kind} input; it takes {_accepted_text(modalities)}")
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise MediaError(f"{name}: cannot read the uploaded file ({e.strerror or e})") from e
    if size == 0:
        raise MediaError(f"{name}: the file is empty")
    if size > max_bytes:
        raise MediaError(f"{name}: {size / 2**20:.1f} MB is over the {max_bytes / 2**20:g} MB upload limit")
    return kind


def user_content(text: str, media: Iterable[tuple[str, str]]) -> list[dict]:
    """One user turn as pipeline content parts: the media ``(kind, path)`` in order, then the text (if any)."""
    parts = [{"type": kind, kind: str(path)} for kind, path in media]
    if text and text.strip():
        parts.append({"type": "text", "text": text})
    return parts


def _file_part(file: Any) -> dict | None:
    """A gradio file value (``{"path", "mime_type", ...}`` or a path string) -> a pipeline media part."""
    if isinstance(file, dict):
        path, mime = file.get("path"), file.get("mime_type")
    else:
        path, mime = file, None
    if not path:
        return None
    kind = media_kind(path, mime)
    return {"type": kind, kind: str(path)} if kind else None


def _content_parts(content: Any) -> list[dict]:
    """A gradio message's content (a string, a file dict, a tuple of paths, or a list of these / of normalised
    parts) -> pipeline parts. Parts the model cannot read (other files, rendered components) are left out."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if isinstance(content, tuple):  # the legacy (path, alt text) file form
        part = _file_part(content[0]) if content else None
        return [part] if part else []
    if isinstance(content, dict):
        kind = content.get("type")
        if kind == "text":
            return _content_parts(content.get("text"))
        if kind == "file":
            part = _file_part(content.get("file"))
            return [part] if part else []
        if "path" in content:
            part = _file_part(content)
            return [part] if part else []
        return []
    if isinstance(content, list):
        return [p for item in content for p in _content_parts(item)]
    return []


def is_error_message(message: dict) -> bool:
    """True for an assistant message this demo wrote to report an error (see ``error_message``)."""
    metadata = message.get("metadata") or {}
    return message.get("role") == "assistant" and metadata.get("title") == ERROR_TITLE


def history_to_messages(history: Sequence[dict]) -> list[dict]:
    """Gradio chat history (messages format) -> pipeline chat messages.

    Consecutive messages of one role become one turn (gradio may show a turn's files and text as separate
    bubbles). A user turn answered by an error report is dropped together with the report, so a bad file does
    not poison the following turns. Other assistant messages with a metadata title (gradio "thoughts") and
    empty messages are left out.
    """
    turns: list[dict] = []
    for message in history:
        role = message.get("role")
        if role not in ("user", "assistant", "system"):
            raise PromptError(f"chat history holds a message with role {role!r}")
        if is_error_message(message):
            while turns and turns[-1]["role"] == "user":
                turns.pop()
            continue
        if role == "assistant" and (message.get("metadata") or {}).get("title"):
            continue
        parts = _content_parts(message.get("content"))
        if not parts:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(parts)
        else:
            turns.append({"role": role, "content": parts})
    return turns


def build_messages(history: Sequence[dict], text: str, media: Sequence[tuple[str, str]]) -> list[dict]:
    """The pipeline's messages for a new user turn (``text`` plus ``media`` ``(kind, path)`` pairs) after
    ``history``. Raises PromptError when the new turn is empty."""
    content = user_content(text, media)
    if not content:
        raise PromptError("the message is empty: type some text or attach a file")
    messages = history_to_messages(history)
    if messages and messages[-1]["role"] == "user":  # an earlier turn stopped before any answer
        messages[-1]["content"].extend(content)
    else:
        messages.append({"role": "user", "content": content})
    return messages


def sampling_options(max_new_tokens, temperature, top_p, top_k, seed) -> dict:
    """The settings controls' values -> ``Pipeline.stream`` keyword arguments; PromptError names a bad one.

    Sliders and number boxes send floats (or None when a box is cleared); counts must be whole numbers.
    """

    def number(name: str, value, lo: float, hi: float | None = None, whole: bool = False):
        if value is None or isinstance(value, bool):
            raise PromptError(f"{name} is not set")
        try:
            x = float(value)
        except (TypeError, ValueError):
            raise PromptError(f"{name} must be a number, got {value!r}") from None
        except OverflowError:  # an integer beyond float's range
            x = float("inf") if value > 0 else float("-inf")
        if not math.isfinite(x) or x < lo or (hi is not None and x > hi):
            raise PromptError(f"{name} must be in [{lo:g}, {'inf' if hi is None else f'{hi:g}'}], got {value!r}")
        if whole:
            if x != int(x):
                raise PromptError(f"{name} must be a whole number, got {value!r}")
            return int(x)
        return x

    options = dict(max_new_tokens=number("max new tokens", max_new_tokens, 1, whole=True),
                   temperature=number("temperature", temperature, 0.0),
                   top_p=number("top-p", top_p, 0.0, 1.0),
                   top_k=number("top-k", top_k, 0, whole=True),
                   seed=number("seed", seed, 0, 2**32 - 1, whole=True))
    if options["top_p"] == 0.0:
        raise PromptError("top-p must be above 0 (1 turns the filter off)")
    return options


def answer_message(text: str) -> dict:
    """An assistant chat message holding ``text`` as it is (a bare string would be re-indented by gradio)."""
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


def error_message(error: BaseException | str, paths: Iterable[str | os.PathLike] = ()) -> dict:
    """An assistant chat message reporting ``error`` (an exception, or a string). Each of ``paths`` (the turn's
    uploads, kept by gradio under long cache folders) is shown by its file name only."""
    text = str(error) if not isinstance(error, BaseException) else (str(error) or type(error).__name__)
    for path in sorted({os.fspath(p) for p in paths}, key=len, reverse=True):
        text = text.replace(path, pathlib.PurePath(path).name)
    return {"role": "assistant", "content": text, "metadata": {"title": ERROR_TITLE}}


@dataclasses.dataclass(frozen=True)
class AnswerStats:
    """One answer's numbers. prompt_tokens / generated_tokens: None when the pipeline did not report them;
    first_token_s: seconds from the request to the first text piece (None if nothing was generated);
    total_s: seconds from the request to the end of the answer."""

    prompt_tokens: int | None
    generated_tokens: int | None
    first_token_s: float | None
    total_s: float
    first_audio_s: float | None = None  # a spoken answer: seconds from the request to its first audio chunk
    audio_s: float | None = None  # ... and its length in seconds

    @property
    def tokens_per_s(self) -> float | None:
        """Generated tokens per second over the whole answer (prompt processing included)."""
        if self.generated_tokens is None or self.total_s <= 0:
            return None
        return self.generated_tokens / self.total_s


def format_stats(stats: AnswerStats) -> str:
    """One line: ``prompt 51 tokens · generated 32 tokens · first token 0.84 s · 10.2 tokens/s`` (and for a spoken
    answer `` · spoken 2.40 s (first audio 1.10 s)``)."""

    def num(n: int | None) -> str:
        return "n/a" if n is None else str(n)

    parts = [f"prompt {num(stats.prompt_tokens)} tokens", f"generated {num(stats.generated_tokens)} tokens",
             "first token " + ("n/a" if stats.first_token_s is None else f"{stats.first_token_s:.2f} s"),
             ("n/a" if stats.tokens_per_s is None else f"{stats.tokens_per_s:.1f}") + " tokens/s"]
    if stats.audio_s is not None:
        parts.append(f"spoken {stats.audio_s:.2f} s" + ("" if stats.first_audio_s is None else
                                                        f" (first audio {stats.first_audio_s:.2f} s)"))
    return " · ".join(parts)


SPEECH_WINDOW = 3  # chunks each player update repeats, so a browser that coalesces updates misses none


def speech_update(answer: int, chunks: Sequence[np.ndarray], sample_rate: int) -> str:
    """The speech player's value after the chunks so far of answer number ``answer``: JSON
    ``{"answer", "rate", "chunks": [{"seq", "pcm"}]}`` with the last SPEECH_WINDOW chunks as base64 16-bit
    little-endian PCM; the page plays each ``seq`` once, in order."""
    from omnijax.app.wav import pcm16_bytes

    first = max(0, len(chunks) - SPEECH_WINDOW)
    return json.dumps({"answer": answer, "rate": int(sample_rate),
                       "chunks": [{"seq": i, "pcm": base64.b64encode(pcm16_bytes(chunks[i])).decode()}
                                  for i in range(first, len(chunks))]})


def model_header(name: str, family: str, modalities: Sequence[str], notice: str | None = None) -> str:
    """Markdown naming the model, its family and what it takes as input (plus an optional notice)."""
    inputs = ", ".join(["text"] + [k for k in MEDIA_KINDS if k in modalities])
    text = f"**Model:** `{name}` · **family:** `{family}` · **inputs:** {inputs}"
    return text + (f"\n\n{notice}" if notice else "")
