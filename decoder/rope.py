"""Rotary position embeddings."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from decoder.config import RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> np.ndarray:
    """inv_freq [head_dim // 2] in float32, as transformers computes it (including linear scaling)."""
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = (1.0 / (np.float32(rope.theta) ** exponents)).astype(np.float32)
    if rope.kind == "linear":
        inv_freq = (inv_freq / np.float32(rope.factor)).astype(np.float32)
    elif rope.kind != "default":
        raise ValueError(f"unknown RoPE kind {rope.kind!r}")
    return inv_freq


def cos_sin(positions: jax.Array, inv_freq: np.ndarray) -> tuple[jax.Array, jax.Array]:
    """cos, sin [..., head_dim] for integer ``positions`` [...] (rotate-half layout: freqs repeated twice)."""
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)[None]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rotary(x_BLNH: jax.Array, cos_BLH: jax.Array, sin_BLH: jax.Array) -> jax.Array:
    """Rotate-half RoPE on x [batch, seq, heads, head_dim] with cos/sin [batch, seq, head_dim]."""
    half = x_BLNH.shape[-1] // 2
    x1, x2 = x_BLNH[..., :half], x_BLNH[..., half:]
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    cos = cos_BLH[:, :, None, :].astype(x_BLNH.dtype)
    sin = sin_BLH[:, :, None, :].astype(x_BLNH.dtype)
    return x_BLNH * cos + rotated * sin
