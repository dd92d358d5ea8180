"""Parity of the Qwen3-Omni vision tower (with deepstack features) and audio tower against Hugging Face on tiny
random configs, plus the static helpers (interpolation taps, RoPE positions, chunking, attention windows) against
the reference's own functions, and the weight maps against a saved checkpoint's keys."""

from __future__ import annotations

import jax
import jax.numpy as jnp
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

from encoders.qwen3_omni_audio import (QwenAudioConfig, QwenAudioTower, audio_attention_seqlens, audio_chunk_lengths,
                                       audio_output_length, qwen_audio_weight_map)
from encoders.qwen3_omni_vision import (QwenVisionConfig, QwenVisionTower, qwen_vision_weight_map, segment_attention,
                                        vision_pos_interpolation, vision_rope_cos_sin, vision_rope_positions,
                                        vision_segments, vision_token_count)

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

from module_parity import assert_close, flat_paths, load_module


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


class _Runner:
    """Jitted calls of one loaded tower, one compilation per static grid / lengths tuple, shared across tests."""

    def __init__(self, graphdef, params):
        self.graphdef, self.params, self._compiled = graphdef, params, {}

    def __call__(self, x: np.ndarray, static):
        if static not in self._compiled:
            self._compiled[static] = jax.jit(lambda p, x: nnx.merge(self.graphdef, p)(x, static))
        return jax.tree.map(np.asarray, self._compiled[static](self.params, jnp.asarray(x)))


@pytest.fixture(scope="module")
def vision():
    """(reference tower, runner of our tower, config)."""
    hf_cfg = Qwen3OmniMoeVisionEncoderConfig(**VISION)
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    ref = hf_qwen.Qwen3OmniMoeVisionEncoder(hf_cfg).eval()
    _randomise(ref, seed=1)
    cfg = QwenVisionConfig.from_hf(hf_cfg.to_dict())
    graphdef, params = load_module(lambda: QwenVisionTower(cfg, rngs=nnx.Rngs(0)),
                             qwen_vision_weight_map(cfg, VISION_PREFIX), _state_dict_np(ref, VISION_PREFIX))
    return ref, _Runner(graphdef, params), cfg


@pytest.fixture(scope="module")
def audio():
    hf_cfg = Qwen3OmniMoeAudioEncoderConfig(**AUDIO)
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    ref = hf_qwen.Qwen3OmniMoeAudioEncoder(hf_cfg).eval()
    _randomise(ref, seed=2)
    cfg = QwenAudioConfig.from_hf(hf_cfg.to_dict())
    graphdef, params = load_module(lambda: QwenAudioTower(cfg, rngs=nnx.Rngs(0)),
                             qwen_audio_weight_map(cfg, AUDIO_PREFIX), _state_dict_np(ref, AUDIO_PREFIX))
    return ref, _Runner(graphdef, params), cfg


def _patches(grid, cfg: QwenVisionConfig, seed: int) -> np.ndarray:
    n = sum(t * h * w for t, h, w in grid)
    return np.random.default_rng(seed).normal(size=(n, cfg.patch_dim)).astype(np.float32)


# ---------------------------------------------------------------------------------------------------------------
# vision


@pytest.mark.parametrize("grid", [
    ((1, 4, 6),),                       # one image, non-square grid (interpolation differs per axis)
    ((1, 4, 6), (1, 8, 4)),             # two images of different grids
    ((2, 4, 4), (1, 6, 6), (1, 4, 4)),  # a two-frame entry (attention per frame) and two same-size segments
])
def test_vision_tower_matches_hf(vision, grid):
    ref, run, cfg = vision
    patches = _patches(grid, cfg, seed=len(grid))
    with torch.no_grad():
        out = ref(hidden_states=torch.from_numpy(patches), grid_thw=torch.tensor(grid))
    embeds, deep = run(patches, grid)
    assert embeds.shape == (vision_token_count(grid, 2), cfg.out_hidden_size)
    rel = assert_close(embeds, out.pooler_output.numpy())
    assert len(deep) == len(out.deepstack_features) == len(cfg.deepstack_visual_indexes)
    for ours, theirs in zip(deep, out.deepstack_features):
        rel = max(rel, assert_close(ours, theirs.numpy()))
    print(f"vision {grid}: rel err {rel:.2e}")


def test_vision_images_do_not_attend_to_each_other(vision):
    """Each image's embeddings are the same alone and next to another image."""
    _, run, cfg = vision
    a, b = ((1, 4, 6),), ((1, 8, 4),)
    pa, pb = _patches(a, cfg, seed=7), _patches(b, cfg, seed=8)
    alone_a, deep_a = run(pa, a)
    alone_b, _ = run(pb, b)
    both, deep_both = run(np.concatenate([pa, pb]), a + b)
    n_a = alone_a.shape[0]
    np.testing.assert_allclose(both[:n_a], alone_a, rtol=0, atol=1e-5)
    np.testing.assert_allclose(both[n_a:], alone_b, rtol=0, atol=1e-5)
    np.testing.assert_allclose(deep_both[1][:n_a], deep_a[1], rtol=0, atol=1e-5)


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
    cos, sin = vision_rope_cos_sin(pos, cfg.head_dim, cfg.rope_theta)
    ref_cos, ref_sin = ref.rotary_pos_emb(torch.zeros(1), torch.from_numpy(pos).long())
    np.testing.assert_allclose(np.asarray(cos), ref_cos.numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.asarray(sin), ref_sin.numpy(), rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# audio


@pytest.mark.parametrize("lengths", [
    (350,),          # 4 chunks (100, 100, 100, 50) -> 46 tokens, windows [26, 20]
    (350, 120),      # two clips of different lengths: windows [26, 20] and [16]
    (70,),           # a lone short clip: chunks padded to 70 frames only, 9-token chunks, 18-token windows
    (200, 30, 260),  # an exact multiple of 100 frames, a tiny clip, windows [26], [4], [26, 8]
])
def test_audio_tower_matches_hf(audio, lengths):
    ref, run, cfg = audio
    feats = np.random.default_rng(sum(lengths)).normal(size=(cfg.num_mel_bins, sum(lengths))).astype(np.float32)
    with torch.no_grad():
        out = ref(input_features=torch.from_numpy(feats), feature_lens=torch.tensor(lengths)).last_hidden_state
    ours = run(feats, lengths)
    assert ours.shape == (sum(audio_output_length(n) for n in lengths), cfg.output_dim)
    rel = assert_close(ours, out.numpy())
    print(f"audio {lengths}: rel err {rel:.2e}")


def test_audio_clips_are_independent(audio):
    """With the same batch-wide window size, a clip's tokens do not depend on the other clips."""
    _, run, cfg = audio
    rng = np.random.default_rng(3)
    fa, fb = (rng.normal(size=(cfg.num_mel_bins, n)).astype(np.float32) for n in (350, 120))
    alone = run(fa, (350,))
    both = run(np.concatenate([fa, fb], axis=1), (350, 120))
    np.testing.assert_allclose(both[:alone.shape[0]], alone, rtol=0, atol=1e-5)


def test_audio_static_helpers_match_reference():
    frames = np.arange(1, 1000)
    ref = hf_qwen._get_feat_extract_output_lengths(torch.from_numpy(frames), 50).numpy()
    np.testing.assert_array_equal([audio_output_length(int(n)) for n in frames], ref)
    np.testing.assert_array_equal(audio_output_length(frames), ref)
    for lengths in ((350,), (350, 120), (70,), (200, 30, 260), (1,), (100, 99, 1601)):
        for n_window_infer in (100, 200, 800):
            feature_lens = torch.tensor(lengths)
            _, chunks = hf_qwen.chunk_and_pad_features(torch.zeros(2, sum(lengths)), feature_lens, 50)
            assert audio_chunk_lengths(lengths, 50) == tuple(chunks.tolist())
            cu = hf_qwen.get_audio_cu_seqlens(chunks, feature_lens, n_window_infer, 50)
            assert np.array_equal(np.cumsum((0,) + audio_attention_seqlens(lengths, 50, n_window_infer)), cu.numpy())


# ---------------------------------------------------------------------------------------------------------------
# shared attention, configs, weight maps, bad input


def test_segment_attention_equals_block_diagonal_mask():
    seqlens = (5, 3, 5, 1, 3, 5)  # repeated lengths out of order: exercises the regrouping permutation
    s, h, d = sum(seqlens), 2, 4
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(s, h, d)).astype(np.float32) for _ in range(3))
    seg = np.repeat(np.arange(len(seqlens)), seqlens)
    scores = np.einsum("qhd,khd->hqk", q, k) * 0.5
    scores = np.where(seg[None, :, None] == seg[None, None, :], scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    expected = np.einsum("hqk,khd->qhd", probs, v)
    got = jax.jit(lambda q, k, v: segment_attention(q, k, v, seqlens, 0.5))(q, k, v)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=0, atol=1e-5)


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
                         (lambda: QwenAudioTower(acfg, rngs=nnx.Rngs(0)), qwen_audio_weight_map(acfg))):
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


def test_bad_input_raises_clear_errors(vision, audio):
    _, vrun, vcfg = vision
    _, arun, acfg = audio
    tower = nnx.merge(vrun.graphdef, vrun.params)
    with pytest.raises(ValueError, match="patches"):
        tower(jnp.zeros((10, vcfg.patch_dim)), ((1, 4, 4),))
    with pytest.raises(ValueError, match="multiples of spatial_merge_size"):
        tower(jnp.zeros((15, vcfg.patch_dim)), ((1, 3, 5),))
    with pytest.raises(ValueError, match="grid_thw"):
        tower(jnp.zeros((16, vcfg.patch_dim)), (4, 4))
    audio_tower = nnx.merge(arun.graphdef, arun.params)
    with pytest.raises(ValueError, match="audio features"):
        audio_tower(jnp.zeros((acfg.num_mel_bins, 99)), (100,))
    with pytest.raises(ValueError, match="positive"):
        audio_tower(jnp.zeros((acfg.num_mel_bins, 10)), (10, 0))
    with pytest.raises(ValueError, match="n_window"):
        QwenAudioConfig.from_hf(dict(AUDIO, n_window_infer=60))
    with pytest.raises(ValueError, match="deepstack_visual_indexes"):
        QwenVisionConfig.from_hf(dict(VISION, deepstack_visual_indexes=[3]))
