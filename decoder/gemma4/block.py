"""Gemma 4's decoder layer (``Gemma4TextDecoderLayer``), the block type "gemma4" (added by the Gemma 4 family).

    x = x + post_attention_norm(attention(input_norm(x)))
    h = mlp(pre_feedforward_norm(x))
    with experts beside the MLP (``Gemma4BlockOptions.moe``):
        h = post_feedforward_norm_1(h) + post_feedforward_norm_2(experts(pre_feedforward_norm_2(x), route=x))
    x = x + post_feedforward_norm(h)
    with per-layer inputs (``Gemma4BlockOptions.layer_input_width`` P; the layer's slice u [B, L, P] of the per-layer
    inputs):
        x = x + post_per_layer_input_norm(projection(act(gate(x)) * u))
    x = x * layer_scalar

Every norm is an RMSNorm scaling by w (``DecoderSpec.norm_plus_one`` False); ``act`` is the feed-forward's
activation.

Parameter tree (paths relative to the block), beside ``SandwichBlock``'s (attn_norm_in, attn, attn_norm_out,
mlp_norm_in, mlp, mlp_norm_out)::

    ("layer_scalar",) [1]
    ("moe", ...) (decoder.gemma4.moe.ExpertsBeside), ("dense_norm_out" | "moe_norm_in" | "moe_norm_out", "weight")
    ("layer_input_gate", "kernel") [P, embed], ("layer_input_proj", "kernel") [embed, P],
    ("layer_input_norm", "weight") [embed]
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from omnijax.common.activations import activation
from omnijax.common.linear import Linear
from omnijax.common.sharding import constrain
from omnijax.decoder.blocks import SandwichBlock, norm_of
from omnijax.decoder.gemma4.moe import ExpertsBeside
from omnijax.decoder.spec import DecoderSpec, FeedForwardSpec, LayerSpec


@dataclasses.dataclass(frozen=True)
class Gemma4BlockOptions:
    """moe: a mixture-of-experts spec run beside the dense ``LayerSpec.ffn`` (None: none). layer_input_width: P,
    the width of the layer's per-layer input (0: none)."""

    moe: FeedForwardSpec | None = None
    layer_input_width: int = 0

    def __post_init__(self):
        if self.layer_input_width < 0:
            raise ValueError(f"per-layer input width must be >= 0, got {self.layer_input_width}")


class Gemma4Block(SandwichBlock):
    def __init__(self, layer: LayerSpec, dspec: DecoderSpec, parts, *, rngs: nnx.Rngs):
        options = Gemma4BlockOptions() if layer.options is None else layer.options
        if not isinstance(options, Gemma4BlockOptions):
            raise TypeError(f"a gemma4 block takes Gemma4BlockOptions, got {options!r}")
        super().__init__(layer, dspec, parts, rngs=rngs)
        norm = norm_of(dspec)
        hidden = dspec.hidden_size
        moe = options.moe
        self.moe = ExpertsBeside(moe, hidden, parts.router(moe.router), eps=dspec.rms_norm_eps, rngs=rngs) \
            if moe is not None else None
        self.dense_norm_out = norm() if moe is not None else None
        self.moe_norm_in = norm() if moe is not None else None
        self.moe_norm_out = norm() if moe is not None else None
        width = options.layer_input_width
        self.layer_input_gate = Linear(hidden, width, axes=("embed", None), rngs=rngs) if width else None
        self.layer_input_proj = Linear(width, hidden, axes=(None, "embed"), rngs=rngs) if width else None
        self.layer_input_norm = norm() if width else None
        self.act = layer.ffn.activation
        self.layer_scalar = nnx.Param(jnp.ones((1,)), axes=(None,))

    def post_attention(self, x_BLD: jax.Array, h_BLD: jax.Array, layer_input_BLP: jax.Array | None) -> jax.Array:
        x_BLD = x_BLD + self.attn_norm_out(h_BLD)
        h_BLD = self.mlp(self.mlp_norm_in(x_BLD))
        if self.moe is not None:
            experts = self.moe(self.moe_norm_in(x_BLD), x_BLD)
            h_BLD = self.dense_norm_out(h_BLD) + self.moe_norm_out(experts)
        x_BLD = x_BLD + self.mlp_norm_out(h_BLD)
        if self.layer_input_gate is not None:
            if layer_input_BLP is None:
                raise ValueError("a Gemma 4 block with per-layer inputs was called without them")
            g = activation(self.act)(self.layer_input_gate(x_BLD)) * layer_input_BLP.astype(x_BLD.dtype)
            x_BLD = x_BLD + self.layer_input_norm(self.layer_input_proj(g))
        x_BLD = x_BLD * self.layer_scalar[...].astype(x_BLD.dtype)
        return constrain(x_BLD, ("batch", "length", "embed"))
