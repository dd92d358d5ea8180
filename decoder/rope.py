"""Rotary position embeddings: tables from positions, and the two rotation layouts (halves or interleaved pairs)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from omnijax.decoder.spec import RopeSpec


def mrope_axis_of_frequency(num_freqs: int, section: tuple[int, int, int]) -> np.ndarray:
    """Which position axis (0 = t, 1 = h, 2 = w) drives each frequency index in interleaved MRoPE."""
    i = np.arange(num_freqs)
    axis = np.zeros(num_freqs, np.int32)
    axis[(i % 3 == 1) & (i < 3 * section[1])] = 1
    axis[(i % 3 == 2) & (i < 3 * section[2])] = 2
    return axis


def rope_angles(positions_ABL: jax.Array, rope: RopeSpec, head_dim: int) -> jax.Array:
    """Angles [batch, seq, head_dim // 2] = position x inv_freq (MRoPE: each frequency reads its own axis).

    positions_ABL: [axes, batch, seq] integer positions; axes is 1, or 3 (t, h, w) for MRoPE.
    """
    inv_freq = jnp.asarray(rope.inverse_frequencies(head_dim))
    freqs = positions_ABL.astype(jnp.float32)[..., None] * inv_freq  # [A, B, L, H/2]
    if rope.mrope_section is not None and positions_ABL.shape[0] == 3:
        axis = jnp.asarray(mrope_axis_of_frequency(inv_freq.shape[0], rope.mrope_section))
        return jnp.where(axis == 0, freqs[0], jnp.where(axis == 1, freqs[1], freqs[2]))
    return freqs[0]


def cos_sin(positions_ABL: jax.Array, rope: RopeSpec, head_dim: int) -> tuple[jax.Array, jax.Array]:
    """(cos, sin) for ``apply_rotary``: [batch, seq, head_dim] for rotate-half (frequencies repeated twice),
    [batch, seq, head_dim // 2] for interleaved pairs."""
    angles = rope_angles(positions_ABL, rope, head_dim)
    if not rope.interleaved:
        angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def rope_key(rope: RopeSpec, head_dim: int) -> str:
    """Layers whose rotation is the same share one table (a string: tables travel in pytrees with sorted keys)."""
    return f"{rope!r}/{head_dim}"


def rope_tables(positions_ABL: jax.Array, ropes: list[tuple[RopeSpec, int]]) -> dict:
    """{rope_key: (cos, sin)} for every distinct (RopeSpec, head_dim) in ``ropes``.

    A prompt computes these once, outside the layers: inside one compiled program XLA would otherwise recompute
    the cos/sin in every fused consumer (every layer's q and k)."""
    return {rope_key(r, h): cos_sin(positions_ABL, r, h) for r, h in dict.fromkeys(ropes)}


def apply_rotary(x_BLNH: jax.Array, cos: jax.Array, sin: jax.Array, *, interleaved: bool = False) -> jax.Array:
    """RoPE on x [batch, seq, heads, head_dim] with tables from ``cos_sin`` ([batch, seq, ...])."""
    cos = cos[:, :, None, :].astype(x_BLNH.dtype)
    sin = sin[:, :, None, :].astype(x_BLNH.dtype)
    if interleaved:  # (x0 + i x1) * (cos + i sin) on the pairs (2j, 2j+1), in float32 as the reference does
        xf = x_BLNH.astype(jnp.float32).reshape(*x_BLNH.shape[:-1], -1, 2)
        c, s = cos.astype(jnp.float32), sin.astype(jnp.float32)
        x0, x1 = xf[..., 0], xf[..., 1]
        out = jnp.stack([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)
        return out.reshape(x_BLNH.shape).astype(x_BLNH.dtype)
    half = x_BLNH.shape[-1] // 2
    x1, x2 = x_BLNH[..., :half], x_BLNH[..., half:]
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return x_BLNH * cos + rotated * sin
