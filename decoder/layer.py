"""One decoder layer: pre-norm attention and MLP, with Gemma's optional post ("sandwich") norms."""

from __future__ import annotations

import jax
from flax import nnx

from decoder.attention import Attention
from decoder.config import DecoderConfig
from decoder.mlp import GatedMLP
from decoder.moe import MoEMLP
from common.norms import RMSNorm
from common.sharding import constrain


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: DecoderConfig, layer_type: str, *, mlp_type: str = "dense", rngs: nnx.Rngs):
        self.layer_type = layer_type
        norm = lambda: RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, plus_one=cfg.norm_plus_one, axis_name="embed")
        self.attn_norm_in = norm()
        self.attn = Attention(cfg, rngs=rngs)
        self.attn_norm_out = norm() if cfg.sandwich_norm else None
        self.mlp_norm_in = norm()
        if mlp_type == "moe":
            self.mlp = MoEMLP(cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts, cfg.num_experts_per_tok,
                              cfg.activation, normalize=cfg.norm_topk_prob, rngs=rngs)
        else:
            self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.activation, rngs=rngs)
        self.mlp_norm_out = norm() if cfg.sandwich_norm else None

    def __call__(self, x_BLD: jax.Array, cos_BLH, sin_BLH, mask_BLS, cache_k, cache_v, write_index, *,
                 cache_mask_BLT=None, last_query_only: bool = False, key_reach=None):
        """See Attention: ``cache_mask_BLT`` to attend to the cache too; ``last_query_only``: fill the cache for
        every position, return [B, 1, D] for the last one only."""
        h, cache_k, cache_v = self.attn(self.attn_norm_in(x_BLD), cos_BLH, sin_BLH, mask_BLS, cache_k, cache_v,
                                        write_index, cache_mask_BLT=cache_mask_BLT, last_query_only=last_query_only,
                                        key_reach=key_reach)
        if last_query_only:
            x_BLD = x_BLD[:, -1:]
        if self.attn_norm_out is not None:
            h = self.attn_norm_out(h)
        x_BLD = x_BLD + h
        h = self.mlp(self.mlp_norm_in(x_BLD))
        if self.mlp_norm_out is not None:
            h = self.mlp_norm_out(h)
        x_BLD = constrain(x_BLD + h, ("batch", "length", "embed"))
        return x_BLD, cache_k, cache_v
