"""The decoder model's forward: ``prefill`` a batch of prompts into a KV cache, then ``step`` one token per row.

Both are pure functions of (parameters, inputs, cache): the engine (app/generation.py) owns jit, shape buckets,
sampling and the loop. The forward takes token ids and, per media placeholder id, the encoder's feature rows;
it merges them into the embeddings, runs the layers of the ``DecoderSpec`` (each with its own attention kind,
positional encoding, head counts and cache), adds per-layer extras (deepstack features after the first layers,
per-layer inputs computed from the token ids) and returns float32 logits.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from omnijax.common.norms import RMSNorm
from omnijax.common.sharding import constrain
from omnijax.decoder.attention import PromptContext, StepContext
from omnijax.decoder.attention_op import PromptMeta
from omnijax.decoder.blocks import take_rows
from omnijax.decoder.embed import Embedder, add_at_placeholders, merge_media
from omnijax.decoder.kv_cache import (LayerCache, cache_index, cache_slots, fill_from_prompt, last_readers,
                                     slot_positions, write_pending)
from omnijax.decoder.parts import BUILTIN_PARTS, DecoderParts
from omnijax.decoder.rope import rope_tables
from omnijax.decoder.spec import DecoderSpec


class Media(NamedTuple):
    """One modality's encoder output for a batch: features [R, D], valid [R] (None: all rows real), extras:
    feature maps aligned row for row with ``features`` (deepstack), each [R, D]."""

    features: jax.Array
    valid: jax.Array | None = None
    extras: tuple = ()


class Prompt(NamedTuple):
    """A batch of right-padded prompts.

    tokens [B, L] int32 (media placeholders included); lengths [B]; rope_pos [axes, B, L] RoPE positions (axes 3
    for MRoPE); bidirectional [B, L] bool: tokens of media blocks that attend to their whole block.
    media: {placeholder token id: Media}; deepstack: the placeholder id whose Media extras are added after the
    first layers (or None).
    """

    tokens: jax.Array
    lengths: jax.Array
    rope_pos: jax.Array
    bidirectional: jax.Array
    media: dict
    deepstack: int | None = None


def block_ids(is_media_BL: jax.Array) -> jax.Array:
    """Block id per token [batch, seq]: contiguous runs of media tokens numbered 0, 1, ... per row; -1 elsewhere."""
    prev = jnp.pad(is_media_BL[:, :-1], ((0, 0), (1, 0)), constant_values=False)
    starts = is_media_BL & ~prev
    ids = jnp.cumsum(starts.astype(jnp.int32), axis=1) - 1
    return jnp.where(is_media_BL, ids, -1)


def prompt_meta(lengths_B: jax.Array, bidirectional_BL: jax.Array) -> PromptMeta:
    """Positions, media block ids and each token's media reach (the last position of its block)."""
    b, l = bidirectional_BL.shape
    idx = jnp.broadcast_to(jnp.arange(l, dtype=jnp.int32), (b, l))
    pos = jnp.where(idx < lengths_B[:, None], idx, -1)
    block = block_ids(bidirectional_BL & (pos >= 0))
    nxt = jnp.pad(block[:, 1:], ((0, 0), (0, 1)), constant_values=-1)
    ends = (block >= 0) & (nxt != block)
    reach = jax.lax.cummin(jnp.where(ends, idx, l), axis=1, reverse=True)
    reach = jnp.where(block >= 0, reach, pos)
    return PromptMeta(pos, block, reach)


class DecoderModel(nnx.Module):
    """The decoder of ``spec``, its blocks, routers and per-layer inputs taken from ``parts`` by the names the spec
    uses (``BUILTIN_PARTS``: the decoder's own; a model family extends them with its own)."""

    def __init__(self, spec: DecoderSpec, *, rngs: nnx.Rngs, parts: DecoderParts = BUILTIN_PARTS):
        parts.check(spec)
        self.spec = spec
        self.embedder = Embedder(spec.vocab_size, spec.hidden_size, embed_scale=spec.embed_scale,
                                 tie=spec.tie_embeddings, substitutes=spec.embed_substitutes, rngs=rngs)
        self.layers = nnx.List([parts.block(layer.block)(layer, spec, parts, rngs=rngs) for layer in spec.layers])
        self.final_norm = RMSNorm(spec.hidden_size, eps=spec.rms_norm_eps, plus_one=spec.norm_plus_one,
                                  axis_name="embed")
        # one assignment: an NNX attribute first set to None would stay static and refuse the module
        self.layer_inputs = None if spec.layer_inputs is None else \
            parts.layer_input(spec.layer_inputs.kind)(spec, rngs=rngs)

    # ---- pieces --------------------------------------------------------------------------------------------
    def rope_tables(self, rope_pos_ABL: jax.Array) -> dict:
        """{rope_key: (cos, sin)} for the layers' rotations at these positions [axes, B, L]."""
        return rope_tables(rope_pos_ABL, [(l.attention.rope, l.attention.head_dim) for l in self.spec.layers
                                          if l.attention.rope is not None])

    def embed(self, tokens_BL: jax.Array, media: dict) -> jax.Array:
        x = self.embedder.encode(tokens_BL)
        for token_id, m in media.items():
            x = merge_media(x, tokens_BL == token_id, m.features, m.valid)
        return constrain(x, ("batch", "length", "embed"))

    def logits(self, h_BLD: jax.Array) -> jax.Array:
        logits = self.embedder.logits(self.final_norm(h_BLD))
        cap = self.spec.final_logit_softcap
        return logits if cap is None else jnp.tanh(logits / cap) * cap

    def _layer_inputs(self, tokens_BL: jax.Array, x_BLD: jax.Array):
        return None if self.layer_inputs is None else self.layer_inputs(tokens_BL, x_BLD)  # [B, L, layers, P]

    # ---- forward passes ------------------------------------------------------------------------------------
    def _output(self, h_BLD: jax.Array, output: str) -> jax.Array:
        """The final layer's output as ``output`` asks: "logits" (float32 [.., V]) or "hidden" (final-normed
        hidden states [.., D], for a model whose head is not the embedder's)."""
        if output == "hidden":
            return self.final_norm(h_BLD)
        if output != "logits":
            raise ValueError(f"unknown decoder output {output!r}; use 'logits' or 'hidden'")
        return self.logits(h_BLD)

    def prefill(self, prompt: Prompt, *, cache_len: int, cache_dtype, all_logits: bool = False,
                rope: dict | None = None, attention: str = "auto", embeds: jax.Array | None = None,
                hidden_at: tuple[int, ...] = (), output: str = "logits"):
        """Run the prompts; returns (logits, cache), or (logits, cache, hidden) with ``hidden_at``.

        logits: [B, V] at each row's last token, or [B, L, V] at every position with ``all_logits``
        (``output="hidden"``: the final-normed hidden states [B, D] / [B, L, D] instead). The cache holds every
        layer's keys/values of the prompt (``kv_cache``), ``cache_len`` long, each layer's filled as the layer
        runs. ``rope``: tables for ``prompt.rope_pos`` computed beforehand (``rope_tables``). ``attention``: the
        attention backend (``attention_op.backend_for``). ``embeds`` [B, L, D]: input embeddings taken instead of
        the token embeddings of ``prompt.tokens`` and its media (for a decoder fed with another model's states).
        ``hidden_at``: hidden states to return at every position, numbered as transformers' ``hidden_states``:
        0 the input embeddings (media merged), i >= 1 the output of layer i - 1, taken before any deepstack
        addition after that layer; ``hidden`` is {i: [B, L, D]}.
        """
        spec = self.spec
        if any(not 0 <= i < spec.num_layers for i in hidden_at):
            raise ValueError(f"hidden_at {hidden_at} must name hidden states 0..{spec.num_layers - 1}")
        x = self.embed(prompt.tokens, prompt.media) if embeds is None else embeds
        hidden = {0: x} if 0 in hidden_at else {}
        meta = prompt_meta(prompt.lengths, prompt.bidirectional)
        ctx = PromptContext(meta, rope if rope is not None else self.rope_tables(prompt.rope_pos), backend=attention)
        per_layer = self._layer_inputs(prompt.tokens, x)
        deepstack = () if prompt.deepstack is None else prompt.media[prompt.deepstack].extras
        last_rows = jnp.maximum(prompt.lengths - 1, 0)[:, None]  # [B, 1]
        # from this layer on only each row's last position is needed (later layers compute no keys/values)
        narrow_from = len(spec.layers) if all_logits else max(spec.last_kv_layer, len(deepstack), *hidden_at)
        slots = cache_slots(spec, cache_len)
        prompt_kv: dict[int, tuple] = {}  # owner layer -> its keys and values [B, L, K, H], for sharing layers
        caches: list[LayerCache] = []
        for i, layer in enumerate(self.layers):
            layer_ctx = ctx if i < narrow_from else ctx._replace(query_rows=last_rows, narrowed=i > narrow_from)
            layer_in = None if per_layer is None else per_layer[:, :, i]
            if layer_in is not None and i >= narrow_from:
                layer_in = take_rows(layer_in, last_rows)
            x, kv = layer.prefill(x, layer_ctx, prompt_kv.get(spec.kv_layer(i)), layer_in,
                                  last_rows if i == narrow_from else None)
            if kv is not None:
                prompt_kv[i] = kv
                caches.append(LayerCache(*fill_from_prompt(*kv, prompt.lengths, slots[i], cache_dtype)))
            if i + 1 in hidden_at:
                hidden[i + 1] = x
            if i < len(deepstack):
                m = prompt.media[prompt.deepstack]
                x = add_at_placeholders(x, prompt.tokens == prompt.deepstack, deepstack[i], m.valid)
        out = self._output(x, output)
        out = out if all_logits else out[:, 0]
        cache = {"length": prompt.lengths.astype(jnp.int32), "k": tuple(c.k for c in caches),
                 "v": tuple(c.v for c in caches)}
        return (out, cache, hidden) if hidden_at else (out, cache)

    def step(self, tokens_B: jax.Array, rope_pos_AB: jax.Array, cache: dict, *, embeds: jax.Array | None = None,
             output: str = "logits") -> tuple[jax.Array, dict]:
        """One token per row at position cache["length"] -> (logits [B, V], the cache with it written).

        ``embeds`` [B, D]: the input embedding of each row, taken instead of the embedding of ``tokens_B``;
        ``output="hidden"``: the final-normed hidden state [B, D] instead of the logits.
        A layer that owns keys/values takes its cache and returns it holding the token; a layer that shares them
        reads the owner's cache, token included. Once a cache's last reader has run, its token is written into
        its ring (``write_pending``)."""
        spec = self.spec
        pos = cache["length"]
        tokens = tokens_B[:, None]
        x = self.embed(tokens, {}) if embeds is None else embeds[:, None]
        per_layer = self._layer_inputs(tokens, x)
        ctx = StepContext(pos, self.rope_tables(rope_pos_AB[:, :, None]),
                          {s: slot_positions(pos, s) for s in sorted({k.shape[-1] for k in cache["k"]})})
        index, last = cache_index(spec), last_readers(spec)
        caches = [LayerCache(k, v) for k, v in zip(cache["k"], cache["v"])]
        for i, layer in enumerate(self.layers):
            j = index[spec.kv_layer(i)]
            x, mine = layer.step(x, ctx, caches[j], None if per_layer is None else per_layer[:, :, i])
            if mine is not None:
                caches[j] = mine
            if last[j] == i:
                caches[j] = write_pending(caches[j], pos, x)
        return self._output(x, output)[:, 0], {"length": pos + 1, "k": tuple(c.k for c in caches),
                                               "v": tuple(c.v for c in caches)}
