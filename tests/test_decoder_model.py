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
from omnijax.decoder.model import DecoderModel, Prompt
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
    m = DecoderModel(SPEC, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(m)
    rng = np.random.default_rng(0)
    state = jax.tree.map(lambda x: jnp.asarray(rng.normal(0, 0.3, x.shape), x.dtype), state)  # nothing at init values
    return graphdef, state


def _prefill(graphdef, state, tokens, lengths, cache_len, all_logits):
    tokens = jnp.asarray(tokens)
    b, l = tokens.shape
    pos = jnp.broadcast_to(jnp.arange(l), (1, b, l))
    bidir = (tokens == 7) & (jnp.arange(l)[None] < jnp.asarray(lengths)[:, None])
    prompt = Prompt(tokens, jnp.asarray(lengths), pos, bidir, {})
    return nnx.merge(graphdef, state).prefill(prompt, cache_len=cache_len, cache_dtype=jnp.float32,
                                              all_logits=all_logits)


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

    step = jax.jit(lambda s, t, c: nnx.merge(graphdef, s).step(t, c["length"][None], c))
    for i in range(max(lengths) - min(start)):
        idx = np.minimum(np.array(start) + i, np.array(lengths) - 1)
        out, cache = step(state, jnp.asarray(tokens[np.arange(2), idx]), cache)
        for r in range(2):
            if start[r] + i < lengths[r]:
                np.testing.assert_allclose(np.asarray(out)[r], full[r, start[r] + i], atol=2e-5, rtol=1e-5,
                                           err_msg=f"row {r} position {start[r] + i}")
    assert np.asarray(cache["length"]).tolist() == [s + max(lengths) - min(start) for s in start]
