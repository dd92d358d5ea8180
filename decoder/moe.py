"""Mixture-of-experts feed-forward: softmax routing, top-k, optional renormalisation, gated experts.

Exact (no token dropping) and with a cost that follows the *active* experts:
- few assignments (decode): the selected experts' weights are gathered per (token, k) pair;
- many assignments (prefill): assignments are sorted by expert into fixed-size tiles, each tile multiplies by its
  one expert's weights inside a scan. Padding is at most one tile per expert.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from common.linear import matmul_oi, param
from common.activations import activation

GATHER_LIMIT = 64  # assignments (tokens x k) up to which weights are gathered per assignment


def route(x_TD: jax.Array, router_ED: jax.Array, k: int, normalize: bool) -> tuple[jax.Array, jax.Array]:
    """(weights [T, k] in x's dtype, expert ids [T, k]): softmax in float32, top-k, optional renormalisation."""
    logits = matmul_oi(x_TD, router_ED)
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    top_w, top_i = jax.lax.top_k(probs, k)
    if normalize:
        top_w = top_w / jnp.sum(top_w, axis=-1, keepdims=True)
    return top_w.astype(x_TD.dtype), top_i


def _expert_ffn(x_ND, wg_NDI, wu_NDI, wd_NID, act):
    g = jnp.einsum("nd,ndi->ni", x_ND, wg_NDI)
    u = jnp.einsum("nd,ndi->ni", x_ND, wu_NDI)
    return jnp.einsum("ni,nid->nd", act(g) * u, wd_NID)


def experts_gathered(x_ND, ids_N, wg_EDI, wu_EDI, wd_EID, act):
    """Each assignment n through expert ids_N[n], reading only the selected experts' weights."""
    return _expert_ffn(x_ND, wg_EDI[ids_N], wu_EDI[ids_N], wd_EID[ids_N], act)


def experts_tiled(x_ND, ids_N, wg_EDI, wu_EDI, wd_EID, act, tile: int):
    """The same result by sorting assignments by expert into tiles of ``tile`` rows (one expert per tile)."""
    n, d = x_ND.shape
    e = wg_EDI.shape[0]
    order = jnp.argsort(ids_N, stable=True)
    sorted_ids = ids_N[order]
    sizes = jnp.bincount(ids_N, length=e)
    padded = (sizes + tile - 1) // tile * tile
    padded_start = jnp.cumsum(padded) - padded
    group_start = jnp.cumsum(sizes) - sizes
    slot = padded_start[sorted_ids] + (jnp.arange(n) - group_start[sorted_ids])
    num_tiles = -(-n // tile) + e
    buf = jnp.zeros((num_tiles * tile, d), x_ND.dtype).at[slot].set(x_ND[order])
    tile_start = jnp.arange(num_tiles) * tile
    tile_expert = jnp.clip(jnp.searchsorted(jnp.cumsum(padded), tile_start, side="right"), 0, e - 1)

    def one_tile(_, inputs):
        xt, ex = inputs
        h = act(xt @ wg_EDI[ex]) * (xt @ wu_EDI[ex])
        return None, h @ wd_EID[ex]

    _, out = jax.lax.scan(one_tile, None, (buf.reshape(num_tiles, tile, d), tile_expert))
    out = out.reshape(num_tiles * tile, d)[slot]
    return jnp.zeros_like(out).at[order].set(out)


class MoEMLP(nnx.Module):
    """x [batch, seq, embed] -> [batch, seq, embed] through top-k of ``num_experts`` gated experts."""

    def __init__(self, hidden: int, intermediate: int, num_experts: int, top_k: int, act: str, *,
                 normalize: bool = True, rngs: nnx.Rngs):
        self.router = param(rngs, (num_experts, hidden), (None, "embed"))  # torch layout [experts, embed]
        self.gate_proj = param(rngs, (num_experts, hidden, intermediate), ("expert", "embed", "mlp"))
        self.up_proj = param(rngs, (num_experts, hidden, intermediate), ("expert", "embed", "mlp"))
        self.down_proj = param(rngs, (num_experts, intermediate, hidden), ("expert", "mlp", "embed"))
        self.top_k = top_k
        self.normalize = normalize
        self.act = act

    def __call__(self, x_BLD: jax.Array) -> jax.Array:
        b, l, d = x_BLD.shape
        x = x_BLD.reshape(b * l, d)
        weights_TK, ids_TK = route(x, self.router[...], self.top_k, self.normalize)
        xs = jnp.repeat(x, self.top_k, axis=0)
        ids = ids_TK.reshape(-1)
        wg, wu, wd = (w[...].astype(x.dtype) for w in (self.gate_proj, self.up_proj, self.down_proj))
        act = activation(self.act)
        n = xs.shape[0]
        if n <= GATHER_LIMIT:
            y = experts_gathered(xs, ids, wg, wu, wd, act)
        else:
            tile = int(min(128, max(8, 1 << max(0, (n // wg.shape[0]).bit_length() - 1))))
            y = experts_tiled(xs, ids, wg, wu, wd, act, tile)
        y = (y.reshape(b * l, self.top_k, d) * weights_TK[..., None]).sum(axis=1)
        return y.reshape(b, l, d)
