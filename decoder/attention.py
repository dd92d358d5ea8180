"""Multi-head attention with grouped KV heads, optional q/k norm, RoPE and a KV cache."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from decoder.config import DecoderConfig
from decoder.linear import Linear
from decoder.norms import RMSNorm
from decoder.rope import apply_rotary
from decoder.sharding import constrain


def dot_attention(q_BLNH: jax.Array, k_BKSH: jax.Array, v_BKSH: jax.Array, mask_BLS: jax.Array, *, scale: float,
                  softcap: float | None = None) -> jax.Array:
    """softmax(q.k * scale [softcapped] + mask) . v with N query heads sharing K kv heads -> [batch, q_len, N, H].

    Keys and values are heads-major [batch, kv_heads, keys, head_dim] (the KV cache layout). The G = N / K query
    heads of one kv head are folded into the rows of one matrix product per kv head.
    """
    b, l, n, h = q_BLNH.shape
    kv, s = k_BKSH.shape[1], k_BKSH.shape[2]
    g = n // kv
    q = (q_BLNH * jnp.asarray(scale, q_BLNH.dtype)).reshape(b, l, kv, g, h).transpose(0, 2, 3, 1, 4)
    scores = jnp.einsum("bkqh,bksh->bkqs", q.reshape(b, kv, g * l, h), k_BKSH,
                        preferred_element_type=jnp.float32).reshape(b, kv, g, l, s)
    if softcap is not None:
        scores = jnp.tanh(scores / softcap) * softcap
    scores = scores + jnp.where(mask_BLS, 0.0, -1e30).astype(jnp.float32)[:, None, None]
    scores = scores - jnp.max(scores, axis=-1, keepdims=True)
    probs = jnp.exp(scores)
    probs = (probs / jnp.sum(probs, axis=-1, keepdims=True)).astype(v_BKSH.dtype)
    out = jnp.einsum("bkqs,bksh->bkqh", probs.reshape(b, kv, g * l, s), v_BKSH).reshape(b, kv, g, l, h)
    return out.transpose(0, 3, 1, 2, 4).reshape(b, l, n, h)


class Attention(nnx.Module):
    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
        d, n, kv, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = n, kv, h
        self.scale = cfg.scale
        self.softcap = cfg.attn_logit_softcap
        bias = cfg.attention_bias
        # q, k and v projections fused into one [embed, (N + 2K) * head_dim] kernel: one matmul
        self.qkv_proj = Linear(d, (n + 2 * kv) * h, axes=("embed", "heads"), use_bias=bias, rngs=rngs)
        self.o_proj = Linear(n * h, d, axes=("heads", "embed"), use_bias=bias, rngs=rngs)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(h, eps=cfg.rms_norm_eps, plus_one=cfg.norm_plus_one, axis_name="head_dim")
            self.k_norm = RMSNorm(h, eps=cfg.rms_norm_eps, plus_one=cfg.norm_plus_one, axis_name="head_dim")
        else:
            self.q_norm = self.k_norm = None

    def __call__(self, x_BLD: jax.Array, cos_BLH: jax.Array, sin_BLH: jax.Array, mask_BLS: jax.Array,
                 cache_k_BKTH: jax.Array, cache_v_BKTH: jax.Array, write_index: jax.Array, *,
                 attend_cache: bool, last_query_only: bool = False) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Returns (output [B, L, D], updated cache k, updated cache v).

        The new keys/values are written into the cache at slot ``write_index``. With ``attend_cache`` the queries
        attend over the whole cache (decode; mask [B, L, T]); without it only over the new keys (prefill of an
        empty cache; mask [B, L, L]). ``last_query_only``: keys and values of every position go into the cache
        but only the last position's output is computed ([B, 1, D]).
        """
        b, l, _ = x_BLD.shape
        n, kv, h = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(x_BLD)
        q = qkv[..., :n * h].reshape(b, l, n, h)
        k = qkv[..., n * h:(n + kv) * h].reshape(b, l, kv, h)
        v = qkv[..., (n + kv) * h:].reshape(b, l, kv, h)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rotary(q, cos_BLH, sin_BLH)
        k = apply_rotary(k, cos_BLH, sin_BLH)
        q = constrain(q, ("batch", "length", "heads", "head_dim"))
        k = k.transpose(0, 2, 1, 3)  # [B, K, L, H]
        v = v.transpose(0, 2, 1, 3)
        zero = jnp.zeros((), jnp.int32)
        at = (zero, zero, write_index, zero)
        cache_k = jax.lax.dynamic_update_slice(cache_k_BKTH, k.astype(cache_k_BKTH.dtype), at)
        cache_v = jax.lax.dynamic_update_slice(cache_v_BKTH, v.astype(cache_v_BKTH.dtype), at)
        cache_k = constrain(cache_k, ("batch", "kv_heads", "cache_len", "head_dim"))
        cache_v = constrain(cache_v, ("batch", "kv_heads", "cache_len", "head_dim"))
        keys, values = (cache_k, cache_v) if attend_cache else (k, v)
        if last_query_only:
            q, mask_BLS, l = q[:, -1:], mask_BLS[:, -1:], 1
        out = dot_attention(q, keys.astype(q.dtype), values.astype(q.dtype), mask_BLS, scale=self.scale,
                            softcap=self.softcap)
        return self.o_proj(out.reshape(b, l, self.num_heads * self.head_dim)), cache_k, cache_v
