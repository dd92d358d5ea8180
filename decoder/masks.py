"""Attention masks from positions and media block ids (no [L, L] constants baked into the graph).

Every token carries ``pos`` (its index in the sequence; -1 for padding and empty cache slots) and ``block``
(the id of the media block it belongs to; -1 for text). A query q may see key k when

    k is valid  AND  (k <= q  OR  (same block AND block >= 0 AND bidirectional on this layer))  AND  k > q - window

which is transformers' AND(sliding_window, OR(causal, blockwise)) composition.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def attention_mask(q_pos_BL: jax.Array, k_pos_BS: jax.Array, q_block_BL: jax.Array | None,
                   k_block_BS: jax.Array | None, *, window: int | None, bidirectional: bool) -> jax.Array:
    """Boolean mask [batch, q_len, k_len]: True where the query may attend to the key."""
    q = q_pos_BL[:, :, None]
    k = k_pos_BS[:, None, :]
    allowed = k <= q
    if bidirectional and q_block_BL is not None and k_block_BS is not None:
        qb = q_block_BL[:, :, None]
        kb = k_block_BS[:, None, :]
        allowed = allowed | ((qb == kb) & (qb >= 0))
    if window is not None:
        allowed = allowed & (k > q - window)
    return allowed & (k >= 0) & (q >= 0)


def block_ids(is_media_BL: jax.Array) -> jax.Array:
    """Block id per token [batch, seq]: contiguous runs of media tokens numbered 0, 1, ... per row; -1 elsewhere."""
    prev = jnp.pad(is_media_BL[:, :-1], ((0, 0), (1, 0)), constant_values=False)
    starts = is_media_BL & ~prev
    ids = jnp.cumsum(starts.astype(jnp.int32), axis=1) - 1
    return jnp.where(is_media_BL, ids, -1)
