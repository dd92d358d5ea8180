"""Audio loading and Whisper log-mel features against transformers (Qwen3-Omni's processor settings) and librosa."""

import json
import types

import librosa
import numpy as np
import pytest
import soundfile
from transformers import WhisperFeatureExtractor
from transformers.audio_utils import load_audio as hf_load_audio
from transformers.audio_utils import mel_filter_bank
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe, processing_qwen3_omni_moe
from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import Qwen3OmniMoeProcessor

from omnijax.common.errors import CheckpointError, MediaError
from omnijax.preprocess.audio import load_audio
from omnijax.preprocess.qwen3_omni.audio_features import (
    WhisperFeatureConfig,
    audio_token_count,
    batch_features,
    frame_mask,
    log_mel,
    mel_filters,
)

from fixtures.qwen3_omni_tokenizer import FEATURE_EXTRACTOR_CONFIG

pytestmark = pytest.mark.reference

# Against the reference's torch.stft (float32) path, the one Qwen3OmniMoeProcessor runs when torch is installed.
TOL = 1e-4
# Against the reference's float64 numpy path (_np_extract_fbank_features), the arithmetic this module follows.
NP_TOL = 1e-6
SR = 16000

# The feature extractor keys of the published Qwen3-Omni preprocessor_config.json (image keys left out).
QWEN3_OMNI_FEATURE_CONFIG = {**FEATURE_EXTRACTOR_CONFIG, "processor_class": "Qwen3OmniMoeProcessor"}


@pytest.fixture(scope="module")
def cfg():
    return WhisperFeatureConfig.from_dict(QWEN3_OMNI_FEATURE_CONFIG)


@pytest.fixture(scope="module")
def hf_extractor():
    return WhisperFeatureExtractor(**QWEN3_OMNI_FEATURE_CONFIG)


def make_clip(num_samples: int, seed: int) -> np.ndarray:
    """Deterministic noise plus a sine, float32 [num_samples] at 16 kHz."""
    rng = np.random.default_rng(seed)
    t = np.arange(num_samples) / SR
    clip = 0.05 * rng.standard_normal(num_samples) + 0.4 * np.sin(2 * np.pi * (220 + 60 * seed) * t)
    return clip.astype(np.float32)


def hf_process_audio(extractor, clips):
    """``Qwen3OmniMoeProcessor._process_audio`` (the processor's own code) on ``clips`` with the processor's default
    audio kwargs, on a stand-in processor that holds only what that method reads."""
    processor = types.SimpleNamespace(feature_extractor=extractor, n_window=Qwen3OmniMoeProcessor.n_window)
    processor.audio_token = "<|audio_pad|>"
    processor.replace_audio_token = lambda inputs, audio_idx: Qwen3OmniMoeProcessor.replace_audio_token(
        processor, inputs, audio_idx
    )
    kwargs = dict(Qwen3OmniMoeProcessor.audio_kwargs, n_window=Qwen3OmniMoeProcessor.n_window)
    inputs, replacements = Qwen3OmniMoeProcessor._process_audio(processor, clips, **kwargs)
    return inputs, replacements


# ---------------------------------------------------------------------------------------------------------------
# Config and filters


def test_processor_audio_kwargs_are_the_ones_implemented():
    # batch_features pads to the longest clip and never truncates: that is what these defaults ask for.
    assert Qwen3OmniMoeProcessor.audio_kwargs == {
        "sampling_rate": 16000,
        "padding": True,
        "truncation": False,
        "return_attention_mask": True,
    }
    assert Qwen3OmniMoeProcessor.n_window == 50


def test_config_from_dict_matches_the_reference_extractor(cfg, hf_extractor):
    assert cfg.feature_size == hf_extractor.feature_size == 128
    assert cfg.sampling_rate == hf_extractor.sampling_rate == 16000
    assert cfg.hop_length == hf_extractor.hop_length == 160
    assert cfg.n_fft == hf_extractor.n_fft == 400
    assert cfg.n_samples == hf_extractor.n_samples == 4800000
    assert cfg.nb_max_frames == hf_extractor.nb_max_frames == 30000
    assert cfg.padding_value == hf_extractor.padding_value
    assert cfg.padding_side == hf_extractor.padding_side == "right"
    assert cfg.dither == hf_extractor.dither == 0.0
    # Missing keys take WhisperFeatureExtractor's defaults, and n_samples follows chunk_length like it does there.
    bare = WhisperFeatureConfig.from_dict({"feature_size": 128, "n_samples": 123})
    assert bare.chunk_length == WhisperFeatureExtractor(feature_size=128).chunk_length == 30
    assert bare.n_samples == WhisperFeatureExtractor(feature_size=128, n_samples=123).n_samples == 480000


def test_config_from_folder_prefers_processor_config_section(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"feature_size": 80}))
    assert WhisperFeatureConfig.from_folder(tmp_path).feature_size == 80
    (tmp_path / "processor_config.json").write_text(json.dumps({"feature_extractor": {"feature_size": 128}}))
    assert WhisperFeatureConfig.from_folder(tmp_path).feature_size == 128
    with pytest.raises(CheckpointError, match="checkpoint folder not found"):
        WhisperFeatureConfig.from_folder(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="no feature extractor config"):
        WhisperFeatureConfig.from_folder(empty)


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"feature_size": "128"}, "feature_size"),
        ({"hop_length": 0}, "hop_length"),
        ({"n_fft": 400.5}, "n_fft"),
        ({"padding_side": "middle"}, "padding_side"),
        ({"dither": -1.0}, "dither"),
        ({"feature_extractor_type": "SeamlessM4TFeatureExtractor"}, "WhisperFeatureExtractor"),
    ],
)
def test_config_from_dict_rejects_bad_values(bad, match):
    with pytest.raises(CheckpointError, match=match):
        WhisperFeatureConfig.from_dict(bad)


def test_mel_filters_equal_transformers(cfg):
    ref = mel_filter_bank(
        num_frequency_bins=1 + cfg.n_fft // 2,
        num_mel_filters=cfg.feature_size,
        min_frequency=0.0,
        max_frequency=8000.0,
        sampling_rate=cfg.sampling_rate,
        norm="slaney",
        mel_scale="slaney",
    )
    ours = mel_filters(cfg)
    assert ours.shape == (201, 128) and ours.dtype == np.float64
    np.testing.assert_array_equal(ours, ref)


# ---------------------------------------------------------------------------------------------------------------
# Feature parity


def assert_batch_parity(cfg, extractor, clips):
    ours, ours_mask = batch_features(clips, cfg)
    ref_inputs, replacements = hf_process_audio(extractor, clips)
    ref = np.asarray(ref_inputs["input_features"])
    ref_mask = np.asarray(ref_inputs["feature_attention_mask"])
    longest = max(len(c) for c in clips)
    assert ours.dtype == np.float32 and ours_mask.dtype == np.int32
    assert ours.shape == ref.shape == (len(clips), cfg.feature_size, longest // cfg.hop_length)
    diff = float(np.abs(ours - ref).max())
    assert diff <= TOL, diff
    np.testing.assert_array_equal(ours_mask, ref_mask)
    # The float64 numpy path of the reference, on the same padded waveforms.
    padded = np.stack([np.pad(c, (0, longest - len(c))) for c in clips]).astype(np.float32)
    np_diff = float(np.abs(ours - extractor._np_extract_fbank_features(padded, "cpu")).max())
    assert np_diff <= NP_TOL, np_diff
    # Token counts follow from the mask exactly as in the processor.
    counts = [audio_token_count(int(n)) for n in ours_mask.sum(-1)]
    assert counts == [int(n) for n in ref_inputs["num_audio_tokens"]]
    assert [len(r) // len("<|audio_pad|>") for r in replacements] == counts
    return ours, ours_mask


@pytest.mark.parametrize("seconds", [0.5, 1.7, 12.0])
def test_single_clip_parity(cfg, hf_extractor, seconds):
    clip = make_clip(round(seconds * SR), seed=int(seconds * 10))
    feats, mask = assert_batch_parity(cfg, hf_extractor, [clip])
    assert mask.sum() == len(clip) // cfg.hop_length
    np.testing.assert_array_equal(log_mel(clip, cfg), feats[0])


def test_batch_parity_padded_to_longest(cfg, hf_extractor):
    clips = [make_clip(round(s * SR), seed=i) for i, s in enumerate([0.5, 1.7, 12.0])]
    feats, mask = assert_batch_parity(cfg, hf_extractor, clips)
    assert mask.sum(-1).tolist() == [50, 170, 1200]
    assert [audio_token_count(n) for n in mask.sum(-1).tolist()] == [7, 22, 156]
    # A padded clip's real frames away from the padding equal its features alone.
    np.testing.assert_array_equal(feats[0, :, :45], log_mel(clips[0], cfg)[:, :45])


def test_batch_parity_lengths_not_multiple_of_hop(cfg, hf_extractor):
    # A partial last hop counts as a frame in a padded clip's mask, but the longest clip's last frame is dropped.
    clips = [make_clip(n, seed=7 + i) for i, n in enumerate([8037, 27283, 40101])]
    _, mask = assert_batch_parity(cfg, hf_extractor, clips)
    assert mask.shape == (3, 250)
    assert mask.sum(-1).tolist() == [51, 171, 250]


def test_long_clip_is_not_truncated(cfg, hf_extractor):
    clip = make_clip(35 * SR, seed=3)  # over Whisper's 30 s chunk
    feats, mask = assert_batch_parity(cfg, hf_extractor, [clip])
    assert feats.shape == (1, 128, 3500) and int(mask.sum()) == 3500


def test_frame_mask_left_padding_matches_the_reference_rule():
    cfg = WhisperFeatureConfig(padding_side="left")
    mask = frame_mask([8037, 400], 8100, cfg)
    sample_mask = np.zeros((2, 8100), dtype=np.int32)
    sample_mask[0, 63:] = 1
    sample_mask[1, 7700:] = 1
    np.testing.assert_array_equal(mask, sample_mask[:, ::160][:, :-1])


@pytest.mark.parametrize(
    "clips, match",
    [
        ([], "no audio clips"),
        ([np.zeros(100, np.float32)], "shorter than the minimum of 201 samples"),
        ([np.zeros((2, 1000), np.float32)], "shape"),
        ([np.array([0.0, np.nan] * 500, np.float32)], "NaN"),
        ([np.zeros(1000, np.int16)], "dtype int16"),
    ],
)
def test_batch_features_rejects_bad_clips(cfg, clips, match):
    with pytest.raises(MediaError, match=match):
        batch_features(clips, cfg)


# ---------------------------------------------------------------------------------------------------------------
# Audio token count


def test_audio_token_count_matches_reference_formula():
    frames = np.arange(0, 4001)
    ref_processing = processing_qwen3_omni_moe._get_feat_extract_output_lengths(frames, 50)
    ref_modeling = modeling_qwen3_omni_moe._get_feat_extract_output_lengths(frames, 50)
    ours = np.array([audio_token_count(int(n)) for n in frames])
    np.testing.assert_array_equal(ours, ref_processing)
    np.testing.assert_array_equal(ours, ref_modeling)
    assert [audio_token_count(n) for n in (0, 1, 2, 50, 99, 100, 101, 3000)] == [0, 1, 1, 7, 13, 13, 14, 390]
    assert audio_token_count(250, n_window=25) == int(modeling_qwen3_omni_moe._get_feat_extract_output_lengths(250, 25))
    with pytest.raises(ValueError, match="num_frames"):
        audio_token_count(-1)


# ---------------------------------------------------------------------------------------------------------------
# Loading


def stereo_44k(seconds: float = 0.6) -> np.ndarray:
    """float32 [samples, 2] at 44.1 kHz: two different tones plus noise, within [-1, 1]."""
    n = round(seconds * 44100)
    t = np.arange(n) / 44100
    rng = np.random.default_rng(5)
    left = 0.3 * np.sin(2 * np.pi * 330 * t) + 0.02 * rng.standard_normal(n)
    right = 0.3 * np.sin(2 * np.pi * 550 * t) + 0.02 * rng.standard_normal(n)
    return np.stack([left, right], axis=1).astype(np.float32)


def test_load_wav_at_16k_equals_written_array(tmp_path):
    clip = make_clip(12345, seed=1)
    path = tmp_path / "clip.wav"
    soundfile.write(path, clip, SR, subtype="FLOAT")
    loaded = load_audio(path)
    assert loaded.dtype == np.float32 and loaded.shape == clip.shape
    np.testing.assert_array_equal(loaded, clip)

    pcm = (clip * 20000).astype(np.int16)
    pcm_path = tmp_path / "pcm16.wav"
    soundfile.write(pcm_path, pcm, SR, subtype="PCM_16")
    np.testing.assert_array_equal(load_audio(str(pcm_path)), pcm.astype(np.float32) / 32768)
    np.testing.assert_array_equal(load_audio(str(pcm_path)), hf_load_audio(str(pcm_path), 16000, backend="soundfile"))


# wav, flac, and the lossy ogg (vorbis) and mp3, which libsndfile >= 1.1 writes offline (an older libsndfile
# without an mp3 / vorbis writer leaves those formats out of the list).
WRITABLE_FORMATS = [
    (name, fmt, subtype)
    for name, fmt, subtype in [
        ("stereo.wav", "WAV", "FLOAT"),
        ("stereo.flac", "FLAC", "PCM_16"),
        ("stereo.ogg", "OGG", "VORBIS"),
        ("stereo.mp3", "MP3", "MPEG_LAYER_III"),
    ]
    if fmt in soundfile.available_formats() and subtype in soundfile.available_subtypes(fmt)
]


@pytest.mark.parametrize("name, fmt, subtype", WRITABLE_FORMATS)
def test_load_resampled_stereo_file_equals_librosa(tmp_path, name, fmt, subtype):
    audio = stereo_44k()
    path = tmp_path / name
    soundfile.write(path, audio, 44100, format=fmt, subtype=subtype)
    loaded = load_audio(path)
    ref, ref_sr = librosa.load(path, sr=16000, mono=True)
    assert ref_sr == 16000 and loaded.dtype == np.float32
    np.testing.assert_array_equal(loaded, ref)
    np.testing.assert_array_equal(loaded, hf_load_audio(str(path), 16000, backend="soundfile"))
    if fmt in ("WAV", "FLAC"):  # lossless: the sample count follows ceil(n * 16000 / 44100)
        assert loaded.shape == (int(np.ceil(len(audio) * 16000 / 44100)),)


@pytest.mark.parametrize("rate", [8000, 16000, 37123, 44100, 384000])
def test_block_by_block_mono_equals_the_whole(rate):
    """MonoStream (files and video sound tracks are averaged and resampled as they are decoded) gives the samples of
    downmixing and resampling the whole clip as librosa does, whatever the block sizes."""
    from omnijax.preprocess.audio import MonoStream

    clip_CN = np.random.default_rng(rate).uniform(-0.5, 0.5, (3, rate * 2 + 77)).astype(np.float32)
    stream = MonoStream(rate, 16000)
    cuts = [0, 1, 1000, 1001, 65536 + 1000, clip_CN.shape[1]]
    for start, stop in zip(cuts, cuts[1:]):
        stream.add(np.ascontiguousarray(clip_CN[:, start:stop]))
    assert stream.read == clip_CN.shape[1]
    expected = librosa.resample(np.mean(clip_CN, axis=0), orig_sr=rate, target_sr=16000) if rate != 16000 else \
        np.mean(clip_CN, axis=0)
    np.testing.assert_array_equal(stream.finish(), expected)


def test_load_tuple_downmixes_and_resamples():
    audio = stereo_44k()
    expected = librosa.resample(audio.T.mean(axis=0), orig_sr=44100, target_sr=16000)
    np.testing.assert_array_equal(load_audio((audio, 44100)), expected)  # [samples, channels]
    np.testing.assert_array_equal(load_audio((audio.T, 44100)), expected)  # [channels, samples]

    pcm = (audio * 32767).astype(np.int16)
    np.testing.assert_array_equal(load_audio((pcm[:, 0], 16000)), pcm[:, 0].astype(np.float32) / 32768)

    clip = make_clip(5000, seed=2)
    np.testing.assert_array_equal(load_audio((clip.astype(np.float64), 16000)), clip)
    np.testing.assert_array_equal(load_audio(clip), clip)


def test_load_errors(tmp_path):
    with pytest.raises(MediaError, match="not found.*nope.wav"):
        load_audio(tmp_path / "nope.wav")

    corrupt = tmp_path / "x.wav"
    corrupt.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(MediaError, match="cannot decode audio file .*x.wav"):
        load_audio(corrupt)

    empty = tmp_path / "empty.wav"
    soundfile.write(empty, np.zeros(0, np.float32), SR)
    with pytest.raises(MediaError, match="empty.wav holds no samples"):
        load_audio(empty)

    long_file = tmp_path / "long.wav"
    soundfile.write(long_file, np.zeros(3 * SR, np.float32), SR, subtype="PCM_16")
    with pytest.raises(MediaError, match=r"long.wav: audio lasts 3.00 s, longer than the limit of 2.5 s"):
        load_audio(long_file, max_seconds=2.5)
    assert load_audio(long_file, max_seconds=3).shape == (3 * SR,)
    with pytest.raises(MediaError, match=r"audio lasts 2.00 s, longer than the limit of 1 s"):
        load_audio((np.zeros(88200, np.float32), 44100), max_seconds=1)

    with pytest.raises(MediaError, match="no samples"):
        load_audio(np.zeros(0, np.float32))
    with pytest.raises(MediaError, match="NaN or infinite"):
        load_audio(np.array([0.0, np.inf], np.float32))
    with pytest.raises(MediaError, match="shape"):
        load_audio((np.zeros((2, 3, 4), np.float32), SR))
    with pytest.raises(MediaError, match="pass \\(array, sampling_rate\\)"):
        load_audio(np.zeros((2, 100), np.float32))
    with pytest.raises(MediaError, match="dtype uint8"):
        load_audio((np.zeros(100, np.uint8), SR))
    with pytest.raises(MediaError, match="sampling rate must be positive"):
        load_audio((np.zeros(100, np.float32), 0))
    with pytest.raises(MediaError, match="URLs are not fetched"):
        load_audio("https://example.com/a.wav")
    with pytest.raises(MediaError, match="unsupported audio source"):
        load_audio(42)
