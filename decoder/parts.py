"""The block, router and per-layer input types a decoder is built from, by the names its spec uses.

A ``DecoderSpec`` names its parts (``LayerSpec.block``, ``FeedForwardSpec.router``, ``LayerInputsSpec.kind``);
``DecoderParts`` maps those names to types. ``BUILTIN_PARTS`` holds the decoder's own; a model family extends them
with its own (``extended``) and hands the result to ``DecoderModel``. Nothing is registered by importing a module.

The types are built as
    block:        cls(layer_spec, decoder_spec, parts, rngs=...)  (decoder/blocks.py)
    router:       cls(feed_forward_spec, hidden, rngs=..., **extras) -> called as router(x_TD) -> (weights [T, k],
                  expert ids [T, k]), with a class attribute ``scales_input`` (decoder/moe.py)
    layer inputs: cls(decoder_spec, rngs=...) -> called as provider(tokens_BL, embeddings_BLD) -> [B, L, layers, P]
"""

from __future__ import annotations

import dataclasses
import types
from typing import Mapping

from omnijax.decoder.blocks import PreNormBlock, SandwichBlock
from omnijax.decoder.moe import SigmoidInputRouter, SoftmaxRouter
from omnijax.decoder.spec import DecoderSpec

_EMPTY: Mapping[str, type] = types.MappingProxyType({})


def _frozen(mapping: Mapping[str, type]) -> Mapping[str, type]:
    return types.MappingProxyType(dict(mapping))


@dataclasses.dataclass(frozen=True)
class DecoderParts:
    """Block, router and per-layer input types by name (read-only mappings)."""

    blocks: Mapping[str, type] = dataclasses.field(default_factory=dict)
    routers: Mapping[str, type] = dataclasses.field(default_factory=dict)
    layer_inputs: Mapping[str, type] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        for name in ("blocks", "routers", "layer_inputs"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))

    def extended(self, *, blocks: Mapping[str, type] = _EMPTY, routers: Mapping[str, type] = _EMPTY,
                 layer_inputs: Mapping[str, type] = _EMPTY) -> "DecoderParts":
        """These parts and the given ones; a name already taken is refused."""
        merged = {}
        for what, mine, added in (("block", self.blocks, blocks), ("router", self.routers, routers),
                                  ("per-layer input", self.layer_inputs, layer_inputs)):
            taken = sorted(set(mine) & set(added))
            if taken:
                raise ValueError(f"{what} name(s) {taken} are already taken")
            merged[what] = {**mine, **added}
        return DecoderParts(merged["block"], merged["router"], merged["per-layer input"])

    def block(self, name: str) -> type:
        return _lookup("block", name, self.blocks)

    def router(self, name: str) -> type:
        return _lookup("router", name, self.routers)

    def layer_input(self, name: str) -> type:
        return _lookup("per-layer input", name, self.layer_inputs)

    def check(self, spec: DecoderSpec) -> None:
        """Raise ValueError naming the first part ``spec`` uses that these parts do not hold."""
        for i, layer in enumerate(spec.layers):
            try:
                self.block(layer.block)
                if layer.ffn.kind == "moe":
                    self.router(layer.ffn.router)
            except ValueError as e:
                raise ValueError(f"decoder layer {i}: {e}") from None
        if spec.layer_inputs is not None:
            self.layer_input(spec.layer_inputs.kind)


def _lookup(what: str, name: str, known: Mapping[str, type]) -> type:
    if name not in known:
        raise ValueError(f"unknown {what} {name!r}; known: {sorted(known)} (the decoder's own and those its model "
                         f"family adds)")
    return known[name]


BUILTIN_PARTS = DecoderParts(
    blocks={"pre_norm": PreNormBlock, "sandwich": SandwichBlock},
    routers={"softmax": SoftmaxRouter, "sigmoid_input": SigmoidInputRouter},
)
