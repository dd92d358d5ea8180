"""The decoder model's forward: ``forward`` runs new tokens after their rows of a KV cache (decode steps: a token
per row; prompt chunks: a row's next tokens); ``prefill`` runs whole prompts into a new cache (the speech path and
code2wav).

Both are pure functions of (parameters, inputs, cache): the serving engine (app/slots.py, app/scheduler.py) owns
jit, shape buckets, sampling and the loop. They take token ids and the media's feature rows at their placeholders,
merge them into the embeddings, run the layers of the ``DecoderSpec`` (each with its own attention kind,
positional encoding, head counts and cache), add per-layer extras (deepstack features after the first layers,
per-layer inputs computed from the token ids) and return the last layer's output, which ``logits`` /
``last_logits`` / ``hidden`` turn into float32 logits or final-normed states.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from omnijax.common.norms import RMSNorm
from omnijax.common.sharding import constrain
from omnijax.decoder.attention import BatchContext, GroupContext, PromptContext
from omnijax.decoder.attention_op import PromptMeta
from omnijax.decoder.blocks import take_rows
from omnijax.decoder.embed import Embedder, add_at_placeholders, merge_media
from omnijax.decoder.kv_cache import (PAGE, LayerCache, cache_index, cache_slots, fill_from_prompt, paged_entries,
                                      slot_positions, write_paged, write_tokens)
from omnijax.decoder.packing import Packing
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
    media: {placeholder token id: Media}; deepstack: the placeholder ids whose Media extras are added after the
    first layers (images and video frames of one vision tower; each at its own placeholders).
    """

    tokens: jax.Array
    lengths: jax.Array
    rope_pos: jax.Array
    bidirectional: jax.Array
    media: dict
    deepstack: tuple[int, ...] = ()


class TokenBatch(NamedTuple):
    """New tokens continuing cached sequences: S sequences of T tokens (right-padded), sequence s continuing cache
    row ``rows[s]`` (``rows`` None: row s) after the ``start[s]`` tokens the row holds. A decode step is S rows of
    one token, prompt chunks C rows of T tokens; every array has a fixed shape for a given (S, T), whatever the
    batch holds.

    tokens [S, T] int32 (media placeholders included); count [S]: how many are real (0: the row takes no token,
    e.g. an idle slot or a padding sequence; its length stays); start [S]; rows [S] int32 or None (an index past
    the cache's last row: a padding sequence, count 0); rope_pos [axes, S, T] (float32: time-aware positions may be
    fractional). Optional (None: absent, e.g. in a decode step): bidirectional [S, T] (tokens of media blocks that
    attend to their whole block; a chunk never splits such a block); media [S, T, D] float32 (each media
    placeholder's feature row, zeros elsewhere) with is_media [S, T] (the tokens that take it instead of their
    embedding); deepstack [E, S, T, D] float32 (added to the hidden state after layer i < E); embeds [S, T, D]: input
    embeddings taken instead of the tokens' (a decoder fed with another model's states).
    """

    tokens: jax.Array
    count: jax.Array
    start: jax.Array
    rows: jax.Array | None
    rope_pos: jax.Array
    bidirectional: jax.Array | None = None
    media: jax.Array | None = None
    is_media: jax.Array | None = None
    deepstack: jax.Array | None = None
    embeds: jax.Array | None = None


def one_token_batch(tokens_S: jax.Array, rope_pos_AS: jax.Array, cache: dict, active_S: jax.Array | None = None,
                    embeds_SD: jax.Array | None = None) -> TokenBatch:
    """A decode step's batch: one token per row of the first S rows of ``cache``, after what each row holds;
    ``active_S``: the rows that take their token (default all)."""
    s = tokens_S.shape[0]
    count = jnp.ones((s,), jnp.int32) if active_S is None else active_S.astype(jnp.int32)
    return TokenBatch(tokens_S[:, None], count, cache["length"][:s], None,
                      rope_pos_AS[:, :, None], embeds=None if embeds_SD is None else embeds_SD[:, None])


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

    def _output(self, h_BLD: jax.Array, output: str) -> jax.Array:
        """The final layer's output as ``output`` asks: "logits" (float32 [.., V]) or "hidden" (final-normed
        hidden states [.., D], for a model whose head is not the embedder's)."""
        if output == "hidden":
            return self.hidden(h_BLD)
        if output != "logits":
            raise ValueError(f"unknown decoder output {output!r}; use 'logits' or 'hidden'")
        return self.logits(h_BLD)

    # ---- forward passes ------------------------------------------------------------------------------------
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
        x, cache, hidden = self._prompt_layers(prompt, cache_len=cache_len, cache_dtype=cache_dtype,
                                               all_rows=all_logits, rope=rope, attention=attention, embeds=embeds,
                                               hidden_at=hidden_at)
        out = self._output(x, output)
        out = out if all_logits else out[:, 0]
        return (out, cache, hidden) if hidden_at else (out, cache)

    def next_token_logprobs(self, h_BTD: jax.Array, targets_BT: jax.Array, rows_per_chunk: int = 32,
                            top: int = 0) -> tuple:
        """(float32 [B, T],): at each position, the natural-log probability of ``targets`` there (the log-softmax of
        the logits of the last layer's output ``h``, gathered at the target); with ``top`` > 0, also the ``top`` most
        likely tokens there, most likely first: their ids (int32 [B, T, top]) and theirs ([B, T, top]). The logits
        are made ``rows_per_chunk`` positions at a time, so the memory stays [B, rows_per_chunk, V] however long T
        is."""
        b, t, d = h_BTD.shape
        pad = -t % rows_per_chunk
        h = jnp.pad(h_BTD, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets_BT, ((0, 0), (0, pad)))
        chunks = (t + pad) // rows_per_chunk

        def one_chunk(args):
            h_BCD, t_BC = args
            logp = jax.nn.log_softmax(self.logits(h_BCD).astype(jnp.float32), axis=-1)
            chosen = jnp.take_along_axis(logp, t_BC[..., None], axis=-1)[..., 0]
            if not top:
                return (chosen,)
            values, ids = jax.lax.top_k(logp, top)
            return chosen, ids.astype(jnp.int32), values

        h = h.reshape(b, chunks, rows_per_chunk, d).transpose(1, 0, 2, 3)
        targets = targets.reshape(b, chunks, rows_per_chunk).transpose(1, 0, 2)
        out = jax.lax.map(one_chunk, (h, targets))  # [chunks, B, rows(, top)]
        unchunk = lambda a: jnp.moveaxis(a, 0, 1).reshape(b, t + pad, *a.shape[3:])[:, :t]  # noqa: E731
        return tuple(unchunk(a) for a in out)

    def _prompt_layers(self, prompt: Prompt, *, cache_len: int, cache_dtype, all_rows: bool, rope: dict | None,
                       attention: str, embeds: jax.Array | None = None,
                       hidden_at: tuple[int, ...] = ()) -> tuple[jax.Array, dict, dict]:
        """The prompt through every layer -> (the last layer's output [B, L, D], or [B, 1, D] at each row's last
        token unless ``all_rows``; the cache; the hidden states ``hidden_at`` asks for, as ``prefill``)."""
        all_logits = all_rows
        spec = self.spec
        if any(not 0 <= i < spec.num_layers for i in hidden_at):
            raise ValueError(f"hidden_at {hidden_at} must name hidden states 0..{spec.num_layers - 1}")
        x = self.embed(prompt.tokens, prompt.media) if embeds is None else embeds
        hidden = {0: x} if 0 in hidden_at else {}
        meta = prompt_meta(prompt.lengths, prompt.bidirectional)
        ctx = PromptContext(meta, rope if rope is not None else self.rope_tables(prompt.rope_pos), backend=attention)
        per_layer = self._layer_inputs(prompt.tokens, x)
        deepstack = max((len(prompt.media[t].extras) for t in prompt.deepstack), default=0)
        last_rows = jnp.maximum(prompt.lengths - 1, 0)[:, None]  # [B, 1]
        # from this layer on only each row's last position is needed (later layers compute no keys/values)
        narrow_from = len(spec.layers) if all_logits else max(spec.last_kv_layer, deepstack, *hidden_at)
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
            for token_id in prompt.deepstack:
                m = prompt.media[token_id]
                if i < len(m.extras):
                    x = add_at_placeholders(x, prompt.tokens == token_id, m.extras[i], m.valid)
        return x, {"length": prompt.lengths.astype(jnp.int32), "k": tuple(c.k for c in caches),
                   "v": tuple(c.v for c in caches)}, hidden

    def forward(self, batch: TokenBatch | tuple[TokenBatch, ...], cache: dict, *,
                attention: str = "auto") -> tuple[jax.Array | tuple[jax.Array, ...], dict]:
        """New tokens continuing their rows of the cache -> (the last layer's output [S, T, D] before the final
        norm: ``logits`` / ``_output`` of it at the positions wanted; the cache with every real token written and
        each row's length ``start + count``).

        ``batch``: one ``TokenBatch``, or a tuple of them (groups of different shapes, e.g. a decode step's rows
        beside prompt chunks: one program, the weights read once for all; the output is then a tuple, one [S, T, D]
        per group; no two groups may continue the same row). Each layer attends to the rows' caches as they were and
        to the batch's own tokens (``Attention.forward``); a layer that shares an earlier layer's keys/values reads
        that layer's cache and new keys/values. Once every layer has run, each cache takes the new keys and values
        (``write_tokens``, group after group, ordered after the last layer's output so the cache is updated in
        place). Other rows are untouched. ``attention``: the attention backend (``attention_op.backend_for``)."""
        spec = self.spec
        batches = (batch,) if isinstance(batch, TokenBatch) else tuple(batch)
        packing = Packing(tuple(b.tokens.shape for b in batches))
        x = constrain(packing.join([self._embed_batch(b) for b in batches]), ("batch", "length", "embed"))
        paged = paged_entries(spec, cache)
        tables = cache.get("pages", ())
        spans = {k.shape[-1] for k, p in zip(cache["k"], paged) if p is None} | {t.shape[1] * PAGE for t in tables}
        groups = []
        for b in batches:
            idx = jnp.arange(b.tokens.shape[1], dtype=jnp.int32)[None]
            pos = jnp.where(idx < b.count[:, None], b.start[:, None] + idx, -1)
            block = None if b.bidirectional is None else block_ids(b.bidirectional & (pos >= 0))
            held = jnp.max(jnp.where(b.count > 0, b.start, 0))
            pages = tuple(table[:b.tokens.shape[0]] if b.rows is None else jnp.take(table, b.rows, axis=0, mode="clip")
                          for table in tables)
            groups.append(GroupContext(b.rows, pos, block, {n: slot_positions(b.start, n) for n in sorted(spans)},
                                       held, pages))
        ctx = BatchContext(tuple(groups), packing, packing.join([g.pos for g in groups]),
                           self.rope_tables(packing.join([b.rope_pos for b in batches], axis=1)), attention)
        per_layer = self._layer_inputs(packing.join([b.tokens for b in batches]), x)
        deepstack = self._deepstack(batches, packing, x.shape[-1])
        index = cache_index(spec)
        new_kv: dict[int, tuple] = {}  # owner layer -> the batch's keys and values, for sharing layers
        for i, layer in enumerate(self.layers):
            j = index[spec.kv_layer(i)]
            x, kv = layer.forward(x, ctx, LayerCache(cache["k"][j], cache["v"][j], paged[j]),
                                  new_kv.get(spec.kv_layer(i)), None if per_layer is None else per_layer[:, :, i])
            if kv is not None:
                new_kv[i] = kv
            if deepstack is not None and i < deepstack.shape[0]:
                x = x + deepstack[i].astype(x.dtype)
        keys, values = list(cache["k"]), list(cache["v"])
        for i, (k, v) in new_kv.items():
            j = index[i]
            for b, g, kg, vg in zip(batches, groups, packing.split(k), packing.split(v)):
                if paged[j] is not None:
                    keys[j], values[j] = write_paged(keys[j], values[j], g.pages[paged[j]], kg, vg, b.start, b.count,
                                                     after_x=x)
                else:
                    keys[j], values[j] = write_tokens(keys[j], values[j], b.rows, kg, vg, b.start, b.count, after_x=x)
        length = cache["length"]
        for b in batches:
            grown = b.start + b.count
            if b.rows is not None:
                length = length.at[b.rows].set(grown, mode="drop")
            elif grown.shape[0] == length.shape[0]:
                length = grown
            else:
                length = jax.lax.dynamic_update_slice_in_dim(length, grown, 0, 0)
        out = x if packing.single else tuple(packing.split(x))
        return out, {**cache, "length": length, "k": tuple(keys), "v": tuple(values)}

    def _embed_batch(self, batch: TokenBatch) -> jax.Array:
        """A group's input embeddings [S, T, D]: its ``embeds``, or its tokens' embeddings with the media rows."""
        if batch.embeds is not None:
            return batch.embeds
        x = self.embedder.encode(batch.tokens)
        if batch.media is not None:
            x = jnp.where(batch.is_media[..., None], batch.media.astype(x.dtype), x)
        return x

    @staticmethod
    def _deepstack(batches: tuple[TokenBatch, ...], packing: Packing, d: int) -> jax.Array | None:
        """The groups' deepstack rows in the forward's layout [E, ..] (zeros for a group without; None if none has)."""
        layers = max((b.deepstack.shape[0] for b in batches if b.deepstack is not None), default=0)
        if not layers:
            return None
        parts = [jnp.zeros((layers, *b.tokens.shape, d), jnp.float32) if b.deepstack is None
                 else jnp.pad(b.deepstack, ((0, layers - b.deepstack.shape[0]),) + ((0, 0),) * 3) for b in batches]
        return packing.join(parts, axis=1)

    def last_logits(self, h_STD: jax.Array, count_S: jax.Array) -> jax.Array:
        """Float32 logits [S, V] at each sequence's last real token of ``forward``'s output (its first for a
        sequence that took none)."""
        last = jnp.take_along_axis(h_STD, jnp.maximum(count_S - 1, 0)[:, None, None], axis=1)
        return self.logits(last)[:, 0]

    def hidden(self, h_STD: jax.Array) -> jax.Array:
        """The final-normed hidden states of ``forward``'s output (for a model whose head is not the embedder's)."""
        return self.final_norm(h_STD)

    def embeds_step(self, embeds_SD: jax.Array, rope_pos_AS: jax.Array, cache: dict) -> tuple[jax.Array, dict]:
        """One input embedding per row of the first S rows of ``cache`` through ``forward`` (a decoder fed with
        another model's states: the speech stacks) -> (final-normed hidden states [S, D], the cache)."""
        s = embeds_SD.shape[0]
        batch = one_token_batch(jnp.zeros((s,), jnp.int32), rope_pos_AS, cache, embeds_SD=embeds_SD)
        h, cache = self.forward(batch, cache)
        return self.hidden(h)[:, 0], cache
