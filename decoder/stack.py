"""The decoder stack: embeddings in, layers with per-layer-type RoPE and masks, final norm, logits out."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from decoder.config import DecoderConfig
from decoder.embed import Embedder, add_at_placeholders
from decoder.kv_cache import write_positions
from decoder.layer import DecoderLayer
from decoder.masks import attention_mask
from common.norms import RMSNorm
from decoder.rope import rope_tables
from common.sharding import constrain


class Decoder(nnx.Module):
    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embedder = Embedder(cfg.vocab_size, cfg.hidden_size, embed_scale=cfg.embed_scale,
                                 tie=cfg.tie_embeddings, rngs=rngs)
        self.layers = nnx.List([DecoderLayer(cfg, t, mlp_type=cfg.mlp_type(i), rngs=rngs)
                                for i, t in enumerate(cfg.layer_types)])
        self.final_norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, plus_one=cfg.norm_plus_one,
                                  axis_name="embed")

    def __call__(self, x_BLD: jax.Array, *, seq_pos_BL: jax.Array, block_BL: jax.Array, cache: dict,
                 write_index: jax.Array, attend_cache: bool, rope_pos_ABL: jax.Array | None = None,
                 rope: dict | None = None, deepstack: tuple[jax.Array, tuple[jax.Array, ...]] | None = None,
                 last_only: bool = False, media_ahead: int | None = None) -> tuple[jax.Array, dict]:
        """Run the layers on input embeddings; returns (final-normed hidden [B, L, D], updated cache).

        seq_pos_BL: sequence position of each input token (-1 for padding), for masks and the cache.
        block_BL: media block id per token (-1 for text), for bidirectional attention inside a block.
        rope_pos_ABL: RoPE positions [axes, B, L] (default: seq_pos_BL); 3 axes (t, h, w) for MRoPE.
        rope: precomputed ``rope_tables`` for these positions (then ``rope_pos_ABL`` is not used).
        deepstack: (positions mask [B, L], features per layer [rows, D]): features i are added at the masked
            positions (j-th row at the j-th position) after layer i.
        last_only: only the last position's hidden state is wanted ([B, 1, D]); the last layer then computes its
            attention output and MLP for that position alone (the cache is still filled for every position).
        media_ahead: an upper bound on the length of any bidirectional media block in the input; given, a long
            prompt's attention skips the keys no query can see (causal, sliding window) block by block.
        """
        cfg = self.cfg
        x_BLD = constrain(x_BLD, ("batch", "length", "embed"))
        if rope is None:
            if rope_pos_ABL is None:
                rope_pos_ABL = jnp.maximum(seq_pos_BL, 0)[None]
            rope = rope_tables(rope_pos_ABL, cfg.rope_by_type, cfg.head_dim)

        def masks_for(k_pos, k_block):
            return {t: attention_mask(seq_pos_BL, k_pos, block_BL, k_block, window=cfg.window_of(t),
                                      bidirectional=t in cfg.bidirectional_layer_types)
                    for t in set(cfg.layer_types)}

        # the new tokens see each other; in decode also the cache as it was (its new slots are still empty)
        masks = masks_for(seq_pos_BL, block_BL)
        cache_masks = masks_for(cache["pos"], cache["block"]) if attend_cache else {}
        reach = {t: None if media_ahead is None or attend_cache else
                 (cfg.window_of(t), media_ahead if t in cfg.bidirectional_layer_types else 0)
                 for t in set(cfg.layer_types)}
        new_k, new_v = [], []
        for i, layer in enumerate(self.layers):
            t = cfg.layer_types[i]
            cos, sin = rope[t]
            last = last_only and i == len(self.layers) - 1 and not (deepstack is not None and i < len(deepstack[1]))
            x_BLD, k, v = layer(x_BLD, cos, sin, masks[t], cache["k"][i], cache["v"][i], write_index,
                                cache_mask_BLT=cache_masks.get(t), last_query_only=last, key_reach=reach[t])
            new_k.append(k)
            new_v.append(v)
            if deepstack is not None and i < len(deepstack[1]):
                x_BLD = add_at_placeholders(x_BLD, deepstack[0], deepstack[1][i])
        cache = write_positions(cache, seq_pos_BL, block_BL, write_index)
        cache = dict(cache, k=tuple(new_k), v=tuple(new_v))
        if last_only:
            x_BLD = x_BLD[:, -1:]
        return self.final_norm(x_BLD), cache

    def logits(self, h_BLD: jax.Array) -> jax.Array:
        logits = self.embedder.logits(h_BLD)
        if self.cfg.final_logit_softcap is not None:
            cap = self.cfg.final_logit_softcap
            logits = jnp.tanh(logits / cap) * cap
        return logits
