"""Qwen3-Omni's talker and code predictor: the decoders that turn the thinker's answer into codec codes.

The talker is a ``DecoderModel`` (MoE layers with a gated shared expert, 3-D MRoPE) fed with input embeddings:
the thinker's states projected to its width (``text_projection`` of text embeddings, ``hidden_projection`` of
hidden states), plus codec embeddings. Its embedder holds the codec embedding (group 0) and the codec head. Each
step gives the first code group of a frame; the code predictor, a small ``DecoderModel`` started afresh per frame
from [talker state, embedding of code 0], gives the other G - 1 groups, one per step, group g from its own head
(``heads[g - 1]``) and embedded for the next step by its own table (rows (g - 1) * codebook .. of the predictor's
embedding). The talker's next input is the sum of the frame's G code embeddings plus the next text position.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from omnijax.common.activations import activation
from omnijax.common.linear import Linear, param
from omnijax.decoder.kv_cache import init_cache
from omnijax.decoder.model import DecoderModel
from omnijax.decoder.parts import DecoderParts
from omnijax.decoder.spec import DecoderSpec


@dataclasses.dataclass(frozen=True)
class TalkerConfig:
    """decoder: the talker (vocab_size: its codec vocabulary); predictor: the code predictor (vocab_size:
    (num_code_groups - 1) * codebook_size, one table per group after the first); thinker_hidden: the width of
    the thinker states it reads; projection: the width and activation of its two input projections."""

    decoder: DecoderSpec
    predictor: DecoderSpec
    num_code_groups: int
    codebook_size: int
    thinker_hidden: int
    projection: int
    projection_act: str = "silu"

    def __post_init__(self):
        if self.predictor.vocab_size != (self.num_code_groups - 1) * self.codebook_size:
            raise ValueError("the code predictor's table must hold (groups - 1) x codebook rows")
        if self.predictor.hidden_size != self.decoder.hidden_size:
            raise ValueError("the code predictor reads the talker's states: their widths must match")


class ResizeMLP(nnx.Module):
    """fc2(act(fc1(x))) with biases: thinker width -> talker width."""

    def __init__(self, cin: int, width: int, cout: int, act: str, *, rngs: nnx.Rngs):
        self.linear_fc1 = Linear(cin, width, axes=("embed", "mlp"), use_bias=True, rngs=rngs)
        self.linear_fc2 = Linear(width, cout, axes=("mlp", "embed"), use_bias=True, rngs=rngs)
        self.act = act

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.linear_fc2(activation(self.act)(self.linear_fc1(x)))


Chooser = Callable[[jax.Array, jax.Array], jax.Array]  # (logits [B, V] float32, group index) -> codes [B]


class Talker(nnx.Module):
    def __init__(self, cfg: TalkerConfig, parts: DecoderParts, *, rngs: nnx.Rngs):
        self.cfg = cfg
        width = cfg.decoder.hidden_size
        self.text_projection = ResizeMLP(cfg.thinker_hidden, cfg.projection, width, cfg.projection_act, rngs=rngs)
        self.hidden_projection = ResizeMLP(cfg.thinker_hidden, cfg.projection, width, cfg.projection_act, rngs=rngs)
        self.decoder = DecoderModel(cfg.decoder, parts=parts, rngs=rngs)
        self.predictor = DecoderModel(cfg.predictor, parts=parts, rngs=rngs)
        self.heads = param(rngs, (cfg.num_code_groups - 1, cfg.codebook_size, width), (None, "vocab", "embed"))

    def codec_embed(self, codes_B: jax.Array) -> jax.Array:
        """The talker's embeddings [B, D] of group-0 (or special) codec ids."""
        return self.decoder.embedder.encode(codes_B[:, None])[:, 0]

    def codec_logits(self, h_BD: jax.Array) -> jax.Array:
        """Float32 logits [B, codec vocab] of final-normed talker states."""
        return self.decoder.embedder.logits(h_BD[:, None])[:, 0]

    def predict_codes(self, h_BD: jax.Array, code0_B: jax.Array, choose: Chooser) -> tuple[jax.Array, jax.Array]:
        """The rest of a frame: (codes [B, G - 1] of groups 1.., the sum of the frame's G code embeddings [B, D])
        from the talker's final-normed state ``h_BD`` and the frame's first code. ``choose(logits, g)`` picks
        group g's codes."""
        cfg = self.cfg
        b = h_BD.shape[0]
        cache = init_cache(cfg.predictor, b, cfg.num_code_groups, h_BD.dtype)

        def step(x_BD, cache):
            return self.predictor.embeds_step(x_BD, cache["length"][None], cache)

        _, cache = step(h_BD, cache)
        first = self.codec_embed(code0_B).astype(h_BD.dtype)

        def group(g, carry):
            cache, x, total, codes = carry
            h, cache = step(x, cache)
            head = jax.lax.dynamic_index_in_dim(self.heads[...], g - 1, 0, keepdims=False)
            logits = jnp.einsum("bd,vd->bv", h, head.astype(h.dtype), preferred_element_type=jnp.float32)
            code = choose(logits, g)
            x = self.predictor.embedder.encode(((g - 1) * cfg.codebook_size + code)[:, None])[:, 0].astype(h.dtype)
            return cache, x, total + x, jax.lax.dynamic_update_index_in_dim(codes, code, g - 1, 1)

        codes = jnp.zeros((b, cfg.num_code_groups - 1), jnp.int32)
        _, _, total, codes = jax.lax.fori_loop(1, cfg.num_code_groups, group, (cache, first, first, codes))
        return codes, total
