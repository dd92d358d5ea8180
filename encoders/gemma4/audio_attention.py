"""Gemma 4 audio attention: chunked local self-attention with a learned relative-position term and a logit softcap
(``Gemma4AudioAttention``), computed in float32 the way the reference computes it.

For x [B, L, D] and key validity [B, L]:
  q = q_proj(x) * head_dim^-0.5 / ln 2 * softplus(per_dim_scale), k = k_proj(x) * ln(1 + e) / ln 2, v = v_proj(x);
  queries are cut into nb = ceil(L / c) chunks of c = attention_chunk_size; chunk b sees the w = c + (left - 1) +
  right keys starting at b*c - (left - 1) (zeros outside [0, L)); logits = q.k + q.r, where r are the
  ``relative_k_proj`` of sinusoidal embeddings of the positions w//2, ..., 0 arranged by the Transformer-XL shift
  (pad to w + 1 columns, flatten, cut, reshape), exactly as the reference does; logits = cap * tanh(logits / cap);
  a key is allowed when it lies in [0, L), is valid, and q - (left - 2) <= k <= q + right - 1 (the reference's
  sliding-window mask); other logits are set to ``attention_invalid_logits_value``; softmax; out = post(probs @ v).
This is not encoders/attention.py's attention (one window of keys per chunk of queries, a relative-position term,
soft-capped logits, float32 throughout).

Shapes are static (L from the input), so a jitted call compiles once per padded length.

Parameter tree: ``q_proj``, ``k_proj``, ``v_proj``, ``post`` (``ClippableLinear``), ``relative_k_proj`` (``kernel``
[D, D]), ``per_dim_scale`` [head_dim].
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from omnijax.common.linear import Linear
from omnijax.common.weights import ParamPath, TensorSpec, linear, plain
from omnijax.encoders.gemma4.audio_config import Gemma4AudioEncoderConfig
from omnijax.encoders.gemma4.clippable_linear import ClippableLinear, clippable_linear_map


def relative_position_embeddings(cfg: Gemma4AudioEncoderConfig) -> np.ndarray:
    """float32 [context_size // 2 + 1, hidden_size]: [sin, cos] of positions context_size // 2 down to 0 times
    ``inv_timescales`` (``Gemma4AudioRelPositionalEncoding``, timescales 1 to 1e4)."""
    num_timescales = cfg.hidden_size // 2
    increment = math.log(10000.0) / max(num_timescales - 1, 1)
    inv_timescales = np.exp(np.arange(num_timescales, dtype=np.float32) * np.float32(-increment)).astype(np.float32)
    positions = np.arange(cfg.context_size // 2, -1, -1, dtype=np.float32)[:, None]
    scaled = positions * inv_timescales[None, :]
    return np.concatenate([np.sin(scaled), np.cos(scaled)], axis=-1).astype(np.float32)


def chunk_context_indices(num_chunks: int, cfg: Gemma4AudioEncoderConfig) -> np.ndarray:
    """int32 [num_chunks, context_size]: the key position each context slot of each chunk holds (may be outside
    [0, T): those are padding)."""
    starts = np.arange(num_chunks)[:, None] * cfg.attention_chunk_size - cfg.max_past_horizon
    return (starts + np.arange(cfg.context_size)[None, :]).astype(np.int32)


def chunk_window_allowed(num_frames: int, cfg: Gemma4AudioEncoderConfig) -> np.ndarray:
    """bool [num_chunks, chunk, context_size]: whether query (chunk, i) may see context slot j by position alone:
    the query and key lie in [0, num_frames) and the key is within the reference's sliding window of the query."""
    chunk = cfg.attention_chunk_size
    num_chunks = -(-num_frames // chunk)
    keys = chunk_context_indices(num_chunks, cfg)[:, None, :]  # [chunks, 1, context]
    queries = (np.arange(num_chunks)[:, None] * chunk + np.arange(chunk)[None, :])[:, :, None]  # [chunks, chunk, 1]
    dist = queries - keys
    in_window = ((dist >= 0) & (dist < cfg.max_past_horizon)) | ((dist < 0) & (-dist < cfg.attention_context_right))
    return in_window & (keys >= 0) & (keys < num_frames) & (queries < num_frames)


def relative_shift(scores: jax.Array, context_size: int) -> jax.Array:
    """[..., chunk, positions] position scores -> [..., chunk, context]: the reference's ``_rel_shift`` (pad to
    context + 1 columns, flatten chunk * (context + 1), keep the first chunk * context, reshape)."""
    *lead, chunk, positions = scores.shape
    x = jnp.pad(scores, [(0, 0)] * (len(lead) + 1) + [(0, context_size + 1 - positions)])
    x = x.reshape(*lead, chunk * (context_size + 1))[..., : chunk * context_size]
    return x.reshape(*lead, chunk, context_size)


class Gemma4AudioAttention(nnx.Module):
    def __init__(self, cfg: Gemma4AudioEncoderConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d, clipped = cfg.hidden_size, cfg.use_clipped_linears
        self.q_proj = ClippableLinear(d, d, clipped=clipped, axes=("audio_embed", "audio_heads"), rngs=rngs)
        self.k_proj = ClippableLinear(d, d, clipped=clipped, axes=("audio_embed", "audio_heads"), rngs=rngs)
        self.v_proj = ClippableLinear(d, d, clipped=clipped, axes=("audio_embed", "audio_heads"), rngs=rngs)
        self.post = ClippableLinear(d, d, clipped=clipped, axes=("audio_heads", "audio_embed"), rngs=rngs)
        self.relative_k_proj = Linear(d, d, axes=("audio_embed", "audio_heads"), rngs=rngs)
        self.per_dim_scale = nnx.Param(jnp.zeros((cfg.head_dim,)), axes=(None,))

    def __call__(self, x_BLD: jax.Array, key_valid_BL: jax.Array, rel_pos: jax.Array) -> jax.Array:
        """x [B, L, D], key validity [B, L] bool, relative position embeddings [context_size // 2 + 1, D] ->
        [B, L, D]."""
        cfg = self.cfg
        b, t, _ = x_BLD.shape
        h, hd, chunk, w = cfg.num_attention_heads, cfg.head_dim, cfg.attention_chunk_size, cfg.context_size
        nb = -(-t // chunk)
        f32 = jnp.float32

        q = self.q_proj(x_BLD).astype(f32).reshape(b, t, h, hd)
        k = self.k_proj(x_BLD).astype(f32).reshape(b, t, h, hd)
        v = self.v_proj(x_BLD).astype(f32).reshape(b, t, h, hd)
        q = q * ((hd ** -0.5) / math.log(2)) * jax.nn.softplus(self.per_dim_scale[...].astype(f32))
        k = k * (math.log(1 + math.e) / math.log(2))

        # Query chunks [B, chunks, chunk, N, H]; key / value contexts [B, chunks, context, N, H] gathered from a
        # zero-padded copy.
        q_chunks = jnp.pad(q, ((0, 0), (0, nb * chunk - t), (0, 0), (0, 0))).reshape(b, nb, chunk, h, hd)
        slots = chunk_context_indices(nb, cfg)
        in_range = (slots >= 0) & (slots < t)
        gather = np.where(in_range, slots, t)  # index t: an appended zero row, as the reference pads with zeros
        k_ctx = jnp.concatenate([k, jnp.zeros((b, 1, h, hd), f32)], axis=1)[:, gather]
        v_ctx = jnp.concatenate([v, jnp.zeros((b, 1, h, hd), f32)], axis=1)[:, gather]

        rel_k = self.relative_k_proj(rel_pos.astype(x_BLD.dtype)).astype(f32).reshape(-1, h, hd)  # [positions, N, H]
        content = jnp.einsum("bnchd,bnwhd->bhncw", q_chunks, k_ctx)
        position = relative_shift(jnp.einsum("bnchd,phd->bhncp", q_chunks, rel_k), w)
        cap = cfg.attention_logit_cap
        logits = jnp.tanh((content + position) / cap) * cap  # [B, N, chunks, chunk, context]

        # [B, chunks, context]
        key_ok = jnp.concatenate([key_valid_BL, jnp.zeros((b, 1), bool)], axis=1)[:, gather] & in_range
        allowed = jnp.asarray(chunk_window_allowed(t, cfg))[None] & key_ok[:, :, None, :]  # [B, chunks, chunk, context]
        logits = jnp.where(allowed[:, None], logits, cfg.attention_invalid_logits_value)
        probs = jax.nn.softmax(logits, axis=-1)

        out = jnp.einsum("bhncw,bnwhd->bnchd", probs, v_ctx).reshape(b, nb * chunk, h * hd)[:, :t]
        return self.post(out.astype(x_BLD.dtype))


def attention_map(path: ParamPath, key: str, cfg: Gemma4AudioEncoderConfig) -> dict[ParamPath, TensorSpec]:
    """A ``Gemma4AudioAttention`` at ``path`` <- the checkpoint's ``{key}.*`` (a layer's ``self_attn``)."""
    m: dict[ParamPath, TensorSpec] = {}
    for name in ("q_proj", "k_proj", "v_proj", "post"):
        m.update(clippable_linear_map(path + (name,), f"{key}.{name}", cfg.use_clipped_linears))
    m[path + ("relative_k_proj", "kernel")] = linear(f"{key}.relative_k_proj")
    m[path + ("per_dim_scale",)] = plain(f"{key}.per_dim_scale")
    return m
