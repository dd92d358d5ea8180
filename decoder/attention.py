"""Multi-head attention with grouped KV heads, optional q/k norm, RoPE and a KV cache."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from decoder.config import DecoderConfig
from decoder.kv_cache import after, write_keys, write_values
from common.linear import Linear
from common.norms import RMSNorm
from decoder.rope import apply_rotary
from common.sharding import constrain


def dot_attention(q_BLNH: jax.Array, segments: list[tuple[jax.Array, jax.Array, jax.Array]], *, scale: float,
                  softcap: float | None = None, keys_transposed: bool = False) -> jax.Array:
    """softmax(q.k * scale [softcapped] + mask) . v over the keys of all ``segments`` -> [batch, q_len, N, H].

    Each segment is (keys [B, K, S, H], or [B, K, H, S] as the key cache holds them when ``keys_transposed``,
    values [B, K, S, H], mask [B, L, S]);
    one softmax spans every segment's keys (decode attends to the cache as it was plus the new tokens without
    concatenating them). N query heads share K kv heads: the G = N / K query heads of one kv head are folded into
    the rows of one matrix product per kv head.
    """
    b, l, n, h = q_BLNH.shape
    kv = segments[0][1].shape[1]
    g = n // kv
    q = (q_BLNH * jnp.asarray(scale, q_BLNH.dtype)).reshape(b, l, kv, g, h).transpose(0, 2, 3, 1, 4)
    q = q.reshape(b, kv, g * l, h)
    parts = []
    for keys, _, mask_BLS in segments:
        s = keys.shape[3 if keys_transposed else 2]
        scores = jnp.einsum("bkqh,bkhs->bkqs" if keys_transposed else "bkqh,bksh->bkqs", q, keys.astype(q.dtype),
                            preferred_element_type=jnp.float32).reshape(b, kv, g, l, s)
        if softcap is not None:
            scores = jnp.tanh(scores / softcap) * softcap
        parts.append(scores + jnp.where(mask_BLS, 0.0, -1e30).astype(jnp.float32)[:, None, None])
    scores = parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=-1)
    scores = scores - jnp.max(scores, axis=-1, keepdims=True)
    probs = jnp.exp(scores)
    probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
    out, offset = 0, 0
    for _, v_BKSH, _ in segments:
        s = v_BKSH.shape[2]
        p = probs[..., offset:offset + s].astype(q.dtype).reshape(b, kv, g * l, s)
        out = out + jnp.einsum("bkqs,bksh->bkqh", p, v_BKSH.astype(q.dtype))
        offset += s
    return out.reshape(b, kv, g, l, h).transpose(0, 3, 1, 2, 4).reshape(b, l, n, h)


PREFILL_CHUNK = 128  # query rows per attention block when a long prompt is split (see ``attention_spans``)


def attention_spans(first_query: int, length: int, *, window: int | None, ahead: int,
                    chunk: int = PREFILL_CHUNK) -> list[tuple[int, int, int, int]]:
    """(query start, query end, key start, key end) blocks covering queries ``first_query..length`` of a prompt.

    A query at index i sees keys in [i - window + 1, i + ahead] at most (causal attention: ahead 0; tokens of a
    bidirectional media block also see the rest of their block, which is at most ``ahead`` tokens long). Keys
    outside a block's span are masked anyway; skipping them saves their work (about half of it for causal
    attention, more for sliding windows). Prompts of at most two chunks stay one block.
    """
    rows = length - first_query
    step = rows if rows <= 2 * chunk else chunk
    spans = []
    for qs in range(first_query, length, step):
        qe = min(qs + step, length)
        ks = 0 if window is None else max(0, qs - window + 1)
        spans.append((qs, qe, ks, min(length, qe + ahead)))
    return spans


class Attention(nnx.Module):
    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
        d, n, kv, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = n, kv, h
        self.scale = cfg.scale
        self.softcap = cfg.attn_logit_softcap
        bias = cfg.attention_bias
        # q, k and v projections fused into one [(N + 2K) * head_dim, embed] kernel: one matmul
        self.qkv_proj = Linear(d, (n + 2 * kv) * h, axes=("embed", "heads"), use_bias=bias, rngs=rngs)
        self.o_proj = Linear(n * h, d, axes=("heads", "embed"), use_bias=bias, rngs=rngs)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(h, eps=cfg.rms_norm_eps, plus_one=cfg.norm_plus_one, axis_name="head_dim")
            self.k_norm = RMSNorm(h, eps=cfg.rms_norm_eps, plus_one=cfg.norm_plus_one, axis_name="head_dim")
        else:
            self.q_norm = self.k_norm = None

    def __call__(self, x_BLD: jax.Array, cos_BLH: jax.Array, sin_BLH: jax.Array, mask_BLS: jax.Array,
                 cache_k_BKHT: jax.Array, cache_v_BKTH: jax.Array, write_index: jax.Array, *,
                 cache_mask_BLT: jax.Array | None = None, last_query_only: bool = False,
                 key_reach: tuple[int | None, int] | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Returns (output [B, L, D], updated key cache [B, K, H, T], updated value cache [B, K, T, H]).

        The queries attend to the new keys/values (``mask_BLS`` [B, L, L]) and, given ``cache_mask_BLT``
        [B, L, T] (decode), to the cache as it was before this call. The new keys/values are then written into
        the cache at slot ``write_index``; the write is ordered after the cache reads so that XLA updates the
        cache in place instead of copying it. ``last_query_only``: keys and values of every position go into the
        cache but only the last position's output is computed ([B, 1, D]). ``key_reach`` (window, ahead): how
        far back and ahead of itself a query can see (see ``attention_spans``); given for a prompt (no cache
        attended), the attention is computed in blocks that skip the keys no query of the block can see.
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
        k_BKHL = k.transpose(0, 2, 3, 1)  # as the key cache holds keys
        v = v.transpose(0, 2, 1, 3)  # [B, K, L, H]
        first = l - 1 if last_query_only else 0
        if cache_mask_BLT is not None:
            # keys [H, S] per kv head: the decode scores are a plain [G, H] x [H, S] product per kv head
            out = dot_attention(q, [(cache_k_BKHT, cache_v_BKTH, cache_mask_BLT), (k_BKHL, v, mask_BLS)],
                                scale=self.scale, softcap=self.softcap, keys_transposed=True)
        else:  # a prompt: [S, H] keys per kv head (the transposed layout is slower for many query rows)
            k_BKLH = k.transpose(0, 2, 1, 3)
            spans = ([(first, l, 0, l)] if key_reach is None
                     else attention_spans(first, l, window=key_reach[0], ahead=key_reach[1]))
            out = jnp.concatenate([
                dot_attention(q[:, qs:qe], [(k_BKLH[:, :, ks:ke], v[:, :, ks:ke], mask_BLS[:, qs:qe, ks:ke])],
                              scale=self.scale, softcap=self.softcap) for qs, qe, ks, ke in spans], axis=1)
        l -= first
        if cache_mask_BLT is not None:
            dep_BK11 = out[:, 0].reshape(b, kv, n // kv, h)[:, :, :1, :1]  # shard-local: same heads as k, v
            k_BKHL, v = after(k_BKHL, dep_BK11), after(v, dep_BK11)
        cache_k = write_keys(cache_k_BKHT, k_BKHL, write_index)
        cache_v = write_values(cache_v_BKTH, v, write_index)
        return self.o_proj(out.reshape(b, l, self.num_heads * self.head_dim)), cache_k, cache_v
