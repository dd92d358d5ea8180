"""Mixture-of-experts feed-forward: a router picks top-k experts per token, gated experts compute, an optional shared
expert adds. The built-in routers are here (``FeedForwardSpec.router`` names one: decoder/parts.py); a family adds
its own.

Exact (no token dropping) and with a cost that follows the *active* experts:
- few assignments (decode): the selected experts' weights are gathered per (token, k) pair;
- many assignments (prefill): assignments are sorted by expert into fixed-size tiles, each tile multiplies by its
  one expert's weights inside a scan. Padding is at most one tile per expert.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from omnijax.common.activations import activation
from omnijax.common.linear import matmul_oi, param
from omnijax.common.matmul_policy import expert_weights, widened
from omnijax.decoder.mlp import GatedMLP
from omnijax.decoder.spec import FeedForwardSpec

GATHER_LIMIT = 64  # assignments (tokens x k) up to which weights are gathered per assignment


def route(x_TD, router_ED, k: int, normalize: bool):
    """Softmax routing as a pure function in float32, top-k, optional renormalisation."""
    probs = jax.nn.softmax(matmul_oi(x_TD, router_ED).astype(jnp.float32), axis=-1)
    top_w, top_i = jax.lax.top_k(probs, k)
    if normalize:
        top_w = top_w / jnp.sum(top_w, axis=-1, keepdims=True)
    return top_w.astype(x_TD.dtype), top_i


class SoftmaxRouter(nnx.Module):
    """Softmax over all experts in float32, top-k, optional renormalisation; the weights scale expert outputs."""

    scales_input = False

    def __init__(self, spec: FeedForwardSpec, hidden: int, *, rngs: nnx.Rngs, **_):
        self.weight = param(rngs, (spec.num_experts, hidden), (None, "embed"))  # torch layout [experts, embed]
        self.top_k = spec.top_k
        self.renormalize = spec.renormalize

    def __call__(self, x_TD: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(weights [T, k] in x's dtype, expert ids [T, k])."""
        return route(x_TD, self.weight[...], self.top_k, self.renormalize)


class SigmoidInputRouter(nnx.Module):
    """Top-k of the raw logits; the sigmoid of each chosen logit scales that expert's INPUT (outputs add with
    weight 1)."""

    scales_input = True

    def __init__(self, spec: FeedForwardSpec, hidden: int, *, rngs: nnx.Rngs, **_):
        self.weight = param(rngs, (spec.num_experts, hidden), (None, "embed"))
        self.top_k = spec.top_k

    def __call__(self, x_TD: jax.Array) -> tuple[jax.Array, jax.Array]:
        top_logit, top_i = jax.lax.top_k(matmul_oi(x_TD, self.weight[...]), self.top_k)
        return jax.nn.sigmoid(top_logit.astype(jnp.float32)).astype(x_TD.dtype), top_i


def _expert_ffn(x_ND, wg_NDI, wu_NDI, wd_NID, act):
    g = jnp.einsum("nd,ndi->ni", x_ND, widened(wg_NDI, x_ND.dtype))
    u = jnp.einsum("nd,ndi->ni", x_ND, widened(wu_NDI, x_ND.dtype))
    return jnp.einsum("ni,nid->nd", act(g) * u, widened(wd_NID, x_ND.dtype))


def experts_gathered(x_ND, ids_N, wg_EDI, wu_EDI, wd_EID, act):
    """Each assignment n through expert ids_N[n], reading only the selected experts' weights (arrays in x's dtype,
    or QuantizedArrays: the selected experts are gathered narrow, then widened)."""
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
        h = act(xt @ widened(wg_EDI[ex], xt.dtype)) * (xt @ widened(wu_EDI[ex], xt.dtype))
        return None, h @ widened(wd_EID[ex], xt.dtype)

    _, out = jax.lax.scan(one_tile, None, (buf.reshape(num_tiles, tile, d), tile_expert))
    out = out.reshape(num_tiles * tile, d)[slot]
    return jnp.zeros_like(out).at[order].set(out)


def run_experts(x_ND: jax.Array, ids_N: jax.Array, wg_EDI, wu_EDI, wd_EID, act) -> jax.Array:
    """Each row through its expert, exactly, at a cost that follows the rows (not the experts)."""
    n = x_ND.shape[0]
    if n <= GATHER_LIMIT:
        return experts_gathered(x_ND, ids_N, wg_EDI, wu_EDI, wd_EID, act)
    tile = int(min(128, max(8, 1 << max(0, (n // wg_EDI.shape[0]).bit_length() - 1))))
    return experts_tiled(x_ND, ids_N, wg_EDI, wu_EDI, wd_EID, act, tile)


class MoEMLP(nnx.Module):
    """x [batch, seq, embed] -> [batch, seq, embed] through top-k of ``num_experts`` gated experts chosen by the
    router (``router_cls``, the router type the spec names), plus an optional shared gated MLP (optionally scaled
    per token by a sigmoid gate)."""

    def __init__(self, spec: FeedForwardSpec, hidden: int, router_cls: type, *, rngs: nnx.Rngs):
        e, i = spec.num_experts, spec.intermediate
        self.router = router_cls(spec, hidden, rngs=rngs)
        self.gate_proj = param(rngs, (e, hidden, i), ("expert", "embed", "mlp"), quant_axis=1)
        self.up_proj = param(rngs, (e, hidden, i), ("expert", "embed", "mlp"), quant_axis=1)
        self.down_proj = param(rngs, (e, i, hidden), ("expert", "mlp", "embed"), quant_axis=1)
        self.shared = GatedMLP(hidden, spec.shared_intermediate, spec.activation, rngs=rngs) \
            if spec.shared_intermediate else None
        self.shared_gate = param(rngs, (1, hidden), (None, "embed")) if spec.shared_gate else None
        self.top_k = spec.top_k
        self.act = spec.activation

    def __call__(self, x_BLD: jax.Array) -> jax.Array:
        b, l, d = x_BLD.shape
        x = x_BLD.reshape(b * l, d)
        weights_TK, ids_TK = self.router(x)
        xs = jnp.repeat(x, self.top_k, axis=0)
        if self.router.scales_input:
            xs = xs * weights_TK.reshape(-1, 1)
        wg, wu, wd = (expert_weights(w[...], x.dtype) for w in (self.gate_proj, self.up_proj, self.down_proj))
        y = run_experts(xs, ids_TK.reshape(-1), wg, wu, wd, activation(self.act)).reshape(b * l, self.top_k, d)
        y = y.sum(axis=1) if self.router.scales_input else (y * weights_TK[..., None]).sum(axis=1)
        if self.shared is not None:
            shared = self.shared(x[None])[0]
            if self.shared_gate is not None:
                shared = jax.nn.sigmoid(matmul_oi(x, self.shared_gate[...])) * shared
            y = y + shared
        return y.reshape(b, l, d)
