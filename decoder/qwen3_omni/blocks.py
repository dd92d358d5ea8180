"""Qwen3-Omni's code2wav transformer block: a pre-norm block whose attention and feed-forward outputs are each
scaled per channel by a learned layer scale before the residual add."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from omnijax.common.sharding import constrain
from omnijax.decoder.blocks import PreNormBlock
from omnijax.decoder.spec import DecoderSpec, LayerSpec


class LayerScaleBlock(PreNormBlock):
    """x + attn_scale * attn(norm(x)), then x + mlp_scale * mlp(norm(x))."""

    def __init__(self, layer: LayerSpec, dspec: DecoderSpec, parts, *, rngs: nnx.Rngs):
        super().__init__(layer, dspec, parts, rngs=rngs)
        self.attn_scale = nnx.Param(jnp.ones((dspec.hidden_size,)), axes=("embed",))
        self.mlp_scale = nnx.Param(jnp.ones((dspec.hidden_size,)), axes=("embed",))

    def post_attention(self, x_BLD: jax.Array, h_BLD: jax.Array, layer_input_BLP: jax.Array | None) -> jax.Array:
        x_BLD = x_BLD + self.attn_scale[...].astype(h_BLD.dtype) * h_BLD
        h_BLD = self.mlp(self.mlp_norm_in(x_BLD))
        return constrain(x_BLD + self.mlp_scale[...].astype(h_BLD.dtype) * h_BLD, ("batch", "length", "embed"))
