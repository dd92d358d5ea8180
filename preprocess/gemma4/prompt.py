"""Gemma 4 media placeholders: expanding the markers of a rendered chat prompt into soft-token runs.

The Gemma 4 chat template writes one marker per media part: ``<|image|>`` for an image, ``<|audio|>`` for an audio
clip. ``Gemma4Processor`` replaces the markers in order of appearance (one left-to-right pass; text inserted by a
replacement is not scanned again), the i-th image marker by ``<|image>`` + ``<|image|>`` x n_i + ``<image|>`` and the
i-th audio marker by ``<|audio>`` + ``<|audio|>`` x m_i + ``<audio|>``, with no separators around them. n_i is the
image's soft-token count (``preprocess.gemma4.image.num_soft_tokens``), m_i the audio clip's (computed by the
audio preprocessing). The marker is the soft token itself, so the expanded prompt holds exactly n_i image soft
tokens per image.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from omnijax.common.errors import PromptError


@dataclasses.dataclass(frozen=True)
class Gemma4MediaTokens:
    """The marker / soft-token and begin / end strings of both modalities (the tokenizer's ``image_token``,
    ``boi_token``, ``eoi_token``, ``audio_token``, ``boa_token``, ``eoa_token``). Defaults are the published ones."""

    image_token: str = "<|image|>"
    boi_token: str = "<|image>"
    eoi_token: str = "<image|>"
    audio_token: str = "<|audio|>"
    boa_token: str = "<|audio>"
    eoa_token: str = "<audio|>"

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{field.name} must be a non-empty string, got {value!r}")
        if self.image_token == self.audio_token:
            raise ValueError(f"image_token and audio_token must differ, both are {self.image_token!r}")

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "Gemma4MediaTokens":
        """The strings a loaded transformers tokenizer names (its model-specific special tokens); missing ones keep
        the published defaults."""
        defaults = cls()
        kwargs = {}
        for field in dataclasses.fields(cls):
            value = getattr(tokenizer, field.name, None)
            kwargs[field.name] = value if isinstance(value, str) and value else getattr(defaults, field.name)
        return cls(**kwargs)


def image_replacement(num_tokens: int, tokens: Gemma4MediaTokens = Gemma4MediaTokens()) -> str:
    """``<|image>`` + ``<|image|>`` x num_tokens + ``<image|>``."""
    return f"{tokens.boi_token}{tokens.image_token * _count(num_tokens, 'image')}{tokens.eoi_token}"


def audio_replacement(num_tokens: int, tokens: Gemma4MediaTokens = Gemma4MediaTokens()) -> str:
    """``<|audio>`` + ``<|audio|>`` x num_tokens + ``<audio|>``."""
    return f"{tokens.boa_token}{tokens.audio_token * _count(num_tokens, 'audio')}{tokens.eoa_token}"


def _count(value, kind: str) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__") or int(value) < 0:
        raise PromptError(f"an {kind} soft-token count must be a non-negative integer, got {value!r}")
    return int(value)


def count_markers(prompt: str, tokens: Gemma4MediaTokens = Gemma4MediaTokens()) -> tuple[int, int]:
    """(image markers, audio markers) in ``prompt``."""
    return prompt.count(tokens.image_token), prompt.count(tokens.audio_token)


def expand_placeholders(prompt: str, image_token_counts: Sequence[int] = (), audio_token_counts: Sequence[int] = (),
                        tokens: Gemma4MediaTokens = Gemma4MediaTokens()) -> str:
    """``prompt`` with its i-th image marker replaced by :func:`image_replacement` (image_token_counts[i]) and its
    i-th audio marker by :func:`audio_replacement` (audio_token_counts[i]), in one left-to-right pass as
    ``Gemma4Processor`` does. Raises ``PromptError`` when the number of markers of a modality differs from the
    number of counts given for it."""
    if not isinstance(prompt, str):
        raise PromptError(f"the prompt must be a string, got {type(prompt).__name__}")
    image_token_counts, audio_token_counts = list(image_token_counts), list(audio_token_counts)
    n_images, n_audio = count_markers(prompt, tokens)
    if n_images != len(image_token_counts):
        raise PromptError(f"the prompt has {n_images} {tokens.image_token} markers but {len(image_token_counts)} "
                          f"images were given")
    if n_audio != len(audio_token_counts):
        raise PromptError(f"the prompt has {n_audio} {tokens.audio_token} markers but {len(audio_token_counts)} "
                          f"audio clips were given")
    replacements = {
        tokens.image_token: iter([image_replacement(n, tokens) for n in image_token_counts]),
        tokens.audio_token: iter([audio_replacement(n, tokens) for n in audio_token_counts]),
    }
    pattern = "|".join(re.escape(t) for t in (tokens.image_token, tokens.audio_token))
    return re.sub(pattern, lambda m: next(replacements[m.group(0)]), prompt)
