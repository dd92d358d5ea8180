"""Gemma 4's mixture of experts, which runs beside the dense MLP of a layer: its router (the router "gemma4", added
by the Gemma 4 family) and the experts whose router reads another input than they do.

Router (``Gemma4TextRouter``): r = RMSNorm_without_weight(x) * scale * hidden**-0.5; p = softmax(r @ W.T) in
float32; the top-k of p, renormalised to sum to 1, times ``per_expert_scale`` of each chosen expert. The router reads
the layer's residual stream (before any feed-forward norm); the experts read ``pre_feedforward_layernorm_2`` of it,
so ``ExpertsBeside`` takes both inputs (``MoEMLP`` routes its own input).

Parameter trees (paths relative to each module; torch layouts noted where they differ)::

    Gemma4Router   ("weight",) [experts, embed]   ("scale",) [embed]   ("per_expert_scale",) [experts]
    ExpertsBeside  ("router", ...)   ("gate_proj",) ("up_proj",) [experts, embed, mlp]   ("down_proj",)
                   [experts, mlp, embed]  (the checkpoint holds gate and up as one [experts, 2 mlp, embed] tensor
                   and down as [experts, embed, mlp])
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from omnijax.common.activations import activation
from omnijax.common.linear import matmul_oi, param
from omnijax.common.matmul_policy import expert_weights
from omnijax.common.norms import rms_norm
from omnijax.decoder.moe import run_experts
from omnijax.decoder.spec import FeedForwardSpec


class Gemma4Router(nnx.Module):
    """x [T, D] -> (weights [T, k] in x's dtype, expert ids [T, k]); the weights scale expert outputs."""

    scales_input = False

    def __init__(self, spec: FeedForwardSpec, hidden: int, *, rngs: nnx.Rngs, eps: float = 1e-6, **_):
        self.weight = param(rngs, (spec.num_experts, hidden), (None, "embed"))  # torch layout [experts, embed]
        self.scale = nnx.Param(jnp.ones((hidden,)), axes=("embed",))
        self.per_expert_scale = nnx.Param(jnp.ones((spec.num_experts,)), axes=(None,))
        self.top_k = spec.top_k
        self.eps = float(eps)
        self.root = float(hidden) ** -0.5

    def __call__(self, x_TD: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = rms_norm(x_TD, None, eps=self.eps, plus_one=False)
        h = h * self.scale[...].astype(h.dtype) * jnp.asarray(self.root, h.dtype)
        probs = jax.nn.softmax(matmul_oi(h, self.weight[...]).astype(jnp.float32), axis=-1)
        top_w, top_i = jax.lax.top_k(probs, self.top_k)
        top_w = top_w / jnp.sum(top_w, axis=-1, keepdims=True)
        top_w = top_w * self.per_expert_scale[...].astype(jnp.float32)[top_i]
        return top_w.astype(x_TD.dtype), top_i


class ExpertsBeside(nnx.Module):
    """experts(x [B, L, D], route [B, L, D]) -> [B, L, D]: each token through the top-k of ``num_experts`` gated
    experts that the router (``router_cls``, the router type the spec names) picks from ``route``, outputs weighted
    and summed (exact, no token dropping; ``decoder.moe.run_experts`` keeps the cost following the active
    experts)."""

    def __init__(self, spec: FeedForwardSpec, hidden: int, router_cls: type, *, eps: float, rngs: nnx.Rngs):
        if spec.kind != "moe" or spec.shared_intermediate:
            raise ValueError(f"experts beside a dense MLP need a mixture-of-experts spec without a shared expert, "
                             f"got {spec}")
        e, i = spec.num_experts, spec.intermediate
        self.router = router_cls(spec, hidden, eps=eps, rngs=rngs)
        if self.router.scales_input:
            raise ValueError(f"router {spec.router!r} scales the expert inputs; experts beside take output weights")
        self.gate_proj = param(rngs, (e, hidden, i), ("expert", "embed", "mlp"), quant_axis=1)
        self.up_proj = param(rngs, (e, hidden, i), ("expert", "embed", "mlp"), quant_axis=1)
        self.down_proj = param(rngs, (e, i, hidden), ("expert", "mlp", "embed"), quant_axis=1)
        self.top_k = spec.top_k
        self.act = spec.activation

    def __call__(self, x_BLD: jax.Array, route_BLD: jax.Array) -> jax.Array:
        b, l, d = x_BLD.shape
        weights_TK, ids_TK = self.router(route_BLD.reshape(b * l, d))
        xs = jnp.repeat(x_BLD.reshape(b * l, d), self.top_k, axis=0)
        wg, wu, wd = (expert_weights(w[...], x_BLD.dtype) for w in (self.gate_proj, self.up_proj, self.down_proj))
        y = run_experts(xs, ids_TK.reshape(-1), wg, wu, wd, activation(self.act)).reshape(b * l, self.top_k, d)
        return (y * weights_TK[..., None]).sum(axis=1).reshape(b, l, d)
