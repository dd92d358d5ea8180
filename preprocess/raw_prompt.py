"""Raw completion: a plain-text prompt for a base (pretrained) model, tokenized without any chat template."""

from __future__ import annotations

import numpy as np

from omnijax.common.errors import PromptError
from omnijax.preprocess.encode_text import encode


def raw_prompt_ids(tokenizer, text) -> np.ndarray:
    """``text`` -> token ids [seq] int32, as the tokenizer encodes it by default: the special tokens it is
    configured to add (a BOS for Gemma, Llama, ...) and nothing else. Text that spells a special token (``<eos>``,
    a turn marker) is tokenized as plain characters: user text never becomes a control token."""
    if not isinstance(text, str):
        raise PromptError(f"a raw prompt must be a string, got {type(text).__name__}")
    if not text:
        raise PromptError("the raw prompt is empty")
    return np.asarray(encode(tokenizer, text, split_special_tokens=True)["input_ids"], np.int32)
