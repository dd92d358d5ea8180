"""Gated feed-forward block (GeGLU / SwiGLU)."""

from __future__ import annotations

import jax
from flax import nnx

from omnijax.common.activations import activation
from omnijax.common.linear import Linear, matmul_oi, param


ROW_CHUNK = 1024  # rows of a long prompt per MLP pass


class GatedMLP(nnx.Module):
    """down(act(gate(x)) * up(x)); x [batch, seq, embed] -> [batch, seq, embed].

    gate and up are one fused kernel [mlp, 2, embed] (row i's gate, then its up projection): one matmul reads
    both as a plain [2 * mlp, embed] matrix, and split over the model axis along ``mlp`` every shard holds
    matching rows of both halves (no collective before the product)."""

    def __init__(self, hidden: int, intermediate: int, act: str, *, rngs: nnx.Rngs):
        self.gate_up_proj = param(rngs, (intermediate, 2, hidden), ("mlp", None, "embed"), quant_axis=-1)
        self.down_proj = Linear(intermediate, hidden, axes=("mlp", "embed"), rngs=rngs)
        self.act = act

    def __call__(self, x_BLD: jax.Array) -> jax.Array:
        b, l, d = x_BLD.shape
        if l > ROW_CHUNK and l % ROW_CHUNK == 0:  # a long prompt: rows in chunks keep the intermediates bounded
            chunks = x_BLD.reshape(b, l // ROW_CHUNK, ROW_CHUNK, d).transpose(1, 0, 2, 3)
            return jax.lax.map(self._rows, chunks).transpose(1, 0, 2, 3).reshape(b, l, d)
        return self._rows(x_BLD)

    def _rows(self, x_BLD: jax.Array) -> jax.Array:
        w = self.gate_up_proj[...]
        gate_up = matmul_oi(x_BLD, w.reshape(-1, w.shape[-1])).reshape(*x_BLD.shape[:-1], w.shape[0], 2)
        return self.down_proj(activation(self.act)(gate_up[..., 0]) * gate_up[..., 1])
