"""Token embedding (scaled, guarded against out-of-table placeholder ids), media merge, and output logits."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from common.linear import param


class Embedder(nnx.Module):
    def __init__(self, vocab_size: int, hidden: int, *, embed_scale: float = 1.0, tie: bool = True,
                 rngs: nnx.Rngs):
        self.vocab_size = vocab_size
        self.embed_scale = embed_scale
        self.embedding = param(rngs, (vocab_size, hidden), ("vocab", "embed"))
        self.lm_head = None if tie else param(rngs, (vocab_size, hidden), ("vocab", "embed"))  # torch layout

    def encode(self, tokens_BL: jax.Array) -> jax.Array:
        """Scaled embeddings [batch, seq, hidden]; ids outside the table (media placeholders) read row 0."""
        table = self.embedding[...]
        safe = jnp.where((tokens_BL >= 0) & (tokens_BL < self.vocab_size), tokens_BL, 0)
        x = jnp.take(table, safe, axis=0)
        return x * jnp.asarray(self.embed_scale, jnp.float32).astype(table.dtype)

    def logits(self, h_BLD: jax.Array) -> jax.Array:
        """Logits [batch, seq, vocab] in float32."""
        w = self.embedding[...] if self.lm_head is None else self.lm_head[...]
        return jnp.einsum("bld,vd->blv", h_BLD, w.astype(h_BLD.dtype), preferred_element_type=jnp.float32)


def _rows_at_placeholders(is_placeholder_BL: jax.Array, features_MD: jax.Array, dtype) -> jax.Array:
    """[B, L, D]: the j-th feature row at the j-th placeholder position (row-major over the batch)."""
    b, l = is_placeholder_BL.shape
    flat = is_placeholder_BL.reshape(-1)
    idx = jnp.clip(jnp.cumsum(flat.astype(jnp.int32)) - 1, 0, features_MD.shape[0] - 1)
    return jnp.take(features_MD, idx, axis=0).reshape(b, l, features_MD.shape[-1]).astype(dtype)


def merge_media(x_BLD: jax.Array, is_placeholder_BL: jax.Array, features_MD: jax.Array) -> jax.Array:
    """Replace placeholder embeddings by media features: the j-th row at the j-th placeholder.

    features_MD [num_rows, hidden]; rows past the number of placeholders (bucket padding) are never read.
    """
    rows = _rows_at_placeholders(is_placeholder_BL, features_MD, x_BLD.dtype)
    return jnp.where(is_placeholder_BL[..., None], rows, x_BLD)


def add_at_placeholders(x_BLD: jax.Array, is_placeholder_BL: jax.Array, features_MD: jax.Array) -> jax.Array:
    """Add the j-th feature row to the hidden state at the j-th placeholder (deepstack injection)."""
    rows = _rows_at_placeholders(is_placeholder_BL, features_MD, x_BLD.dtype)
    return x_BLD + jnp.where(is_placeholder_BL[..., None], rows, jnp.zeros_like(rows))
