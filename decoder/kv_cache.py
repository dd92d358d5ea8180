"""The KV cache: a plain pytree sized by a cache budget, so decode shapes never change.

    k:     tuple (one per layer) of [batch, kv_heads, head_dim, cache_len]: keys stored transposed, so the decode
           scores q . k are a plain [q, head_dim] x [head_dim, cache_len] product per kv head
    v:     tuple (one per layer) of [batch, kv_heads, cache_len, head_dim]
    pos:   [batch, cache_len] int32 sequence position of the token in each slot, -1 for empty/padding
    block: [batch, cache_len] int32 media block id of the token in each slot, -1 for text/empty
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from decoder.config import DecoderConfig
from common.sharding import constrain


KEY_AXES = ("batch", "kv_heads", "head_dim", "cache_len")
VALUE_AXES = ("batch", "kv_heads", "cache_len", "head_dim")


def init_cache(cfg: DecoderConfig, batch: int, cache_len: int, dtype=jnp.float32) -> dict:
    b, kv, h = batch, cfg.num_kv_heads, cfg.head_dim
    keys = lambda: constrain(jnp.zeros((b, kv, h, cache_len), dtype), KEY_AXES)
    values = lambda: constrain(jnp.zeros((b, kv, cache_len, h), dtype), VALUE_AXES)
    return {
        "k": tuple(keys() for _ in range(cfg.num_layers)),
        "v": tuple(values() for _ in range(cfg.num_layers)),
        "pos": jnp.full((batch, cache_len), -1, jnp.int32),
        "block": jnp.full((batch, cache_len), -1, jnp.int32),
    }


def write_positions(cache: dict, pos_BL: jax.Array, block_BL: jax.Array, write_index: jax.Array) -> dict:
    """The cache with the new tokens' positions and block ids written at slot ``write_index``."""
    zero = jnp.zeros((), jnp.int32)
    return dict(cache,
                pos=jax.lax.dynamic_update_slice(cache["pos"], pos_BL.astype(jnp.int32), (zero, write_index)),
                block=jax.lax.dynamic_update_slice(cache["block"], block_BL.astype(jnp.int32), (zero, write_index)))


def write_keys(cache_BKHT: jax.Array, new_BKHL: jax.Array, write_index: jax.Array) -> jax.Array:
    """One layer's key cache [B, K, H, T] with the new keys [B, K, H, L] written at slots write_index..+L."""
    return _write_slots(cache_BKHT, new_BKHL, write_index, KEY_AXES)


def write_values(cache_BKTH: jax.Array, new_BKLH: jax.Array, write_index: jax.Array) -> jax.Array:
    """One layer's value cache [B, K, T, H] with the new values [B, K, L, H] written at slots write_index..+L."""
    return _write_slots(cache_BKTH, new_BKLH, write_index, VALUE_AXES)


def _write_slots(cache: jax.Array, new: jax.Array, write_index: jax.Array, axes: tuple[str, ...]) -> jax.Array:
    start = [jnp.zeros((), jnp.int32)] * len(axes)
    start[axes.index("cache_len")] = write_index
    return constrain(jax.lax.dynamic_update_slice(cache, new.astype(cache.dtype), tuple(start)), axes)


def after(x: jax.Array, dep: jax.Array) -> jax.Array:
    """``x`` unchanged, but computed from ``dep`` (broadcastable to ``x``) as far as the compiler can tell.

    A cache update that depends on the attention output is scheduled after the cache has been read, so XLA can
    write the cache in place inside a loop; without the dependency it may schedule the write first and copy every
    cache buffer on every step. The added term is min(|dep|, 0) = 0 (NaN only where ``dep`` already is).
    """
    return x + jnp.minimum(jnp.abs(dep), 0).astype(x.dtype)
