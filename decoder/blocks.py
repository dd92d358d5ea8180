"""Decoder block types, by name. A ``LayerSpec.block`` names one; a family with a genuinely new block registers it.

A block takes the residual stream x [B, L, D] and a ``LayerCall`` that runs its attention for the current pass
(a prompt or a decode step), and returns (x, the keys/values its attention produced).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
from flax import nnx

from omnijax.common.norms import RMSNorm
from omnijax.common.sharding import constrain
from omnijax.decoder.attention import KV, Attention
from omnijax.decoder.mlp import GatedMLP
from omnijax.decoder.moe import MoEMLP
from omnijax.decoder.spec import DecoderSpec, FeedForwardSpec, LayerSpec

BLOCKS: dict[str, type] = {}


def register_block(name: str):
    """Class decorator: make a block type available to ``LayerSpec.block``."""

    def add(cls):
        BLOCKS[name] = cls
        return cls

    return add


class LayerCall(NamedTuple):
    """How a block runs in the current pass.

    attend(attention module, normed x) -> (output [B, Lq, D], KV); select(x) -> the residual rows matching the
    attention output rows (a prompt's last layers compute only the rows whose outputs are wanted);
    layer_input: this layer's slice of the per-layer inputs [B, L, P] (or None).
    """

    attend: Callable[[Attention, jax.Array], tuple[jax.Array, KV]]
    select: Callable[[jax.Array], jax.Array]
    layer_input: jax.Array | None = None


def feed_forward(spec: FeedForwardSpec, hidden: int, *, rngs: nnx.Rngs) -> nnx.Module:
    if spec.kind == "moe":
        return MoEMLP(spec, hidden, rngs=rngs)
    return GatedMLP(hidden, spec.intermediate, spec.activation, rngs=rngs)


def norm_of(dspec: DecoderSpec) -> Callable[[], RMSNorm]:
    return lambda: RMSNorm(dspec.hidden_size, eps=dspec.rms_norm_eps, plus_one=dspec.norm_plus_one,
                           axis_name="embed")


@register_block("pre_norm")
class PreNormBlock(nnx.Module):
    """x + attn(norm(x)), then x + ffn(norm(x)) (Llama, Qwen)."""

    post_norms = False

    def __init__(self, layer: LayerSpec, dspec: DecoderSpec, *, rngs: nnx.Rngs):
        norm = norm_of(dspec)
        self.attn_norm_in = norm()
        self.attn = Attention(layer.attention, dspec.hidden_size, eps=dspec.rms_norm_eps,
                              norm_plus_one=dspec.norm_plus_one, rngs=rngs)
        self.attn_norm_out = norm() if self.post_norms else None
        self.mlp_norm_in = norm()
        self.mlp = feed_forward(layer.ffn, dspec.hidden_size, rngs=rngs)
        self.mlp_norm_out = norm() if self.post_norms else None

    def __call__(self, x_BLD: jax.Array, call: LayerCall) -> tuple[jax.Array, KV]:
        h, kv = call.attend(self.attn, self.attn_norm_in(x_BLD))
        x_BLD = call.select(x_BLD)
        if self.attn_norm_out is not None:
            h = self.attn_norm_out(h)
        x_BLD = x_BLD + h
        h = self.mlp(self.mlp_norm_in(x_BLD))
        if self.mlp_norm_out is not None:
            h = self.mlp_norm_out(h)
        return constrain(x_BLD + h, ("batch", "length", "embed")), kv


@register_block("sandwich")
class SandwichBlock(PreNormBlock):
    """Gemma's block: each sub-block's output is normed again before the residual add."""

    post_norms = True
