"""Gated feed-forward blocks (GeGLU / SwiGLU)."""

from __future__ import annotations

import jax
from flax import nnx

from common.activations import activation
from common.linear import Linear


class GatedMLP(nnx.Module):
    """down(act(gate(x)) * up(x)); x [batch, seq, embed] -> [batch, seq, embed].

    gate and up are one fused [2 * mlp, embed] kernel (gate rows first): one matmul reads both."""

    def __init__(self, hidden: int, intermediate: int, act: str, *, rngs: nnx.Rngs):
        self.gate_up_proj = Linear(hidden, 2 * intermediate, axes=("embed", "mlp"), rngs=rngs)
        self.down_proj = Linear(intermediate, hidden, axes=("mlp", "embed"), rngs=rngs)
        self.intermediate = intermediate
        self.act = act

    def __call__(self, x_BLD: jax.Array) -> jax.Array:
        gate_up = self.gate_up_proj(x_BLD)
        h = activation(self.act)(gate_up[..., :self.intermediate]) * gate_up[..., self.intermediate:]
        return self.down_proj(h)
