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


def mrope_axis_of_frequency(num_freqs: int, section: tuple[int, int, int]) -> np.ndarray:
    """Which position axis (0 = t, 1 = h, 2 = w) drives each frequency index in interleaved MRoPE."""
    i = np.arange(num_freqs)
    axis = np.zeros(num_freqs, np.int32)
    axis[(i % 3 == 1) & (i < 3 * section[1])] = 1
    axis[(i % 3 == 2) & (i < 3 * section[2])] = 2
    return axis


def cos_sin(positions_ABL: jax.Array, rope: RopeConfig, head_dim: int) -> tuple[jax.Array, jax.Array]:
    """cos, sin [batch, seq, head_dim] (rotate-half layout: frequencies repeated twice).

    positions_ABL: [axes, batch, seq] integer positions; axes is 1, or 3 (t, h, w) for MRoPE.
    """
    inv_freq = jnp.asarray(inverse_frequencies(rope, head_dim))
    freqs = positions_ABL.astype(jnp.float32)[..., None] * inv_freq  # [A, B, L, H/2]
    if rope.mrope_section is not None and positions_ABL.shape[0] == 3:
        axis = jnp.asarray(mrope_axis_of_frequency(inv_freq.shape[0], rope.mrope_section))
        freqs = jnp.where(axis == 0, freqs[0], jnp.where(axis == 1, freqs[1], freqs[2]))
    else:
        freqs = freqs[0]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def rope_tables(positions_ABL: jax.Array, rope_by_type: dict[str, RopeConfig], head_dim: int) -> dict:
    """{layer type: (cos, sin) [batch, seq, head_dim]} for every RoPE variant of a decoder.

    Long prompts compute these in a call of their own and hand them to the layers: inside one compiled program
    XLA would recompute the cos/sin in every fused consumer (every layer's q and k)."""
    return {t: cos_sin(positions_ABL, r, head_dim) for t, r in rope_by_type.items()}


def apply_rotary(x_BLNH: jax.Array, cos_BLH: jax.Array, sin_BLH: jax.Array) -> jax.Array:
    """Rotate-half RoPE on x [batch, seq, heads, head_dim] with cos/sin [batch, seq, head_dim]."""
    half = x_BLNH.shape[-1] // 2
    x1, x2 = x_BLNH[..., :half], x_BLNH[..., half:]
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    cos = cos_BLH[:, :, None, :].astype(x_BLNH.dtype)
    sin = sin_BLH[:, :, None, :].astype(x_BLNH.dtype)
    return x_BLNH * cos + rotated * sin
