"""The serving engine's device side: a fixed number of slots, each a row of one KV cache, and the jitted programs
that fill and decode them.

Every slot holds one request: its row of every layer's cache (full layers: the context length; sliding / chunked
layers: a ring of the window) and its decoding state (``SlotState``: the next token to feed, how many it has
generated, whether it is active, its sampling settings). The model runs through one forward
(``DecoderModel.forward``: new tokens after their rows of the cache) in one program, ``step``, on fixed shapes:

- a decode group: one token for every active slot of the first ``rows`` slots (rows: a power of two, so a lone
  request decodes at batch 1) with each slot's own settings; a slot turns inactive on an end id or its last token;
- beside it (the decode group then of ``chunk_tiers`` rows: the first 8 slots, or every slot once a later one is
  taken), prompt chunks of up to ``MAX_CHUNK_ROWS`` requests (``ChunkGroup``: C rows of a bucketed length T,
  each continuing its slot; their media come as one feature row per token, so a shape is one program whatever
  media the chunks hold): their logits at each chunk's last token, and their last layer's output at every token,
  which ``head`` turns into the logits at every token for ``Pipeline.prompt_logits``, and ``logprobs`` into each
  next prompt token's log-probability for scoring.

Both groups go through the weights once (decoder/packing.py). The step returns the decode rows' logits on the
device; ``sample``, a program of its own, draws each row's token from them (app/sampling.py) and advances the rows'
state, so the sampler compiles once per decode row count instead of inside every step shape. With ``logprobs``,
its variant that also returns each decoded token's log probability and the top 20 (app/token_logprobs.py),
compiled the first time a step holds a request that asks for them; with a token ``mask`` (structured outputs:
app/grammar.py), its variant that draws from the logits the mask allows (``sampling.apply_bitmask``), compiled the
first time a step holds a constrained request: a step without one runs the unmasked program. Other programs:

- ``insert``: the first token of a prefilled request, drawn from its prompt's last logits (within its ``mask``,
  when it has one), makes its slot active (with ``logprobs``, its log probabilities too);
- ``release``: a slot stops (a cancelled or stopped request) at the next step;
- ``snapshot`` / ``restore``: a row's keys and values copied out (the prefix cache) and into another row.

Requests coming and going change only array contents: nothing compiles again once each shape has run
(``warm_up`` compiles them up front). The host side (app/scheduler.py) decides what runs when.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from omnijax.app.kv_pages import KVPages, pages_for
from omnijax.app.sampling import SamplingParams, apply_bitmask, choose_rows, row_settings
from omnijax.app.token_logprobs import TOP, token_logprobs
from omnijax.common.matmul_policy import narrow_products, products_setting
from omnijax.common.sharding import named_sharding, use_mesh
from omnijax.decoder.kv_cache import (PAGE, cache_axes, cache_slots, init_cache, paged_entries, paged_spans,
                                      restore_row, snapshot_row)
from omnijax.decoder.model import TokenBatch, one_token_batch

DEFAULT_MAX_BATCHED_TOKENS = 512  # prompt tokens of one step, unless a media block needs more (it is never split)
DEFAULT_SLOTS = 32
DEFAULT_KV_CACHE_MB = 1024  # the paged cache's pools (keys and values of every layer whose cache spans whole pages)
MAX_CHUNK_ROWS = 4  # prompt chunks of different requests in one step: 1, 2 or 4 rows
CHUNK_TIER = 8  # decode rows beside prompt chunks while no later slot is taken (then every slot)


class ChunkMedia(NamedTuple):
    """The media of a chunk of ``count`` tokens, on the host: rows [count, D] (each media placeholder's feature
    row, zeros elsewhere), is_media [count] (the placeholders), deepstack [E, count, D] (what is added after the
    first E decoder layers at each placeholder; zeros elsewhere). None for a chunk without media."""

    rows: np.ndarray
    is_media: np.ndarray
    deepstack: np.ndarray


class ChunkGroup(NamedTuple):
    """A step's prompt chunks as the program takes them (host arrays; C rows of T tokens, C a power of two, rows
    past the chunks being padding): tokens [C, T], count [C], start [C], rows [C] (each chunk's slot; padding: the
    slot count, past the last row), rope_pos [axes, C, T], bidirectional [C, T], media [C, T, D], is_media [C, T],
    deepstack [E, C, T, D]."""

    tokens: np.ndarray
    count: np.ndarray
    start: np.ndarray
    rows: np.ndarray
    rope_pos: np.ndarray
    bidirectional: np.ndarray
    media: np.ndarray
    is_media: np.ndarray
    deepstack: np.ndarray


class Chunk(NamedTuple):
    """One request's prompt chunk for a step: ``tokens`` [count] at positions start.. of slot ``row``, their RoPE
    positions [axes, count], which are in media blocks (``bidirectional`` [count]) and their ``media``."""

    tokens: np.ndarray
    start: int
    row: int
    rope_pos: np.ndarray
    bidirectional: np.ndarray
    media: ChunkMedia | None


def chunk_row_counts(slots: int) -> tuple[int, ...]:
    """The row counts a step's chunk group may have with ``slots`` slots: 1, 2 and 4, at most one past ``slots``."""
    return tuple(c for c in (1, 2, MAX_CHUNK_ROWS) if c // 2 < slots)


class SlotState(NamedTuple):
    """The decoding state of every slot, each [slots]: ``token`` (generated token number ``index`` of the slot's
    request, not yet in the cache), ``active`` (the slot decodes at the next step), ``remaining`` (tokens it may
    still generate after ``token``), ``delta`` (added to the cache length for the RoPE position; float32, as
    time-aware positions may be fractional), ``eos_on`` (end
    ids end the request), ``settings`` ({temperature, top_k, top_p: [slots], key: [slots, 2]})."""

    token: jax.Array
    index: jax.Array
    active: jax.Array
    remaining: jax.Array
    delta: jax.Array
    eos_on: jax.Array
    settings: dict


def empty_state(slots: int) -> SlotState:
    """Every slot idle, as host arrays (one array per field: each becomes a buffer of its own on the device, and no
    program is compiled for them); an idle slot's values never reach an answer (its key: zeros, threefry's key(0))."""
    key = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0)))
    zeros = lambda dtype: np.zeros((slots,), dtype)  # noqa: E731
    return SlotState(zeros(np.int32), zeros(np.int32), zeros(bool), zeros(np.int32), zeros(np.float32),
                     np.ones((slots,), bool),
                     {"temperature": zeros(np.float32), "top_k": zeros(np.int32),
                      "top_p": np.ones((slots,), np.float32), "key": np.zeros((slots, *key.shape), key.dtype)})


def round_context(n: int) -> int:
    """A cache length of at least n: above 512 a multiple of 128 (so the chunk attention reads it in blocks)."""
    return n if n <= 512 else -(-n // 128) * 128


def row_buckets(slots: int) -> tuple[int, ...]:
    """Row counts a decode step runs: powers of two below ``slots``, and ``slots``."""
    out, r = [], 1
    while r < slots:
        out.append(r)
        r *= 2
    return tuple(out) + (slots,)


class Slots:
    """The slots of one loaded model (``engine``: app/generation.py's Engine, for its parameters, mesh and model).

    slots: how many requests decode together. context: the longest prompt plus answer a slot holds. kv_cache_mb:
    the memory of the paged cache's pools (decoder/kv_cache.py: the context's, and each ring's that is whole pages;
    each at most what every slot holding a whole context / ring needs, the rings together at most half the budget
    unless that is too little for one whole ring each), shared by the requests in the slots, each holding the pages
    of its prompt and answer (``pages``, app/kv_pages.py). With the rows split over a data axis every layer keeps a
    row per slot instead (``paged`` False). The cache is allocated on first use."""

    def __init__(self, engine, *, slots: int = DEFAULT_SLOTS, context: int | None = None,
                 kv_cache_mb: float = DEFAULT_KV_CACHE_MB):
        if slots < 1:
            raise ValueError(f"the engine needs at least one slot, got {slots}")
        if not kv_cache_mb > 0:
            raise ValueError(f"kv_cache_mb must be > 0, got {kv_cache_mb}")
        self.engine = engine
        self.cfg = engine.cfg
        self.slots = slots
        self.context = round_context(min(context or engine.max_context, engine.max_context))
        self.cache_len = pages_for(self.context) * PAGE  # the paged layers' positions a row's table spans
        # with the rows split over a data axis every layer keeps a row per slot: one pool of pages would be
        # replicated, and each step would gather every row's new keys and values into it
        self.paged = engine.mesh.shape["data"] == 1
        self.spans = paged_spans(self.cfg.decoder, self.cache_len)
        self.pages = KVPages(slots, self.spans, self._pool_pages(kv_cache_mb))
        self._pages_version = None  # the table version the device cache holds
        # the shapes a step may take: its decode row counts, and the row counts of its chunk group (fewer of either:
        # fewer programs to compile, more padding or more steps)
        self.rows = row_buckets(slots) if engine.mesh.shape["data"] == 1 else (slots,)
        self.chunk_counts = chunk_row_counts(slots)
        self.cache = None
        self.state = None
        self._laid_out = False  # the programs know the allocated state's layout
        self.dispatched = 0  # programs given the device state so far (each donates the cache or the slot state)
        self._empty_media: dict[tuple[int, int], tuple] = {}
        self._programs(None, None)

    def _programs(self, cache_sharding, state_sharding) -> None:
        """The jitted programs; with the shardings of the allocated cache and state they return them laid out the
        same way, so a program's output fed back as its input never compiles it again."""
        one = None if state_sharding is None else jax.sharding.NamedSharding(self.engine.mesh,
                                                                               jax.sharding.PartitionSpec())
        out = lambda *shardings: None if cache_sharding is None else shardings  # noqa: E731
        # the decode logits keep the layout the compiler gives them (None; e.g. split over the vocabulary on a
        # model axis) and the sample program takes them so: no gather forced between the two
        self._step = jax.jit(self._step_impl, static_argnames=("rows", "products"), donate_argnames=("cache",),
                             out_shardings=out(None, one, cache_sharding, one, one))
        self._sample = jax.jit(self._sample_impl, static_argnames=("rows", "logprobs"), donate_argnames=("state",),
                               out_shardings=out(one, state_sharding, one))
        self._head = jax.jit(self._head_impl, static_argnames=("products",))
        self._logprobs = jax.jit(self._logprobs_impl, static_argnames=("products", "top"))
        self._insert = jax.jit(self._insert_impl, static_argnames=("logprobs",), donate_argnames=("state",),
                               out_shardings=out(state_sharding, one, one))
        self._release = jax.jit(lambda state, slot: state._replace(active=state.active.at[slot].set(False)),
                                donate_argnames=("state",), out_shardings=None if state_sharding is None
                                else state_sharding)
        paged = paged_entries(self.cfg.decoder, jax.eval_shape(
            lambda: init_cache(self.cfg.decoder, 1, self.cache_len, self.engine.dtype,
                               (2,) * len(self.spans) if self.paged else None)))
        self._snapshot = jax.jit(lambda cache, row, *, length: snapshot_row(cache, row, length, paged),
                                 static_argnames=("length",))
        self._restore = jax.jit(lambda cache, row, saved, length: restore_row(cache, row, saved, length, paged),
                                donate_argnames=("cache",),
                                out_shardings=None if cache_sharding is None else cache_sharding)

    # ---- jitted bodies -------------------------------------------------------------------------------------
    def _step_impl(self, params, cache, state: SlotState, chunks: ChunkGroup | None, *, rows, products):
        """One forward: the decode group of the first ``rows`` slots (none when 0) and the prompt ``chunks`` (None:
        none) -> (the decode rows' logits [rows, V] (float32), which rows were active, the cache, the chunks' logits
        at their last tokens [C, V], their last layer's output [C, T, D]); an absent group's outputs are empty. The
        state is only read: ``_sample_impl`` draws the decode rows' tokens and updates it."""
        dec = self.engine.model(params).decoder
        batches = []
        if rows:
            token, active = state.token[:rows], state.active[:rows]
            pos = cache["length"][:rows] + state.delta[:rows]
            batches.append(one_token_batch(token, jnp.broadcast_to(pos[None], (dec.spec.rope_axes, rows)), cache,
                                           active))
        if chunks is not None:
            batches.append(TokenBatch(chunks.tokens, chunks.count, chunks.start, chunks.rows, chunks.rope_pos,
                                      chunks.bidirectional, chunks.media, chunks.is_media, chunks.deepstack))
        with narrow_products(products):
            h, cache = dec.forward(tuple(batches), cache, attention=self.engine.attention)
            h = (h,) if len(batches) == 1 else h
            d, v = dec.spec.hidden_size, dec.spec.vocab_size
            chunk_h = h[-1] if chunks is not None else jnp.zeros((0, 0, d), jnp.float32)
            chunk_logits = dec.last_logits(chunk_h, chunks.count) if chunks is not None \
                else jnp.zeros((0, v), jnp.float32)
            if not rows:
                return jnp.zeros((0, v), jnp.float32), jnp.zeros((0,), bool), cache, chunk_logits, chunk_h
            logits = dec.last_logits(h[0], batches[0].count)
        return logits, active, cache, chunk_logits, chunk_h

    def _sample_impl(self, state: SlotState, logits, eos_ids, mask=None, *, rows, logprobs=False):
        """The decode rows' tokens drawn from their ``logits`` [rows, V] (a step's; with ``mask`` int32 [rows,
        words], from the tokens it allows) -> (tokens [rows], the state with each active row's token, index and
        remaining advanced and rows that ended inactive, and with ``logprobs`` the tokens' ``StepLogprobs``, else
        None; their raw log probabilities are the model's, before the mask)."""
        active = state.active[:rows]
        index = state.index[:rows] + 1
        settings = {k: v[:rows] for k, v in state.settings.items()}
        drawn = logits if mask is None else apply_bitmask(logits, mask)
        nxt = choose_rows(drawn, settings, index)
        remaining = state.remaining[:rows]
        ended = (jnp.isin(nxt, eos_ids) & state.eos_on[:rows]) | (remaining <= 1)
        head = lambda a, v: a.at[:rows].set(jnp.where(active, v, a[:rows]))  # noqa: E731
        state = state._replace(token=head(state.token, nxt), index=head(state.index, index),
                               remaining=head(state.remaining, remaining - 1),
                               active=state.active.at[:rows].set(active & ~ended))
        return nxt, state, token_logprobs(logits, nxt, settings, drawn) if logprobs else None

    def _head_impl(self, params, hidden, *, products):
        with narrow_products(products):
            return self.engine.model(params).decoder.logits(hidden)

    def _logprobs_impl(self, params, hidden, targets, *, products, top):
        with narrow_products(products):
            return self.engine.model(params).decoder.next_token_logprobs(hidden, targets, top=top)

    def _insert_impl(self, state: SlotState, slot, logits_1V, settings, max_new, delta, eos_on, eos_ids,
                     mask=None, *, logprobs=False):
        row = {k: v[None] for k, v in settings.items()}
        drawn = logits_1V if mask is None else apply_bitmask(logits_1V, mask)
        token = choose_rows(drawn, row, jnp.zeros((1,), jnp.int32))[0]
        ended = (jnp.isin(token, eos_ids) & eos_on) | (max_new <= 1)
        put = lambda a, v: a.at[slot].set(v)  # noqa: E731
        state = SlotState(put(state.token, token), put(state.index, 0), put(state.active, ~ended),
                          put(state.remaining, max_new - 1), put(state.delta, delta), put(state.eos_on, eos_on),
                          {k: put(state.settings[k], v) for k, v in settings.items()})
        return state, token, token_logprobs(logits_1V, token[None], row, drawn) if logprobs else None

    # ---- host side -----------------------------------------------------------------------------------------
    def page_bytes(self) -> tuple[int, ...]:
        """Bytes of one page of each pool (``spans``): keys and values of every layer of that span (0: none)."""
        spec, itemsize = self.cfg.decoder, jnp.dtype(self.engine.dtype).itemsize
        per = dict.fromkeys(self.spans, 0)
        for layer, n in zip(spec.layers, cache_slots(spec, self.cache_len)):
            if n in per:
                per[n] += 2 * layer.attention.kv_heads * layer.attention.head_dim * PAGE * itemsize
        return tuple(per.values())

    def _pool_pages(self, kv_cache_mb: float) -> tuple[int, ...]:
        """Pages of each pool: every slot's whole context / ring where ``kv_cache_mb`` holds them; else the rings
        share up to half the budget (in proportion to what their whole rings would take; at least one whole ring
        each) and the context's pool the rest (at least one whole context), so any request within the context runs,
        alone if need be."""
        whole = [self.slots * (span // PAGE) for span in self.spans]
        per_page = self.page_bytes()
        budget = int(kv_cache_mb * 2**20)
        if not self.paged or sum(w * b for w, b in zip(whole, per_page)) <= budget:
            return tuple(whole)
        rings_whole = sum(w * b for w, b in zip(whole[1:], per_page[1:]))
        pools = [0] * len(self.spans)
        for i in range(1, len(self.spans)):
            share = budget / 2 * whole[i] * per_page[i] / rings_whole if rings_whole else 0
            pools[i] = whole[i] if not per_page[i] else min(whole[i], max(int(share // per_page[i]),
                                                                          self.spans[i] // PAGE))
        rest = budget - sum(n * b for n, b in zip(pools[1:], per_page[1:]))
        pools[0] = whole[0] if not per_page[0] else min(whole[0], max(rest // per_page[0], self.spans[0] // PAGE))
        return tuple(pools)

    def ensure_allocated(self) -> None:
        if self.cache is not None:
            return
        spec, dtype, mesh = self.cfg.decoder, self.engine.dtype, self.engine.mesh
        pools = tuple(t.pages + 1 for t in self.pages.tables) if self.paged else None  # and each scratch page
        shapes = jax.eval_shape(lambda: init_cache(spec, self.slots, self.cache_len, dtype, pools))

        def zeros(a, axes):  # one buffer per array (a jitted init may hand several outputs one buffer)
            return jnp.zeros(a.shape, a.dtype, device=named_sharding(axes, a.shape, mesh))

        self.cache = jax.tree.map(zeros, shapes, cache_axes(spec, shapes))
        self._pages_version = None
        self.sync_pages()
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        self.state = jax.tree.map(lambda a: jax.device_put(a, replicated), empty_state(self.slots))
        if not self._laid_out:  # an allocation after ``reset`` has the same layout: its programs stay
            self._programs(jax.tree.map(lambda a: a.sharding, self.cache),
                           jax.tree.map(lambda a: a.sharding, self.state))
            self._laid_out = True

    def reset(self) -> None:
        """Drop the device state (every slot's cache row and decoding state: after a failed program it may be gone
        or hold the failure); it is allocated again, zeroed, on first use; every page is free."""
        self.cache = self.state = None
        self.pages.reset()

    def sync_pages(self) -> None:
        """The device cache's page table made the host's (``pages``), when they differ: called before any program
        that reads or writes the cache after pages were taken or given back."""
        if self.cache is None or "pages" not in self.cache or self._pages_version == self.pages.version:
            return
        tables = zip(self.pages.tables, self.cache["pages"])
        self.cache = {**self.cache, "pages": tuple(jax.device_put(t.table.copy(), a.sharding) for t, a in tables)}
        self._pages_version = self.pages.version

    def cache_bytes(self) -> int:
        self.ensure_allocated()
        return sum(int(a.nbytes) for a in jax.tree.leaves(self.cache))

    def rows_for(self, highest_slot: int) -> int:
        """The decode step's row count for active slots up to ``highest_slot``."""
        return next(r for r in self.rows if r > highest_slot)

    def chunk_rows(self, n: int) -> int:
        """The row count of a chunk group holding ``n`` chunks (at most the largest of ``chunk_counts``)."""
        return next(c for c in self.chunk_counts if c >= min(n, self.chunk_counts[-1]))

    def chunk_group(self, chunks: list[Chunk], length: int) -> ChunkGroup:
        """A step's ``chunks`` (at most the largest of ``chunk_counts``, each at most ``length`` tokens) as the
        program's inputs: ``chunk_rows`` rows of ``length`` tokens, padded with rows that take no token; media inputs
        without media are zeros made once per shape."""
        c, spec = self.chunk_rows(len(chunks)), self.cfg.decoder
        axes = spec.rope_axes
        tokens = np.full((c, length), self.cfg.pad_id, np.int32)
        count, start = np.zeros(c, np.int32), np.zeros(c, np.int32)
        rows = np.full(c, self.slots, np.int32)  # past the last row: padding
        rope = np.zeros((axes, c, length), np.float32)
        bid = np.zeros((c, length), bool)
        for i, ch in enumerate(chunks):
            n = len(ch.tokens)
            tokens[i, :n], count[i], start[i], rows[i] = ch.tokens, n, ch.start, ch.row
            rope[:, i, :n] = ch.rope_pos
            bid[i, :n] = ch.bidirectional
        if all(ch.media is None for ch in chunks):
            if (c, length) not in self._empty_media:
                self._empty_media[(c, length)] = tuple(self.engine.put(a, (None,) * a.ndim) for a in (
                    np.zeros((c, length, spec.hidden_size), np.float32), np.zeros((c, length), bool),
                    np.zeros((spec.deepstack_layers, c, length, spec.hidden_size), np.float32)))
            media = self._empty_media[(c, length)]
        else:
            rows_m = np.zeros((c, length, spec.hidden_size), np.float32)
            is_media = np.zeros((c, length), bool)
            deep = np.zeros((spec.deepstack_layers, c, length, spec.hidden_size), np.float32)
            for i, ch in enumerate(chunks):
                if ch.media is not None:
                    n = len(ch.tokens)
                    rows_m[i, :n], is_media[i, :n], deep[:, i, :n] = ch.media.rows, ch.media.is_media, \
                        ch.media.deepstack
            media = tuple(self.engine.put(a, (None,) * a.ndim) for a in (rows_m, is_media, deep))
        return ChunkGroup(tokens, count, start, rows, rope, bid, *media)

    def step(self, rows: int, chunks: ChunkGroup | None = None, logprobs: bool = False, mask=None) -> tuple:
        """One step of the first ``rows`` slots (0: none) and the prompt ``chunks`` -> (tokens [rows], which rows
        were active, the chunks' logits at their last tokens [C, V], their last layer's output [C, T, D]: see
        ``head``; with ``logprobs`` the decode rows' ``StepLogprobs``, else None) as device arrays (tokens: an
        empty host array when no row decodes). With decode rows, two programs: the forward, then ``sample`` on its
        logits. ``mask``: None, or a function called once the forward is dispatched (the host works while the
        device runs it) that returns the decode rows' token masks (int32 [rows, words], app/grammar.py) or None;
        with masks the tokens are drawn by the sample program's masked variant."""
        token, step = np.zeros((0,), np.int32), None
        self.sync_pages()
        self.dispatched += 1
        with use_mesh(self.engine.mesh):
            decode_logits, active, self.cache, logits, hidden = self._step(
                self.engine.params, self.cache, self.state, chunks, rows=rows, products=products_setting())
        if rows:
            mask_RW = None if mask is None else mask()
            self.dispatched += 1
            with use_mesh(self.engine.mesh):
                token, self.state, step = self._sample(self.state, decode_logits, self.engine.eos_ids,
                                                       self._put_mask(mask_RW), rows=rows, logprobs=bool(logprobs))
        return token, active, logits, hidden, step

    def _put_mask(self, mask_RW: np.ndarray | None):
        return None if mask_RW is None else self.engine.put(np.asarray(mask_RW, np.int32), (None, None))

    def lower_step(self, rows: int, chunk_shape: tuple[int, int] | None = None):
        """The step program for ``rows`` decode rows and a chunk group of ``chunk_shape`` (C, T) lowered (for
        checks of the compiled program; nothing runs)."""
        self.ensure_allocated()
        chunks = None
        if chunk_shape is not None:
            c, t = chunk_shape
            chunks = self.chunk_group([Chunk(np.array([self.cfg.pad_id]), 0, 0,
                                             np.zeros((self.cfg.decoder.rope_axes, 1), np.float32), np.zeros(1, bool),
                                             None)] * c, t)
        with use_mesh(self.engine.mesh):
            return self._step.lower(self.engine.params, self.cache, self.state, chunks, rows=rows,
                                    products=products_setting())

    def lower_sample(self, rows: int, logprobs: bool = False, sharding=None):
        """The sample program for ``rows`` decode rows lowered, its logits laid out by ``sharding`` (default: as on
        the first device); nothing runs."""
        self.ensure_allocated()
        logits = jax.ShapeDtypeStruct((rows, self.cfg.decoder.vocab_size), jnp.float32, sharding=sharding)
        with use_mesh(self.engine.mesh):
            return self._sample.lower(self.state, logits, self.engine.eos_ids, rows=rows, logprobs=logprobs)

    def head(self, hidden: jax.Array) -> jax.Array:
        """The logits [1, T, V] (float32, device) of one chunk's last-layer output [1, T, D] (a row of ``step``'s):
        the final norm and the output matrix, as the step applies them at its last token."""
        with use_mesh(self.engine.mesh):
            return self._head(self.engine.params, hidden, products=products_setting())

    def logprobs(self, hidden: jax.Array, targets: np.ndarray, top: bool = False) -> tuple:
        """(float32 [1, T],) (device): at each position of one chunk's last-layer output [1, T, D], the natural-log
        probability of ``targets`` [T] (the prompt's next token there; its value past the prompt means nothing).
        With ``top``, also the ``TOP`` most likely tokens' ids (int32 [1, T, TOP]) and log probabilities
        ([1, T, TOP]): one program whatever number of alternatives a request keeps."""
        with use_mesh(self.engine.mesh):
            return self._logprobs(self.engine.params, hidden, np.asarray(targets, np.int32)[None],
                                  products=products_setting(), top=min(TOP, self.cfg.decoder.vocab_size) if top else 0)

    def insert(self, slot: int, logits_1V: jax.Array, sampling: SamplingParams, max_new: int, delta: int,
               eos_on: bool, logprobs: bool = False, mask: np.ndarray | None = None):
        """Make ``slot`` active with its first token drawn from ``logits`` (within ``mask``, int32 [1, words], when
        given) -> (that token, with ``logprobs`` its ``StepLogprobs`` of one row, else None), device arrays."""
        self.dispatched += 1
        self.state, token, step = self._insert(self.state, np.int32(slot), logits_1V, row_settings(sampling),
                                               np.int32(max_new), np.float32(delta), np.bool_(eos_on),
                                               self.engine.eos_ids, self._put_mask(mask), logprobs=bool(logprobs))
        return token, step

    def release(self, slot: int) -> None:
        self.dispatched += 1
        self.state = self._release(self.state, np.int32(slot))

    def snapshot(self, slot: int, length: int) -> dict:
        """Slot ``slot``'s keys and values for ``length`` tokens (device arrays; ``length`` a bucket)."""
        self.sync_pages()
        return self._snapshot(self.cache, np.int32(slot), length=length)

    def restore(self, slot: int, saved: dict, length: int) -> None:
        """Slot ``slot`` holds ``saved`` (a snapshot) as its first ``length`` tokens."""
        self.sync_pages()
        self.dispatched += 1
        self.cache = self._restore(self.cache, np.int32(slot), saved, np.int32(length))

    def warm_up(self, shapes) -> None:
        """Compile the step for each chunk group shape (C, T) of ``shapes`` (text) and for every decode row count
        (with the sample program of each row count, without log probabilities or a token mask: those variants
        compile at first use), and insert and release (nothing stays active)."""
        self.ensure_allocated()
        logits = None
        for (c, t), rows in itertools.product(shapes, self.chunk_tiers or (0,)):
            chunk = Chunk(np.array([self.cfg.pad_id]), 0, 0, np.zeros((self.cfg.decoder.rope_axes, 1), np.float32),
                          np.zeros(1, bool), None)
            _, _, logits, _, _ = self.step(rows, self.chunk_group([chunk] * c, t))
        if logits is not None:
            self.insert(0, logits[:1], SamplingParams(), 2, 0, True)
            self.release(0)
        for rows in self.rows:
            jax.block_until_ready(self.step(rows))

    @property
    def decode_rows_with_chunks(self) -> int:
        """The most decode rows of a step with prompt chunks: every slot, in the same program (0 when the batch axis
        is split over devices: a chunk then runs in a program of its own, beside the decode step)."""
        return self.slots if self.engine.mesh.shape["data"] == 1 else 0

    @property
    def chunk_tiers(self) -> tuple[int, ...]:
        """The decode row counts a step with prompt chunks takes: the first ``CHUNK_TIER`` slots while no later one
        is taken, else every slot (two programs per chunk shape at most: a chunk step beside a few requests does
        not compute every slot's row, e.g. their logits); none when the batch axis is split over devices."""
        most = self.decode_rows_with_chunks
        return tuple(sorted({min(most, CHUNK_TIER), most})) if most else ()

    def rows_beside_chunks(self, highest_slot: int) -> int:
        """The decode row count of a step with prompt chunks when ``highest_slot`` is the highest slot taken."""
        return next(r for r in self.chunk_tiers if r > highest_slot)

    def compilations(self) -> int:
        return sum(f._cache_size() for f in (self._step, self._sample, self._head, self._logprobs, self._insert,
                                             self._release, self._snapshot, self._restore))
