"""Tokenizing text from several threads at once (the server, the batch runners and the captioner prepare prompts
in worker threads).

A Hugging Face fast tokenizer keeps some settings of a call in the Rust tokenizer it shares with every other call:
whether special-token strings are split into ordinary pieces (``split_special_tokens``), truncation and padding. A
call sets them and then encodes, so two calls with different settings at once may each encode with the other's:
a chat prompt tokenized while a raw prompt (which splits special tokens) is being tokenized gets its ``<bos>`` and
turn markers as plain characters. ``encode`` runs each call with its tokenizer to itself.
"""

from __future__ import annotations

import threading

_GUARD = threading.Lock()
_ATTRIBUTE = "_omnijax_encode_lock"


def tokenizer_lock(tokenizer) -> threading.Lock:
    """The lock of ``tokenizer`` (one per tokenizer object, made on first use)."""
    lock = getattr(tokenizer, _ATTRIBUTE, None)
    if lock is None:
        with _GUARD:
            lock = getattr(tokenizer, _ATTRIBUTE, None)
            if lock is None:
                lock = threading.Lock()
                setattr(tokenizer, _ATTRIBUTE, lock)
    return lock


def encode(tokenizer, text: str, **kwargs):
    """``tokenizer(text, **kwargs)``, with no other ``encode`` of the same tokenizer running meanwhile."""
    with tokenizer_lock(tokenizer):
        return tokenizer(text, **kwargs)
