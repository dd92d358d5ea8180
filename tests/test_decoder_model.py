"""The model forward on a decoder mixing every layer kind: a prompt's logits at every position equal those of a
shorter prompt continued token by token through the KV caches.

The layers: a sliding window of 5 with bidirectional media blocks (a ring cache that wraps many times), a chunked
layer (chunk 6; interleaved llama3 RoPE; L2 qk norm after RoPE; a sigmoid-routed MoE with a shared expert), a NoPE
layer with query temperature tuning, a layer sharing the sliding layer's keys/values (no cache of its own), a full
layer with its own head_dim and kv heads, K = V, v norm and proportional partial RoPE, and a layer sharing that
one's keys/values. Two rows of different lengths run together.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from omnijax.decoder.kv_cache import cache_slots
from omnijax.decoder.model import DecoderModel, Prompt, one_token_batch
from omnijax.decoder.spec import AttentionSpec, DecoderSpec, FeedForwardSpec, LayerSpec, MaskSpec, RopeSpec

HIDDEN, VOCAB = 32, 50
DENSE = FeedForwardSpec("dense", 48, "gelu_tanh")
MOE = FeedForwardSpec("moe", 16, "silu", num_experts=4, top_k=1, router="sigmoid_input", shared_intermediate=24)
SLIDING = AttentionSpec(4, 2, 8, mask=MaskSpec("sliding", 5, media_bidirectional=True), qk_norm="rms")
WIDE = AttentionSpec(4, 1, 16, mask=MaskSpec("full"), rope=RopeSpec(theta=1e4, kind="proportional", fraction=0.25),
                     qk_norm="rms", v_norm=True, k_eq_v=True, scale=1.0)
SPEC = DecoderSpec(VOCAB, HIDDEN, (
    LayerSpec(SLIDING, DENSE, block="sandwich"),
    LayerSpec(AttentionSpec(4, 2, 8, mask=MaskSpec("chunked", 6), qk_norm="l2",
                            rope=RopeSpec(theta=500.0, kind="llama3", factor=4.0, original_max_position=16,
                                          interleaved=True)), MOE),
    LayerSpec(AttentionSpec(4, 4, 8, rope=None, temperature=(3.0, 0.5)), DENSE),
    LayerSpec(AttentionSpec(4, 2, 8, mask=MaskSpec("sliding", 5, media_bidirectional=True), qk_norm="rms",
                            kv_source=0), DENSE, block="sandwich"),
    LayerSpec(WIDE, DENSE),
    LayerSpec(AttentionSpec(4, 1, 16, rope=WIDE.rope, qk_norm="rms", scale=1.0, kv_source=4), DENSE),
), norm_plus_one=True, embed_scale=2.0, final_logit_softcap=8.0)


@pytest.fixture(scope="module")
def model():
    m = nnx.eval_shape(lambda: DecoderModel(SPEC, rngs=nnx.Rngs(0)))  # shapes only: the weights are drawn below
    graphdef, state = nnx.split(m)
    rng = np.random.default_rng(0)
    state = jax.tree.map(lambda x: jnp.asarray(rng.normal(0, 0.3, x.shape), x.dtype), state)  # nothing at init values
    return graphdef, state


def _step(graphdef, state, tokens_S, cache):
    """One decode step of every row (``DecoderModel.forward`` on one token per row) -> (logits [S, V], cache)."""
    m = nnx.merge(graphdef, state)
    batch = one_token_batch(tokens_S, cache["length"][None], cache)
    h, cache = m.forward(batch, cache)
    return m.last_logits(h, batch.count), cache


def _prefill(graphdef, state, tokens, lengths, cache_len, all_logits):
    tokens = jnp.asarray(tokens)
    b, l = tokens.shape
    pos = jnp.broadcast_to(jnp.arange(l), (1, b, l))
    bidir = (tokens == 7) & (jnp.arange(l)[None] < jnp.asarray(lengths)[:, None])
    prompt = Prompt(tokens, jnp.asarray(lengths), pos, bidir, {})
    return nnx.merge(graphdef, state).prefill(prompt, cache_len=cache_len, cache_dtype=jnp.float32,
                                              all_logits=all_logits)


@pytest.mark.slow
def test_prompt_logits_equal_cached_continuation(model):
    graphdef, state = model
    rng = np.random.default_rng(1)
    lengths = [23, 17]
    tokens = rng.integers(8, VOCAB, (2, 24)).astype(np.int32)
    tokens[0, 2:5] = 7  # a bidirectional media block of 3 tokens in row 0, inside the first prompt
    tokens[1, 1:3] = 7
    full, _ = jax.jit(lambda s, t: _prefill(graphdef, s, t, lengths, 32, True))(state, tokens)
    full = np.asarray(full)
    start = [9, 6]
    first = tokens.copy()
    for r, s in enumerate(start):
        first[r, s:] = 0
    logits, cache = jax.jit(lambda s, t: _prefill(graphdef, s, t, start, 32, False))(state, first[:, :16])
    np.testing.assert_allclose(np.asarray(logits), full[np.arange(2), np.array(start) - 1], atol=2e-5, rtol=1e-5)
    slots = cache_slots(SPEC, 32)
    assert slots == (5, 6, 32, None, 32, None)  # rings for the local layers, nothing for the sharing layers
    assert [k.shape[-1] for k in cache["k"]] == [5, 6, 32, 32]

    step = jax.jit(lambda s, t, c: _step(graphdef, s, t, c))
    for i in range(max(lengths) - min(start)):
        idx = np.minimum(np.array(start) + i, np.array(lengths) - 1)
        out, cache = step(state, jnp.asarray(tokens[np.arange(2), idx]), cache)
        for r in range(2):
            if start[r] + i < lengths[r]:
                np.testing.assert_allclose(np.asarray(out)[r], full[r, start[r] + i], atol=2e-5, rtol=1e-5,
                                           err_msg=f"row {r} position {start[r] + i}")
    assert np.asarray(cache["length"]).tolist() == [s + max(lengths) - min(start) for s in start]


def test_prefill_returns_hidden_states_and_takes_embeddings(model):
    """hidden_at gives transformers' hidden_states (0: the input embeddings, i: layer i-1's output) without changing
    the logits; embeddings given as input give the logits of the tokens; output="hidden" is the final-normed state
    the logits are made from; a decode step takes embeddings too (``embeds_step``: its final-normed state)."""
    graphdef, state = model
    tokens = jnp.asarray(np.random.default_rng(2).integers(8, VOCAB, (1, 12)).astype(np.int32))
    prompt = Prompt(tokens, jnp.asarray([12]), jnp.broadcast_to(jnp.arange(12), (1, 1, 12)),
                    jnp.zeros((1, 12), bool), {})

    @jax.jit
    def run(state):
        m = nnx.merge(graphdef, state)
        plain = m.prefill(prompt, cache_len=16, cache_dtype=jnp.float32)
        logits, cache, hidden = m.prefill(prompt, cache_len=16, cache_dtype=jnp.float32, hidden_at=(0, 2),
                                          all_logits=True)
        via_embeds, _ = m.prefill(prompt, cache_len=16, cache_dtype=jnp.float32, embeds=hidden[0])
        normed, _ = m.prefill(prompt, cache_len=16, cache_dtype=jnp.float32, output="hidden")
        capped = jnp.tanh(m.embedder.logits(normed[:, None])[:, 0] / 8.0) * 8.0
        nxt = jnp.asarray([9])
        by_token, _ = m.forward(one_token_batch(nxt, plain[1]["length"][None], plain[1]), plain[1])
        by_token = m.hidden(by_token)[:, 0]
        by_embed, _ = m.embeds_step(m.embed(nxt[:, None], {})[:, 0], plain[1]["length"][None], plain[1])
        return len(plain), plain[0], logits[:, -1], hidden, m.embed(tokens, {}), via_embeds, capped, by_token, by_embed

    n, plain, last, hidden, embedded, via_embeds, capped, by_token, by_embed = run(state)
    assert n == 2  # the default result is unchanged
    np.testing.assert_allclose(np.asarray(last), np.asarray(plain), rtol=1e-5, atol=1e-5)
    assert set(hidden) == {0, 2} and hidden[2].shape == (1, 12, HIDDEN)
    np.testing.assert_allclose(np.asarray(hidden[0]), np.asarray(embedded), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(via_embeds), np.asarray(plain), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(capped), np.asarray(plain), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(by_embed), np.asarray(by_token), rtol=1e-5, atol=1e-5)
    # hidden state 2 is the output of layer 1: the first two layers alone, final-normed, give it final-normed
    two = nnx.eval_shape(lambda: DecoderModel(DecoderSpec(VOCAB, HIDDEN, SPEC.layers[:2], norm_plus_one=True,
                                                          embed_scale=2.0), rngs=nnx.Rngs(0)))
    weights = dict(nnx.to_flat_state(state))
    nnx.update(two, nnx.from_flat_state([(path, weights[path]) for path, _ in nnx.to_flat_state(nnx.state(two))]))
    alone, _ = jax.jit(lambda: two.prefill(prompt, cache_len=16, cache_dtype=jnp.float32, output="hidden",
                                           all_logits=True))()
    np.testing.assert_allclose(np.asarray(two.final_norm(hidden[2])), np.asarray(alone), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="hidden_at"):
        nnx.merge(graphdef, state).prefill(prompt, cache_len=16, cache_dtype=jnp.float32,
                                           hidden_at=(len(SPEC.layers),))


def test_a_grown_cache_continues_as_a_longer_one(model):
    from omnijax.decoder.kv_cache import extend_cache

    graphdef, state = model
    tokens = np.random.default_rng(3).integers(8, VOCAB, (1, 10)).astype(np.int32)
    prefill = jax.jit(lambda s, t, *, n: _prefill(graphdef, s, t, [10], n, False)[1], static_argnames="n")
    short, long = prefill(state, tokens, n=16), prefill(state, tokens, n=48)
    grown = extend_cache(SPEC, short, 48)
    assert [k.shape for k in grown["k"]] == [k.shape for k in long["k"]]
    step = jax.jit(lambda s, t, c: _step(graphdef, s, t, c))
    for token in range(11, 21):
        a, grown = step(state, jnp.asarray([token]), grown)
        b, long = step(state, jnp.asarray([token]), long)
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=2e-6 * np.abs(np.asarray(b)).max())
    with pytest.raises(ValueError, match="shrink"):
        extend_cache(SPEC, long, 16)


def test_a_shared_expert_gate_needs_a_shared_expert():
    with pytest.raises(ValueError, match="shared expert"):
        FeedForwardSpec("moe", 16, "silu", num_experts=4, top_k=2, shared_gate=True)


def test_the_fused_backend_continues_the_cache_as_the_default_one(model):
    """``attention="fused"`` (``jax.nn.dot_product_attention``, the GPU/TPU default for prompt chunks) in the
    serving forward: a prompt chunk of one row, with a media block, gives the default backend's output and cache."""
    from omnijax.decoder.model import TokenBatch

    graphdef, state = model
    tokens = np.random.default_rng(4).integers(8, VOCAB, (2, 24)).astype(np.int32)
    tokens[1, 15:17] = 7  # a media block inside the chunk
    _, cache = jax.jit(lambda s, t: _prefill(graphdef, s, t, [20, 13], 32, False))(state, tokens[:, :16])
    start = 13
    chunk = TokenBatch(jnp.asarray(tokens[1:, start:start + 6]), jnp.asarray([4]), jnp.asarray([start]),
                       jnp.asarray([1]), jnp.broadcast_to(jnp.arange(start, start + 6, dtype=jnp.float32), (1, 1, 6)),
                       bidirectional=jnp.asarray(tokens[1:, start:start + 6] == 7))

    @jax.jit
    def run(state, cache):
        m = nnx.merge(graphdef, state)
        out = {}
        for backend in ("auto", "fused"):
            out[backend] = m.forward(chunk, cache, attention=backend)
        return out

    out = run(state, cache)
    for a, b in zip(jax.tree.leaves(out["auto"]), jax.tree.leaves(out["fused"])):
        a, b = np.asarray(a), np.asarray(b)  # float32, two summation orders: the parity tests' bound
        assert np.abs(b - a).max() <= 1e-4 * max(1.0, float(np.abs(a).max()))


PACKED_BOUND = 1e-5


def test_a_packed_forward_equals_its_groups_run_one_after_another(model):
    """A decode step's rows and two prompt chunks (one of them a padding sequence) in one forward give the outputs
    and the cache of a decode step followed by the chunk alone: each group attends in its own shape, the tokens
    laid end to end for everything else; the chunk's row, idle in the decode group, ends holding the chunk."""
    from omnijax.decoder.model import TokenBatch

    graphdef, state = model
    rng = np.random.default_rng(5)
    tokens = rng.integers(8, VOCAB, (3, 24)).astype(np.int32)
    tokens[1, 9:11] = 7  # a media block inside the chunk
    lengths = [11, 8, 14]
    _, cache = jax.jit(lambda s, t: _prefill(graphdef, s, t, lengths, 32, False))(state, tokens[:, :16])
    active = jnp.asarray([True, False, True])
    nxt = jnp.asarray(tokens[np.arange(3), lengths])
    start, count = lengths[1], 5
    chunk_tokens = np.zeros((2, 8), np.int32)
    chunk_tokens[0, :count] = tokens[1, start:start + count]
    chunk = TokenBatch(jnp.asarray(chunk_tokens), jnp.asarray([count, 0]), jnp.asarray([start, 0]),
                       jnp.asarray([1, 3]),  # row 3 is past the cache's rows: the padding sequence
                       jnp.broadcast_to(jnp.arange(start, start + 8, dtype=jnp.float32), (1, 2, 8)),
                       bidirectional=jnp.asarray(chunk_tokens == 7))

    @jax.jit
    def run(state, cache):
        m = nnx.merge(graphdef, state)
        decode = one_token_batch(nxt, cache["length"][None].astype(jnp.float32), cache, active)
        h_dec, after_decode = m.forward(decode, cache)
        h_chunk, one_by_one = m.forward(chunk, after_decode)
        (p_dec, p_chunk), packed = m.forward((decode, chunk), cache)
        return (h_dec, h_chunk, one_by_one), (p_dec, p_chunk, packed)

    (h_dec, h_chunk, one_by_one), (p_dec, p_chunk, packed) = run(state, cache)
    # float32 in two summation orders (the products and attention run over other row counts; XLA's CPU products
    # sum in an order that depends on the shape): within 1e-5 of the largest value. Over 12 draws of the tokens the
    # largest difference was 2.5e-6 of it on a Xeon with AMX (0.3e-6 to 2.5e-6); a packing mistake (a token
    # attending to another row, a position off by one) moves values by a whole unit.
    for got, want in ((np.asarray(p_dec)[[0, 2]], np.asarray(h_dec)[[0, 2]]),
                      (np.asarray(p_chunk)[0, :count], np.asarray(h_chunk)[0, :count])):
        np.testing.assert_allclose(got, want, rtol=0, atol=PACKED_BOUND * np.abs(want).max())
    assert np.asarray(packed["length"]).tolist() == [12, start + count, 15] == \
        np.asarray(one_by_one["length"]).tolist()
    for a, b in zip(packed["k"] + packed["v"], one_by_one["k"] + one_by_one["v"]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0,
                                   atol=PACKED_BOUND * np.abs(np.asarray(b)).max())


RING_SPEC = DecoderSpec(VOCAB, HIDDEN, (  # a sliding window of whole pages: a paged ring that wraps
    LayerSpec(AttentionSpec(4, 2, 8, mask=MaskSpec("sliding", 128, media_bidirectional=True), qk_norm="rms"), DENSE),
    LayerSpec(WIDE, DENSE),
    LayerSpec(AttentionSpec(4, 2, 8, mask=MaskSpec("sliding", 128, media_bidirectional=True), qk_norm="rms",
                            kv_source=0), DENSE),
), norm_plus_one=True, final_logit_softcap=8.0)


@pytest.mark.parametrize("which, context", [("mixed", 256), ("mixed", 640), ("ring", 384)])
def test_a_paged_cache_gives_the_outputs_of_a_cache_of_rows(model, which, context):
    """The serving engine's paged cache (each layer whose cache spans whole pages holds a pool of pages, each row's
    slots in the pages its table names, in any order; the layers of a span share a table) gives the same outputs
    and lengths as a cache of rows: prompt chunks of two rows that cross a page boundary (and wrap a ring of one
    page), then decode steps of three rows, one of them idle (its tables name only the scratch pages, which it
    writes while nothing reads them). A cache of 256 slots is read whole, one of 640 a page at a time."""
    from omnijax.decoder.kv_cache import PAGE, init_cache, paged_entries, paged_spans
    from omnijax.decoder.model import TokenBatch

    if which == "mixed":
        spec, (graphdef, state) = SPEC, model
    else:
        spec = RING_SPEC
        graphdef, state = nnx.split(nnx.eval_shape(lambda: DecoderModel(spec, rngs=nnx.Rngs(0))))
        rng = np.random.default_rng(1)
        state = jax.tree.map(lambda x: jnp.asarray(rng.normal(0, 0.3, x.shape), x.dtype), state)
    spans = paged_spans(spec, context)
    rows_cache = init_cache(spec, 3, context)
    paged_cache = init_cache(spec, 3, context, pages=(12,) * len(spans))
    if which == "mixed":  # ring 5, ring 6 (not whole pages: rows), full, full
        assert spans == (context,) and paged_entries(spec, paged_cache) == (None, None, 0, 0)
    else:
        assert spans == (context, PAGE) and paged_entries(spec, paged_cache) == (1, 0)
    assert paged_cache["k"][-1].shape == (12, 1, 16, PAGE)
    tables = []
    for span in spans:
        table = np.full((3, span // PAGE), 11, np.int32)
        table[0, :2], table[1, :2] = ([7, 2], [0, 9]) if span > PAGE else ([4], [8])  # row 2 holds no page
        tables.append(jnp.asarray(table))
    paged_cache["pages"] = tuple(tables)
    rng = np.random.default_rng(6)
    tokens = rng.integers(8, VOCAB, (2, 160)).astype(np.int32)
    tokens[1, 30:34] = 7  # a media block
    count = np.asarray([150, 70], np.int32)
    chunk = TokenBatch(jnp.asarray(tokens), jnp.asarray(count), jnp.zeros(2, jnp.int32), jnp.asarray([0, 1]),
                       jnp.broadcast_to(jnp.arange(160, dtype=jnp.float32), (1, 2, 160)),
                       bidirectional=jnp.asarray(tokens == 7))
    nxt = jnp.asarray(rng.integers(8, VOCAB, (2, 3)).astype(np.int32))
    active = jnp.asarray([True, True, False])

    @jax.jit
    def run(state, cache):
        m = nnx.merge(graphdef, state)
        h, cache = m.forward(chunk, cache)
        outs = [m.last_logits(h, chunk.count)]
        for i in range(2):
            batch = one_token_batch(nxt[i], cache["length"][None].astype(jnp.float32), cache, active)
            h, cache = m.forward(batch, cache)
            outs.append(m.last_logits(h, batch.count)[:2])
        return outs, cache["length"]

    want, want_len = run(state, rows_cache)
    got, got_len = run(state, paged_cache)
    assert np.asarray(got_len).tolist() == np.asarray(want_len).tolist() == [152, 72, 0]
    for g, w in zip(got, want):  # the same products over other layouts: float32 summation order only
        g, w = np.asarray(g), np.asarray(w)
        np.testing.assert_allclose(g, w, rtol=0, atol=PACKED_BOUND * np.abs(w).max())
