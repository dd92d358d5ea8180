"""The KV cache: a plain pytree sized by a cache budget, so decode shapes never change.

    k, v:  tuple (one per layer) of [batch, kv_heads, cache_len, head_dim] (heads-major: no per-step transpose)
    pos:   [batch, cache_len] int32 sequence position of the token in each slot, -1 for empty/padding
    block: [batch, cache_len] int32 media block id of the token in each slot, -1 for text/empty
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from decoder.config import DecoderConfig
from decoder.sharding import constrain


def init_cache(cfg: DecoderConfig, batch: int, cache_len: int, dtype=jnp.float32) -> dict:
    shape = (batch, cfg.num_kv_heads, cache_len, cfg.head_dim)
    zeros = lambda: constrain(jnp.zeros(shape, dtype), ("batch", "kv_heads", "cache_len", "head_dim"))
    return {
        "k": tuple(zeros() for _ in range(cfg.num_layers)),
        "v": tuple(zeros() for _ in range(cfg.num_layers)),
        "pos": jnp.full((batch, cache_len), -1, jnp.int32),
        "block": jnp.full((batch, cache_len), -1, jnp.int32),
    }


def write_positions(cache: dict, pos_BL: jax.Array, block_BL: jax.Array, write_index: jax.Array) -> dict:
    """The cache with the new tokens' positions and block ids written at slot ``write_index``."""
    zero = jnp.zeros((), jnp.int32)
    return dict(cache,
                pos=jax.lax.dynamic_update_slice(cache["pos"], pos_BL.astype(jnp.int32), (zero, write_index)),
                block=jax.lax.dynamic_update_slice(cache["block"], block_BL.astype(jnp.int32), (zero, write_index)))
