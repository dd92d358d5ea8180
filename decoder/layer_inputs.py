"""Per-layer input providers, by name: modules that turn token ids (and their embeddings) into an extra input for
every layer, [batch, seq, layers, width]. ``DecoderSpec.layer_inputs`` names one; a family registers its own."""

from __future__ import annotations

LAYER_INPUTS: dict[str, type] = {}


def register_layer_inputs(name: str):
    """Class decorator: make a provider available to ``DecoderSpec.layer_inputs``. The class is built as
    ``cls(decoder_spec, rngs=...)`` and called as ``provider(tokens_BL, embeddings_BLD) -> [B, L, layers, P]``."""

    def add(cls):
        LAYER_INPUTS[name] = cls
        return cls

    return add
