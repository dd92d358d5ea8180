"""Per-layer KV caches: a plain pytree of fixed shapes, with a length per row.

    length: [batch] int32, tokens written so far per row (the next token's sequence position)
    k:      tuple, one per layer that owns keys/values, of [batch, kv_heads, head_dim, slots]: keys stored
            transposed, so a decode step's scores are a plain [q, head_dim] x [head_dim, slots] product per kv head
    v:      tuple, likewise, of [batch, kv_heads, slots, head_dim]

A layer that attends locally (sliding window W, chunk C) keeps a ring of min(W or C, cache length) slots; a full
layer keeps the cache length; a layer that shares another layer's keys/values keeps none. Every cache is a ring:
position p lives in slot p % slots, so the position a slot holds follows from the row's length alone
(``slot_positions``) and nothing else is stored.

A forward over new tokens (decode: one per row; a prompt chunk: a row's next tokens) reads each row's cache as it
was, the new tokens attend to each other directly, and once every layer has run each cache takes the new keys and
values (``write_tokens``; ``write_paged`` for a pool of pages). The write is ordered after the last layer's
output, so every read of the cache comes first and the compiler updates the cache in place (with the write placed
first and the reads after it, XLA on CPU fuses a copy of the write into each reader and copies every cache on every
step).

The serving engine's cache is paged (``init_cache(pages=...)``): a layer whose cache spans a multiple of ``PAGE``
slots (the context on a full layer, or on a local one whose window is at least the context; the window on a
local layer whose window is a multiple of ``PAGE``) keeps instead a pool of pages of ``PAGE`` slots shared by all
rows, keys [N, K, H, PAGE] and values [N, K, PAGE, H]. The layers of one span share a page table ``pages[i]``
[batch, span / PAGE] (``paged_spans``: the context's table first) saying which page holds each row's slots
j * PAGE .. (j + 1) * PAGE - 1 (a ring's slot p % span, as above). The host owns the tables (app/kv_pages.py): a
request holds the pages its prompt and answer can fill, so the memory follows what requests use, not rows x
context. A pool's last page is scratch: every unused entry of a table names it, so what lands past the pages a
row holds (a restored snapshot's last pages) lands there and nothing reads it. A span that is not a multiple of
``PAGE`` (small test windows) keeps a row per slot.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from omnijax.common.sharding import constrain
from omnijax.decoder.spec import DecoderSpec

KEY_AXES = ("batch", "kv_heads", "head_dim", "cache_len")
VALUE_AXES = ("batch", "kv_heads", "cache_len", "head_dim")
PAGE_KEY_AXES = ("kv_pages", "kv_heads", "head_dim", "cache_len")
PAGE_VALUE_AXES = ("kv_pages", "kv_heads", "cache_len", "head_dim")
PAGE = 128  # positions per page of a paged cache (the attention reads a long cache in blocks of this size)


class LayerCache(NamedTuple):
    """One layer's cache: keys [B, K, H, slots] (transposed) and values [B, K, slots, H]; ``table``: not None for a
    pool of pages instead, keys [N, K, H, PAGE] and values [N, K, PAGE, H], whose page table is ``pages[table]``
    (see the module docstring)."""

    k: jax.Array
    v: jax.Array
    table: int | None = None


def cache_slots(spec: DecoderSpec, cache_len: int) -> tuple[int | None, ...]:
    """Slots per layer (None for a layer that shares another's keys/values)."""
    out = []
    for layer in spec.layers:
        att = layer.attention
        if att.kv_source is not None:
            out.append(None)
        elif att.mask.local:
            out.append(min(att.mask.size, cache_len))
        else:
            out.append(cache_len)
    return tuple(out)


def cache_index(spec: DecoderSpec) -> tuple[int | None, ...]:
    """For each layer, its entry in the cache's ``k`` / ``v`` tuples (None for a sharing layer)."""
    index, n = [], 0
    for i in range(spec.num_layers):
        if spec.owns_kv(i):
            index.append(n)
            n += 1
        else:
            index.append(None)
    return tuple(index)


def paged_spans(spec: DecoderSpec, cache_len: int) -> tuple[int, ...]:
    """The spans of a paged cache's page tables: ``cache_len`` first (the table that also names the context), then
    the local layers' rings that are a multiple of ``PAGE``, in increasing order."""
    rings = {n for n in cache_slots(spec, cache_len) if n is not None and n != cache_len and n % PAGE == 0}
    return (cache_len,) + tuple(sorted(rings))


def paged_entries(spec: DecoderSpec, cache: dict) -> tuple[int | None, ...]:
    """For each entry of the cache's ``k`` / ``v`` tuples: the index of its page table in ``cache["pages"]`` (a
    pool of pages), or None (a row per slot; every entry of a cache made without ``pages``)."""
    if "pages" not in cache:
        return (None,) * len(cache["k"])
    cache_len = cache["pages"][0].shape[1] * PAGE
    spans = paged_spans(spec, cache_len)
    return tuple(spans.index(n) if n in spans else None for n in cache_slots(spec, cache_len) if n is not None)


def init_cache(spec: DecoderSpec, batch: int, cache_len: int, dtype=jnp.float32,
               pages: tuple[int, ...] | None = None) -> dict:
    """A zeroed cache of ``batch`` rows of ``cache_len`` positions; with ``pages`` (a pool size for each of
    ``paged_spans``, its scratch page included), paged (the module docstring): ``cache_len`` a multiple of ``PAGE``,
    tables naming the scratch pages everywhere."""
    spans = paged_spans(spec, cache_len)
    if pages is not None and (cache_len % PAGE or len(pages) != len(spans) or min(pages) < 1):
        raise ValueError(f"a paged cache needs a context that is a multiple of {PAGE} and a pool for each span of "
                         f"{spans}, got {cache_len} and {pages}")
    keys, values = [], []
    for layer, slots in zip(spec.layers, cache_slots(spec, cache_len)):
        if slots is None:
            continue
        att = layer.attention
        if pages is not None and slots in spans:
            n = pages[spans.index(slots)]
            keys.append(constrain(jnp.zeros((n, att.kv_heads, att.head_dim, PAGE), dtype), PAGE_KEY_AXES))
            values.append(constrain(jnp.zeros((n, att.kv_heads, PAGE, att.head_dim), dtype), PAGE_VALUE_AXES))
            continue
        keys.append(constrain(jnp.zeros((batch, att.kv_heads, att.head_dim, slots), dtype), KEY_AXES))
        values.append(constrain(jnp.zeros((batch, att.kv_heads, slots, att.head_dim), dtype), VALUE_AXES))
    cache = {"length": jnp.zeros((batch,), jnp.int32), "k": tuple(keys), "v": tuple(values)}
    if pages is not None:
        cache["pages"] = tuple(jnp.full((batch, span // PAGE), n - 1, jnp.int32) for span, n in zip(spans, pages))
    return cache


def cache_axes(spec: DecoderSpec, cache: dict) -> dict:
    """The logical axes of each array of ``cache`` (a pytree like it)."""
    paged = paged_entries(spec, cache)
    out = {"length": ("batch",), "k": tuple(KEY_AXES if p is None else PAGE_KEY_AXES for p in paged),
           "v": tuple(VALUE_AXES if p is None else PAGE_VALUE_AXES for p in paged)}
    if "pages" in cache:
        out["pages"] = tuple(("batch", None) for _ in cache["pages"])
    return out


def slot_positions(length_B: jax.Array, slots: int) -> jax.Array:
    """[batch, slots]: the sequence position held in each slot after ``length`` tokens (-1 for an empty slot).

    Slot s holds the latest position p < length with p % slots == s: p = s + slots * floor((length-1-s)/slots)."""
    s = jnp.arange(slots, dtype=jnp.int32)[None]
    p = s + slots * jnp.floor_divide(length_B[:, None] - 1 - s, slots)
    return jnp.where(p >= 0, p, -1)


def fill_from_prompt(k_BLKH: jax.Array, v_BLKH: jax.Array, length_B: jax.Array, slots: int,
                     dtype) -> tuple[jax.Array, jax.Array]:
    """A layer's cache (keys [B, K, H, slots], values [B, K, slots, H]) holding a right-padded prompt's keys and
    values: position p of each row in slot p % slots (a ring keeps each row's last ``slots`` positions)."""
    b, l = k_BLKH.shape[:2]
    k = k_BLKH.astype(dtype).transpose(0, 2, 3, 1)  # [B, K, H, L]
    v = v_BLKH.astype(dtype).transpose(0, 2, 1, 3)  # [B, K, L, H]
    if slots >= l:
        k = jnp.pad(k, ((0, 0), (0, 0), (0, 0), (0, slots - l)))
        v = jnp.pad(v, ((0, 0), (0, 0), (0, slots - l), (0, 0)))
    else:
        src = jnp.clip(slot_positions(length_B, slots), 0, l - 1)  # [B, slots]: the prompt row each slot takes
        k = jnp.take_along_axis(k, src[:, None, None, :], axis=3)
        v = jnp.take_along_axis(v, src[:, None, :, None], axis=2)
    return constrain(k, KEY_AXES), constrain(v, VALUE_AXES)


def write_tokens(cache_k_RKHC: jax.Array, cache_v_RKCH: jax.Array, rows_S: jax.Array | None, k_STKH: jax.Array,
                 v_STKH: jax.Array, start_S: jax.Array, count_S: jax.Array,
                 after_x: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Every row's cache with S sequences' new keys/values written: sequence s into row ``rows_S[s]`` (``rows_S``
    None: row s), its first ``count[s]`` tokens at positions start[s], start[s] + 1, ... (slot p % slots; a ring
    keeps the last ``slots``; a row index past the last row writes nothing: a padding sequence's).

    ``after_x``: an output of the step computed after every read of this cache (the last layer's), so the write is
    ordered after them and the compiler updates the cache in place (see ``after``). One token per sequence (decode)
    is a slice update per row that every row makes, its slot being its next position: a row that takes no token
    (count 0) writes there too, which nothing reads before that position is written again, since a masked write
    would make the compiler rewrite whole caches. Several tokens (a prompt chunk) are a scatter that drops the
    padding and the tokens a ring does not keep."""
    s, t = k_STKH.shape[:2]
    r, _, _, slots = cache_k_RKHC.shape
    k_new = k_STKH.astype(cache_k_RKHC.dtype)
    v_new = v_STKH.astype(cache_v_RKCH.dtype)
    if after_x is not None:  # [S, 1, 1, 1]: each row's own, replicated over the model axis (stays local); [1, ...]
        dep = after_x[:, :1, :1, None]  # for a packed batch of several groups (one flat row of tokens)
        k_new, v_new = after(k_new, dep), after(v_new, dep)
    zero = jnp.zeros((), jnp.int32)
    if t == 1 and rows_S is None:
        slot_S = start_S % slots
        kt, vt = k_new[:, 0], v_new[:, 0]  # [S, K, H]
        if s == r and s > 1:  # a slot per row: a scatter batched over rows (stays shard-local when rows are split)
            k = jax.vmap(lambda c, n, p: jax.lax.dynamic_update_slice(c, n[..., None], (zero, zero, p)))(
                cache_k_RKHC, kt, slot_S)
            v = jax.vmap(lambda c, n, p: jax.lax.dynamic_update_slice(c, n[:, None], (zero, p, zero)))(
                cache_v_RKCH, vt, slot_S)
        else:  # rows 0..S-1: a plain slice update per row
            k, v = cache_k_RKHC, cache_v_RKCH
            for i in range(s):
                k = jax.lax.dynamic_update_slice(k, kt[i][None, ..., None], (i, zero, zero, slot_S[i]))
                v = jax.lax.dynamic_update_slice(v, vt[i][None, :, None], (i, zero, slot_S[i], zero))
        return constrain(k, KEY_AXES), constrain(v, VALUE_AXES)
    k, v = cache_k_RKHC, cache_v_RKCH
    i = jnp.arange(t, dtype=jnp.int32)
    rows = jnp.arange(s, dtype=jnp.int32) if rows_S is None else rows_S
    for j in range(s):
        keep = (i < count_S[j]) & (i >= count_S[j] - slots)
        slot_T = jnp.where(keep, (start_S[j] + i) % slots, slots)  # slots: out of range, dropped
        k = k.at[rows[j], :, :, slot_T].set(k_new[j], mode="drop")
        v = v.at[rows[j], :, slot_T, :].set(v_new[j], mode="drop")
    return constrain(k, KEY_AXES), constrain(v, VALUE_AXES)


def write_paged(pool_k_NKHP: jax.Array, pool_v_NKPH: jax.Array, pages_SM: jax.Array, k_STKH: jax.Array,
                v_STKH: jax.Array, start_S: jax.Array, count_S: jax.Array,
                after_x: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """A paged layer's pools with S sequences' new keys/values written: token i of sequence s (position
    p = start[s] + i) in slot p % span of its row, at its offset in page ``pages_SM[s, slot // PAGE]`` (``pages_SM``:
    each sequence's row of the layer's page table, span = M * PAGE). One scatter, in place: tokens past a sequence's
    count (padding, and the token of a decode row that takes none) and those a ring does not keep are dropped.
    ``after_x``: as ``write_tokens``."""
    s, t = k_STKH.shape[:2]
    n, span = pool_k_NKHP.shape[0], pages_SM.shape[1] * PAGE
    k_new = k_STKH.astype(pool_k_NKHP.dtype)
    v_new = v_STKH.astype(pool_v_NKPH.dtype)
    if after_x is not None:
        dep = after_x[:, :1, :1, None]
        k_new, v_new = after(k_new, dep), after(v_new, dep)
    i = jnp.arange(t, dtype=jnp.int32)[None]
    slot_ST = (start_S[:, None] + i) % span
    page_ST = jnp.take_along_axis(pages_SM, slot_ST // PAGE, axis=1)
    keep = (i < count_S[:, None]) & (i >= count_S[:, None] - span)
    page_ST = jnp.where(keep, page_ST, n)  # n: out of range, dropped
    page, offset = page_ST.reshape(-1), (slot_ST % PAGE).reshape(-1)
    k = pool_k_NKHP.at[page, :, :, offset].set(k_new.reshape(s * t, *k_new.shape[2:]), mode="drop")
    v = pool_v_NKPH.at[page, :, offset, :].set(v_new.reshape(s * t, *v_new.shape[2:]), mode="drop")
    return constrain(k, PAGE_KEY_AXES), constrain(v, PAGE_VALUE_AXES)


def after(x: jax.Array, dep: jax.Array) -> jax.Array:
    """``x`` unchanged, but computed from ``dep`` (broadcastable to ``x``) as far as the compiler can tell.

    A cache write that depends on the output of the cache's readers is scheduled after them, so XLA writes the cache
    in place inside a loop; without the dependency it may schedule the write first and copy every cache buffer on
    every step. The added term is min(|dep|, 0) = 0 (NaN only where ``dep`` already is).
    """
    return x + jnp.minimum(jnp.abs(dep), 0).astype(x.dtype)


def extend_cache(spec: DecoderSpec, cache: dict, cache_len: int) -> dict:
    """``cache`` (holding fewer positions than any of its rings has slots) moved into a longer cache of
    ``cache_len``: each ring of a full-attention layer grows to ``cache_len`` slots, local rings keep their size.
    Position p stays in slot p (no ring has wrapped yet), so the larger ring holds the same positions."""
    keys, values = [], []
    for k, v, slots in zip(cache["k"], cache["v"], (s for s in cache_slots(spec, cache_len) if s is not None)):
        grow = slots - k.shape[-1]
        if grow < 0:
            raise ValueError(f"cannot shrink a cache of {k.shape[-1]} slots to {slots}")
        keys.append(constrain(jnp.pad(k, ((0, 0), (0, 0), (0, 0), (0, grow))), KEY_AXES))
        values.append(constrain(jnp.pad(v, ((0, 0), (0, 0), (0, grow), (0, 0))), VALUE_AXES))
    return {"length": cache["length"], "k": tuple(keys), "v": tuple(values)}


def snapshot_row(cache: dict, row: jax.Array, length: int, paged: tuple[int | None, ...] | None = None) -> dict:
    """Row ``row`` of every layer's cache, the first ``length`` slots of each cache longer than that (ring caches
    whole; a paged layer: the pages holding them): what ``restore_row`` writes back into any row to continue from
    the same tokens. ``paged``: ``paged_entries`` of the cache (None: none is paged)."""
    keys, values = [], []
    for k, v, p in zip(cache["k"], cache["v"], paged or (None,) * len(cache["k"])):
        if p is not None:
            table = jax.lax.dynamic_index_in_dim(cache["pages"][p], row, 0, keepdims=False)[:-(-length // PAGE)]
            keys.append(jnp.take(k, table, axis=0))
            values.append(jnp.take(v, table, axis=0))
            continue
        n = min(length, k.shape[-1])
        keys.append(jax.lax.dynamic_slice_in_dim(k, row, 1, axis=0)[..., :n])
        values.append(jax.lax.dynamic_slice_in_dim(v, row, 1, axis=0)[:, :, :n])
    return {"k": tuple(keys), "v": tuple(values)}


def restore_row(cache: dict, row: jax.Array, saved: dict, length: jax.Array,
                paged: tuple[int | None, ...] | None = None) -> dict:
    """``cache`` with row ``row`` holding a ``snapshot_row`` of ``length`` tokens (a paged layer's saved pages into
    the pages the row's table names: pages past what the row holds are its scratch page's)."""
    zero = jnp.zeros((), jnp.int32)
    keys, values = [], []
    for k, v, sk, sv, p in zip(cache["k"], cache["v"], saved["k"], saved["v"], paged or (None,) * len(cache["k"])):
        if p is not None:
            table = jax.lax.dynamic_index_in_dim(cache["pages"][p], row, 0, keepdims=False)[:sk.shape[0]]
            keys.append(k.at[table].set(sk))
            values.append(v.at[table].set(sv))
            continue
        keys.append(jax.lax.dynamic_update_slice(k, sk, (row, zero, zero, zero)))
        values.append(jax.lax.dynamic_update_slice(v, sv, (row, zero, zero, zero)))
    return {**cache, "length": cache["length"].at[row].set(length), "k": tuple(keys), "v": tuple(values)}
