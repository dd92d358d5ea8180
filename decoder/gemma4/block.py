"""Gemma 4's decoder layer (``Gemma4TextDecoderLayer``), registered as the block type "gemma4".

    x = x + post_attention_norm(attention(input_norm(x)))
    h = mlp(pre_feedforward_norm(x))
    with experts beside the MLP ("moe" option):
        h = post_feedforward_norm_1(h) + post_feedforward_norm_2(experts(pre_feedforward_norm_2(x), route=x))
    x = x + post_feedforward_norm(h)
    with per-layer inputs ("layer_input" option, width P; the layer's slice u [B, L, P] of the per-layer inputs):
        x = x + post_per_layer_input_norm(projection(act(gate(x)) * u))
    x = x * layer_scalar

Every norm is an RMSNorm scaling by w (``DecoderSpec.norm_plus_one`` False); ``act`` is the feed-forward's
activation. Options (``LayerSpec.options``): "moe" (a mixture-of-experts ``FeedForwardSpec`` run beside the dense
``LayerSpec.ffn``, or absent) and "layer_input" (P, or 0 / absent).

Parameter tree (paths relative to the block), beside ``SandwichBlock``'s (attn_norm_in, attn, attn_norm_out,
mlp_norm_in, mlp, mlp_norm_out)::

    ("layer_scalar",) [1]
    ("moe", ...) (decoder.gemma4.moe.ExpertsBeside), ("dense_norm_out" | "moe_norm_in" | "moe_norm_out", "weight")
    ("layer_input_gate", "kernel") [P, embed], ("layer_input_proj", "kernel") [embed, P],
    ("layer_input_norm", "weight") [embed]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from omnijax.common.activations import activation
from omnijax.common.linear import Linear
from omnijax.common.sharding import constrain
from omnijax.decoder.attention import KV
from omnijax.decoder.blocks import LayerCall, SandwichBlock, norm_of, register_block
from omnijax.decoder.gemma4.moe import ExpertsBeside
from omnijax.decoder.spec import DecoderSpec, LayerSpec


@register_block("gemma4")
class Gemma4Block(SandwichBlock):
    def __init__(self, layer: LayerSpec, dspec: DecoderSpec, *, rngs: nnx.Rngs):
        super().__init__(layer, dspec, rngs=rngs)
        norm = norm_of(dspec)
        hidden = dspec.hidden_size
        moe = layer.option("moe")
        self.moe = ExpertsBeside(moe, hidden, eps=dspec.rms_norm_eps, rngs=rngs) if moe is not None else None
        self.dense_norm_out = norm() if moe is not None else None
        self.moe_norm_in = norm() if moe is not None else None
        self.moe_norm_out = norm() if moe is not None else None
        width = int(layer.option("layer_input", 0) or 0)
        self.layer_input_gate = Linear(hidden, width, axes=("embed", None), rngs=rngs) if width else None
        self.layer_input_proj = Linear(width, hidden, axes=(None, "embed"), rngs=rngs) if width else None
        self.layer_input_norm = norm() if width else None
        self.act = layer.ffn.activation
        self.layer_scalar = nnx.Param(jnp.ones((1,)), axes=(None,))

    def __call__(self, x_BLD: jax.Array, call: LayerCall) -> tuple[jax.Array, KV]:
        h, kv = call.attend(self.attn, self.attn_norm_in(x_BLD))
        x_BLD = call.select(x_BLD) + self.attn_norm_out(h)
        h = self.mlp(self.mlp_norm_in(x_BLD))
        if self.moe is not None:
            experts = self.moe(self.moe_norm_in(x_BLD), x_BLD)
            h = self.dense_norm_out(h) + self.moe_norm_out(experts)
        x_BLD = x_BLD + self.mlp_norm_out(h)
        if self.layer_input_gate is not None:
            if call.layer_input is None:
                raise ValueError("a Gemma 4 block with per-layer inputs was called without them")
            u = call.select(call.layer_input)  # the rows of the residual stream, as for x
            g = activation(self.act)(self.layer_input_gate(x_BLD)) * u.astype(x_BLD.dtype)
            x_BLD = x_BLD + self.layer_input_norm(self.layer_input_proj(g))
        x_BLD = x_BLD * self.layer_scalar[...].astype(x_BLD.dtype)
        return constrain(x_BLD, ("batch", "length", "embed")), kv
