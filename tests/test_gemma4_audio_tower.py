"""Parity of the Gemma 4 audio encoder (conformer tower + embedder into the text width) with transformers'
``Gemma4AudioModel`` and ``Gemma4MultimodalEmbedder`` on tiny configs with every weight random (norms, scalars, clip
bounds, relative-position projections), loaded from the keys ``save_pretrained`` writes; the batching contract
(buckets, valid rows, no recompilation inside a bucket) and the weight map against a real-size config."""

from __future__ import annotations

import copy
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors
import torch
from flax import nnx
from transformers import Gemma4AudioConfig, Gemma4Config, Gemma4ForConditionalGeneration, Gemma4TextConfig
from transformers.models.gemma4 import modeling_gemma4 as hf

from omnijax.encoders.gemma4.audio import (Gemma4AudioEncoder, gemma4_audio_embedder_weight_map,
                                   gemma4_audio_tower_weight_map, gemma4_audio_weight_map)
from omnijax.encoders.gemma4.audio_attention import relative_position_embeddings
from omnijax.preprocess.gemma4.audio_batch import clip_bucket, collate, frame_bucket, token_rows_per_clip
from omnijax.encoders.gemma4.audio_config import Gemma4AudioEncoderConfig
from fixtures.module_parity import assert_close, flat_paths, load_module
from omnijax.preprocess.gemma4.audio_features import tokens_from_frames

pytestmark = pytest.mark.reference

# 16 mel bins -> 4 after two stride-2 convs == subsampling_conv_channels[0] // 4, as the projection assumes.
MELS = 16
# Clamps that bind: a small gradient_clipping and logit cap, and rms_norm_eps unlike the fixed 1e-6 of some norms.
AUDIO = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, subsampling_conv_channels=[16, 8],
             conv_kernel_size=5, attention_chunk_size=4, attention_context_left=5, attention_context_right=0,
             output_proj_dims=24, attention_logit_cap=3.0, gradient_clipping=2.5, residual_weight=0.7,
             rms_norm_eps=1e-3, hidden_act="silu", use_clipped_linears=True)
# One layer with right context, a chunk unlike the left context, no clipping, another activation.
AUDIO_B = dict(AUDIO, num_hidden_layers=1, attention_chunk_size=3, attention_context_left=6, attention_context_right=2,
               use_clipped_linears=False, hidden_act="gelu_pytorch_tanh", conv_kernel_size=3)
TEXT = dict(vocab_size=64, hidden_size=40, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, head_dim=8, global_head_dim=8, layer_types=["full_attention"],
            hidden_size_per_layer_input=4, vocab_size_per_layer_input=64)
# Lengths in frames of one batch: a single-frame clip, and clips spanning several attention chunks; all in the
# 128-frame bucket with 4 clip slots (the one compiled program of this file's encoder).
LENGTHS = (37, 90, 1, 61)


def _randomise_audio(*modules: torch.nn.Module, seed: int) -> None:
    """Overwrite every parameter and persistent buffer: clip bounds +-(1 + |N|) (they bind on some entries), norm
    weights 1 + 0.3 N, per_dim_scale 0.5 N, everything else 0.3 N."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in modules:
            persistent = set(module.state_dict())
            for name, t in list(module.named_parameters()) + list(module.named_buffers()):
                if name not in persistent:  # inv_timescales, softcap: derived from the config
                    continue
                noise = torch.randn(t.shape, generator=gen)
                if name.endswith(("input_min", "output_min")):
                    t.copy_(-(1.0 + noise.abs()))
                elif name.endswith(("input_max", "output_max")):
                    t.copy_(1.0 + noise.abs())
                elif "norm" in name:
                    t.copy_(1.0 + 0.3 * noise)
                elif name.endswith("per_dim_scale"):
                    t.copy_(0.5 * noise)
                else:
                    t.copy_(0.3 * noise)


def _abstract_call(cfg: Gemma4AudioEncoderConfig, inputs: dict):
    """Output shapes of the encoder for abstract ``inputs``, without weights or compilation."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Gemma4AudioEncoder(cfg, rngs=nnx.Rngs(0))))
    return jax.eval_shape(lambda st, x: nnx.merge(graphdef, st)(x), state, inputs)


def _jitted(graphdef):
    return jax.jit(lambda params, inputs: nnx.merge(graphdef, params)(inputs))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny Gemma4ForConditionalGeneration with audio (no vision) whose audio weights are random, saved with
    save_pretrained: (reference tower, reference embedder, every tensor on disk, our config)."""
    torch.manual_seed(0)
    config = Gemma4Config(text_config=TEXT, audio_config=AUDIO, vision_config=None)
    model = Gemma4ForConditionalGeneration(config).eval()
    tower, embedder = model.model.audio_tower, model.model.embed_audio
    _randomise_audio(tower, embedder, seed=1)
    folder = tmp_path_factory.mktemp("gemma4_audio")
    model.save_pretrained(folder)
    with safetensors.safe_open(str(folder / "model.safetensors"), "np") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    cfg = Gemma4AudioEncoderConfig.from_hf(config.audio_config.to_dict(), config.text_config.hidden_size)
    return tower, embedder, tensors, cfg


@pytest.fixture(scope="module")
def encoder(saved):
    """(jitted encoder call, params) of our encoder loaded from the saved tensors through the weight map."""
    _, _, tensors, cfg = saved
    graphdef, params = load_module(lambda: Gemma4AudioEncoder(cfg, rngs=nnx.Rngs(0)), gemma4_audio_weight_map(cfg),
                                   tensors)
    return _jitted(graphdef), params


def _clips(lengths, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(n, MELS)).astype(np.float32) for n in lengths]


def _reference_alone(tower, embedder, clip: np.ndarray) -> np.ndarray:
    """The reference's embedded soft tokens of one clip fed alone, unpadded (every frame valid)."""
    with torch.no_grad():
        out = tower(torch.from_numpy(clip[None]), torch.ones(1, len(clip), dtype=torch.bool))
        return embedder(out.last_hidden_state)[out.attention_mask].numpy()


def _reference_batch(tower, embedder, clips) -> np.ndarray:
    """The reference's valid embedded soft tokens of clips padded to the longest, in order."""
    longest = max(len(c) for c in clips)
    feats = np.zeros((len(clips), longest, MELS), np.float32)
    mask = np.zeros((len(clips), longest), bool)
    for i, c in enumerate(clips):
        feats[i, : len(c)], mask[i, : len(c)] = c, True
    with torch.no_grad():
        out = tower(torch.from_numpy(feats), torch.from_numpy(mask))
        return embedder(out.last_hidden_state)[out.attention_mask].numpy()


def _run(fn, params, clips):
    inputs = collate(clips)
    feats, valid, extras = fn(params, inputs)
    assert extras == ()
    return np.asarray(feats), np.asarray(valid), inputs


# ---------------------------------------------------------------------------------------------------------------
# Weight map


def test_weight_map_covers_every_audio_tensor(saved):
    _, _, tensors, cfg = saved
    audio_keys = {k for k in tensors if k.startswith(("model.audio_tower.", "model.embed_audio."))}
    assert {k for k in tensors if "audio" in k} == audio_keys
    mapped = [spec.key for spec in gemma4_audio_weight_map(cfg).values()]
    assert len(mapped) == len(set(mapped))
    assert set(mapped) == audio_keys
    assert len(gemma4_audio_tower_weight_map(cfg)) + len(gemma4_audio_embedder_weight_map(cfg)) == len(mapped)
    assert "model.audio_tower.layers.1.self_attn.q_proj.input_min" in audio_keys  # clip bounds are on disk


def test_weight_map_of_a_published_size_config():
    """The default (published) geometry: 128 mel bins, 1024 wide, 12 layers; shapes from the reference on the meta
    device against our abstract parameters, and one abstract call on 128-bin features."""
    hf_cfg = Gemma4AudioConfig()
    with torch.device("meta"):
        tower = hf.Gemma4AudioModel(hf_cfg)
        embedder = hf.Gemma4MultimodalEmbedder(hf_cfg, Gemma4TextConfig(hidden_size=1536))
    shapes = {f"model.audio_tower.{k}": tuple(v.shape) for k, v in tower.state_dict().items()}
    shapes.update({f"model.embed_audio.{k}": tuple(v.shape) for k, v in embedder.state_dict().items()})
    cfg = Gemma4AudioEncoderConfig.from_hf(hf_cfg.to_dict(), 1536)
    wm = gemma4_audio_weight_map(cfg)
    assert {spec.key for spec in wm.values()} == set(shapes)
    abstract = flat_paths(nnx.to_pure_dict(nnx.state(nnx.eval_shape(lambda: Gemma4AudioEncoder(cfg,
                                                                                               rngs=nnx.Rngs(0))))))
    assert set(abstract) == set(wm)
    for path, spec in wm.items():
        assert tuple(abstract[path].shape) == shapes[spec.key], path
    inputs = {"features": jax.ShapeDtypeStruct((2, 3072, 128), jnp.float32),
              "num_frames": jax.ShapeDtypeStruct((2,), jnp.int32)}
    feats, valid, _ = _abstract_call(dataclasses.replace(cfg, num_hidden_layers=1), inputs)  # same geometry
    assert feats.shape == (2 * 768, 1536) and valid.shape == (2 * 768,) and valid.dtype == jnp.bool_


# ---------------------------------------------------------------------------------------------------------------
# Parity


def test_encoder_matches_reference_alone_and_batched(saved, encoder):
    tower, embedder, _, cfg = saved
    fn, params = encoder
    clips = _clips(LENGTHS, seed=2)
    feats, valid, inputs = _run(fn, params, clips)
    rows = token_rows_per_clip(inputs["features"].shape[1])
    assert feats.shape == (4 * rows, cfg.text_hidden_size) and valid.shape == (4 * rows,)
    # Clip c owns rows c*rows .. c*rows + tokens - 1, in order.
    expected_valid = np.zeros((4, rows), bool)
    for c, n in enumerate(LENGTHS):
        expected_valid[c, : tokens_from_frames(n)] = True
    np.testing.assert_array_equal(valid, expected_valid.reshape(-1))
    rel = 0.0
    for c, clip in enumerate(clips):
        ours = feats[c * rows:(c + 1) * rows][valid[c * rows:(c + 1) * rows]]
        rel = max(rel, assert_close(ours, _reference_alone(tower, embedder, clip)))
    rel = max(rel, assert_close(feats[valid], _reference_batch(tower, embedder, clips)))
    print(f"gemma4 audio encoder {LENGTHS}: rel err {rel:.2e}")


def test_reference_config_exercises_every_clamp(saved):
    """Guard against a vacuous parity test: with the clip bounds opened or gradient_clipping huge, the reference's
    output moves well beyond the parity tolerance, so both clamps bind on these inputs."""
    tower, embedder, _, _ = saved
    clip = _clips((61,), seed=3)[0]
    base = _reference_alone(tower, embedder, clip)
    unclipped = copy.deepcopy(tower)
    with torch.no_grad():
        for name, buf in unclipped.named_buffers():
            if name.endswith(("input_min", "output_min", "input_max", "output_max")):
                buf.fill_(float("inf") if name.endswith("max") else -float("inf"))
    loose = copy.deepcopy(tower)
    for module in loose.modules():
        if hasattr(module, "gradient_clipping"):
            module.gradient_clipping = 1e10
    scale = np.abs(base).max()
    assert np.abs(_reference_alone(unclipped, embedder, clip) - base).max() > 1e-2 * scale
    assert np.abs(_reference_alone(loose, embedder, clip) - base).max() > 1e-2 * scale


def test_other_config_matches_reference():
    hf_cfg = Gemma4AudioConfig(**AUDIO_B)
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    tower = hf.Gemma4AudioModel(hf_cfg).eval()
    embedder = hf.Gemma4MultimodalEmbedder(hf_cfg, Gemma4TextConfig(**TEXT)).eval()
    _randomise_audio(tower, embedder, seed=4)
    tensors = {f"model.audio_tower.{k}": v.numpy() for k, v in tower.state_dict().items()}
    tensors.update({f"model.embed_audio.{k}": v.numpy() for k, v in embedder.state_dict().items()})
    cfg = Gemma4AudioEncoderConfig.from_hf(hf_cfg.to_dict(), TEXT["hidden_size"])
    assert not cfg.use_clipped_linears and cfg.attention_context_right == 2
    graphdef, params = load_module(lambda: Gemma4AudioEncoder(cfg, rngs=nnx.Rngs(0)), gemma4_audio_weight_map(cfg),
                                   tensors)
    clips = _clips((50, 23), seed=5)
    feats, valid, _ = _run(_jitted(graphdef), params, clips)
    rel = assert_close(feats[valid], np.concatenate([_reference_alone(tower, embedder, c) for c in clips]))
    print(f"gemma4 audio encoder, right context: rel err {rel:.2e}")


def test_relative_position_embeddings_match_reference(saved):
    tower, _, _, cfg = saved
    ref = tower.rel_pos_enc(torch.zeros(1, 1, cfg.hidden_size))
    np.testing.assert_allclose(relative_position_embeddings(cfg), ref.numpy().reshape(-1, cfg.hidden_size),
                               rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# Batching contract


def test_no_recompile_within_a_bucket_and_padding_does_not_leak(saved, encoder):
    tower, embedder, _, _ = saved
    fn, params = encoder
    for lengths in ((100, 7, 128), (3, 64, 65, 2), (127, 1, 50)):
        clips = _clips(lengths, seed=len(lengths) + lengths[0])
        assert collate(clips)["features"].shape == (4, 128, MELS)
        feats, valid, _ = _run(fn, params, clips)
        assert int(valid.sum()) == sum(tokens_from_frames(n) for n in lengths)
        assert_close(feats[valid], _reference_batch(tower, embedder, clips))
    assert fn._cache_size() == 1


def test_padding_clips_and_frames_are_invalid_and_zero_filled():
    clips = _clips((5, 200, 9), seed=6)
    inputs = collate(clips)
    assert inputs["features"].dtype == np.float32 and inputs["num_frames"].dtype == np.int32
    assert inputs["features"].shape == (4, 256, MELS)
    np.testing.assert_array_equal(inputs["num_frames"], [5, 200, 9, 0])
    np.testing.assert_array_equal(inputs["features"][1, :200], clips[1])
    assert not inputs["features"][0, 5:].any() and not inputs["features"][3].any()


def test_buckets():
    assert [frame_bucket(n) for n in (0, 1, 128, 129, 192, 193, 300, 2999, 3072, 3073)] == \
        [128, 128, 128, 192, 192, 256, 384, 3072, 3072, 4096]
    assert [clip_bucket(n) for n in (1, 2, 3, 4, 5, 9)] == [1, 2, 4, 4, 8, 16]
    assert token_rows_per_clip(3072) == 768 == tokens_from_frames(3072)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError):
            frame_bucket(bad)


@pytest.mark.parametrize("items, match", [
    ([], "no audio clips"),
    ([np.zeros((0, MELS), np.float32)], "frames >= 1"),
    ([np.zeros(MELS, np.float32)], "features"),
    ([np.zeros((3, MELS), np.float32), np.zeros((3, MELS + 1), np.float32)], "mel bins"),
])
def test_collate_rejects_bad_items(items, match):
    with pytest.raises(ValueError, match=match):
        collate(items)


def test_wrong_mel_count_is_refused(saved):
    _, _, _, cfg = saved
    inputs = {"features": jax.ShapeDtypeStruct((1, 128, 128), jnp.float32),
              "num_frames": jax.ShapeDtypeStruct((1,), jnp.int32)}
    with pytest.raises(ValueError, match="128 mel bins.*expects 4"):
        _abstract_call(cfg, inputs)


@pytest.mark.parametrize("change, match", [
    ({"hidden_size": 30}, "divisible"),
    ({"subsampling_conv_channels": [16]}, "subsampling_conv_channels"),
    ({"hidden_act": "swish2"}, "unknown activation"),
    ({"attention_logit_cap": 0.0}, "attention_logit_cap"),
    ({"use_clipped_linears": "yes"}, "use_clipped_linears"),
    ({"attention_context_right": -1}, "attention_context_right"),
])
def test_config_rejects_bad_values(change, match):
    with pytest.raises(ValueError, match=match):
        Gemma4AudioEncoderConfig.from_hf({**AUDIO, **change}, 40)
