"""Gemma 4 audio features, frame masks and audio token counts against transformers' ``Gemma4AudioFeatureExtractor``
and ``Gemma4Processor``'s token arithmetic, including audio loaded through preprocess.audio."""

import inspect
import json
import types

import numpy as np
import pytest
import soundfile
from transformers import Gemma4AudioFeatureExtractor, Gemma4Processor
from transformers.audio_utils import load_audio as hf_load_audio
from transformers.audio_utils import mel_filter_bank

from omnijax.common.errors import CheckpointError, MediaError
from omnijax.preprocess.gemma4.audio_features import (
    REFERENCE_MAX_SAMPLES,
    REFERENCE_PAD_TO_MULTIPLE_OF,
    Gemma4AudioFeatureConfig,
    audio_token_count,
    batch_features,
    clip_features,
    hann_window,
    load_clip_features,
    mel_filters,
    tokens_from_frames,
    valid_frame_count,
)

pytestmark = pytest.mark.reference

SR = 16000


@pytest.fixture(scope="module")
def cfg():
    return Gemma4AudioFeatureConfig()


@pytest.fixture(scope="module")
def hf_extractor():
    return Gemma4AudioFeatureExtractor()


def make_clip(num_samples: int, seed: int, sr: int = SR) -> np.ndarray:
    """Deterministic noise plus a sine, float32 [num_samples]."""
    rng = np.random.default_rng(seed)
    t = np.arange(num_samples) / sr
    return (0.05 * rng.standard_normal(num_samples) + 0.4 * np.sin(2 * np.pi * (220 + 60 * seed) * t)).astype(
        np.float32)


def hf_token_counts(extractor, mask_BT) -> list[int]:
    """``Gemma4Processor.replace_audio_token`` (the processor's own code) on each row of the reference's frame mask,
    on a stand-in holding only the attributes it reads; the placeholder count of each replacement."""
    processor = types.SimpleNamespace(boa_token="<a>", audio_token="X", eoa_token="</a>")
    inputs = {"input_features_mask": list(mask_BT)}
    return [Gemma4Processor.replace_audio_token(processor, inputs, i).count("X") for i in range(len(mask_BT))]


def hf_duration_token_count(extractor, num_samples: int) -> int:
    """``Gemma4Processor._compute_audio_num_tokens`` (the processor's sample-count arithmetic, capped at its default
    audio_seq_length) on a stand-in processor."""
    processor = types.SimpleNamespace(feature_extractor=extractor, audio_seq_length=750)
    return Gemma4Processor._compute_audio_num_tokens(processor, np.zeros(num_samples), SR)


# ---------------------------------------------------------------------------------------------------------------
# Config, filters, window


def test_reference_call_defaults_are_the_ones_implemented():
    # Gemma4Processor passes no audio kwargs of its own, so the extractor's call defaults apply.
    assert getattr(Gemma4Processor, "audio_kwargs", None) is None
    defaults = {k: p.default for k, p in inspect.signature(Gemma4AudioFeatureExtractor.__call__).parameters.items()}
    assert defaults["padding"] == "longest" and defaults["truncation"] is True
    assert defaults["max_length"] == REFERENCE_MAX_SAMPLES and defaults["pad_to_multiple_of"] == 128
    assert REFERENCE_PAD_TO_MULTIPLE_OF == 128


def test_config_matches_the_reference_extractor(cfg, hf_extractor):
    assert cfg.feature_size == hf_extractor.feature_size == 128
    assert cfg.sampling_rate == hf_extractor.sampling_rate == 16000
    assert (cfg.frame_length, cfg.hop_length, cfg.fft_length) == (hf_extractor.frame_length, hf_extractor.hop_length,
                                                                  hf_extractor.fft_length) == (320, 160, 512)
    assert cfg.pad_left == 160 and cfg.min_samples == 161
    assert cfg.mel_floor == float(hf_extractor.mel_floor) == 1e-3
    odd = dict(sampling_rate=22050, frame_length_ms=25.0, hop_length_ms=12.5, fft_overdrive=True)
    ours, ref = Gemma4AudioFeatureConfig(**odd), Gemma4AudioFeatureExtractor(**odd)
    assert (ours.frame_length, ours.hop_length, ours.fft_length) == (ref.frame_length, ref.hop_length, ref.fft_length)


def test_config_from_folder_reads_what_transformers_saves(tmp_path, hf_extractor):
    settings = dict(feature_size=64, preemphasis=0.97, mel_floor=1e-5, per_bin_mean=[0.5] * 64, hop_length_ms=12.5)
    Gemma4AudioFeatureExtractor(**settings).save_pretrained(tmp_path)
    ours = Gemma4AudioFeatureConfig.from_folder(tmp_path)
    ref = Gemma4AudioFeatureExtractor.from_pretrained(tmp_path)
    assert ours.feature_size == ref.feature_size == 64
    assert ours.preemphasis == ref.preemphasis and ours.mel_floor == float(ref.mel_floor)
    assert ours.per_bin_mean == tuple(ref.per_bin_mean.ravel())
    # transformers writes frame_length / hop_length but reads only the *_ms settings (not saved): 10 ms again.
    saved = json.loads((tmp_path / "preprocessor_config.json").read_text())
    assert saved["hop_length"] == 200 and "hop_length_ms" not in saved
    assert ours.hop_length == ref.hop_length == 160

    (tmp_path / "processor_config.json").write_text(json.dumps({"feature_extractor": {"feature_size": 32}}))
    assert Gemma4AudioFeatureConfig.from_folder(tmp_path).feature_size == 32
    with pytest.raises(CheckpointError, match="checkpoint folder not found"):
        Gemma4AudioFeatureConfig.from_folder(tmp_path / "missing")


@pytest.mark.parametrize("bad, match", [
    ({"feature_size": "128"}, "feature_size"),
    ({"frame_length_ms": 0.01}, "frame_length_ms"),
    ({"mel_floor": 0.0}, "mel_floor"),
    ({"per_bin_stddev": [1.0] * 3}, "per_bin_stddev"),
    ({"fft_overdrive": "yes"}, "fft_overdrive"),
    ({"padding_side": "left"}, "padding_side"),
    ({"feature_extractor_type": "WhisperFeatureExtractor"}, "Gemma4AudioFeatureExtractor"),
])
def test_config_from_dict_rejects_bad_values(bad, match):
    with pytest.raises(CheckpointError, match=match):
        Gemma4AudioFeatureConfig.from_dict(bad)


def test_mel_filters_and_window_equal_transformers(cfg, hf_extractor):
    np.testing.assert_array_equal(mel_filters(cfg), hf_extractor.mel_filters)
    assert mel_filters(cfg).shape == (257, 128)
    np.testing.assert_array_equal(hann_window(320), hf_extractor.window)
    with pytest.warns(UserWarning, match="mel filter has all zero values"):  # 128 HTK mels over 257 bins: the
        ref = mel_filter_bank(num_frequency_bins=257, num_mel_filters=128,  # lowest filters fall between bins
                              min_frequency=0.0, max_frequency=8000.0, sampling_rate=16000, norm=None,
                              mel_scale="htk")
    np.testing.assert_array_equal(mel_filters(cfg), ref)
    empty = ~ref.any(axis=0)
    assert empty.any() and np.array_equal(~mel_filters(cfg).any(axis=0), empty)  # the same filters are empty


# ---------------------------------------------------------------------------------------------------------------
# Feature parity


def assert_batch_parity(cfg, extractor, clips):
    """Our batch layout, per-clip features and token counts against the reference on ``clips``."""
    ref = extractor(clips, return_tensors="np")
    ref_feats, ref_mask = np.asarray(ref["input_features"]), np.asarray(ref["input_features_mask"])
    feats, mask = batch_features(clips, cfg)
    assert feats.dtype == ref_feats.dtype == np.float32 and mask.dtype == ref_mask.dtype == bool
    assert feats.shape == ref_feats.shape and mask.shape == ref_mask.shape
    np.testing.assert_array_equal(mask, ref_mask)
    np.testing.assert_allclose(feats, ref_feats, rtol=0, atol=1e-6)
    ref_counts = hf_token_counts(extractor, ref_mask)
    for i, clip in enumerate(clips):
        valid = int(ref_mask[i].sum())
        assert valid == valid_frame_count(len(clip), cfg)
        alone = clip_features(clip, cfg)  # the clip's valid frames, computed without any batch padding
        assert alone.shape == (valid, 128)
        np.testing.assert_allclose(alone, ref_feats[i, :valid], rtol=0, atol=1e-6)
        assert audio_token_count(len(clip), cfg) == tokens_from_frames(valid) == ref_counts[i]
        assert ref_counts[i] == hf_duration_token_count(extractor, min(len(clip), REFERENCE_MAX_SAMPLES))
    return feats, mask, ref_counts


def test_batch_parity_short_boundary_and_silent(cfg, hf_extractor):
    # 161 samples: the shortest clip with a frame; 16160 / 16161: one sample either side of a frame boundary;
    # 8037: not a multiple of the hop; zeros: silence (log of the mel floor).
    clips = [make_clip(161, 1), make_clip(16160, 2), make_clip(16161, 3), make_clip(8037, 4),
             np.zeros(4000, np.float32)]
    _, mask, counts = assert_batch_parity(cfg, hf_extractor, clips)
    assert mask.sum(-1).tolist() == [1, 100, 101, 50, 24]
    assert counts == [1, 25, 26, 13, 6]
    np.testing.assert_allclose(clip_features(clips[-1], cfg), np.log(1e-3), rtol=1e-6)


def test_long_clip_is_truncated_like_the_reference(cfg, hf_extractor):
    clips = [make_clip(31 * SR, 5), make_clip(5 * SR, 6)]
    feats, mask, counts = assert_batch_parity(cfg, hf_extractor, clips)
    assert feats.shape == (2, 2999, 128) and counts == [750, 125]
    np.testing.assert_array_equal(clip_features(clips[0], cfg), clip_features(clips[0][:REFERENCE_MAX_SAMPLES], cfg))


def test_non_default_settings_parity():
    settings = dict(preemphasis=0.97, preemphasis_htk_flavor=False, input_scale_factor=0.5, mel_floor=1e-5,
                    fft_overdrive=True, per_bin_mean=list(np.linspace(-1, 1, 128)),
                    per_bin_stddev=list(np.linspace(0.5, 2, 128)), frame_length_ms=25.0, hop_length_ms=12.5)
    cfg = Gemma4AudioFeatureConfig.from_dict(settings)
    extractor = Gemma4AudioFeatureExtractor(**settings)
    clips = [make_clip(7001, 7), make_clip(3333, 8)]
    assert_batch_parity(cfg, extractor, clips)
    htk = dict(settings, preemphasis_htk_flavor=True)
    assert_batch_parity(Gemma4AudioFeatureConfig.from_dict(htk), Gemma4AudioFeatureExtractor(**htk), clips)


def test_token_counts_match_the_processor_around_boundaries(cfg, hf_extractor):
    lengths = [161, 162, 320, 321, 480, 481, 640, 641, 800, 801, 1441, 1601, 16000, 16001]
    ref_masks = [np.asarray(hf_extractor([np.zeros(n, np.float32)], return_tensors="np")["input_features_mask"])
                 for n in lengths]
    ref = [hf_token_counts(hf_extractor, m)[0] for m in ref_masks]
    assert [audio_token_count(n, cfg) for n in lengths] == ref
    assert [hf_duration_token_count(hf_extractor, n) for n in lengths] == ref
    assert [valid_frame_count(n, cfg) for n in lengths] == [int(m.sum()) for m in ref_masks]
    # Every length from 0 to 2 s against the processor's sample-count arithmetic.
    assert [audio_token_count(n, cfg) for n in range(0, 2 * SR)] == \
        [hf_duration_token_count(hf_extractor, n) for n in range(0, 2 * SR)]
    assert [tokens_from_frames(n) for n in range(9)] == [0, 1, 1, 1, 1, 2, 2, 2, 2]


def test_too_short_clip_is_refused(cfg, hf_extractor):
    # The reference gives such a clip no valid frame, hence no audio token.
    ref = hf_extractor([make_clip(160, 9)], return_tensors="np")
    assert int(np.asarray(ref["input_features_mask"]).sum()) == 0 and audio_token_count(160, cfg) == 0
    with pytest.raises(MediaError, match="160 samples .* shorter than the minimum of 161 samples"):
        clip_features(make_clip(160, 9), cfg)


@pytest.mark.parametrize("clip, kwargs, match", [
    (np.zeros(3 * SR, np.float32), {"max_seconds": 2.5}, r"audio lasts 3.00 s, longer than the limit of 2.5 s"),
    (np.zeros((2, 1000), np.float32), {}, "shape"),
    (np.array([0.0, np.nan] * 500, np.float32), {}, "NaN"),
    (np.zeros(1000, np.int16), {}, "dtype int16"),
])
def test_clip_features_rejects_bad_clips(cfg, clip, kwargs, match):
    with pytest.raises(MediaError, match=match):
        clip_features(clip, cfg, **kwargs)


def test_batch_features_rejects_an_empty_batch(cfg):
    with pytest.raises(MediaError, match="no audio clips"):
        batch_features([], cfg)


def test_dither_is_seeded(cfg):
    dithered = Gemma4AudioFeatureConfig(dither=1e-4)
    clip = np.zeros(3000, np.float32)
    a, b = clip_features(clip, dithered, seed=1), clip_features(clip, dithered, seed=1)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, clip_features(clip, cfg))


# ---------------------------------------------------------------------------------------------------------------
# Loading through preprocess.audio


def stereo(seconds: float, rate: int) -> np.ndarray:
    """float32 [samples, 2]: two tones plus noise."""
    n = round(seconds * rate)
    t = np.arange(n) / rate
    rng = np.random.default_rng(5)
    left = 0.3 * np.sin(2 * np.pi * 330 * t) + 0.02 * rng.standard_normal(n)
    right = 0.3 * np.sin(2 * np.pi * 550 * t) + 0.02 * rng.standard_normal(n)
    return np.stack([left, right], axis=1).astype(np.float32)


def test_stereo_44k_file_and_array_match_the_reference(tmp_path, cfg, hf_extractor):
    audio = stereo(0.7, 44100)
    path = tmp_path / "stereo.wav"
    soundfile.write(path, audio, 44100, subtype="FLOAT")
    ref_samples = hf_load_audio(str(path), SR, backend="soundfile")  # what apply_chat_template loads
    ref = hf_extractor([ref_samples], return_tensors="np")
    valid = int(np.asarray(ref["input_features_mask"]).sum())
    ours = load_clip_features(path, cfg)
    assert ours.shape == (valid, 128) == (valid_frame_count(len(ref_samples), cfg), 128)
    np.testing.assert_allclose(ours, np.asarray(ref["input_features"])[0, :valid], rtol=0, atol=1e-6)
    # The same audio as an in-memory (array, rate) pair, channels last.
    np.testing.assert_allclose(load_clip_features((audio, 44100), cfg), ours, rtol=0, atol=1e-6)
    with pytest.raises(MediaError, match="longer than the limit of 0.5 s"):
        load_clip_features(path, cfg, max_seconds=0.5)


def test_8k_mono_file_and_array_are_resampled(tmp_path, cfg, hf_extractor):
    clip = make_clip(4000, 10, sr=8000)
    path = tmp_path / "mono8k.wav"
    soundfile.write(path, clip, 8000, subtype="FLOAT")
    ref_samples = hf_load_audio(str(path), SR, backend="soundfile")
    ref = hf_extractor([ref_samples], return_tensors="np")
    valid = int(np.asarray(ref["input_features_mask"]).sum())
    ours = load_clip_features(str(path), cfg)
    np.testing.assert_allclose(ours, np.asarray(ref["input_features"])[0, :valid], rtol=0, atol=1e-6)
    np.testing.assert_allclose(load_clip_features((clip, 8000), cfg), ours, rtol=0, atol=1e-6)
