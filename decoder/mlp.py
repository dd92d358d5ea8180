"""Gated feed-forward blocks (GeGLU / SwiGLU)."""

from __future__ import annotations

import jax
from flax import nnx

from decoder.linear import Linear

_gelu_tanh = lambda x: jax.nn.gelu(x, approximate=True)  # noqa: E731

# Names as Hugging Face's ``ACT2FN`` spells them (plus "gelu_tanh"), each computing what ACT2FN[name] computes.
ACTIVATIONS = {
    "gelu_tanh": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu_new": _gelu_tanh,
    "gelu_fast": _gelu_tanh,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
    "silu": jax.nn.silu,
    "relu": jax.nn.relu,
}


def activation(name: str):
    """The elementwise function named ``name``; ValueError naming the known ones otherwise."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; known: {sorted(ACTIVATIONS)}") from None


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
