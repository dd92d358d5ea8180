"""Elementwise activation functions by their Hugging Face names."""

from __future__ import annotations

import jax

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
