"""The processor of text-only checkpoints (Gemma3ForCausalLM, GGUF files, ...): the chat template and the tokenizer,
no media (messages with media parts are refused)."""

from __future__ import annotations

import pathlib

from omnijax.preprocess.processor import Processor
from omnijax.preprocess.tokenizer import load_tokenizer


class TextProcessor(Processor):
    """The folder's tokenizer and chat template, or ``tokenizer`` when one is already built (e.g. from a GGUF file's
    metadata)."""

    def __init__(self, folder: pathlib.Path, *, tokenizer=None):
        super().__init__(tokenizer if tokenizer is not None else load_tokenizer(folder))
