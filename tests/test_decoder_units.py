"""Small pure pieces of the decoder and the generation loop, each on its own."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from omnijax.app.generation import bucket_for, make_batch
from omnijax.preprocess.processor import PreparedPrompt
from omnijax.app.sampling import SamplingParams, choose
from omnijax.app.stops import StopChecker
from omnijax.decoder.attention_op import visible
from omnijax.decoder.embed import merge_media
from omnijax.decoder.model import block_ids
from omnijax.decoder.rope import apply_rotary, cos_sin
from omnijax.decoder.spec import MaskSpec, RopeSpec


def attention_mask(q_pos, k_pos, q_block, k_block, *, window, bidirectional):
    mask = MaskSpec("full" if window is None else "sliding", window, media_bidirectional=bidirectional)
    return visible(q_pos, k_pos, mask, q_block, k_block)


def reference_mask(q_pos, k_pos, q_block, k_block, window, bidirectional):
    """Element by element: AND(window, OR(causal, same block)) over valid tokens."""
    out = np.zeros((len(q_pos), len(k_pos)), bool)
    for i, q in enumerate(q_pos):
        for j, k in enumerate(k_pos):
            if q < 0 or k < 0:
                continue
            ok = k <= q or (bidirectional and q_block[i] >= 0 and q_block[i] == k_block[j])
            if window is not None:
                ok = ok and k > q - window
            out[i, j] = ok
    return out


@pytest.mark.parametrize("window", [None, 3, 5])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_attention_mask_matches_elementwise_definition(window, bidirectional):
    pos = np.array([-1, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8])
    media = np.array([0, 0, 0, 1, 1, 1, 1, 0, 1, 1, 0], bool)
    media[:2] = False
    blocks = np.asarray(block_ids(jnp.asarray(media[None])))[0]
    got = np.asarray(attention_mask(jnp.asarray(pos[None]), jnp.asarray(pos[None]), jnp.asarray(blocks[None]),
                                    jnp.asarray(blocks[None]), window=window, bidirectional=bidirectional))[0]
    np.testing.assert_array_equal(got, reference_mask(pos, pos, blocks, blocks, window, bidirectional))


def test_block_longer_than_window_keeps_later_block_keys_and_windows_earlier_ones():
    pos = np.arange(10)
    media = np.array([0, 1, 1, 1, 1, 1, 1, 1, 0, 0], bool)
    blocks = np.asarray(block_ids(jnp.asarray(media[None])))[0]
    m = np.asarray(attention_mask(jnp.asarray(pos[None]), jnp.asarray(pos[None]), jnp.asarray(blocks[None]),
                                  jnp.asarray(blocks[None]), window=3, bidirectional=True))[0]
    # the window bounds earlier keys only (k > q - W); every later key of the same block stays visible
    assert m[1, 3] and m[1, 4] and m[1, 7]
    assert not m[1, 8]  # a later text token
    assert m[7, 5] and not m[7, 4]  # earlier keys of the block: only inside the window


def test_block_ids_number_contiguous_runs():
    media = jnp.asarray([[0, 1, 1, 0, 1, 0, 1, 1], [1, 1, 0, 0, 0, 0, 0, 1]], bool)
    np.testing.assert_array_equal(np.asarray(block_ids(media)),
                                  [[-1, 0, 0, -1, 1, -1, 2, 2], [0, 0, -1, -1, -1, -1, -1, 1]])


def test_rope_linear_scaling_divides_frequencies():
    base = RopeSpec(theta=1e6).inverse_frequencies(16)
    scaled = RopeSpec(theta=1e6, kind="linear", factor=8.0).inverse_frequencies(16)
    np.testing.assert_allclose(scaled, base / 8.0, rtol=1e-7)
    assert base[0] == 1.0 and base.shape == (8,)
    with pytest.raises(ValueError, match="unknown RoPE kind"):
        RopeSpec(kind="mystery")


def test_rope_rotation_preserves_norm_and_relative_positions():

    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((1, 1, 1, 8)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((1, 1, 1, 8)), jnp.float32)

    def rot(x, p):
        c, s = cos_sin(jnp.asarray([[[p]]]), RopeSpec(theta=100.0), 8)
        return apply_rotary(x, c, s)

    np.testing.assert_allclose(jnp.linalg.norm(rot(q, 7)), jnp.linalg.norm(q), rtol=1e-5)
    d1 = float(jnp.sum(rot(q, 5) * rot(k, 2)))
    d2 = float(jnp.sum(rot(q, 13) * rot(k, 10)))
    assert abs(d1 - d2) < 1e-4


def test_merge_media_puts_rows_in_placeholder_order_across_the_batch():
    x = jnp.zeros((2, 4, 3))
    ph = jnp.asarray([[0, 1, 1, 0], [1, 0, 0, 1]], bool)
    feats = jnp.arange(1, 6 * 3 + 1, dtype=jnp.float32).reshape(6, 3)  # rows 4, 5 are bucket padding
    out = np.asarray(merge_media(x, ph, feats))
    np.testing.assert_array_equal(out[0, 1], feats[0]); np.testing.assert_array_equal(out[0, 2], feats[1])
    np.testing.assert_array_equal(out[1, 0], feats[2]); np.testing.assert_array_equal(out[1, 3], feats[3])
    assert (out[0, 0] == 0).all() and (out[1, 1] == 0).all()


@pytest.mark.slow
def test_greedy_and_filters():
    logits = jnp.asarray([[0.0, 3.0, 1.0, 2.0]] * 2)
    assert choose(logits, jax.random.key(0), SamplingParams().values(), SamplingParams().mode()).tolist() == [1, 1]

    def picks(params: SamplingParams, draws: int) -> set[int]:
        """The first row's token for seeds 0 .. draws - 1 (one compiled program for all the draws)."""
        draw = jax.jit(jax.vmap(lambda key: choose(logits, key, params.values(), params.mode())[0]))
        return set(np.asarray(draw(jax.vmap(jax.random.key)(jnp.arange(draws)))).tolist())

    assert picks(SamplingParams(temperature=1.0, top_k=1), 20) == {1}
    assert picks(SamplingParams(temperature=5.0, top_k=2), 60) == {1, 3}
    assert picks(SamplingParams(temperature=1.0, top_p=0.5), 30) == {1}  # p(1) = 0.64 > 0.5 -> only token 1
    assert picks(SamplingParams(temperature=1.0, top_p=0.9), 200) == {1, 2, 3}


@pytest.mark.parametrize("kwargs", [dict(temperature=-1), dict(top_k=-2), dict(top_p=0.0), dict(top_p=1.5)])
def test_sampling_params_validate(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_buckets_and_batch_padding():
    assert bucket_for(1, (64, 128)) == 64 and bucket_for(65, (64, 128)) == 128 and bucket_for(300, (64, 128)) == 300
    a = PreparedPrompt(np.array([5, 6, 7], np.int32), {"image": [np.ones((3, 2, 2))]}, np.array([0, 1, 0], bool))
    b = PreparedPrompt(np.array([8], np.int32), {}, np.array([0], bool))
    batch = make_batch([a, b], 4, pad_id=0)
    np.testing.assert_array_equal(batch.tokens, [[5, 6, 7, 0], [8, 0, 0, 0]])  # right-padded: row index = position
    np.testing.assert_array_equal(batch.lengths, [3, 1])
    np.testing.assert_array_equal(batch.bidirectional[0], [0, 1, 0, 0])
    assert len(batch.media["image"]) == 1
    np.testing.assert_array_equal(batch.rope_pos[0], [[0, 1, 2, 0], [0, 0, 0, 0]])


def test_stop_checker_finds_the_earliest_stop_across_pieces():
    c = StopChecker(["o w"])
    assert [c.push(p) for p in ("Hel", "lo", " wor")] == [None, None, 4]  # "Hello wor": "o w" starts at 4
    c = StopChecker(["abc", "b"])
    assert c.push("xab") == 2 and StopChecker(["abc", "b"]).push("abc") == 0
    assert StopChecker(None).push("anything") is None
    c = StopChecker(["abcdefgh", "zz"])  # pieces much shorter than the stop string
    assert [c.push(ch) for ch in "xyabcdefgh"] == [None] * 9 + [2]


def test_stop_checker_holds_back_possible_stop_prefixes():
    c = StopChecker(["END", "xyz"])
    c.push("abc EN")
    assert c.held() == 2
    c = StopChecker(["END", "xyz"])
    c.push("abc x")
    assert c.held() == 1
    c = StopChecker(["END", "xyz"])
    c.push("abc")
    assert c.held() == 0
    c = StopChecker(None)
    c.push("abc E")
    assert c.held() == 0


def test_attention_over_two_key_segments_equals_one_concatenated_segment():
    from omnijax.decoder.attention_op import dot_attention

    rng = np.random.default_rng(0)
    b, l, n, kv, h, s1, s2 = 2, 3, 4, 2, 8, 5, 3
    q = jnp.asarray(rng.normal(size=(b, l, n, h)), jnp.float32)
    k1, v1 = (jnp.asarray(rng.normal(size=(b, kv, s1, h)), jnp.float32) for _ in range(2))
    k2, v2 = (jnp.asarray(rng.normal(size=(b, kv, s2, h)), jnp.float32) for _ in range(2))
    m1 = jnp.asarray(rng.random((b, l, s1)) < 0.6)
    m2 = jnp.asarray(np.tril(np.ones((l, s2), bool), 0)[None].repeat(b, 0))
    t = lambda k_BKSH: k_BKSH.transpose(0, 1, 3, 2)  # keys as the cache holds them: [B, K, H, S]
    split = dot_attention(q, [(t(k1), v1, m1), (k2, v2, m2)], scale=0.3, softcap=5.0, keys_transposed=True)
    joined = dot_attention(q, [(jnp.concatenate([k1, k2], 2), jnp.concatenate([v1, v2], 2),
                                jnp.concatenate([m1, m2], 2))], scale=0.3, softcap=5.0)
    np.testing.assert_allclose(np.asarray(split), np.asarray(joined), rtol=1e-5, atol=1e-6)
    # and the reference softmax attention, head by head
    qn, kn, vn, mn = (np.asarray(x) for x in (q, jnp.concatenate([k1, k2], 2), jnp.concatenate([v1, v2], 2),
                                              jnp.concatenate([m1, m2], 2)))
    for i in range(n):
        sc = np.einsum("blh,bsh->bls", qn[:, :, i] * 0.3, kn[:, i // (n // kv)])
        sc = np.where(mn, np.tanh(sc / 5.0) * 5.0, -np.inf)
        p = np.exp(sc - sc.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        ref = np.einsum("bls,bsh->blh", p, vn[:, i // (n // kv)])
        np.testing.assert_allclose(np.asarray(split)[:, :, i], ref, rtol=1e-5, atol=1e-6)


def test_after_keeps_the_value():
    from omnijax.decoder.kv_cache import after

    x = jnp.arange(12.0).reshape(3, 4)
    for dep in (jnp.float32(-7.5), jnp.float32(np.inf), jnp.float32(0.0), jnp.full((3, 1), 2.0)):
        np.testing.assert_array_equal(np.asarray(after(x, dep)), np.asarray(x))


def reference_attention(q, k, v, vis, scale):
    """Softmax attention head by head in numpy: q [B, L, N, H], k, v [B, S, K, H], vis [B, L, S]."""
    n, kv = q.shape[2], k.shape[2]
    out = np.zeros(q.shape, np.float64)
    for i in range(n):
        sc = np.einsum("blh,bsh->bls", q[:, :, i].astype(np.float64) * scale, k[:, :, i // (n // kv)])
        sc = np.where(vis, sc, -np.inf)
        top = np.where(vis.any(-1, keepdims=True), sc.max(-1, keepdims=True), 0)  # rows seeing nothing: padding
        p = np.exp(sc - top)
        out[:, :, i] = np.einsum("bls,bsh->blh", p / np.maximum(p.sum(-1, keepdims=True), 1e-30),
                                 v[:, :, i // (n // kv)])
    return out


@pytest.mark.parametrize("mask", [MaskSpec(), MaskSpec("full", None, True), MaskSpec("sliding", 40, True),
                                  MaskSpec("sliding", 7), MaskSpec("chunked", 96), MaskSpec("chunked", 50, True)])
def test_blocked_prompt_attention_equals_the_reference(mask):
    """The looped block backend (query blocks x the key blocks any query can see), the single-block backend and the
    fused one (``jax.nn.dot_product_attention``, chosen on GPU/TPU; XLA's own lowering on CPU) all equal plain
    masked softmax attention, with media blocks crossing block boundaries and padded rows."""
    from omnijax.decoder.attention_op import prompt_attention
    from omnijax.decoder.model import prompt_meta

    rng = np.random.default_rng(0)
    b, l, n, kv, h = 2, 300, 4, 2, 8
    lengths = np.array([300, 211])
    media = np.zeros((b, l), bool)
    for row, starts in enumerate(([120, 250], [60, 127])):
        for s0 in starts:
            media[row, s0:s0 + 16] = True
    q = rng.normal(size=(b, l, n, h)).astype(np.float32)
    k, v = (rng.normal(size=(b, l, kv, h)).astype(np.float32) for _ in range(2))
    meta = prompt_meta(jnp.asarray(lengths), jnp.asarray(media))
    pos, blk = np.asarray(meta.pos), np.asarray(meta.block)
    vis = np.stack([reference_mask(pos[r], pos[r], blk[r], blk[r], mask.size if mask.kind == "sliding" else None,
                                   mask.media_bidirectional) for r in range(b)])
    if mask.kind == "chunked":
        vis &= (pos[:, :, None] // mask.size) == (pos[:, None, :] // mask.size)
    ref = reference_attention(q, k, v, vis, 0.3)
    for backend in ("blocked", "dense", "fused"):
        run = jax.jit(lambda q_, k_, v_, m_: prompt_attention(q_, k_, v_, m_, mask, scale=0.3, backend=backend))
        got = np.asarray(run(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), meta))
        for r in range(b):
            np.testing.assert_allclose(got[r, :lengths[r]], ref[r, :lengths[r]], rtol=2e-5, atol=2e-5)


def test_ring_cache_keeps_each_rows_last_positions():
    from omnijax.decoder.kv_cache import fill_from_prompt, slot_positions, write_tokens

    np.testing.assert_array_equal(np.asarray(slot_positions(jnp.asarray([0, 3, 5, 9]), 4)),
                                  [[-1, -1, -1, -1], [0, 1, 2, -1], [4, 1, 2, 3], [8, 5, 6, 7]])
    b, l, kv, h, slots = 2, 9, 1, 2, 4
    k = jnp.asarray(np.arange(b * l * kv * h, dtype=np.float32).reshape(b, l, kv, h))
    lengths = jnp.asarray([9, 5])
    ck, cv = fill_from_prompt(k, k + 1000, lengths, slots, jnp.float32)
    held = np.asarray(slot_positions(lengths, slots))
    for r in range(b):
        for s0 in range(slots):
            np.testing.assert_array_equal(np.asarray(ck)[r, 0, :, s0], np.asarray(k)[r, held[r, s0], 0])
            np.testing.assert_array_equal(np.asarray(cv)[r, 0, s0], np.asarray(k)[r, held[r, s0], 0] + 1000)
    new = jnp.full((b, 1, kv, h), -1.0)
    one = jnp.ones((b,), jnp.int32)
    ck2, cv2 = write_tokens(ck, cv, None, new, new, lengths, one)  # rows write their own slots: 9 % 4 = 1, 5 % 4 = 1
    assert (np.asarray(ck2)[:, 0, :, 1] == -1).all() and (np.asarray(cv2)[:, 0, 1] == -1).all()
    np.testing.assert_array_equal(np.asarray(ck2)[:, :, :, [0, 2, 3]], np.asarray(ck)[:, :, :, [0, 2, 3]])
    ck3, _ = write_tokens(ck, cv, None, new, new, jnp.asarray([9, 6]), one)
    assert (np.asarray(ck3)[0, 0, :, 1] == -1).all() and (np.asarray(ck3)[1, 0, :, 2] == -1).all()
    # a chunk of 6 tokens (token i at position 5 + i) into row 1 after its 5: a ring of 4 keeps positions 7..10
    # (tokens 2..5), each in slot p % 4; the padding (tokens 6, 7) is dropped
    chunk = jnp.asarray(np.arange(8, dtype=np.float32).reshape(1, 8, 1, 1) * np.ones((1, 1, kv, h)) + 100)
    ck4, _ = write_tokens(ck, cv, jnp.asarray([1]), chunk, chunk, jnp.asarray([5]), jnp.asarray([6]))
    np.testing.assert_array_equal(np.asarray(ck4)[1, 0, 0], [103, 104, 105, 102])
    np.testing.assert_array_equal(np.asarray(ck4)[0], np.asarray(ck)[0])


def test_prompt_meta_reach_is_the_end_of_each_media_block():
    from omnijax.decoder.model import prompt_meta

    media = jnp.asarray([[0, 1, 1, 1, 0, 1, 1, 0, 0]], bool)
    meta = prompt_meta(jnp.asarray([8]), media)
    np.testing.assert_array_equal(np.asarray(meta.pos), [[0, 1, 2, 3, 4, 5, 6, 7, -1]])
    np.testing.assert_array_equal(np.asarray(meta.block), [[-1, 0, 0, 0, -1, 1, 1, -1, -1]])
    np.testing.assert_array_equal(np.asarray(meta.reach), [[0, 3, 3, 3, 4, 6, 6, 7, -1]])


def test_llama3_and_proportional_rope_frequencies_match_their_definitions():
    import math

    base = RopeSpec(theta=500000.0).inverse_frequencies(64)
    ll = RopeSpec(theta=500000.0, kind="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                  original_max_position=8192).inverse_frequencies(64)
    wavelen = 2 * math.pi / base
    assert np.allclose(ll[wavelen < 8192 / 4], base[wavelen < 8192 / 4])  # short wavelengths kept
    assert np.allclose(ll[wavelen > 8192], base[wavelen > 8192] / 8.0)  # long ones divided by the factor
    mid = (wavelen >= 2048) & (wavelen <= 8192)
    smooth = (8192 / wavelen[mid] - 1.0) / 3.0
    assert np.allclose(ll[mid], (1 - smooth) * base[mid] / 8 + smooth * base[mid], rtol=1e-6)
    prop = RopeSpec(theta=10000.0, kind="proportional", fraction=0.25).inverse_frequencies(16)
    np.testing.assert_allclose(prop[:2], 1.0 / 10000.0 ** (np.arange(0, 4, 2) / 16), rtol=1e-6)
    assert (prop[2:] == 0).all() and prop.shape == (8,)


def test_interleaved_rotation_rotates_pairs_as_complex_numbers():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(1, 1, 1, 8)).astype(np.float32)
    rope = RopeSpec(theta=100.0, interleaved=True)
    c, s = cos_sin(jnp.asarray([[[3]]]), rope, 8)
    got = np.asarray(apply_rotary(jnp.asarray(x), c, s, interleaved=True))[0, 0, 0]
    z = (x[0, 0, 0, 0::2] + 1j * x[0, 0, 0, 1::2]) * np.exp(1j * 3 * rope.inverse_frequencies(8))
    np.testing.assert_allclose(got[0::2], z.real, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1::2], z.imag, rtol=1e-5, atol=1e-6)


def test_embedding_substitutes_read_their_substitute_row_and_out_of_table_ids_row_zero():
    from flax import nnx

    from omnijax.decoder.embed import Embedder

    emb = Embedder(6, 3, embed_scale=2.0, substitutes=((4, 1), (5, 1)), rngs=nnx.Rngs(0))
    table = np.arange(18, dtype=np.float32).reshape(6, 3)
    emb.embedding[...] = jnp.asarray(table)
    x = np.asarray(emb.encode(jnp.asarray([[0, 4, 5, 2, 9]])))
    np.testing.assert_array_equal(x[0], 2.0 * table[[0, 1, 1, 2, 0]])


def test_loaded_scalar_parameters_stay_scalars(tmp_path):
    import safetensors.numpy

    from omnijax.app.checkpoint import TensorIndex, load_params
    from omnijax.common.sharding import make_mesh
    from omnijax.common.weights import plain

    safetensors.numpy.save_file({"s": np.asarray(0.5, np.float32), "v": np.ones(3, np.float32)},
                                str(tmp_path / "model.safetensors"))
    params = load_params(TensorIndex(tmp_path), {("s",): ((), ()), ("v",): ((3,), (None,))},
                         {("s",): plain("s"), ("v",): plain("v")}, dtype="float32",
                         mesh=make_mesh(1, jax.devices()[:1]))
    assert params["s"].shape == () and float(params["s"]) == 0.5 and params["v"].shape == (3,)


def test_the_attention_backend_is_read_once_from_the_environment():
    from omnijax.app.generation import attention_backend
    from omnijax.decoder.attention_op import backend_for

    assert attention_backend({}) == "auto" and attention_backend({"OMNIJAX_ATTENTION": "dense"}) == "dense"
    with pytest.raises(ValueError, match="OMNIJAX_ATTENTION='flash'"):
        attention_backend({"OMNIJAX_ATTENTION": "flash"})
    assert backend_for(10_000, "dense") == "dense" and backend_for(10, "blocked") == "blocked"
    with pytest.raises(ValueError, match="unknown attention backend"):
        backend_for(10, "flash")


def test_a_spec_naming_an_unknown_part_is_refused_by_name():
    from flax import nnx

    from omnijax.decoder.gemma4.block import Gemma4Block, Gemma4BlockOptions
    from omnijax.decoder.model import DecoderModel
    from omnijax.decoder.parts import BUILTIN_PARTS
    from omnijax.decoder.spec import AttentionSpec, DecoderSpec, FeedForwardSpec, LayerSpec

    attention = AttentionSpec(4, 2, 8)
    dense = FeedForwardSpec("dense", 16)
    gemma4 = DecoderSpec(50, 32, (LayerSpec(attention, dense, block="gemma4", options=Gemma4BlockOptions()),))
    with pytest.raises(ValueError, match=r"layer 0: unknown block 'gemma4'; known: \['pre_norm', 'sandwich'\]"):
        DecoderModel(gemma4, rngs=nnx.Rngs(0))
    parts = BUILTIN_PARTS.extended(blocks={"gemma4": Gemma4Block})
    assert nnx.eval_shape(lambda: DecoderModel(gemma4, parts=parts, rngs=nnx.Rngs(0))).layers[0].layer_scalar.shape == (1,)
    routed = DecoderSpec(50, 32, (LayerSpec(attention, FeedForwardSpec("moe", 16, num_experts=4, top_k=1,
                                                                        router="nope")),))
    with pytest.raises(ValueError, match="unknown router 'nope'"):
        DecoderModel(routed, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="already taken"):
        BUILTIN_PARTS.extended(blocks={"sandwich": Gemma4Block})


def test_block_options_are_typed_and_hashable():
    from omnijax.decoder.gemma4.block import Gemma4BlockOptions
    from omnijax.decoder.spec import AttentionSpec, FeedForwardSpec, LayerInputsSpec, LayerSpec

    moe = FeedForwardSpec("moe", 8, num_experts=4, top_k=2, router="gemma4")
    layer = LayerSpec(AttentionSpec(4, 2, 8), FeedForwardSpec("dense", 16), block="gemma4",
                      options=Gemma4BlockOptions(moe=moe, layer_input_width=4))
    assert hash(layer) == hash(LayerSpec(layer.attention, layer.ffn, block="gemma4",
                                         options=Gemma4BlockOptions(moe=moe, layer_input_width=4)))
    with pytest.raises(TypeError, match="frozen dataclass"):
        LayerSpec(layer.attention, layer.ffn, options=(("moe", moe),))
    with pytest.raises(TypeError, match="frozen dataclass"):
        LayerInputsSpec("gemma4", {"width": 4})


def test_the_family_registry_is_built_from_one_list():
    from omnijax.app.families import FAMILIES, GGUF_ARCHITECTURES, MODEL_TYPES, family_for_config, gguf_arch_for
    from omnijax.common.errors import UnsupportedModelError

    assert sorted(MODEL_TYPES) == sorted(t for f in FAMILIES for t in f.model_types)
    for family in FAMILIES:
        for model_type in family.model_types:
            assert family_for_config({"model_type": model_type}) is family
    assert GGUF_ARCHITECTURES == {f.gguf.architecture: f.gguf for f in FAMILIES if f.gguf is not None}
    assert gguf_arch_for("gemma3").architecture == "gemma3"
    with pytest.raises(UnsupportedModelError, match="'llama'"):
        gguf_arch_for("llama")
    with pytest.raises(UnsupportedModelError, match="'bert'"):
        family_for_config({"model_type": "bert"})
