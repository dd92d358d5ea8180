"""Normalisation layers: RMSNorm (w or 1+w scaling, computed in float32) and LayerNorm."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


def rms_norm(x: jax.Array, weight: jax.Array | None, *, eps: float, plus_one: bool) -> jax.Array:
    """RMS normalisation over the last axis in float32; ``weight`` broadcasts against x (None: no scale)."""
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    if weight is not None:
        w = weight.astype(jnp.float32)
        y = y * (1.0 + w) if plus_one else y * w
    return y.astype(x.dtype)


class RMSNorm(nnx.Module):
    """RMS normalisation over the last axis, computed in float32 and cast back to the input dtype.

    ``plus_one``: scale by (1 + w) (Gemma 3) instead of w (Llama, Qwen, Gemma 4).
    ``with_scale=False``: no weight at all (Gemma 4's v norm, Llama 4's L2 qk-norm).
    """

    def __init__(self, dim: int, *, eps: float = 1e-6, plus_one: bool = False, with_scale: bool = True,
                 axis_name: str | None = None, rngs: nnx.Rngs | None = None):
        self.eps = eps
        self.plus_one = plus_one
        self.weight = nnx.Param(jnp.zeros((dim,)) if plus_one else jnp.ones((dim,)), axes=(axis_name,)) \
            if with_scale else None

    def __call__(self, x: jax.Array) -> jax.Array:
        return rms_norm(x, None if self.weight is None else self.weight[...], eps=self.eps, plus_one=self.plus_one)


class LayerNorm(nnx.Module):
    """LayerNorm over the last axis with weight and bias (computed in float32)."""

    def __init__(self, dim: int, *, eps: float = 1e-6, axis_name: str | None = None, rngs: nnx.Rngs | None = None):
        self.eps = eps
        self.weight = nnx.Param(jnp.ones((dim,)), axes=(axis_name,))
        self.bias = nnx.Param(jnp.zeros((dim,)), axes=(axis_name,))

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        mean = jnp.mean(xf, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
        y = (xf - mean) * jax.lax.rsqrt(var + self.eps)
        y = y * self.weight[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)
        return y.astype(x.dtype)
