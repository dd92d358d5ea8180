"""The serving engine's device side: a fixed number of slots, each a row of one KV cache, and the jitted programs
that fill and decode them.

Every slot holds one request: its row of every layer's cache (full layers: the context length; sliding / chunked
layers: a ring of the window) and its decoding state (``SlotState``: the next token to feed, how many it has
generated, whether it is active, its sampling settings). The model runs through one forward
(``DecoderModel.forward``: new tokens after their rows of the cache); the programs, all on fixed shapes:

- ``extend``: a chunk of one request's prompt (a bucketed length; the forward on one row of many tokens) attends
  to its row and is written into it (its logits at the last token, and its last layer's output at every token,
  which ``head`` turns into the logits at every token for ``Pipeline.prompt_logits``, and ``logprobs`` into each
  next prompt token's log-probability for scoring); its media come as one feature row per token
  (``ChunkMedia``), so a chunk length is one program whatever media the chunk holds;
- ``insert``: the first token of a prefilled request, drawn from the prompt's last logits, makes its slot active;
- ``decode``: one token for every active slot of the first ``rows`` slots (the forward on many rows of one token;
  rows: a power of two, so a lone request decodes at batch 1) with each slot's own settings; a slot turns inactive
  on an end id or its last token;
- ``insert`` and ``decode`` with ``logprobs``: their variant that also returns each token's log probability and
  the top 20 (app/token_logprobs.py), compiled the first time a step holds a request that asks for them;
- ``release``: a slot stops (a cancelled or stopped request) at the next step;
- ``snapshot`` / ``restore``: a row's keys and values copied out (the prefix cache) and into another row.

Requests coming and going change only array contents: nothing compiles again once each bucket has run
(``warm_up`` compiles them up front). The host side (app/scheduler.py) decides what runs when.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from omnijax.app.sampling import SamplingParams, choose_rows, row_settings
from omnijax.app.token_logprobs import token_logprobs
from omnijax.common.matmul_policy import narrow_products, products_setting
from omnijax.common.sharding import named_sharding, use_mesh
from omnijax.decoder.kv_cache import KEY_AXES, VALUE_AXES, init_cache, restore_row, snapshot_row
from omnijax.decoder.model import TokenBatch, one_token_batch

DEFAULT_CHUNK = 512  # the longest chunk of a prompt, unless a media block needs more (it is never split)
DEFAULT_SLOTS = 8


class ChunkMedia(NamedTuple):
    """The media of a chunk of ``count`` tokens, on the host: rows [count, D] (each media placeholder's feature
    row, zeros elsewhere), is_media [count] (the placeholders), deepstack [E, count, D] (what is added after the
    first E decoder layers at each placeholder; zeros elsewhere). None for a chunk without media."""

    rows: np.ndarray
    is_media: np.ndarray
    deepstack: np.ndarray


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

    slots: how many requests decode together. context: the longest prompt plus answer a slot holds (its cache
    length). The cache is allocated on first use."""

    def __init__(self, engine, *, slots: int = DEFAULT_SLOTS, context: int | None = None):
        if slots < 1:
            raise ValueError(f"the engine needs at least one slot, got {slots}")
        self.engine = engine
        self.cfg = engine.cfg
        self.slots = slots
        self.context = round_context(min(context or engine.max_context, engine.max_context))
        self.rows = row_buckets(slots) if engine.mesh.shape["data"] == 1 else (slots,)
        self.cache = None
        self.state = None
        self._laid_out = False  # the programs know the allocated state's layout
        self.dispatched = 0  # programs given the device state so far (each donates it)
        self._empty_media: dict[int, tuple] = {}
        self._programs(None, None)

    def _programs(self, cache_sharding, state_sharding) -> None:
        """The jitted programs; with the shardings of the allocated cache and state they return them laid out the
        same way, so a program's output fed back as its input never compiles it again."""
        one = None if state_sharding is None else jax.sharding.NamedSharding(self.engine.mesh,
                                                                               jax.sharding.PartitionSpec())
        out = lambda *shardings: None if cache_sharding is None else shardings  # noqa: E731
        self._extend = jax.jit(self._extend_impl, static_argnames=("products",), donate_argnames=("cache",),
                               out_shardings=out(one, one, cache_sharding))
        self._head = jax.jit(self._head_impl, static_argnames=("products",))
        self._logprobs = jax.jit(self._logprobs_impl, static_argnames=("products",))
        self._insert = jax.jit(self._insert_impl, static_argnames=("logprobs",), donate_argnames=("state",),
                               out_shardings=out(state_sharding, one, one))
        self._decode = jax.jit(self._decode_impl, static_argnames=("rows", "products", "logprobs"),
                               donate_argnames=("cache", "state"),
                               out_shardings=out(one, one, state_sharding, cache_sharding, one))
        self._release = jax.jit(lambda state, slot: state._replace(active=state.active.at[slot].set(False)),
                                donate_argnames=("state",), out_shardings=None if state_sharding is None
                                else state_sharding)
        self._snapshot = jax.jit(snapshot_row, static_argnames=("length",))
        self._restore = jax.jit(restore_row, donate_argnames=("cache",),
                                out_shardings=None if cache_sharding is None else cache_sharding)

    # ---- jitted bodies -------------------------------------------------------------------------------------
    def _extend_impl(self, params, cache, tokens, count, start, row, rope_pos, bidirectional, media, is_media,
                     deepstack, *, products):
        dec = self.engine.model(params).decoder
        count, start = count[None], start[None]
        with narrow_products(products):
            h, cache = dec.forward(TokenBatch(tokens, count, start, row, rope_pos, bidirectional, media, is_media,
                                              deepstack), cache, attention=self.engine.attention)
            return dec.last_logits(h, count), h, cache

    def _head_impl(self, params, hidden, *, products):
        with narrow_products(products):
            return self.engine.model(params).decoder.logits(hidden)

    def _logprobs_impl(self, params, hidden, targets, *, products):
        with narrow_products(products):
            return self.engine.model(params).decoder.next_token_logprobs(hidden, targets)

    def _insert_impl(self, state: SlotState, slot, logits_1V, settings, max_new, delta, eos_on, eos_ids, *,
                     logprobs=False):
        token = choose_rows(logits_1V, {k: v[None] for k, v in settings.items()}, jnp.zeros((1,), jnp.int32))[0]
        ended = (jnp.isin(token, eos_ids) & eos_on) | (max_new <= 1)
        put = lambda a, v: a.at[slot].set(v)  # noqa: E731
        state = SlotState(put(state.token, token), put(state.index, 0), put(state.active, ~ended),
                          put(state.remaining, max_new - 1), put(state.delta, delta), put(state.eos_on, eos_on),
                          {k: put(state.settings[k], v) for k, v in settings.items()})
        return state, token, token_logprobs(logits_1V, token[None]) if logprobs else None

    def _decode_impl(self, params, cache, state: SlotState, eos_ids, *, rows, products, logprobs=False):
        dec = self.engine.model(params).decoder
        token, active = state.token[:rows], state.active[:rows]
        pos = cache["length"][:rows] + state.delta[:rows]
        with narrow_products(products):
            batch = one_token_batch(token, jnp.broadcast_to(pos[None], (dec.spec.rope_axes, rows)), cache, active)
            h, cache = dec.forward(batch, cache, attention=self.engine.attention)
            logits = dec.last_logits(h, batch.count)
        index = state.index[:rows] + 1
        nxt = choose_rows(logits, {k: v[:rows] for k, v in state.settings.items()}, index)
        remaining = state.remaining[:rows]
        ended = (jnp.isin(nxt, eos_ids) & state.eos_on[:rows]) | (remaining <= 1)
        head = lambda a, v: a.at[:rows].set(jnp.where(active, v, a[:rows]))  # noqa: E731
        state = state._replace(token=head(state.token, nxt), index=head(state.index, index),
                               remaining=head(state.remaining, remaining - 1),
                               active=state.active.at[:rows].set(active & ~ended))
        return nxt, active, state, cache, token_logprobs(logits, nxt) if logprobs else None

    # ---- host side -----------------------------------------------------------------------------------------
    def ensure_allocated(self) -> None:
        if self.cache is not None:
            return
        spec, dtype, mesh = self.cfg.decoder, self.engine.dtype, self.engine.mesh
        shapes = jax.eval_shape(lambda: init_cache(spec, self.slots, self.context, dtype))

        def zeros(a, axes):  # one buffer per array (a jitted init may hand several outputs one buffer)
            return jnp.zeros(a.shape, a.dtype, device=named_sharding(axes, a.shape, mesh))

        self.cache = {"length": zeros(shapes["length"], ("batch",)),
                      "k": tuple(zeros(a, KEY_AXES) for a in shapes["k"]),
                      "v": tuple(zeros(a, VALUE_AXES) for a in shapes["v"])}
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        self.state = jax.tree.map(lambda a: jax.device_put(a, replicated), empty_state(self.slots))
        if not self._laid_out:  # an allocation after ``reset`` has the same layout: its programs stay
            self._programs(jax.tree.map(lambda a: a.sharding, self.cache),
                           jax.tree.map(lambda a: a.sharding, self.state))
            self._laid_out = True

    def reset(self) -> None:
        """Drop the device state (every slot's cache row and decoding state: after a failed program it may be gone
        or hold the failure); it is allocated again, zeroed, on first use."""
        self.cache = self.state = None

    def cache_bytes(self) -> int:
        self.ensure_allocated()
        return sum(int(a.nbytes) for a in jax.tree.leaves(self.cache))

    def rows_for(self, highest_slot: int) -> int:
        """The decode step's row count for active slots up to ``highest_slot``."""
        return next(r for r in self.rows if r > highest_slot)

    def _media_inputs(self, media: ChunkMedia | None, count: int, length: int) -> tuple[jax.Array, ...]:
        """The chunk program's media inputs (rows [1, length, D], is_media [1, length], deepstack [E, 1, length, D])
        as device arrays laid out alike whatever the chunk holds; a chunk without media takes zeros made once per
        length."""
        if media is None:
            if length not in self._empty_media:
                spec = self.cfg.decoder
                self._empty_media[length] = self._media_inputs(ChunkMedia(
                    np.zeros((count, spec.hidden_size), np.float32), np.zeros(count, bool),
                    np.zeros((spec.deepstack_layers, count, spec.hidden_size), np.float32)), count, length)
            return self._empty_media[length]
        pad = length - count
        arrays = (np.pad(media.rows, ((0, pad), (0, 0)))[None], np.pad(media.is_media, (0, pad))[None],
                  np.pad(media.deepstack, ((0, 0), (0, pad), (0, 0)))[:, None])
        return tuple(self.engine.put(a, (None,) * a.ndim) for a in arrays)

    def extend(self, tokens: np.ndarray, start: int, row: int, rope_pos: np.ndarray, bidirectional: np.ndarray,
               media: ChunkMedia | None, length: int) -> tuple[jax.Array, jax.Array]:
        """Run one chunk (``tokens`` [count] of a prompt at positions start.., with its ``media``) into slot ``row``,
        right-padded to ``length`` -> (the logits [1, V] at its last token, the last layer's output [1, length, D]
        at every position: see ``head``), device arrays."""
        count = len(tokens)
        tok = np.full((1, length), self.cfg.pad_id, np.int32)
        tok[0, :count] = tokens
        pos = np.zeros((rope_pos.shape[0], 1, length), np.float32)
        pos[:, 0, :count] = rope_pos
        bid = np.zeros((1, length), bool)
        bid[0, :count] = bidirectional
        rows, is_media, deep = self._media_inputs(media, count, length)
        self.dispatched += 1
        with use_mesh(self.engine.mesh):
            logits, hidden, self.cache = self._extend(self.engine.params, self.cache, tok, np.int32(count),
                                                      np.int32(start), np.int32(row), pos, bid, rows, is_media, deep,
                                                      products=products_setting())
        return logits, hidden

    def head(self, hidden: jax.Array) -> jax.Array:
        """The logits [1, T, V] (float32, device) of ``extend``'s last-layer output: the final norm and the output
        matrix, as the chunk program applies them at its last token."""
        with use_mesh(self.engine.mesh):
            return self._head(self.engine.params, hidden, products=products_setting())

    def logprobs(self, hidden: jax.Array, targets: np.ndarray) -> jax.Array:
        """float32 [1, T] (device): at each position of ``extend``'s last-layer output [1, T, D], the natural-log
        probability of ``targets`` [T] (the prompt's next token there; its value past the prompt means nothing)."""
        with use_mesh(self.engine.mesh):
            return self._logprobs(self.engine.params, hidden, np.asarray(targets, np.int32)[None],
                                  products=products_setting())

    def insert(self, slot: int, logits_1V: jax.Array, sampling: SamplingParams, max_new: int, delta: int,
               eos_on: bool, logprobs: bool = False):
        """Make ``slot`` active with its first token drawn from ``logits`` -> (that token, with ``logprobs`` its
        ``StepLogprobs`` of one row, else None), device arrays."""
        self.dispatched += 1
        self.state, token, step = self._insert(self.state, np.int32(slot), logits_1V, row_settings(sampling),
                                               np.int32(max_new), np.float32(delta), np.bool_(eos_on),
                                               self.engine.eos_ids, logprobs=bool(logprobs))
        return token, step

    def decode(self, rows: int, logprobs: bool = False):
        """One step of the first ``rows`` slots -> (tokens [rows], which rows were active, with ``logprobs`` the
        step's ``StepLogprobs`` of those rows, else None) as device arrays."""
        self.dispatched += 1
        with use_mesh(self.engine.mesh):
            token, active, self.state, self.cache, step = self._decode(
                self.engine.params, self.cache, self.state, self.engine.eos_ids, rows=rows,
                products=products_setting(), logprobs=bool(logprobs))
        return token, active, step

    def release(self, slot: int) -> None:
        self.dispatched += 1
        self.state = self._release(self.state, np.int32(slot))

    def snapshot(self, slot: int, length: int) -> dict:
        """Slot ``slot``'s keys and values for ``length`` tokens (device arrays; ``length`` a bucket)."""
        return self._snapshot(self.cache, np.int32(slot), length=length)

    def restore(self, slot: int, saved: dict, length: int) -> None:
        """Slot ``slot`` holds ``saved`` (a snapshot) as its first ``length`` tokens."""
        self.dispatched += 1
        self.cache = self._restore(self.cache, np.int32(slot), saved, np.int32(length))

    def warm_up(self, chunk_lengths) -> None:
        """Compile the chunk program for each of ``chunk_lengths`` (text), insert, release and every decode row
        count (nothing stays active)."""
        self.ensure_allocated()
        rope = np.zeros((self.cfg.decoder.rope_axes, 1), np.float32)
        logits = None
        for length in chunk_lengths:
            logits, _ = self.extend(np.array([self.cfg.pad_id]), 0, 0, rope, np.zeros(1, bool), None, length)
        self.insert(0, logits, SamplingParams(), 2, 0, True)
        self.release(0)
        for rows in self.rows:
            jax.block_until_ready(self.decode(rows))

    def compilations(self) -> int:
        return sum(f._cache_size() for f in (self._extend, self._head, self._logprobs, self._insert, self._decode,
                                             self._release, self._snapshot, self._restore))
