"""A layer's attention: projections, q/k/v norms, RoPE or temperature tuning, then the attention op.

The q/k/v projections are one fused kernel laid out per kv head: [kv_heads, (G + 2) * head_dim, embed] holds, for
each (held) kv head, its G query heads, its key and its value rows (no value rows when k == v, only query rows for
a layer that shares another layer's keys/values). Split over the model axis by kv head, every shard holds whole
heads of q, k and v: the projection needs no collective.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from omnijax.common.linear import Linear, matmul_oi, param
from omnijax.common.norms import RMSNorm, rms_norm
from omnijax.common.sharding import constrain
from omnijax.decoder.attention_op import PromptMeta, cache_attention, prompt_attention
from omnijax.decoder.kv_cache import LayerCache
from omnijax.decoder.packing import Packing
from omnijax.decoder.rope import apply_rotary, rope_key
from omnijax.decoder.spec import AttentionSpec


class PromptContext(NamedTuple):
    """What every layer of a prompt's forward shares.

    meta: the prompt tokens' positions / media blocks. rope: {rope_key: (cos, sin) [B, L, ...]}.
    query_rows: [B, Lq] rows whose outputs this layer computes (None: every row); keys/values are still computed
    for every row. narrowed: the layer's input holds only those rows (a layer after the last one that computes
    keys/values of its own). backend: the attention backend (``attention_op.backend_for``), chosen by the engine.
    """

    meta: PromptMeta
    rope: dict
    query_rows: jax.Array | None = None
    narrowed: bool = False
    backend: str = "auto"


class GroupContext(NamedTuple):
    """One group of a forward over new tokens: S sequences of T tokens, sequence s continuing cache row
    ``rows[s]`` (None: row s; decode: S rows of one token; prompt chunks: C rows of T tokens).

    pos [S, T]: the tokens' sequence positions (-1: padding, or a row that takes no token); block [S, T]: their
    media block ids (-1 text; None: no media in the group); slot_pos {slots: [S, slots]}: the position each slot of
    the rows' caches holds before the batch (-1 empty; a paged layer's slots are its table's M * PAGE); held: the
    most slots any row holds (a long cache is read only that far); pages: for each page table of a paged cache
    (decoder/kv_cache.py) the rows' rows of it [S, M] (empty: not paged)."""

    rows: jax.Array | None
    pos: jax.Array
    block: jax.Array | None
    slot_pos: dict
    held: jax.Array
    pages: tuple = ()


class BatchContext(NamedTuple):
    """What every layer of a forward over new tokens shares: its groups (``GroupContext``) and how they lie in the
    forward's tokens (``packing``: decoder/packing.py); pos and rope {rope_key: (cos, sin)} of every token in that
    layout; backend: the attention backend (``attention_op.backend_for``), chosen by the engine."""

    groups: tuple
    packing: Packing
    pos: jax.Array
    rope: dict
    backend: str = "auto"


def grouped_qkv(spec: AttentionSpec):
    """(regroup, ungroup): the layout change from torch's concatenated q, k, v projection rows [(N + 2K) * H, ...]
    (k, v absent for a sharing layer, v absent when k == v) to the fused per-kv-head kernel
    [K * repeat, (G + rows) * H, ...] (each held kv head's query heads, then its key and value rows; repeated kv
    heads each get a copy), and back."""
    n, kh, h, r = spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.kv_repeat
    kv_rows = 0 if spec.kv_source is not None else 1 if spec.k_eq_v else 2
    g = n // (kh * r)

    def regroup(a):
        rest = a.shape[1:]
        if a.shape[0] != (n + kv_rows * kh) * h:
            raise ValueError(f"q/k/v rows {a.shape[0]} do not match {n} heads, {kh} kv heads of {h}")
        parts = [a[:n * h].reshape(kh, r, g, h, *rest)]
        for i in range(kv_rows):
            kv = a[(n + i * kh) * h:(n + (i + 1) * kh) * h].reshape(kh, 1, 1, h, *rest)
            parts.append(np.broadcast_to(kv, (kh, r, 1, h, *rest)))
        return np.concatenate(parts, axis=2).reshape(kh * r, -1, *rest)

    def ungroup(a):
        rest = a.shape[2:]
        a = a.reshape(kh, r, g + kv_rows, h, *rest)
        rows = [a[:, :, :g].reshape(n * h, *rest)]
        rows += [a[:, 0, g + i].reshape(kh * h, *rest) for i in range(kv_rows)]  # the first copy of each kv head
        return np.concatenate(rows, axis=0)

    return regroup, ungroup


def temperature_scale(pos_BL: jax.Array, floor_scale: float, attn_scale: float) -> jax.Array:
    """Query temperature tuning [B, L]: log1p(floor((pos + 1) / floor_scale)) * attn_scale + 1."""
    pos = jnp.maximum(pos_BL, 0).astype(jnp.float32)
    return jnp.log1p(jnp.floor((pos + 1.0) / floor_scale)) * attn_scale + 1.0


class Attention(nnx.Module):
    def __init__(self, spec: AttentionSpec, hidden: int, *, eps: float, norm_plus_one: bool, rngs: nnx.Rngs):
        self.spec = spec
        self.eps = eps
        k, g, h = spec.kv_heads, spec.group, spec.head_dim
        self.own_kv = spec.kv_source is None
        self.rows = g + (0 if not self.own_kv else 1 if spec.k_eq_v else 2)  # row groups per kv head
        self.qkv = param(rngs, (k, self.rows * h, hidden), ("kv_heads", None, "embed"), quant_axis=-1)
        self.qkv_bias = nnx.Param(jnp.zeros((k, self.rows * h)), axes=("kv_heads", None)) if spec.bias else None
        self.o_proj = Linear(spec.num_heads * h, hidden, axes=("heads", "embed"), use_bias=spec.bias, rngs=rngs)
        if spec.qk_norm == "rms":
            self.q_norm = RMSNorm(h, eps=eps, plus_one=norm_plus_one, axis_name="head_dim")
            self.k_norm = RMSNorm(h, eps=eps, plus_one=norm_plus_one, axis_name="head_dim") if self.own_kv else None
        else:
            self.q_norm = self.k_norm = None

    # ---- projections ---------------------------------------------------------------------------------------
    def _project(self, x_BLD: jax.Array, pos_BL: jax.Array, cos_sin) -> tuple[jax.Array, jax.Array | None,
                                                                                 jax.Array | None]:
        """q [B, L, N, H], and (own k/v only) k, v [B, L, K, H], normed and rotated."""
        spec = self.spec
        b, l, _ = x_BLD.shape
        k_heads, g, h = spec.kv_heads, spec.group, spec.head_dim
        y = matmul_oi(x_BLD, self.qkv[...].reshape(k_heads * self.rows * h, -1))
        if self.qkv_bias is not None:
            y = y + self.qkv_bias[...].reshape(-1).astype(y.dtype)
        y = y.reshape(b, l, k_heads, self.rows, h)
        q = y[:, :, :, :g].reshape(b, l, k_heads * g, h)
        k = v = None
        if self.own_kv:
            k = y[:, :, :, g]
            v = k if spec.k_eq_v else y[:, :, :, g + 1]
        if self.q_norm is not None:
            q = self.q_norm(q)
            if k is not None:
                k = self.k_norm(k)
        if spec.v_norm and v is not None:
            v = rms_norm(v, None, eps=self.eps, plus_one=False)
        if spec.rope is not None:
            cos, sin = cos_sin
            q = apply_rotary(q, cos, sin, interleaved=spec.rope.interleaved)
            if k is not None:
                k = apply_rotary(k, cos, sin, interleaved=spec.rope.interleaved)
        if spec.qk_norm == "l2":
            q = rms_norm(q, None, eps=self.eps, plus_one=False)
            if k is not None:
                k = rms_norm(k, None, eps=self.eps, plus_one=False)
        if spec.temperature is not None:
            q = (q * temperature_scale(pos_BL, *spec.temperature)[:, :, None, None]).astype(q.dtype)
        q = constrain(q, ("batch", "length", "heads", "head_dim"))
        return q, k, v

    def _output(self, out_BLNH: jax.Array) -> jax.Array:
        b, l, n, h = out_BLNH.shape
        return self.o_proj(out_BLNH.reshape(b, l, n * h))

    def _rope(self, ctx) -> tuple | None:
        spec = self.spec
        return None if spec.rope is None else ctx.rope[rope_key(spec.rope, spec.head_dim)]

    # ---- a whole prompt, and new tokens after the cache --------------------------------------------------------
    def prefill(self, x_BLD: jax.Array, ctx: PromptContext,
                shared: tuple[jax.Array, jax.Array] | None = None) -> tuple[jax.Array, tuple | None]:
        """A prompt's attention -> (output [B, Lq, D] at ``ctx.query_rows``, this layer's keys and values
        ([B, L, K, H] each), or None for a layer that attends to the keys/values ``shared`` of an earlier layer)."""
        rows = ctx.query_rows
        if ctx.narrowed:  # x holds only the query rows: their positions and rope tables
            pos = jnp.take_along_axis(ctx.meta.pos, rows, axis=1)
            rope = self._rope(ctx)
            rope = None if rope is None else tuple(jnp.take_along_axis(t, rows[:, :, None], axis=1) for t in rope)
            q, k, v = self._project(x_BLD, pos, rope)
        else:
            q, k, v = self._project(x_BLD, ctx.meta.pos, self._rope(ctx))
            if rows is not None:
                q = jnp.take_along_axis(q, rows[:, :, None, None], axis=1)
        own = None if k is None else (k, v)
        k, v = own if own is not None else shared
        out = prompt_attention(q, k, v, ctx.meta, self.spec.mask, scale=self.spec.q_scale, softcap=self.spec.softcap,
                               query_rows=ctx.query_rows, backend=ctx.backend)
        return self._output(out), own

    def forward(self, x_STD: jax.Array, ctx: BatchContext, cache: LayerCache,
                shared: tuple[jax.Array, jax.Array] | None = None) -> tuple[jax.Array, tuple | None]:
        """New tokens attending to their rows' caches (as they were before the batch) and to each other ->
        (output [S, T, D], the tokens' keys and values [S, T, K, H], or None for a layer that attends to the keys /
        values ``shared`` of an earlier layer's tokens, over that layer's cache ``cache``). With several groups
        (``ctx.packing``) the tokens lie in one flat row [1, N, ...]; each group attends in its own shape."""
        spec = self.spec
        q, k, v = self._project(x_STD, ctx.pos, self._rope(ctx))
        own = None if k is None else (k, v)
        k, v = own if own is not None else shared
        split = ctx.packing.split
        outs = []
        for g, qg, kg, vg in zip(ctx.groups, split(q), split(k), split(v)):
            pages = None if cache.table is None else g.pages[cache.table]
            slots = cache.k.shape[-1] if pages is None else pages.shape[1] * cache.k.shape[-1]
            outs.append(cache_attention(qg, cache.k, cache.v, g.rows, g.slot_pos[slots], kg, vg, g.pos, g.block,
                                        spec.mask, scale=spec.q_scale, softcap=spec.softcap, held=g.held,
                                        backend=ctx.backend, pages_SM=pages))
        return self._output(ctx.packing.join(outs)), own
