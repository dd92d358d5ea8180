"""Bidirectional attention inside each item of an encoder batch: the one attention of the SigLIP, Llama 4, Qwen3-Omni
and Gemma 4 vision towers and of the Qwen3-Omni audio tower.

Each item of the batch (an image, a tile, a frame block, an attention window of audio chunks) attends over its own
tokens only; which of them are real is data (``key_valid``, bucket padding is not), so one compiled program serves
every size inside a bucket. Letters as in encoders/__init__.py.

The Gemma 4 audio conformer's attention (encoders/gemma4/audio_attention.py) is not this one: each chunk of queries
sees its own window of keys, a learned relative-position term is added to the logits, the logits are soft-capped
and everything runs in float32 - a different computation, not another mask over this one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def attention(q_BLNH: jax.Array, k_BLKH: jax.Array, v_BLKH: jax.Array, key_valid_BL: jax.Array | None = None, *,
              scale: float = 1.0, query_block: int | None = None) -> jax.Array:
    """Every query of an item over the valid keys of the same item -> [B, L, N, H].

    q [B, L, N, H]; k, v [B, L, K, H] with N a multiple of K (grouped-query attention: query head n uses kv head
    n // G, G = N / K); key_valid [B, L] bool (None: every key is real). Scores are scaled by ``scale`` in the
    inputs' dtype, the softmax runs in float32. A valid query sees exactly the valid keys of its item, so padding
    (whatever its values, NaN included) never reaches a valid row; the rows of an item with no valid key are zeros.
    With ``query_block``, items longer than it are attended ``query_block`` queries at a time (``lax.map``): the
    scores of a step then take B x N x query_block x L values instead of B x N x L x L.
    """
    b, length, n, h = q_BLNH.shape
    kv_heads = k_BLKH.shape[2]
    if key_valid_BL is not None:
        v_BLKH = jnp.where(key_valid_BL[:, :, None, None], v_BLKH, jnp.zeros((), v_BLKH.dtype))
    # q [B, L, K, G, H] when heads are grouped; as it is otherwise (G = 1: the same products, one axis fewer)
    q = q_BLNH if n == kv_heads else q_BLNH.reshape(b, length, kv_heads, n // kv_heads, h)
    if query_block is None or length <= query_block:
        out = _attend(q, k_BLKH, v_BLKH, key_valid_BL, scale)
    else:
        steps = -(-length // query_block)
        q = jnp.pad(q, ((0, 0), (0, steps * query_block - length)) + ((0, 0),) * (q.ndim - 2))
        q_steps = jnp.moveaxis(q.reshape(b, steps, query_block, *q.shape[2:]), 1, 0)  # [steps, B, query_block, ...]
        out_steps = jax.lax.map(lambda q_step: _attend(q_step, k_BLKH, v_BLKH, key_valid_BL, scale), q_steps)
        out = jnp.moveaxis(out_steps, 0, 1).reshape(b, steps * query_block, *q.shape[2:])[:, :length]
    return out.reshape(b, length, n, h)


# (scores, output) einsums of queries [B, Q, N, H] / grouped [B, Q, K, G, H] over keys and values [B, L, K, H]
_EINSUMS = {4: ("bqnh,blnh->bnql", "bnql,blnh->bqnh"), 5: ("bqkgh,blkh->bkgql", "bkgql,blkh->bqkgh")}


def _attend(q: jax.Array, k_BLKH: jax.Array, v_BLKH: jax.Array, key_valid_BL: jax.Array | None,
            scale: float) -> jax.Array:
    """Q queries of each item ([B, Q, N, H], or [B, Q, K, G, H] grouped) over its L keys -> the queries' shape."""
    scores_spec, out_spec = _EINSUMS[q.ndim]
    scores = (jnp.einsum(scores_spec, q, k_BLKH) * scale).astype(jnp.float32)  # [B, heads..., Q, L]
    if key_valid_BL is not None:
        mask = key_valid_BL.reshape(key_valid_BL.shape[0], *(1,) * (scores.ndim - 2), key_valid_BL.shape[1])
        scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_BLKH.dtype)
    return jnp.einsum(out_spec, probs, v_BLKH)
