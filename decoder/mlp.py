"""Gated feed-forward blocks (GeGLU / SwiGLU)."""

from __future__ import annotations

import jax
from flax import nnx

from decoder.linear import Linear

ACTIVATIONS = {
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "silu": jax.nn.silu,
}


def activation(name: str):
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; known: {sorted(ACTIVATIONS)}") from None


class GatedMLP(nnx.Module):
    """down(act(gate(x)) * up(x)); x [batch, seq, embed] -> [batch, seq, embed].

    gate and up are one fused [embed, 2 * mlp] kernel (gate columns first): one matmul reads both."""

    def __init__(self, hidden: int, intermediate: int, act: str, *, rngs: nnx.Rngs):
        self.gate_up_proj = Linear(hidden, 2 * intermediate, axes=("embed", "mlp"), rngs=rngs)
        self.down_proj = Linear(intermediate, hidden, axes=("mlp", "embed"), rngs=rngs)
        self.intermediate = intermediate
        self.act = act

    def __call__(self, x_BLD: jax.Array) -> jax.Array:
        gate_up = self.gate_up_proj(x_BLD)
        h = activation(self.act)(gate_up[..., :self.intermediate]) * gate_up[..., self.intermediate:]
        return self.down_proj(h)
