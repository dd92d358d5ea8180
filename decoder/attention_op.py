"""The attention op: softmax(q.k * scale [softcapped], masked) . v, with the mask built inside from positions.

Every token carries a sequence position (-1 for padding and empty cache slots) and a media block id (-1 for text).
A query at position q may see a key at position k when (see ``visible``)

    k is valid  AND  (k <= q  OR  (same media block AND bidirectional on this layer))  AND  locality

where locality is nothing (full), k > q - W (sliding window W) or floor(k / C) == floor(q / C) (chunk C): the
AND(window, OR(causal, block)) composition transformers uses. No [B, L, L] mask is stored anywhere: each block of
scores builds the part it needs from the positions.

Backends (``backend_for``: chosen once by the engine, "auto" unless forced, and passed down as data):
- dense: one block of scores, for prompts up to ``DENSE_LIMIT`` tokens;
- blocked: a loop (not Python unrolling) over 128-query blocks and, inside, over the 128-key blocks that any
  query of the block can see (flash-attention style running softmax): program size and compile time do not grow
  with the prompt, temporary memory grows linearly, and keys outside the causal / window / chunk reach are skipped;
- fused: ``jax.nn.dot_product_attention`` (the platform's fused kernel where one exists), chosen on GPU/TPU.

Tokens that continue cached sequences (decode steps: a token per row; prompt chunks: a row's next tokens) use
``cache_attention``: each row's cache as it was plus its new tokens' own keys/values.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from omnijax.decoder.spec import MaskSpec

DENSE_LIMIT = 256  # prompts up to this many tokens attend in one block
Q_BLOCK = 128
K_BLOCK = 128
NEG = -1e30
BACKENDS = ("auto", "dense", "blocked", "fused")


class PromptMeta(NamedTuple):
    """Per-token metadata of a prompt (shared by every layer).

    pos: [batch, length] sequence position, -1 for padding. The prompt is right-padded: token j of a row is at
        position j (or padding), which the blocked backend relies on to skip key blocks.
    block: [batch, length] media block id, -1 for text.
    reach: [batch, length] the last position the token can see through its media block on a bidirectional layer
        (its own position for text; -1 for padding).
    """

    pos: jax.Array
    block: jax.Array
    reach: jax.Array


def visible(q_pos: jax.Array, k_pos: jax.Array, mask: MaskSpec, q_block: jax.Array | None = None,
            k_block: jax.Array | None = None) -> jax.Array:
    """Boolean [batch, q_len, k_len]: may the query see the key? Positions [batch, len], -1 = invalid."""
    q = q_pos[:, :, None]
    k = k_pos[:, None, :]
    allowed = k <= q
    if mask.media_bidirectional and q_block is not None and k_block is not None:
        qb = q_block[:, :, None]
        allowed = allowed | ((qb == k_block[:, None, :]) & (qb >= 0))
    if mask.kind == "sliding":
        allowed = allowed & (k > q - mask.size)
    elif mask.kind == "chunked":
        allowed = allowed & (k // mask.size == q // mask.size)
    return allowed & (k >= 0) & (q >= 0)


def _scores(q_BKQH: jax.Array, k_BKSH: jax.Array, *, softcap: float | None, keys_transposed: bool = False):
    s = jnp.einsum("bkqh,bkhs->bkqs" if keys_transposed else "bkqh,bksh->bkqs", q_BKQH, k_BKSH.astype(q_BKQH.dtype),
                   preferred_element_type=jnp.float32)
    return s if softcap is None else jnp.tanh(s / softcap) * softcap


def _group_queries(q_BLNH: jax.Array, kv_heads: int, scale: float) -> jax.Array:
    """q [B, L, N, H] * scale -> [B, K, G * L, H]: the G query heads of a kv head as rows of one product."""
    b, l, n, h = q_BLNH.shape
    g = n // kv_heads
    q = (q_BLNH * jnp.asarray(scale, q_BLNH.dtype)).reshape(b, l, kv_heads, g, h).transpose(0, 2, 3, 1, 4)
    return q.reshape(b, kv_heads, g * l, h)


def _ungroup(out_BKQH: jax.Array, l: int) -> jax.Array:
    b, kv, gl, h = out_BKQH.shape
    g = gl // l
    return out_BKQH.reshape(b, kv, g, l, h).transpose(0, 3, 1, 2, 4).reshape(b, l, kv * g, h)


def dot_attention(q_BLNH: jax.Array, segments: list[tuple[jax.Array, jax.Array, jax.Array]], *, scale: float,
                  softcap: float | None = None, keys_transposed: bool = False) -> jax.Array:
    """softmax over the keys of all ``segments`` -> [batch, q_len, N, H].

    Each segment is (keys [B, K, S, H], values [B, K, S, H], visible [B, L, S]); with ``keys_transposed`` the first
    segment's keys are [B, K, H, S], as the key cache holds them; one softmax spans every segment's keys (decode
    attends to the cache as it was plus the new token without concatenating them).
    """
    b, l, n, h = q_BLNH.shape
    kv = segments[0][1].shape[1]
    q = _group_queries(q_BLNH, kv, scale)
    parts = []
    for i, (keys, _, vis_BLS) in enumerate(segments):
        s = _scores(q, keys, softcap=softcap, keys_transposed=keys_transposed and i == 0)
        s = s.reshape(b, kv, n // kv, l, s.shape[-1])
        parts.append(s + jnp.where(vis_BLS, 0.0, NEG).astype(jnp.float32)[:, None, None])
    scores = parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=-1)
    scores = scores - jnp.max(scores, axis=-1, keepdims=True)
    probs = jnp.exp(scores)
    probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
    out, offset = 0, 0
    for _, v_BKSH, _ in segments:
        s = v_BKSH.shape[2]
        p = probs[..., offset:offset + s].astype(q.dtype).reshape(b, kv, -1, s)
        out = out + jnp.einsum("bkqs,bksh->bkqh", p, v_BKSH.astype(q.dtype))
        offset += s
    return _ungroup(out, l)


def _blocked(q_BLNH, k_BKLH, v_BKLH, meta: PromptMeta, mask: MaskSpec, *, scale, softcap):
    """Blocked running-softmax self-attention of a prompt (length a multiple of the block sizes); see the module
    docstring."""
    b, l, n, h = q_BLNH.shape
    kv = k_BKLH.shape[1]
    g = n // kv
    q = _group_queries(q_BLNH, kv, scale).reshape(b, kv, g, l, h)
    reach = meta.reach if mask.media_bidirectional else meta.pos

    def one_query_block(_, i):
        qs = i * Q_BLOCK
        qi = jax.lax.dynamic_slice_in_dim(q, qs, Q_BLOCK, axis=3).reshape(b, kv, g * Q_BLOCK, h)
        qp = jax.lax.dynamic_slice_in_dim(meta.pos, qs, Q_BLOCK, axis=1)
        qb = jax.lax.dynamic_slice_in_dim(meta.block, qs, Q_BLOCK, axis=1)
        if mask.kind == "sliding":  # row r is at position r: the block's first query reaches back the furthest
            lo = jnp.maximum(qs - mask.size + 1, 0)
        elif mask.kind == "chunked":
            lo = qs // mask.size * mask.size
        else:
            lo = 0
        hi = jnp.max(jax.lax.dynamic_slice_in_dim(reach, qs, Q_BLOCK, axis=1))  # the furthest key any query sees
        kb_lo = jnp.asarray(lo, jnp.int32) // K_BLOCK
        kb_hi = jnp.maximum(hi // K_BLOCK + 1, kb_lo + 1)

        def one_key_block(j, carry):
            m, total, acc = carry
            ks = j * K_BLOCK
            kj = jax.lax.dynamic_slice_in_dim(k_BKLH, ks, K_BLOCK, axis=2)
            vj = jax.lax.dynamic_slice_in_dim(v_BKLH, ks, K_BLOCK, axis=2)
            kp = jax.lax.dynamic_slice_in_dim(meta.pos, ks, K_BLOCK, axis=1)
            kb = jax.lax.dynamic_slice_in_dim(meta.block, ks, K_BLOCK, axis=1)
            s = _scores(qi, kj, softcap=softcap).reshape(b, kv, g, Q_BLOCK, K_BLOCK)
            s = s + jnp.where(visible(qp, kp, mask, qb, kb), 0.0, NEG)[:, None, None]
            return _accumulate(m, total, acc, s, vj, q.dtype)

        init = (jnp.full((b, kv, g, Q_BLOCK), NEG, jnp.float32), jnp.zeros((b, kv, g, Q_BLOCK), jnp.float32),
                jnp.zeros((b, kv, g * Q_BLOCK, h), jnp.float32))
        _, total, acc = jax.lax.fori_loop(kb_lo, kb_hi, one_key_block, init)
        out = acc / total.reshape(b, kv, g * Q_BLOCK)[..., None]
        return None, _ungroup(out.astype(q_BLNH.dtype), Q_BLOCK)

    _, blocks = jax.lax.scan(one_query_block, None, jnp.arange(l // Q_BLOCK))  # [blocks, B, Q_BLOCK, N, H]
    return blocks.transpose(1, 0, 2, 3, 4).reshape(b, l, n, h)


def backend_for(length: int, chosen: str = "auto") -> str:
    """The backend for a prompt of ``length`` tokens: ``chosen`` (dense / blocked / fused) unless "auto", else
    fused on GPU/TPU, dense for short prompts and blocked for long ones."""
    if chosen not in BACKENDS:
        raise ValueError(f"unknown attention backend {chosen!r}; known: {BACKENDS}")
    if chosen != "auto":
        return chosen
    if jax.default_backend() in ("gpu", "tpu"):
        return "fused"
    return "dense" if length <= DENSE_LIMIT else "blocked"


def _pad_to(x: jax.Array, axis: int, multiple: int, value=0) -> jax.Array:
    extra = -x.shape[axis] % multiple
    if not extra:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


def prompt_attention(q_BLNH: jax.Array, k_BLKH: jax.Array, v_BLKH: jax.Array, meta: PromptMeta, mask: MaskSpec, *,
                     scale: float, softcap: float | None = None, query_rows: jax.Array | None = None,
                     backend: str = "auto") -> jax.Array:
    """A prompt's self-attention -> [batch, queries, N, H].

    k, v [B, L, K, H] are the prompt's keys and values and ``meta`` describes its L tokens; q [B, Lq, N, H] are the
    queries of every row, or of the few rows ``query_rows`` [B, Lq] (e.g. each row's last token). ``backend``: see
    ``backend_for``.
    """
    b, l = meta.pos.shape
    if query_rows is None:
        q_pos, q_blk = meta.pos, meta.block
    else:
        q_pos = jnp.take_along_axis(meta.pos, query_rows, axis=1)
        q_blk = jnp.take_along_axis(meta.block, query_rows, axis=1)
    backend = backend_for(l, backend)
    if backend == "fused" and softcap is None:
        vis = visible(q_pos, meta.pos, mask, q_blk, meta.block)
        return jax.nn.dot_product_attention(q_BLNH, k_BLKH.astype(q_BLNH.dtype), v_BLKH.astype(q_BLNH.dtype),
                                            mask=vis[:, None], scale=scale)
    k = k_BLKH.transpose(0, 2, 1, 3)  # [B, K, L, H]
    v = v_BLKH.transpose(0, 2, 1, 3)
    if backend == "dense" or query_rows is not None:
        return dot_attention(q_BLNH, [(k, v, visible(q_pos, meta.pos, mask, q_blk, meta.block))], scale=scale,
                             softcap=softcap)
    block = max(Q_BLOCK, K_BLOCK)
    out = _blocked(_pad_to(q_BLNH, 1, block), _pad_to(k, 2, block), _pad_to(v, 2, block),
                   PromptMeta(*(_pad_to(a, 1, block, -1) for a in meta)), mask, scale=scale, softcap=softcap)
    return out[:, :l]


def _history_block(c: int) -> int:
    """Keys per history block for a cache of ``c`` slots: the whole cache up to 512 slots, else 128-slot blocks
    (cache lengths above 512 are multiples of 128)."""
    return c if c <= 512 or c % K_BLOCK else K_BLOCK


def cache_block(cache_RX: jax.Array, rows_S: jax.Array | None, s: int, axis: int, start, size: int,
                pages_SM: jax.Array | None = None) -> jax.Array:
    """Slots start .. start + size - 1 (along ``axis``) of the cache rows S sequences continue: ``rows_S`` None ->
    the first S rows; else the rows ``rows_S`` names (an index past the last row, a padding sequence's, reads the
    last row: what it computes is never used). Only that block is read: the rows' whole caches are never copied
    (a long cache is read block by block in place). ``pages_SM``: the cache is a pool of pages (decoder/kv_cache.py)
    and these are the sequences' rows of the page table; ``start`` is then a multiple of the page size and ``size``
    one page or the whole table's positions."""
    if pages_SM is not None:
        page = cache_RX.shape[axis]
        if size == page:
            return jnp.take(cache_RX, pages_SM[:, start // page], axis=0)
        blocks = jnp.take(cache_RX, pages_SM, axis=0)  # [S, M, ...]: the pages in order along ``axis``
        blocks = jnp.moveaxis(blocks, 1, axis)
        shape = blocks.shape
        return blocks.reshape(*shape[:axis], shape[axis] * shape[axis + 1], *shape[axis + 2:])
    r = cache_RX.shape[0]
    block = jax.lax.dynamic_slice_in_dim(cache_RX, start, size, axis=axis) if size < cache_RX.shape[axis] \
        else cache_RX
    if rows_S is None:
        return block if s == r else block[:s]
    return jnp.take(block, rows_S, axis=0, mode="clip")


def cache_attention(q_STNH: jax.Array, cache_k_RKHC: jax.Array, cache_v_RKCH: jax.Array, rows_S: jax.Array | None,
                    slot_pos_SC: jax.Array, k_STKH: jax.Array, v_STKH: jax.Array, q_pos_ST: jax.Array,
                    q_block_ST: jax.Array | None, mask: MaskSpec, *, scale: float, softcap: float | None = None,
                    held: jax.Array | None = None, backend: str = "auto",
                    pages_SM: jax.Array | None = None) -> jax.Array:
    """S sequences of T new tokens, sequence s continuing cache row ``rows_S[s]`` (``rows_S`` None: row s), each token
    attending to its row's cache (the keys before the batch) and to the new tokens of its own sequence ->
    [S, T, N, H].

    cache_k [R, K, H, C] / cache_v [R, K, C, H]: every row's cache (keys transposed, so the scores are a plain
    [G*T, H] x [H, C] product per kv head); the sequences' rows are read (``cache_block``). slot_pos [S, C]: the position each
    slot of those rows holds before the batch (-1 empty). k, v [S, T, K, H]: the new tokens' keys and values;
    q_pos [S, T] their positions (-1: padding), q_block [S, T] their media block ids (-1 text; None: no media).
    Decode is S rows of one token, prompt chunks C rows of T tokens: the same op. Cache keys never share a media
    block with new tokens (a chunk never splits a block).

    A cache of at most 512 slots is read whole, in one softmax with the new tokens; a longer one in 128-slot blocks
    with a running softmax, only as far as ``held`` (the most slots any of the rows holds; None: all), so a long
    context budget costs nothing until it is used. With ``backend`` "fused" (the default on GPU/TPU, see
    ``backend_for``) a prompt chunk (T > 1) hands the row's keys and the new ones, with the mask, to
    ``jax.nn.dot_product_attention`` instead (not on a soft-capped layer); decode steps keep reading the cache in
    place, only as far as it is held.

    ``pages_SM``: the cache is a pool of pages, keys [N, K, H, P] and values [N, K, P, H] (decoder/kv_cache.py),
    and these are the sequences' rows of its page table (``rows_S`` is then not used): the rows' caches are
    M * P slots long, page j holding slots j * P ..; read a page per block (each block's pages gathered from the
    pool), as far as held, whatever the cache's length."""
    s, t, n, h = q_STNH.shape
    r, kv, _, c = cache_k_RKHC.shape
    if pages_SM is not None:
        c = pages_SM.shape[1] * c
    g = n // kv
    read_k = lambda start, size: cache_block(cache_k_RKHC, rows_S, s, 3, start, size, pages_SM)  # noqa: E731
    read_v = lambda start, size: cache_block(cache_v_RKCH, rows_S, s, 2, start, size, pages_SM)  # noqa: E731
    k_new = k_STKH.transpose(0, 2, 1, 3)  # [S, K, T, H]
    v_new = v_STKH.transpose(0, 2, 1, 3)
    vis_new = visible(q_pos_ST, q_pos_ST, mask, q_block_ST, q_block_ST)
    if t > 1 and backend_for(t, backend) == "fused" and softcap is None:
        rows_k, rows_v = read_k(0, c), read_v(0, c)
        keys = jnp.concatenate([rows_k.transpose(0, 3, 1, 2), k_STKH.astype(rows_k.dtype)], axis=1)  # [S, C+T, K, H]
        values = jnp.concatenate([rows_v.transpose(0, 2, 1, 3), v_STKH.astype(rows_v.dtype)], axis=1)
        vis = jnp.concatenate([visible(q_pos_ST, slot_pos_SC, mask), vis_new], axis=-1)
        return jax.nn.dot_product_attention(q_STNH, keys.astype(q_STNH.dtype), values.astype(q_STNH.dtype),
                                            mask=vis[:, None], scale=scale)
    kb = _history_block(c) if pages_SM is None else cache_k_RKHC.shape[-1]  # a pool of pages: a page per block
    if kb == c:
        return dot_attention(q_STNH, [(read_k(0, c), read_v(0, c), visible(q_pos_ST, slot_pos_SC, mask)),
                                      (k_new, v_new, vis_new)],
                             scale=scale, softcap=softcap, keys_transposed=True)
    q = _group_queries(q_STNH, kv, scale)  # [S, K, G*T, H]
    held = c if held is None else jnp.minimum(held, c)

    def one_block(j, carry):
        m, total, acc = carry
        ks = j * kb
        kj, vj = read_k(ks, kb), read_v(ks, kb)
        kp = jax.lax.dynamic_slice_in_dim(slot_pos_SC, ks, kb, axis=1)
        sc = _scores(q, kj, softcap=softcap, keys_transposed=True).reshape(s, kv, g, t, kb)
        sc = sc + jnp.where(visible(q_pos_ST, kp, mask), 0.0, NEG)[:, None, None]
        return _accumulate(m, total, acc, sc, vj, q.dtype)

    init = (jnp.full((s, kv, g, t), NEG, jnp.float32), jnp.zeros((s, kv, g, t), jnp.float32),
            jnp.zeros((s, kv, g * t, h), jnp.float32))
    carry = jax.lax.fori_loop(0, (held + kb - 1) // kb, one_block, init)
    sc = _scores(q, k_new, softcap=softcap).reshape(s, kv, g, t, t)
    sc = sc + jnp.where(vis_new, 0.0, NEG)[:, None, None]
    _, total, acc = _accumulate(*carry, sc, v_new, q.dtype)
    out = acc / total.reshape(s, kv, g * t)[..., None]
    return _ungroup(out.astype(q_STNH.dtype), t)


def _accumulate(m, total, acc, s, v_BKSH, dtype):
    """One more block of scores s [B, K, G, Q, S] (and values [B, K, S, H]) into a running softmax."""
    b, kv, g, nq, ns = s.shape
    m_new = jnp.maximum(m, jnp.max(s, axis=-1))
    p = jnp.exp(s - m_new[..., None])
    corr = jnp.exp(m - m_new)
    total = total * corr + jnp.sum(p, axis=-1)
    pv = jnp.einsum("bkqs,bksh->bkqh", p.reshape(b, kv, g * nq, ns).astype(dtype), v_BKSH.astype(dtype),
                    preferred_element_type=jnp.float32)
    return m_new, total, acc * corr.reshape(b, kv, g * nq)[..., None] + pv
