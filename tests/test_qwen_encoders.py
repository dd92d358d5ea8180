"""Parity of the Qwen3-Omni image encoder (vision tower with deepstack features) and audio encoder against Hugging
Face on tiny random configs, through the host-side ``collate`` (preprocess/qwen3_omni) + jitted ``__call__``
(several items of different sizes per batch; new sizes inside a bucket compile nothing; padding never reaches a
valid row; oversized items are refused on the host), plus the host-side helpers (interpolation taps, RoPE positions, chunking, attention windows)
against the reference's own functions, and the weight maps against a saved checkpoint's keys."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest
import safetensors
import torch
from flax import nnx
from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf_qwen
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (Qwen3OmniMoeAudioEncoderConfig,
                                                                           Qwen3OmniMoeVisionEncoderConfig)
from transformers.vision_utils import (get_vision_cu_seqlens, get_vision_interpolation_indices_and_weights,
                                       get_vision_position_ids)

from omnijax.common.errors import MediaError
from omnijax.common.weights import prefixed
from omnijax.app.families.qwen3_omni.spec import audio_input, vision_input
from omnijax.encoders.attention import attention
from omnijax.encoders.qwen3_omni.audio import QwenAudioConfig, QwenAudioTower, qwen_audio_weight_map
from omnijax.encoders.qwen3_omni.audio_encoder import QwenAudioEncoder
from omnijax.encoders.qwen3_omni.image_encoder import QwenImageEncoder
from omnijax.encoders.qwen3_omni.vision import QwenVisionConfig, QwenVisionTower, qwen_vision_weight_map
from omnijax.encoders.rope_2d import rope_2d_angles, rope_2d_cos_sin
from omnijax.preprocess.qwen3_omni import audio_batch, image_batch
from omnijax.preprocess.qwen3_omni.audio_batch import audio_attention_seqlens, audio_chunk_lengths, audio_windows
from omnijax.preprocess.qwen3_omni.image_batch import (frame_token_buckets, vision_pos_interpolation,
                                                       vision_rope_positions, vision_segments, vision_token_count)
from omnijax.preprocess.qwen3_omni.mrope import audio_tokens_from_frames as audio_output_length

pytestmark = pytest.mark.reference

VISION = dict(depth=3, hidden_size=32, hidden_act="gelu_pytorch_tanh", intermediate_size=48, num_heads=4,
              in_channels=3, patch_size=4, temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=48,
              num_position_embeddings=36, deepstack_visual_indexes=[0, 1])
# n_window must stay 50: the reference's per-chunk token count hard-codes 13 tokens per 100-frame chunk.
# n_window_infer 200 -> attention windows of 26 tokens (2 chunks), so a 350-frame clip has windows [26, 20].
AUDIO = dict(num_mel_bins=16, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=48, d_model=32,
             output_dim=48, n_window=50, n_window_infer=200, downsample_hidden_size=8, max_source_positions=64,
             activation_function="gelu")
VISION_PREFIX = "thinker.visual."
AUDIO_PREFIX = "thinker.audio_tower."
MAX_PIXELS = 64 * 64  # with patch 4 and merge 2: frames of at most 256 patches (64 tokens)
MAX_FRAMES = 1000

from fixtures.module_parity import assert_close, flat_paths, load_module


# ---------------------------------------------------------------------------------------------------------------
# helpers


def _randomise(module: torch.nn.Module, seed: int) -> None:
    """Overwrite every parameter: 1-D norm weights ~ 1 + N(0, 0.3), everything else ~ N(0, 0.2)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.3 * noise if ("norm" in name or "ln_" in name) and name.endswith("weight")
                    else 0.2 * noise)


def _state_dict_np(module: torch.nn.Module, prefix: str) -> dict[str, np.ndarray]:
    return {prefix + k: v.detach().float().numpy() for k, v in module.state_dict().items()}


class _Encoder:
    """One loaded encoder wrapper: ``collate`` on the host (preprocess/qwen3_omni) and one jitted ``__call__`` shared
    by the module's tests (its cache size counts the programs compiled)."""

    def __init__(self, make_module, collate, weight_map, tensors):
        self.graphdef, self.params = load_module(make_module, weight_map, tensors)
        self.jitted = jax.jit(lambda p, inputs: nnx.merge(self.graphdef, p)(inputs))
        self.collate = collate

    def run(self, inputs: dict):
        """Raw output (features, valid, extras) of one collated batch, as numpy."""
        return jax.tree.map(np.asarray, self.jitted(self.params, inputs))

    def __call__(self, items):
        """(features [valid rows, D], [extra map [valid rows, D], ...]) of a batch of items."""
        features, valid, extras = self.run(self.collate(items))
        return features[valid], [e[valid] for e in extras]


@pytest.fixture(scope="module")
def vision():
    """(reference tower, our image encoder, config)."""
    hf_cfg = Qwen3OmniMoeVisionEncoderConfig(**VISION)
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    ref = hf_qwen.Qwen3OmniMoeVisionEncoder(hf_cfg).eval()
    _randomise(ref, seed=1)
    cfg = QwenVisionConfig.from_hf(hf_cfg.to_dict())
    encoder = _Encoder(lambda: QwenImageEncoder(cfg, rngs=nnx.Rngs(0)),
                       functools.partial(image_batch.collate, vision=vision_input(cfg), max_pixels=MAX_PIXELS),
                       prefixed(qwen_vision_weight_map(cfg, VISION_PREFIX), ("tower",)),
                       _state_dict_np(ref, VISION_PREFIX))
    return ref, encoder, cfg


@pytest.fixture(scope="module")
def audio():
    hf_cfg = Qwen3OmniMoeAudioEncoderConfig(**AUDIO)
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    ref = hf_qwen.Qwen3OmniMoeAudioEncoder(hf_cfg).eval()
    _randomise(ref, seed=2)
    cfg = QwenAudioConfig.from_hf(hf_cfg.to_dict())
    encoder = _Encoder(lambda: QwenAudioEncoder(cfg, rngs=nnx.Rngs(0)),
                       functools.partial(audio_batch.collate, audio=audio_input(cfg), max_frames=MAX_FRAMES),
                       prefixed(qwen_audio_weight_map(cfg, AUDIO_PREFIX), ("tower",)),
                       _state_dict_np(ref, AUDIO_PREFIX))
    return ref, encoder, cfg


def _patches(grid, cfg: QwenVisionConfig, seed: int) -> np.ndarray:
    n = sum(t * h * w for t, h, w in grid)
    return np.random.default_rng(seed).normal(size=(n, cfg.patch_dim)).astype(np.float32)


def _image_items(grid, patches: np.ndarray) -> list[dict]:
    """The processor's per-image items for packed ``patches`` of the images ``grid``."""
    starts = np.cumsum([0] + [t * h * w for t, h, w in grid])
    return [{"patches": patches[starts[i]:starts[i + 1]], "grid": g} for i, g in enumerate(grid)]


def _hf_vision(ref, patches: np.ndarray, grid):
    with torch.no_grad():
        return ref(hidden_states=torch.from_numpy(patches), grid_thw=torch.tensor(grid))


# ---------------------------------------------------------------------------------------------------------------
# vision


@pytest.mark.parametrize("grid", [
    ((1, 4, 6),),                       # one image, non-square grid (interpolation differs per axis)
    ((1, 4, 6), (1, 8, 4)),             # two images of different grids
    ((2, 4, 4), (1, 6, 6), (1, 4, 4)),  # a two-frame entry (attention per frame) and two same-size segments
])
def test_vision_tower_matches_hf(vision, grid):
    ref, encoder, cfg = vision
    patches = _patches(grid, cfg, seed=len(grid))
    out = _hf_vision(ref, patches, grid)
    embeds, deep = encoder(_image_items(grid, patches))
    assert embeds.shape == (vision_token_count(grid, 2), cfg.out_hidden_size)
    rel = assert_close(embeds, out.pooler_output.numpy())
    assert len(deep) == len(out.deepstack_features) == len(cfg.deepstack_visual_indexes)
    for ours, theirs in zip(deep, out.deepstack_features):
        rel = max(rel, assert_close(ours, theirs.numpy()))
    print(f"vision {grid}: rel err {rel:.2e}")


def test_vision_images_do_not_attend_to_each_other(vision):
    """Each image's embeddings are the same alone and next to another image (in other blocks, longer blocks)."""
    _, encoder, cfg = vision
    a, b = ((1, 4, 6),), ((1, 8, 8),)
    pa, pb = _patches(a, cfg, seed=7), _patches(b, cfg, seed=8)
    alone_a, deep_a = encoder(_image_items(a, pa))
    alone_b, _ = encoder(_image_items(b, pb))
    both, deep_both = encoder(_image_items(a + b, np.concatenate([pa, pb])))
    n_a = alone_a.shape[0]
    np.testing.assert_allclose(both[:n_a], alone_a, rtol=0, atol=1e-5)
    np.testing.assert_allclose(both[n_a:], alone_b, rtol=0, atol=1e-5)
    np.testing.assert_allclose(deep_both[1][:n_a], deep_a[1], rtol=0, atol=1e-5)


def test_vision_new_sizes_in_a_bucket_compile_nothing(vision):
    """Three images of different grids (20, 22 and 24 tokens: one 24-token bucket) each match the reference; only
    the first compiles."""
    ref, encoder, cfg = vision
    shapes = []
    for i, grid in enumerate((((1, 8, 10),), ((1, 4, 22),), ((1, 12, 8),))):
        patches = _patches(grid, cfg, seed=20 + i)
        inputs = encoder.collate(_image_items(grid, patches))
        shapes.append({k: v.shape for k, v in inputs.items()})
        features, valid, extras = encoder.run(inputs)
        if i == 0:
            compiled = encoder.jitted._cache_size()
        out = _hf_vision(ref, patches, grid)
        assert_close(features[valid], out.pooler_output.numpy())
        for ours, theirs in zip(extras, out.deepstack_features):
            assert_close(ours[valid], theirs.numpy())
    assert shapes[0] == shapes[1] == shapes[2]
    assert shapes[0]["patches"] == (1, 24 * 4, cfg.patch_dim)
    assert encoder.jitted._cache_size() == compiled


def test_vision_padding_never_reaches_valid_rows(vision):
    """NaN and random junk in every padding slot (patches, position taps, RoPE positions) leave the valid rows
    bit for bit unchanged."""
    _, encoder, cfg = vision
    grid = ((1, 4, 6), (2, 4, 4))
    inputs = encoder.collate(_image_items(grid, _patches(grid, cfg, seed=9)))
    pad = ~inputs["patch_valid"]
    assert pad.sum() > 0 and inputs["patch_valid"].shape[0] == 4  # 3 frames in 4 blocks
    rng = np.random.default_rng(0)
    junk = {k: v.copy() for k, v in inputs.items()}
    junk["patches"][pad] = rng.normal(size=junk["patches"][pad].shape) * 1e3
    junk["patches"][pad, 0] = np.nan
    junk["pos_index"][pad] = rng.integers(0, cfg.num_position_embeddings, junk["pos_index"][pad].shape)
    junk["pos_weight"][pad] = rng.normal(size=junk["pos_weight"][pad].shape)
    junk["rope_pos"][pad] = rng.integers(0, 50, junk["rope_pos"][pad].shape)
    clean, dirty = encoder.run(inputs), encoder.run(junk)
    valid = clean[1]
    np.testing.assert_array_equal(dirty[1], valid)
    np.testing.assert_array_equal(dirty[0][valid], clean[0][valid])
    for a, b in zip(dirty[2], clean[2]):
        np.testing.assert_array_equal(a[valid], b[valid])


def test_vision_collate_buckets_and_refuses_oversized_frames(vision):
    _, encoder, cfg = vision
    compiled = encoder.jitted._cache_size()
    buckets = frame_token_buckets(vision_input(cfg), MAX_PIXELS)
    assert buckets == (16, 24, 32, 48, 64)  # 256 patches / 4 = 64 tokens at most
    inputs = encoder.collate(_image_items(((1, 16, 16),), _patches(((1, 16, 16),), cfg, 0)))  # the largest frame
    assert inputs["patches"].shape == (1, 256, cfg.patch_dim)
    three = ((1, 4, 4), (1, 8, 8), (1, 4, 4))
    inputs = encoder.collate(_image_items(three, _patches(three, cfg, 0)))
    assert inputs["patch_valid"].shape == (4, 16 * 4)
    assert inputs["patch_valid"].sum(axis=1).tolist() == [16, 64, 16, 0]
    with pytest.raises(MediaError, match=r"image 1: a 16x20-patch frame \(320 patches\) is larger than the 256"):
        encoder.collate(_image_items(((1, 4, 4), (1, 16, 20)), _patches(((1, 4, 4), (1, 16, 20)), cfg, 0)))
    with pytest.raises(MediaError, match="image 0: expected patches"):
        encoder.collate([{"patches": np.zeros((15, cfg.patch_dim)), "grid": (1, 4, 4)}])
    with pytest.raises(MediaError, match="image 0: bad patch grid.*multiples of spatial_merge_size"):
        encoder.collate([{"patches": np.zeros((15, cfg.patch_dim)), "grid": (1, 3, 5)}])
    assert encoder.jitted._cache_size() == compiled  # collate alone never reaches the device program


def test_vision_static_helpers_match_reference():
    grid = ((1, 4, 6), (2, 8, 4), (1, 2, 2), (1, 10, 14))
    g = torch.tensor(grid)
    for side in (6, 48):
        idx, wts = vision_pos_interpolation(grid, side, 2)
        ref_idx, ref_wts = get_vision_interpolation_indices_and_weights(
            g, num_grid_per_side=side, mode="bilinear", align_corners=True, spatial_merge_size=2)
        np.testing.assert_array_equal(idx, ref_idx.numpy())
        np.testing.assert_array_equal(wts, ref_wts.numpy())  # bitwise: same float32 operation order
    np.testing.assert_array_equal(vision_rope_positions(grid, 2), get_vision_position_ids(g, 2).numpy())
    np.testing.assert_array_equal(np.cumsum((0,) + vision_segments(grid)), get_vision_cu_seqlens(g).numpy())
    assert vision_token_count(grid, 2) == (24 + 64 + 4 + 140) // 4


def test_vision_rope_matches_reference(vision):
    ref, _, cfg = vision
    pos = vision_rope_positions(((1, 6, 8),), 2)
    cos, sin = rope_2d_cos_sin(rope_2d_angles(pos, cfg.head_dim, cfg.rope_theta))
    ref_cos, ref_sin = ref.rotary_pos_emb(torch.zeros(1), torch.from_numpy(pos).long())
    np.testing.assert_allclose(np.asarray(cos), ref_cos.numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.asarray(sin), ref_sin.numpy(), rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# audio


def _audio_items(lengths, cfg: QwenAudioConfig, seed: int) -> tuple[np.ndarray, list[dict]]:
    """(packed features [n_mels, sum(lengths)], the processor's per-clip items)."""
    feats = np.random.default_rng(seed).normal(size=(cfg.num_mel_bins, sum(lengths))).astype(np.float32)
    starts = np.cumsum((0,) + tuple(lengths))
    return feats, [{"features": feats[:, starts[i]:starts[i + 1]]} for i in range(len(lengths))]


def _hf_audio(ref, feats: np.ndarray, lengths) -> np.ndarray:
    with torch.no_grad():
        return ref(input_features=torch.from_numpy(feats), feature_lens=torch.tensor(lengths)).last_hidden_state.numpy()


@pytest.mark.parametrize("lengths", [
    (350,),          # 4 chunks (100, 100, 100, 50) -> 46 tokens, windows [26, 20]
    (350, 120),      # two clips of different lengths: windows [26, 20] and [16]
    (70,),           # a lone short clip: chunks padded to 70 frames only, 9-token chunks, 18-token windows
    (200, 30, 260),  # an exact multiple of 100 frames, a tiny clip, windows [26], [4], [26, 8]
    (70, 45),        # short clips only: the reference pads both to 70 frames
])
def test_audio_tower_matches_hf(audio, lengths):
    ref, encoder, cfg = audio
    feats, items = _audio_items(lengths, cfg, seed=sum(lengths))
    out = _hf_audio(ref, feats, lengths)
    ours, extras = encoder(items)
    assert ours.shape == (sum(audio_output_length(n) for n in lengths), cfg.output_dim)
    assert extras == []
    rel = assert_close(ours, out)
    print(f"audio {lengths}: rel err {rel:.2e}")


def test_audio_clips_are_independent(audio):
    """With the same batch-wide window size, a clip's tokens do not depend on the other clips."""
    _, encoder, cfg = audio
    _, items = _audio_items((350, 120), cfg, seed=3)
    alone, _ = encoder(items[:1])
    both, _ = encoder(items)
    np.testing.assert_allclose(both[:alone.shape[0]], alone, rtol=0, atol=1e-5)


def test_audio_new_lengths_in_a_bucket_compile_nothing(audio):
    """Three clips of 610, 700 and 790 frames (7, 7 and 8 chunks: 4 windows of up to 2 chunks each) match the
    reference and share one program; so do two short clips whose padded length (data) differs."""
    ref, encoder, cfg = audio
    for group in (((610,), (700,), (790,)), ((70,), (45,))):
        shapes = []
        for i, lengths in enumerate(group):
            feats, items = _audio_items(lengths, cfg, seed=30 + i)
            inputs = encoder.collate(items)
            shapes.append({k: np.shape(v) for k, v in inputs.items()})
            features, valid, _ = encoder.run(inputs)
            if i == 0:
                compiled = encoder.jitted._cache_size()
            assert_close(features[valid], _hf_audio(ref, feats, lengths))
        assert all(s == shapes[0] for s in shapes)
        assert encoder.jitted._cache_size() == compiled
    assert shapes[0]["features"] == (1, 1, cfg.num_mel_bins, 100)


def test_audio_padding_never_reaches_valid_rows(audio):
    """NaN and junk in every frame past a chunk's end and in empty chunk slots leave the valid rows unchanged."""
    _, encoder, cfg = audio
    _, items = _audio_items((350, 30), cfg, seed=4)
    inputs = encoder.collate(items)
    assert inputs["features"].shape[:2] == (3, 2) and inputs["chunk_frames"].tolist() == [[100, 100], [100, 50],
                                                                                          [30, 0]]
    past_end = np.arange(100) >= inputs["chunk_frames"][..., None]  # [W, C, frames]
    junk = dict(inputs, features=inputs["features"].copy())
    noise = np.random.default_rng(0).normal(size=junk["features"].shape).astype(np.float32) * 1e3
    junk["features"] = np.where(past_end[:, :, None, :], noise, junk["features"])
    junk["features"][:, :, 0][past_end] = np.nan
    clean, dirty = encoder.run(inputs), encoder.run(junk)
    np.testing.assert_array_equal(dirty[1], clean[1])
    np.testing.assert_array_equal(dirty[0][clean[1]], clean[0][clean[1]])


def test_audio_collate_buckets_and_refuses_overlong_clips(audio):
    _, encoder, cfg = audio
    compiled = encoder.jitted._cache_size()
    # 5 clips of 1-2 chunks -> 5 windows -> a 6-window bucket of 2-chunk blocks
    inputs = encoder.collate(_audio_items((150, 200, 20, 100, 120), cfg, 0)[1])
    assert inputs["chunk_frames"].shape == (6, 2) and int(inputs["padded_frames"]) == 100
    inputs = encoder.collate(_audio_items((MAX_FRAMES,), cfg, 0)[1])  # the longest clip allowed: 10 chunks
    assert inputs["chunk_frames"].shape == (6, 2)
    with pytest.raises(MediaError, match=f"audio clip 1 has {MAX_FRAMES + 1} feature frames, more than the limit"):
        encoder.collate(_audio_items((100, MAX_FRAMES + 1), cfg, 0)[1])
    with pytest.raises(MediaError, match="audio clip 0: expected log-mel features"):
        encoder.collate([{"features": np.zeros((cfg.num_mel_bins + 1, 10), np.float32)}])
    with pytest.raises(MediaError, match="audio clip 0 has no feature frames"):
        encoder.collate([{"features": np.zeros((cfg.num_mel_bins, 0), np.float32)}])
    assert encoder.jitted._cache_size() == compiled


def test_audio_windows_are_runs_of_chunks():
    for lengths in ((350,), (350, 120), (70,), (200, 30, 260), (100, 99, 1601)):
        for n_window_infer in (100, 200, 800):
            windows = audio_windows(lengths, 50, n_window_infer)
            chunks = audio_chunk_lengths(lengths, 50)
            assert [c for w in windows for c in w] == list(range(len(chunks)))
            assert max(len(w) for w in windows) <= n_window_infer // 100
            tokens = [sum(audio_output_length(chunks[c]) for c in w) for w in windows]
            assert tuple(tokens) == audio_attention_seqlens(lengths, 50, n_window_infer)


# ---------------------------------------------------------------------------------------------------------------
# shared attention, configs, weight maps, bad input


def test_attention_per_block_equals_block_diagonal_mask():
    seqlens = (5, 3, 5, 1, 3, 5)  # the segments laid out one per block of 8, padded with NaN and junk
    s, h, d, width = sum(seqlens), 2, 4, 8
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(s, h, d)).astype(np.float32) for _ in range(3))
    seg = np.repeat(np.arange(len(seqlens)), seqlens)
    scores = np.einsum("qhd,khd->hqk", q, k) * 0.5
    scores = np.where(seg[None, :, None] == seg[None, None, :], scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    expected = np.einsum("hqk,khd->qhd", probs, v)
    valid = np.arange(width)[None, :] < np.asarray(seqlens)[:, None]
    blocks = []
    for x in (q, k, v):
        b = rng.normal(size=(len(seqlens), width, h, d)).astype(np.float32) * 100
        b[~valid] = np.nan
        b[valid] = x
        blocks.append(b)
    got = np.asarray(jax.jit(lambda q, k, v, m: attention(q, k, v, m, scale=0.5))(*blocks, valid))
    np.testing.assert_allclose(got[valid], expected, rtol=0, atol=1e-5)


def test_from_hf_defaults_match_hf_configs():
    v, hv = QwenVisionConfig.from_hf({}), Qwen3OmniMoeVisionEncoderConfig()
    assert (v.depth, v.hidden_size, v.hidden_act, v.intermediate_size, v.num_heads, v.in_channels, v.patch_size,
            v.spatial_merge_size, v.temporal_patch_size, v.out_hidden_size, v.num_position_embeddings,
            v.deepstack_visual_indexes, v.rope_theta) == (
        hv.depth, hv.hidden_size, hv.hidden_act, hv.intermediate_size, hv.num_heads, hv.in_channels, hv.patch_size,
        hv.spatial_merge_size, hv.temporal_patch_size, hv.out_hidden_size, hv.num_position_embeddings,
        tuple(hv.deepstack_visual_indexes), hv.rope_parameters["rope_theta"])
    assert QwenVisionConfig.from_hf(Qwen3OmniMoeVisionEncoderConfig().to_dict()) == v
    a, ha = QwenAudioConfig.from_hf({}), Qwen3OmniMoeAudioEncoderConfig()
    assert (a.num_mel_bins, a.encoder_layers, a.encoder_attention_heads, a.encoder_ffn_dim, a.d_model,
            a.activation_function, a.max_source_positions, a.n_window, a.output_dim, a.n_window_infer,
            a.downsample_hidden_size) == (
        ha.num_mel_bins, ha.encoder_layers, ha.encoder_attention_heads, ha.encoder_ffn_dim, ha.d_model,
        ha.activation_function, ha.max_source_positions, ha.n_window, ha.output_dim, ha.n_window_infer,
        ha.downsample_hidden_size)
    assert QwenAudioConfig.from_hf(ha.to_dict()) == a
    assert QwenVisionConfig.from_hf({"rope_theta": 500.0}).rope_theta == 500.0


def test_weight_map_paths_match_module_state():
    vcfg, acfg = QwenVisionConfig.from_hf(VISION), QwenAudioConfig.from_hf(AUDIO)
    for module, wmap in ((lambda: QwenVisionTower(vcfg, rngs=nnx.Rngs(0)), qwen_vision_weight_map(vcfg)),
                         (lambda: QwenAudioTower(acfg, rngs=nnx.Rngs(0)), qwen_audio_weight_map(acfg)),
                         (lambda: QwenImageEncoder(vcfg, rngs=nnx.Rngs(0)),
                          prefixed(qwen_vision_weight_map(vcfg), ("tower",))),
                         (lambda: QwenAudioEncoder(acfg, rngs=nnx.Rngs(0)),
                          prefixed(qwen_audio_weight_map(acfg), ("tower",)))):
        abstract = nnx.eval_shape(module)
        assert set(flat_paths(nnx.to_pure_dict(nnx.split(abstract)[1]))) == set(wmap)
        for path, var in nnx.to_flat_state(nnx.state(abstract, nnx.Param)):
            axes = var.get_metadata().get("axes")
            assert axes is not None and len(axes) == len(var.shape), (path, axes, var.shape)


def test_keys_match_saved_checkpoint(tmp_path):
    text = dict(vocab_size=64, hidden_size=48, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, moe_intermediate_size=16, num_experts=2, num_experts_per_tok=1)
    config = Qwen3OmniMoeConfig(thinker_config=dict(vision_config=VISION, audio_config=AUDIO, text_config=text),
                                enable_audio_output=False)
    Qwen3OmniMoeForConditionalGeneration(config).save_pretrained(tmp_path)
    with safetensors.safe_open(str(tmp_path / "model.safetensors"), "np") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    thinker = config.thinker_config
    vcfg = QwenVisionConfig.from_hf(thinker.vision_config.to_dict())
    acfg = QwenAudioConfig.from_hf(thinker.audio_config.to_dict())
    for prefix, cfg, wmap, module in (
            (VISION_PREFIX, vcfg, qwen_vision_weight_map(vcfg, VISION_PREFIX), QwenVisionTower),
            (AUDIO_PREFIX, acfg, qwen_audio_weight_map(acfg, AUDIO_PREFIX), QwenAudioTower)):
        disk = {k for k in shapes if k.startswith(prefix)}
        mapped = {spec.key for spec in wmap.values()}
        assert mapped == disk, (disk - mapped, mapped - disk)
        abstract = flat_paths(nnx.to_pure_dict(nnx.split(nnx.eval_shape(lambda: module(cfg, rngs=nnx.Rngs(0))))[1]))
        for path, spec in wmap.items():
            assert spec.apply(np.zeros(shapes[spec.key], np.float32)).shape == tuple(abstract[path].shape), path


def test_bad_configs_raise_clear_errors():
    with pytest.raises(ValueError, match="n_window"):
        QwenAudioConfig.from_hf(dict(AUDIO, n_window_infer=60))
    with pytest.raises(ValueError, match="n_window 40 is not supported"):
        QwenAudioTower(QwenAudioConfig.from_hf(dict(AUDIO, n_window=40)), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="deepstack_visual_indexes"):
        QwenVisionConfig.from_hf(dict(VISION, deepstack_visual_indexes=[3]))
