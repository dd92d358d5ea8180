"""Gemma 4's per-layer inputs (per-layer embeddings, "PLE"), the provider "gemma4" (added by the Gemma 4 family).

For token ids t [B, L] and the merged input embeddings e [B, L, D] (media features already in place), with N layers
of width P each:

    ids   = t with media placeholder ids (and ids outside the table) replaced by the pad id, as the reference does
    token = table[ids] * sqrt(P)                                            -> [B, L, N, P]
    ctx   = RMSNorm_P(projection(e) * D**-0.5)                              -> [B, L, N, P]
    out   = (ctx + token) * 2**-0.5

(``Gemma4TextModel.get_per_layer_inputs`` + ``project_per_layer_inputs``). Settings: ``Gemma4LayerInputsOptions``
(``DecoderSpec.layer_inputs.options``).

Parameter tree (paths relative to the provider)::

    ("embedding",) [vocab_size, N * P]   ("projection", "kernel") [N * P, D]   ("norm", "weight") [P]
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from omnijax.common.linear import Linear, param
from omnijax.common.matmul_policy import table_rows
from omnijax.common.norms import RMSNorm
from omnijax.decoder.spec import DecoderSpec


@dataclasses.dataclass(frozen=True)
class Gemma4LayerInputsOptions:
    """width: P per layer; vocab_size: rows of the table; pad_id: the row placeholders read; placeholder_ids: media
    placeholder ids replaced by pad_id."""

    width: int
    vocab_size: int
    pad_id: int
    placeholder_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if self.width < 1 or self.vocab_size < 1:
            raise ValueError(f"per-layer inputs need width and vocab_size >= 1, got {self}")
        if not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(f"pad id {self.pad_id} is outside the per-layer table of {self.vocab_size} rows")


def table_ids(tokens_BL: jax.Array, placeholder_ids: tuple[int, ...], pad_id: int, vocab_size: int) -> jax.Array:
    """Token ids as the per-layer table reads them: placeholders and ids outside [0, vocab_size) become pad_id."""
    keep = (tokens_BL >= 0) & (tokens_BL < vocab_size)
    for t in placeholder_ids:
        keep = keep & (tokens_BL != t)
    return jnp.where(keep, tokens_BL, pad_id)


class Gemma4LayerInputs(nnx.Module):
    def __init__(self, dspec: DecoderSpec, *, rngs: nnx.Rngs):
        options = dspec.layer_inputs.options
        if not isinstance(options, Gemma4LayerInputsOptions):
            raise TypeError(f"gemma4 per-layer inputs take Gemma4LayerInputsOptions, got {options!r}")
        self.width = options.width
        self.vocab_size = options.vocab_size
        self.pad_id = options.pad_id
        self.placeholder_ids = options.placeholder_ids
        self.num_layers = dspec.num_layers
        self.hidden = dspec.hidden_size
        total = self.num_layers * self.width
        self.embedding = param(rngs, (self.vocab_size, total), ("vocab", None), quant_axis=-1)
        self.projection = Linear(dspec.hidden_size, total, axes=("embed", None), rngs=rngs)
        self.norm = RMSNorm(self.width, eps=dspec.rms_norm_eps)

    def __call__(self, tokens_BL: jax.Array, embeddings_BLD: jax.Array) -> jax.Array:
        """[B, L, layers, P] in the embeddings' dtype."""
        b, l = tokens_BL.shape
        n, p = self.num_layers, self.width
        table = self.embedding[...]
        ids = table_ids(tokens_BL, self.placeholder_ids, self.pad_id, self.vocab_size)
        rows = table_rows(table, ids, embeddings_BLD.dtype)
        token = rows * jnp.asarray(np.float32(p ** 0.5), jnp.float32).astype(rows.dtype)
        x = embeddings_BLD
        ctx = self.projection(x) * jnp.asarray(self.hidden ** -0.5, x.dtype)
        ctx = self.norm(ctx.reshape(b, l, n, p))
        return ((ctx + token.reshape(b, l, n, p).astype(ctx.dtype)) * jnp.asarray(2.0 ** -0.5, ctx.dtype))
