"""Building blocks shared by the encoder towers (SigLIP, Qwen3-Omni vision and audio): modules, their weight-map
helpers and the config-reading helpers.

Parameter tree of each module (paths relative to the module)::

    FeedForward          ("fc1" | "fc2", "kernel" | "bias")
    MultiHeadProjections ("q_proj" | "k_proj" | "v_proj" | "out_proj", "kernel" | "bias")
    PreLNBlock           ("norm1" | "norm2", "weight" | "bias"), ("attn", ...), ("mlp", ...)

The attention core the towers put into ``MultiHeadProjections`` is encoders/attention.py's.
"""

from __future__ import annotations

from typing import Callable

import jax
from flax import nnx

from omnijax.common.weights import ParamPath, TensorSpec, linear, plain
from omnijax.common.linear import Linear
from omnijax.common.activations import activation
from omnijax.common.norms import LayerNorm


class FeedForward(nnx.Module):
    """fc2(act(fc1(x))), both with biases; x [..., dim] -> [..., out_dim] (out_dim defaults to dim).

    Kernels: fc1 [dim, hidden] with logical axes (axes_in, axes_hidden), fc2 [hidden, out_dim] with
    (axes_hidden, axes_out), axes_out defaulting to axes_in."""

    def __init__(self, dim: int, hidden: int, act: str, axes_in: str | None, axes_hidden: str | None, *,
                 rngs: nnx.Rngs, out_dim: int | None = None, axes_out: str | None = None):
        activation(act)  # fail at construction on an unknown name
        self.act = act
        self.fc1 = Linear(dim, hidden, axes=(axes_in, axes_hidden), use_bias=True, rngs=rngs)
        self.fc2 = Linear(hidden, dim if out_dim is None else out_dim,
                          axes=(axes_hidden, axes_in if axes_out is None else axes_out), use_bias=True, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(activation(self.act)(self.fc1(x)))


class MultiHeadProjections(nnx.Module):
    """Separate q/k/v projections and an output projection, all [dim, dim] with biases, around an attention core.

    ``core(q, k, v)`` takes and returns [..., heads, head_dim] arrays; x [..., dim] -> [..., dim]."""

    def __init__(self, dim: int, num_heads: int, axes_embed: str, axes_heads: str, *, rngs: nnx.Rngs):
        if dim % num_heads:
            raise ValueError(f"hidden size {dim} is not divisible by the number of attention heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.q_proj = Linear(dim, dim, axes=(axes_embed, axes_heads), use_bias=True, rngs=rngs)
        self.k_proj = Linear(dim, dim, axes=(axes_embed, axes_heads), use_bias=True, rngs=rngs)
        self.v_proj = Linear(dim, dim, axes=(axes_embed, axes_heads), use_bias=True, rngs=rngs)
        self.out_proj = Linear(dim, dim, axes=(axes_heads, axes_embed), use_bias=True, rngs=rngs)

    def __call__(self, x: jax.Array, core: Callable[[jax.Array, jax.Array, jax.Array], jax.Array]) -> jax.Array:
        split = lambda y: y.reshape(*y.shape[:-1], self.num_heads, self.head_dim)  # noqa: E731
        out = core(split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x)))
        return self.out_proj(out.reshape(*out.shape[:-2], self.num_heads * self.head_dim))


class PreLNBlock(nnx.Module):
    """Pre-LN transformer block: x + attn(norm1(x), *attn_args), then x + mlp(norm2(x)); x [..., dim]."""

    def __init__(self, dim: int, eps: float, axis_name: str, attn: nnx.Module, mlp: nnx.Module):
        self.norm1 = LayerNorm(dim, eps=eps, axis_name=axis_name)
        self.attn = attn
        self.norm2 = LayerNorm(dim, eps=eps, axis_name=axis_name)
        self.mlp = mlp

    def __call__(self, x: jax.Array, *attn_args) -> jax.Array:
        x = x + self.attn(self.norm1(x), *attn_args)
        return x + self.mlp(self.norm2(x))


# ---------------------------------------------------------------------------------------------------------------
# Weight-map helpers: our parameter path -> checkpoint tensor (torch Linear / LayerNorm naming).


def biased_linear_map(path: ParamPath, key: str) -> dict[ParamPath, TensorSpec]:
    """A Linear with bias at ``path`` <- torch ``{key}.weight`` and ``{key}.bias``."""
    return {path + ("kernel",): linear(key), path + ("bias",): plain(f"{key}.bias")}


def layer_norm_map(path: ParamPath, key: str) -> dict[ParamPath, TensorSpec]:
    """A LayerNorm at ``path`` <- ``{key}.weight`` and ``{key}.bias``."""
    return {path + (name,): plain(f"{key}.{name}") for name in ("weight", "bias")}


def feed_forward_map(path: ParamPath, fc1_key: str, fc2_key: str) -> dict[ParamPath, TensorSpec]:
    """A ``FeedForward`` at ``path`` <- the checkpoint's two Linears."""
    return {**biased_linear_map(path + ("fc1",), fc1_key), **biased_linear_map(path + ("fc2",), fc2_key)}


def multi_head_projections_map(path: ParamPath, key: str) -> dict[ParamPath, TensorSpec]:
    """A ``MultiHeadProjections`` at ``path`` <- ``{key}.q_proj`` / ``k_proj`` / ``v_proj`` / ``out_proj``."""
    m: dict[ParamPath, TensorSpec] = {}
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        m.update(biased_linear_map(path + (proj,), f"{key}.{proj}"))
    return m


def pre_ln_block_norms_map(path: ParamPath, norm1_key: str, norm2_key: str) -> dict[ParamPath, TensorSpec]:
    """The two LayerNorms of a ``PreLNBlock`` at ``path``."""
    return {**layer_norm_map(path + ("norm1",), norm1_key), **layer_norm_map(path + ("norm2",), norm2_key)}


# ---------------------------------------------------------------------------------------------------------------
# Reading HF config dicts.
