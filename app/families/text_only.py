"""Pieces shared by the text-only checkpoint classes of every family (Gemma3ForCausalLM, ...): no encoders, and
a processor that renders the chat template and tokenizes."""

from __future__ import annotations

import pathlib

import numpy as np

from omnijax.app.families.spec import ModelConfig, PreparedPrompt
from omnijax.common.errors import PromptError
from omnijax.preprocess.prompts import MEDIA_TYPES, media_of, normalize_messages, render_chat
from omnijax.preprocess.tokenizer import load_tokenizer
from omnijax.preprocess.user_text import encode_prompt


def no_encoders(cfg: ModelConfig, *, rngs) -> dict:
    return {}


class TextProcessor:
    """Chat messages -> token ids through the checkpoint's chat template; messages with media are refused.

    tokenizer: a tokenizer already built (e.g. from a GGUF file's metadata); default: the folder's.
    """

    def __init__(self, folder: pathlib.Path, cfg: ModelConfig, *, max_audio_seconds: float | None = None,
                 tokenizer=None):
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(folder)
        self.collate: dict = {}

    def prepare(self, messages) -> PreparedPrompt:
        messages = normalize_messages(messages)
        for kind in MEDIA_TYPES:
            if media_of(messages, kind):
                raise PromptError(f"this model takes text only: the messages hold {len(media_of(messages, kind))} "
                                  f"{kind} part(s)")
        text = render_chat(self.tokenizer, messages)
        ids = encode_prompt(self.tokenizer, text)
        return PreparedPrompt(token_ids=ids, media={}, bidirectional=np.zeros(len(ids), bool))

    def decode(self, token_ids) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)
