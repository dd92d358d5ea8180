"""Token embedding (scaled, guarded against out-of-table placeholder ids), media merge, and output logits."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from omnijax.common.linear import param
from omnijax.common.matmul_policy import activation_dtype, logits_matmul, table_rows, weight_dtype


class Embedder(nnx.Module):
    def __init__(self, vocab_size: int, hidden: int, *, embed_scale: float = 1.0, tie: bool = True,
                 substitutes: tuple[tuple[int, int], ...] = (), rngs: nnx.Rngs):
        self.vocab_size = vocab_size
        self.embed_scale = embed_scale
        self.substitutes = tuple(substitutes)  # (token id, id whose row it reads)
        self.embedding = param(rngs, (vocab_size, hidden), ("vocab", "embed"), quant_axis=-1, int4=False)
        self.lm_head = None if tie else param(rngs, (vocab_size, hidden), ("vocab", "embed"),  # torch layout
                                              quant_axis=-1, int4=False)

    def encode(self, tokens_BL: jax.Array) -> jax.Array:
        """Scaled embeddings [batch, seq, hidden]; ids outside the table (media placeholders) read row 0, and each
        ``substitutes`` id reads its substitute's row. The embeddings' dtype is the activations' dtype for
        this table's (common/matmul_policy.py: float32 on a CPU, the table's dtype elsewhere)."""
        table = self.embedding[...]
        for token, row in self.substitutes:
            tokens_BL = jnp.where(tokens_BL == token, row, tokens_BL)
        safe = jnp.where((tokens_BL >= 0) & (tokens_BL < self.vocab_size), tokens_BL, 0)
        dtype = activation_dtype(weight_dtype(table))
        x = table_rows(table, safe, dtype).astype(dtype)
        return x * jnp.asarray(self.embed_scale, jnp.float32).astype(dtype)

    def logits(self, h_BLD: jax.Array) -> jax.Array:
        """Logits [batch, seq, vocab] in float32."""
        w = self.embedding[...] if self.lm_head is None else self.lm_head[...]
        return logits_matmul(h_BLD, w)


def rows_at_placeholders(is_placeholder_BL: jax.Array, features_RD: jax.Array, valid_R: jax.Array | None,
                         dtype) -> jax.Array:
    """[B, L, D]: the j-th valid feature row at the j-th placeholder position (row-major over the batch).

    valid_R marks the feature rows that are real (encoder bucket padding is not); None: every row is."""
    b, l = is_placeholder_BL.shape
    rows = features_RD.shape[0]
    j = jnp.clip(jnp.cumsum(is_placeholder_BL.reshape(-1).astype(jnp.int32)) - 1, 0, rows - 1)
    if valid_R is not None:
        j = jnp.nonzero(valid_R, size=rows, fill_value=0)[0][j]
    return jnp.take(features_RD, j, axis=0).reshape(b, l, features_RD.shape[-1]).astype(dtype)


def merge_media(x_BLD: jax.Array, is_placeholder_BL: jax.Array, features_RD: jax.Array,
                valid_R: jax.Array | None = None) -> jax.Array:
    """Replace placeholder embeddings by media features: the j-th valid row at the j-th placeholder."""
    rows = rows_at_placeholders(is_placeholder_BL, features_RD, valid_R, x_BLD.dtype)
    return jnp.where(is_placeholder_BL[..., None], rows, x_BLD)


def add_at_placeholders(x_BLD: jax.Array, is_placeholder_BL: jax.Array, features_RD: jax.Array,
                        valid_R: jax.Array | None = None) -> jax.Array:
    """Add the j-th valid feature row to the hidden state at the j-th placeholder (deepstack injection)."""
    rows = rows_at_placeholders(is_placeholder_BL, features_RD, valid_R, x_BLD.dtype)
    return x_BLD + jnp.where(is_placeholder_BL[..., None], rows, jnp.zeros_like(rows))
