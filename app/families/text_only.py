"""Pieces shared by the text-only checkpoint classes of every family (Gemma3ForCausalLM, ...): no encoders, and the
text-only processor (preprocess/text_processor.py)."""

from __future__ import annotations

import pathlib

from omnijax.app.families.spec import ModelConfig
from omnijax.preprocess.text_processor import TextProcessor


def no_encoders(cfg: ModelConfig, *, rngs) -> dict:
    return {}


def make_text_processor(folder: pathlib.Path, cfg: ModelConfig, *, max_audio_seconds: float | None = None,
                        video_size: str = "processor", tokenizer=None) -> TextProcessor:
    """The chat template and tokenizer of ``folder``, or ``tokenizer`` when one is already built (e.g. from a GGUF
    file's metadata); a text-only model takes no media: ``max_audio_seconds`` and ``video_size`` have no effect."""
    return TextProcessor(folder, tokenizer=tokenizer)
