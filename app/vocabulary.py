"""The tokenizer's vocabulary must fit the model: every id it can produce has a row in the embedding and the output
layer, and the end ids can be generated. Checked at load, before any weight is read; otherwise an id past the
table would read a wrong row (the embedding guards media placeholders only) and answers would be silently wrong."""

from __future__ import annotations

from omnijax.common.errors import CheckpointError
from omnijax.preprocess.tokenizer import tokenizer_size


# special_tokens_map entries that name a media placeholder token
PLACEHOLDER_KEYS = ("image_token", "audio_token", "video_token")


def declared_placeholders(tokenizer) -> set[int]:
    """Ids of the media placeholders the tokenizer declares (``image_token``, ...): a text-only checkpoint cut from a
    multimodal one keeps them (Gemma 3 1B's tokenizer has its image soft token at ``vocab_size``), and never uses
    them (media are refused, user text never becomes a special token)."""
    found = set()
    names = getattr(tokenizer, "special_tokens_map", None) or {}
    for key in PLACEHOLDER_KEYS:
        token = names.get(key)
        if isinstance(token, str):
            token_id = tokenizer.convert_tokens_to_ids(token)
            if isinstance(token_id, int):
                found.add(token_id)
    return found


def check_vocabulary(tokenizer, vocab_size: int, media_token_ids: tuple[int, ...], eos_ids: tuple[int, ...],
                     where: str) -> None:
    """CheckpointError naming both numbers when the tokenizer (``len(tokenizer)``, added tokens included) has ids
    past the ``vocab_size`` rows of the embedding and output layer, other than media placeholders (the model's,
    replaced by encoder features, and the ones the tokenizer declares: they may lie past the table, Gemma 3's image
    soft token is ``vocab_size`` itself), or when an end id is past them."""
    size = tokenizer_size(tokenizer)
    placeholders = set(media_token_ids) | declared_placeholders(tokenizer)
    beyond = size - vocab_size - sum(1 for t in placeholders if vocab_size <= t < size)
    if beyond > 0:
        raise CheckpointError(f"{where}: the tokenizer has {size} tokens (added tokens included) but the embedding "
                              f"and output layer have {vocab_size} rows: {beyond} token id(s) from {vocab_size} on "
                              f"would have no embedding; the tokenizer does not belong to these weights")
    late = sorted(t for t in eos_ids if not 0 <= t < vocab_size)
    if late:
        raise CheckpointError(f"{where}: end-of-generation id(s) {late} are not below the vocabulary size "
                              f"{vocab_size}: the model could never generate them")
