"""What one request (one conversation or raw prompt) may ask for, checked before anything heavy is decoded.

The work a request causes is bounded by the request's own budget, whatever the front end (Python API, CLI, web
demo, captioner, HTTP server):

* text: at most ``max_text_bytes`` (UTF-8) of text in all its messages together (``MAX_TEXT_BYTES``, and at most
  ``TEXT_BYTES_PER_TOKEN`` bytes per token of the context budget), and only valid Unicode (a lone surrogate cannot
  be tokenized);
* media: at most ``max_media_items`` images and audio clips (``MAX_MEDIA_ITEMS``); images of at most
  ``max_pixels`` pixels together as they are decoded (``MAX_REQUEST_PIXELS``; an image larger than
  ``WORKING_IMAGE_PIXELS`` counts at its reduced size), audio of at most ``max_audio_seconds`` together
  (``MAX_REQUEST_AUDIO_SECONDS``; clips a family pads to the longest count as long as the longest). Sizes and
  durations are read from file headers and array shapes, before decoding;
* context: the soft tokens of its media within ``max_tokens`` (the context budget), checked after each item, so
  the rest is not decoded once they are over.

``check_text_size`` is the text cap alone, for a front end to apply to a request body before it builds messages.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import stat
import warnings
from typing import Callable

import numpy as np

from omnijax.common.errors import PromptError
from omnijax.preprocess.media_limits import reduce_factor

MAX_TEXT_BYTES = 1 << 20  # 1 MiB: 250k tokens of English, beyond every context budget omnijax serves on CPU
MAX_SCORE_TEXT_BYTES = 16 << 20  # a text to score (in windows, not one context): 16 MiB (WikiText-103's test: 1.3)
TEXT_BYTES_PER_TOKEN = 64  # no text averages more per token (a token of 31 spaces is 31 bytes)
MAX_MEDIA_ITEMS = 64
MAX_REQUEST_PIXELS = 128_000_000  # e.g. 8 images of 16 MP
MAX_REQUEST_AUDIO_SECONDS = 3600.0


@dataclasses.dataclass(frozen=True)
class RequestBudget:
    """The limits of one request. max_tokens: the context budget (None: not checked here)."""

    max_text_bytes: int = MAX_TEXT_BYTES
    max_media_items: int = MAX_MEDIA_ITEMS
    max_pixels: int = MAX_REQUEST_PIXELS
    max_audio_seconds: float = MAX_REQUEST_AUDIO_SECONDS
    max_tokens: int | None = None

    @classmethod
    def for_context(cls, max_tokens: int) -> "RequestBudget":
        """The default limits for a context budget of ``max_tokens``: text is also at most TEXT_BYTES_PER_TOKEN
        bytes per token of it (more text could not fit in any case)."""
        return cls(max_text_bytes=min(MAX_TEXT_BYTES, TEXT_BYTES_PER_TOKEN * max_tokens), max_tokens=max_tokens)


def text_bytes(text: str, where: str) -> int:
    """UTF-8 bytes of ``text``; PromptError naming ``where`` when it holds a lone surrogate (not valid Unicode)."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise PromptError(f"{where} holds U+{ord(text[e.start]):04X} at character {e.start}, a lone surrogate that "
                          f"is not valid Unicode") from None


def check_text_size(texts, limit: int = MAX_TEXT_BYTES, where: str = "the request") -> int:
    """Total UTF-8 bytes of ``texts`` (strings); PromptError when over ``limit`` or not valid Unicode. A text is
    refused by its length in characters before it is encoded, so the check costs at most ``4 * limit`` bytes."""
    total = 0
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise PromptError(f"{where}: text must be a string, got {type(text).__name__}")
        if total + len(text) > limit:  # a character is at least one byte
            raise PromptError(f"{where} holds more than {limit} bytes of text (the limit per request)")
        total += text_bytes(text, f"{where}: text {i}" if len(texts) > 1 else where)
        if total > limit:
            raise PromptError(f"{where} holds {total}+ bytes of text; at most {limit} bytes are accepted per request")
    return total


def _regular_file(source) -> pathlib.Path | None:
    """``source`` as a path when it names a regular file (anything else is left to the loaders to refuse)."""
    if not isinstance(source, (str, os.PathLike)):
        return None
    text = os.fspath(source)
    text = os.fsdecode(text) if isinstance(text, bytes) else text
    if text.startswith(("http://", "https://")):
        return None
    try:
        return pathlib.Path(text) if stat.S_ISREG(os.stat(text).st_mode) else None
    except (OSError, ValueError):
        return None


def image_pixels(source) -> int:
    """Pixels ``source`` (a path, PIL image or array) has once loaded (reduced when it is over
    WORKING_IMAGE_PIXELS), from its header or shape; 0 when that cannot be read (the loader names the problem)."""
    import PIL.Image

    if isinstance(source, PIL.Image.Image):
        width, height = source.size
    elif isinstance(source, np.ndarray):
        if source.ndim not in (2, 3):
            return 0
        height, width = source.shape[:2]
    else:
        path = _regular_file(source)
        if path is None:
            return 0
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", PIL.Image.DecompressionBombWarning)
                with PIL.Image.open(path) as image:
                    width, height = image.size
        except Exception:  # PIL raises many types on unreadable files; the loader reports them
            return 0
    if width <= 0 or height <= 0:
        return 0
    factor = reduce_factor(width, height)
    return -(-width // factor) * -(-height // factor)


def audio_seconds(source, sampling_rate: int = 16000) -> float:
    """Seconds of audio in ``source`` (a path, an ``(array, rate)`` pair or a bare array at ``sampling_rate``),
    from the header or shape; 0 when that cannot be read (the loader names the problem)."""
    if isinstance(source, tuple) and len(source) == 2 and isinstance(source[0], np.ndarray):
        array, rate = source
        try:
            rate = float(rate)
        except (TypeError, ValueError):
            return 0.0
        if not rate > 0 or array.ndim not in (1, 2):
            return 0.0
        return max(array.shape) / rate if array.ndim == 2 else array.shape[0] / rate
    if isinstance(source, np.ndarray):
        return source.shape[0] / sampling_rate if source.ndim == 1 else 0.0
    path = _regular_file(source)
    if path is None:
        return 0.0
    try:
        import soundfile

        info = soundfile.info(str(path))
        return float(info.frames) / float(info.samplerate) if info.samplerate > 0 else 0.0
    except Exception:  # soundfile cannot read it (mp3 through audioread, corrupt): the loader decides
        return 0.0


def check_media_budget(sources: dict[str, list], budget: RequestBudget, padded: frozenset[str] = frozenset(),
                       audio_tokens: Callable[[float], int] | None = None) -> None:
    """PromptError when the media ``sources`` (modality -> items) of one request are over ``budget``: too many
    items, too many pixels or seconds together, or (``audio_tokens``: the fewest soft tokens a clip of so many
    seconds takes) clips whose tokens alone cannot fit the context. ``padded``: modalities whose items are padded
    to the longest. All from headers and shapes, before anything is decoded."""
    count = sum(len(items) for items in sources.values())
    if count > budget.max_media_items:
        raise PromptError(f"the request holds {count} media items; at most {budget.max_media_items} are accepted "
                          f"per request")
    pixels = 0
    for i, source in enumerate(sources.get("image", [])):
        pixels += image_pixels(source)
        if pixels > budget.max_pixels:
            raise PromptError(f"the images of the request hold more than {budget.max_pixels / 1e6:g} MP together "
                              f"(over the limit at image {i + 1} of {len(sources['image'])}); send fewer or smaller "
                              f"images")
    clips = [audio_seconds(source) for source in sources.get("audio", [])]
    if clips:
        seconds = len(clips) * max(clips) if "audio" in padded else sum(clips)
        if seconds > budget.max_audio_seconds:
            how = " (counting each clip as long as the longest, to which they are padded)" if "audio" in padded else ""
            raise PromptError(f"the audio of the request lasts {seconds:.1f} s together{how}; at most "
                              f"{budget.max_audio_seconds:g} s are accepted per request")
        if audio_tokens is not None and budget.max_tokens is not None:
            tokens = sum(audio_tokens(s) for s in clips)
            if tokens >= budget.max_tokens:
                raise PromptError(f"the audio of the request ({sum(clips):.1f} s) takes at least {tokens} tokens; the "
                                  f"context budget is {budget.max_tokens} tokens: send shorter audio")


def check_media_tokens(tokens: int, budget: RequestBudget, done: int, total: int) -> None:
    """PromptError when media soft tokens alone are over the context budget (after ``done`` of ``total`` items)."""
    if budget.max_tokens is not None and tokens >= budget.max_tokens:
        raise PromptError(f"the media of the prompt take {tokens}+ tokens (after {done} of {total} items); the context "
                          f"budget is {budget.max_tokens} tokens")
