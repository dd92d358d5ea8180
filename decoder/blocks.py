"""Decoder blocks: a layer's norms, attention and feed-forward around the residual stream.

A block is ``pre_attention(x) -> h`` feeding its attention ``attn``, and ``post_attention(x, attention output,
layer input) -> x`` for everything after (residual adds, norms, feed-forward, per-layer extras). ``Block`` runs
both passes from those two: ``prefill`` (a whole prompt; returns the layer's keys/values) and ``forward`` (new
tokens after their rows' caches: decode steps and prompt chunks; returns the new tokens' keys/values). A
``LayerSpec.block`` names a block type; the built-in ones are here (decoder/parts.py), a family adds its own.

A block type is built as ``cls(layer_spec, decoder_spec, parts, rngs=...)``; ``parts`` (decoder/parts.py) resolves
the routers its feed-forward names.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from omnijax.common.norms import RMSNorm
from omnijax.common.sharding import constrain
from omnijax.decoder.attention import Attention, BatchContext, PromptContext
from omnijax.decoder.kv_cache import LayerCache
from omnijax.decoder.mlp import GatedMLP
from omnijax.decoder.moe import MoEMLP
from omnijax.decoder.spec import DecoderSpec, FeedForwardSpec, LayerSpec


def take_rows(x_BLD: jax.Array, rows_BQ: jax.Array) -> jax.Array:
    """x at rows ``rows_BQ`` of each batch row -> [B, Q, ...]."""
    return jnp.take_along_axis(x_BLD, rows_BQ.reshape(*rows_BQ.shape, *(1,) * (x_BLD.ndim - 2)), axis=1)


def feed_forward(spec: FeedForwardSpec, hidden: int, parts, *, rngs: nnx.Rngs) -> nnx.Module:
    if spec.kind == "moe":
        return MoEMLP(spec, hidden, parts.router(spec.router), rngs=rngs)
    return GatedMLP(hidden, spec.intermediate, spec.activation, rngs=rngs)


def norm_of(dspec: DecoderSpec) -> Callable[[], RMSNorm]:
    return lambda: RMSNorm(dspec.hidden_size, eps=dspec.rms_norm_eps, plus_one=dspec.norm_plus_one,
                           axis_name="embed")


class Block(nnx.Module):
    """The two passes of a block, from its ``pre_attention``, ``attn`` (an ``Attention``) and ``post_attention``."""

    def pre_attention(self, x_BLD: jax.Array) -> jax.Array:
        raise NotImplementedError

    def post_attention(self, x_BLD: jax.Array, h_BLD: jax.Array, layer_input_BLP: jax.Array | None) -> jax.Array:
        raise NotImplementedError

    def prefill(self, x_BLD: jax.Array, ctx: PromptContext, shared_kv: tuple | None = None,
                layer_input_BLP: jax.Array | None = None, rows_BQ: jax.Array | None = None):
        """A prompt -> (x, this layer's keys/values or None). ``rows_BQ``: the residual rows the attention output
        holds when its queries were narrowed (``ctx.query_rows``) and ``x`` was not yet; ``layer_input_BLP`` is
        already at the output rows."""
        h, kv = self.attn.prefill(self.pre_attention(x_BLD), ctx, shared_kv)
        if rows_BQ is not None:
            x_BLD = take_rows(x_BLD, rows_BQ)
        return self.post_attention(x_BLD, h, layer_input_BLP), kv

    def forward(self, x_STD: jax.Array, ctx: BatchContext, cache: LayerCache, shared_kv: tuple | None = None,
                layer_input_STP: jax.Array | None = None) -> tuple[jax.Array, tuple | None]:
        """New tokens after their rows' caches -> (x, the tokens' keys/values or None)."""
        h, kv = self.attn.forward(self.pre_attention(x_STD), ctx, cache, shared_kv)
        return self.post_attention(x_STD, h, layer_input_STP), kv


class PreNormBlock(Block):
    """x + attn(norm(x)), then x + ffn(norm(x)) (Llama, Qwen)."""

    post_norms = False

    def __init__(self, layer: LayerSpec, dspec: DecoderSpec, parts, *, rngs: nnx.Rngs):
        norm = norm_of(dspec)
        self.attn_norm_in = norm()
        self.attn = Attention(layer.attention, dspec.hidden_size, eps=dspec.rms_norm_eps,
                              norm_plus_one=dspec.norm_plus_one, rngs=rngs)
        self.attn_norm_out = norm() if self.post_norms else None
        self.mlp_norm_in = norm()
        self.mlp = feed_forward(layer.ffn, dspec.hidden_size, parts, rngs=rngs)
        self.mlp_norm_out = norm() if self.post_norms else None

    def pre_attention(self, x_BLD: jax.Array) -> jax.Array:
        return self.attn_norm_in(x_BLD)

    def post_attention(self, x_BLD: jax.Array, h_BLD: jax.Array, layer_input_BLP: jax.Array | None) -> jax.Array:
        if self.attn_norm_out is not None:
            h_BLD = self.attn_norm_out(h_BLD)
        x_BLD = x_BLD + h_BLD
        h_BLD = self.mlp(self.mlp_norm_in(x_BLD))
        if self.mlp_norm_out is not None:
            h_BLD = self.mlp_norm_out(h_BLD)
        return constrain(x_BLD + h_BLD, ("batch", "length", "embed"))


class SandwichBlock(PreNormBlock):
    """Gemma's block: each sub-block's output is normed again before the residual add."""

    post_norms = True
