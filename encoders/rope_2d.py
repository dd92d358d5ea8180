"""The 2-D rotary position embedding of the vision towers (Gemma 4, Qwen3-Omni, Llama 4): one helper, three ways
of pairing a head's values.

Each token has a position on two axes (a, b): (x, y) or (row, column). With H the head size and
f_j = theta ** (-4 j / H) for j < H / 4, its H / 2 rotation angles are a * f_j, then b * f_j
(:func:`rope_2d_angles`). A pair of head values (u, w) turned by angle t becomes (u cos t - w sin t, w cos t + u sin
t); the towers pair the values differently:

- ``sections=1`` (Qwen3-Omni, ``Qwen3OmniMoeVisionRotaryEmbedding``): rotate_half over the whole head, value i with
  value i + H / 2, by angle i;
- ``sections=2`` (Gemma 4, ``apply_multidimensional_rope``): each half of the head by itself, the first half by the
  a angles (value i with i + H / 4), the second by the b angles;
- ``interleaved=True`` (Llama 4, ``vision_apply_rotary_emb``): value 2i with value 2i + 1, by angle i (a complex
  multiply).

``rope_2d_cos_sin`` lays cos and sin out for :func:`apply_rope_2d`; they are computed once per batch and used by
every layer. Letters as in encoders/__init__.py (J: the head_dim / 2 angles of a token).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def rope_2d_angles(positions_L2, head_dim: int, theta: float, xp=jnp):
    """float32 [..., head_dim / 2]: a * f_j for j < head_dim / 4, then b * f_j, for (a, b) positions [..., 2] (any
    integer or float dtype). ``xp``: jax.numpy (traced positions) or numpy (a table of constants built on the
    host, as Llama 4's)."""
    half = head_dim // 2
    inv_freq = 1.0 / (theta ** (xp.arange(0, half, 2, dtype=np.float32) / half))  # [head_dim / 4]
    angles = xp.asarray(positions_L2).astype(np.float32)[..., None] * inv_freq  # [..., 2, head_dim / 4]
    return angles.reshape(*angles.shape[:-2], -1)


def rope_2d_cos_sin(angles_LJ, *, sections: int = 1, interleaved: bool = False) -> tuple[jax.Array, jax.Array]:
    """cos, sin float32 of the angles [..., head_dim / 2] (:func:`rope_2d_angles`), laid out for
    :func:`apply_rope_2d`: one per pair, [..., head_dim / 2], when ``interleaved``; otherwise one per head value,
    [..., head_dim]: the angles cut into ``sections`` parts, one per section of the head, each written twice
    (rotate_half pairs the two halves of a section)."""
    angles = jnp.asarray(angles_LJ, jnp.float32)
    if not interleaved:
        parts = angles.reshape(*angles.shape[:-1], sections, -1)
        angles = jnp.concatenate([parts, parts], axis=-1).reshape(*angles.shape[:-1], 2 * angles.shape[-1])
    return jnp.cos(angles), jnp.sin(angles)


def rotate_half(x: jax.Array) -> jax.Array:
    """(-second half, first half) of the last axis."""
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rope_2d(x_BLNH: jax.Array, cos: jax.Array, sin: jax.Array, *, sections: int = 1,
                  interleaved: bool = False, float32: bool = False) -> jax.Array:
    """x [..., L, N, H] turned by the angles of :func:`rope_2d_cos_sin` (cos, sin [..., L, H] or, interleaved,
    [..., L, H / 2]; the same ``sections`` / ``interleaved``). ``float32``: computed in float32 and cast back to x's
    dtype (Qwen3-Omni, Llama 4); otherwise in x's dtype (Gemma 4)."""
    dtype = jnp.float32 if float32 else x_BLNH.dtype
    x = x_BLNH.astype(dtype)
    cos, sin = cos[..., None, :].astype(dtype), sin[..., None, :].astype(dtype)
    if interleaved:  # each pair (a, b) as the complex number a + ib, times cos + i sin
        pairs = x.reshape(*x.shape[:-1], x.shape[-1] // 2, 2)
        a, b = pairs[..., 0], pairs[..., 1]
        out = jnp.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(x.shape)
    else:
        size = x.shape[-1] // sections
        cuts = [slice(lo, lo + size) for lo in range(0, x.shape[-1], size)]
        parts = [x[..., cut] * cos[..., cut] + rotate_half(x[..., cut]) * sin[..., cut] for cut in cuts]
        out = parts[0] if sections == 1 else jnp.concatenate(parts, axis=-1)
    return out.astype(x_BLNH.dtype)
