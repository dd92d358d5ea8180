"""Whisper log-mel features in numpy, as transformers' ``WhisperFeatureExtractor`` computes them for Qwen3-Omni.

The reference (``feature_extraction_whisper.py``, called by ``Qwen3OmniMoeProcessor._process_audio`` with the
processor's ``audio_kwargs``: ``sampling_rate=16000, padding=True, truncation=False, return_attention_mask=True``):

1. Every clip is cast to float32 and right-padded with ``padding_value`` to the longest clip of the batch
   (``padding=True`` is "longest": no 30 s chunks, and with ``truncation=False`` long clips are kept whole). A
   sample-level attention mask marks the real samples.
2. Each padded clip: centred STFT (reflect padding of ``n_fft // 2``, periodic Hann window of ``n_fft``, hop
   ``hop_length``), power spectrum, slaney mel filters (0 to 8000 Hz), ``log10(max(mel, 1e-10))``; the last frame
   is dropped, giving ``L // hop_length`` frames for a padded length L; values are clamped from below to
   ``max - 8`` (the max over that clip's frames, padding frames included) and mapped by ``(x + 4) / 4``.
3. The frame mask is the sample mask taken every ``hop_length`` samples (``mask[:, ::hop]``), its last column
   dropped when ``L % hop_length != 0``: a clip of n samples in a batch padded to L has
   ``min(ceil(n / hop), L // hop)`` ones.

transformers computes step 2 with ``torch.stft`` in float32 when torch is installed (``_np_extract_fbank_features``
in float64 otherwise); this module follows the float64 numpy path. The Qwen3-Omni thinker turns a clip of F
feature frames into :func:`audio_token_count` (F) audio tokens.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from omnijax.common.config_values import as_float, as_int, config_getter
from omnijax.preprocess.media_limits import (PROCESSOR_MAX_CHUNK_SECONDS, PROCESSOR_MAX_FFT, PROCESSOR_MAX_MEL_BINS,
                                     PROCESSOR_MAX_RATE)
from omnijax.preprocess.processor_config import processor_section
from omnijax.common.errors import CheckpointError, MediaError


# Fixed by WhisperFeatureExtractor: its mel filters always span 0 to 8000 Hz, whatever the sampling rate.
_MEL_MIN_HZ = 0.0
_MEL_MAX_HZ = 8000.0
# spectrogram(mel_floor=1e-10) in transformers.audio_utils, and torch.clamp(min=1e-10) in the torch path.
_MEL_FLOOR = 1e-10
# Qwen3-Omni audio encoder window: feature frames are processed in chunks of 2 * n_window.
QWEN3_OMNI_N_WINDOW = 50


@dataclasses.dataclass(frozen=True)
class WhisperFeatureConfig:
    """Settings of a ``WhisperFeatureExtractor``; defaults are that class's defaults.

    Qwen3-Omni checkpoints set ``feature_size=128`` (mel bins) and keep 16 kHz, ``hop_length=160``, ``n_fft=400``.

    feature_size: number of mel bins.
    sampling_rate: sample rate in Hz the features expect.
    hop_length: STFT hop in samples (one feature frame per hop).
    n_fft: STFT frame and window length in samples.
    chunk_length: seconds of one Whisper chunk; only ``n_samples`` / ``nb_max_frames`` depend on it, and the
        Qwen3-Omni processor never pads or truncates to them.
    padding_value: sample value used to pad shorter clips.
    padding_side: "right" (the default) or "left".
    dither: standard deviation of Gaussian noise added to the samples (0 disables it).
    """

    feature_size: int = 80
    sampling_rate: int = 16000
    hop_length: int = 160
    n_fft: int = 400
    chunk_length: int = 30
    padding_value: float = 0.0
    padding_side: str = "right"
    dither: float = 0.0

    def __post_init__(self):
        for key in ("feature_size", "sampling_rate", "hop_length", "n_fft", "chunk_length"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"'{key}' must be a positive integer, got {value!r}")
        if self.n_fft < 2:
            raise ValueError(f"'n_fft' must be at least 2, got {self.n_fft}")
        bounds = {"feature_size": PROCESSOR_MAX_MEL_BINS, "n_fft": PROCESSOR_MAX_FFT, "hop_length": PROCESSOR_MAX_FFT,
                  "sampling_rate": PROCESSOR_MAX_RATE, "chunk_length": PROCESSOR_MAX_CHUNK_SECONDS}
        for key, most in bounds.items():
            if getattr(self, key) > most:
                raise ValueError(f"'{key}' is {getattr(self, key)}, over the limit of {most}")
        if self.padding_side not in ("right", "left"):
            raise ValueError(f"'padding_side' must be 'right' or 'left', got {self.padding_side!r}")
        if not np.isfinite(self.padding_value):
            raise ValueError(f"'padding_value' must be finite, got {self.padding_value!r}")
        if not (np.isfinite(self.dither) and self.dither >= 0):
            raise ValueError(f"'dither' must be a finite number >= 0, got {self.dither!r}")

    @property
    def n_samples(self) -> int:
        """Samples in one chunk: ``chunk_length * sampling_rate`` (transformers recomputes it from these two and
        ignores an ``n_samples`` saved in the config file)."""
        return self.chunk_length * self.sampling_rate

    @property
    def nb_max_frames(self) -> int:
        """Feature frames in one chunk: ``n_samples // hop_length``."""
        return self.n_samples // self.hop_length

    @property
    def n_freq(self) -> int:
        """Frequency bins of the one-sided STFT: ``n_fft // 2 + 1``."""
        return self.n_fft // 2 + 1

    @property
    def min_samples(self) -> int:
        """Fewest samples a clip may have: ``n_fft // 2 + 1``, the shortest clip the centred (reflect-padded) STFT
        accepts in transformers' torch path, and more than one hop, so every clip has at least one frame."""
        return self.n_fft // 2 + 1

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "feature extractor config") -> "WhisperFeatureConfig":
        """The config from a feature extractor dict as transformers writes it (``preprocessor_config.json``, or the
        ``"feature_extractor"`` section of ``processor_config.json``).

        Missing keys and ``null`` values take the defaults. Keys of other processors sharing the file (image
        settings, ``n_samples``, ``nb_max_frames``, ``return_attention_mask``, ...) are ignored. Raises
        ``CheckpointError`` mentioning ``source`` when a value has the wrong type or range, or when the dict names a
        feature extractor other than ``WhisperFeatureExtractor``.
        """
        if not isinstance(d, dict):
            raise CheckpointError(f"{source}: expected a JSON object, got {type(d).__name__}")
        kind = d.get("feature_extractor_type")
        if kind is not None and kind != "WhisperFeatureExtractor":
            raise CheckpointError(f"{source}: expected feature_extractor_type 'WhisperFeatureExtractor', got {kind!r}")
        defaults = cls()

        get = config_getter(d, defaults)

        try:
            kwargs: dict[str, Any] = {}
            for key in ("feature_size", "sampling_rate", "hop_length", "n_fft", "chunk_length"):
                kwargs[key] = as_int(get(key), key)
            for key in ("padding_value", "dither"):
                kwargs[key] = as_float(get(key), key)
            kwargs["padding_side"] = get("padding_side")
            return cls(**kwargs)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{source}: {exc}") from exc

    @classmethod
    def from_folder(cls, path: str | os.PathLike) -> "WhisperFeatureConfig":
        """The config of the checkpoint folder ``path``, found the way transformers looks for it.

        The ``"feature_extractor"`` (or ``"audio_processor"``) section of ``processor_config.json`` wins; otherwise
        ``preprocessor_config.json`` (what hub checkpoints ship). Raises ``CheckpointError`` naming the folder or
        file when neither is there, a file is not valid JSON, or a value is unusable.
        """
        settings, source = processor_section(path, ('feature_extractor', 'audio_processor'), 'feature extractor')
        return cls.from_dict(settings, source=source)


# ---------------------------------------------------------------------------------------------------------------
# Mel filters


def _hertz_to_mel_slaney(freq_hz: np.ndarray) -> np.ndarray:
    """Slaney mel scale: linear (3 mels per 200 Hz) below 1 kHz, logarithmic above (27 mels per factor 6.4)."""
    freq_hz = np.asarray(freq_hz, dtype=np.float64)
    mels = 3.0 * freq_hz / 200.0
    log_region = freq_hz >= 1000.0
    log_mels = 15.0 + np.log(np.where(log_region, freq_hz, 1000.0) / 1000.0) * (27.0 / np.log(6.4))
    return np.where(log_region, log_mels, mels)


def _mel_to_hertz_slaney(mels: np.ndarray) -> np.ndarray:
    """Inverse of :func:`_hertz_to_mel_slaney`."""
    mels = np.asarray(mels, dtype=np.float64)
    freq_hz = 200.0 * mels / 3.0
    log_region = mels >= 15.0
    log_freq_hz = 1000.0 * np.exp((np.log(6.4) / 27.0) * (np.where(log_region, mels, 15.0) - 15.0))
    return np.where(log_region, log_freq_hz, freq_hz)


def mel_filters(cfg: WhisperFeatureConfig) -> np.ndarray:
    """Slaney-normalised triangular mel filters, float64 [n_freq, n_mels] (n_freq = n_fft // 2 + 1).

    The same matrix as ``transformers.audio_utils.mel_filter_bank(num_frequency_bins=n_freq,
    num_mel_filters=feature_size, min_frequency=0, max_frequency=8000, sampling_rate, norm="slaney",
    mel_scale="slaney")``: n_mels + 2 points evenly spaced on the slaney mel scale between 0 and 8000 Hz, FFT bins
    at ``linspace(0, sampling_rate // 2, n_freq)``, triangles in Hz, each scaled by ``2 / (upper - lower edge)``.
    """
    n_mels = cfg.feature_size
    mel_points = np.linspace(_hertz_to_mel_slaney(_MEL_MIN_HZ), _hertz_to_mel_slaney(_MEL_MAX_HZ), n_mels + 2)
    edges_hz = _mel_to_hertz_slaney(mel_points)  # [n_mels + 2]
    fft_hz = np.linspace(0, cfg.sampling_rate // 2, cfg.n_freq)  # [n_freq]

    edge_gaps = np.diff(edges_hz)  # [n_mels + 1]
    slopes_FE = edges_hz[None, :] - fft_hz[:, None]  # [n_freq, n_mels + 2]
    down_FM = -slopes_FE[:, :-2] / edge_gaps[:-1]
    up_FM = slopes_FE[:, 2:] / edge_gaps[1:]
    filters_FM = np.maximum(np.zeros(1), np.minimum(down_FM, up_FM))
    filters_FM *= (2.0 / (edges_hz[2 : n_mels + 2] - edges_hz[:n_mels]))[None, :]
    return filters_FM


def hann_window(n_fft: int) -> np.ndarray:
    """Periodic Hann window, float64 [n_fft] (``torch.hann_window(n_fft)``, transformers' ``window_function``)."""
    return np.hanning(n_fft + 1)[:-1]


# ---------------------------------------------------------------------------------------------------------------
# Features


def _check_clip(samples: np.ndarray, cfg: WhisperFeatureConfig, name: str) -> np.ndarray:
    """``samples`` as a float32 [n] array after checking rank, dtype, length and finiteness (``MediaError``)."""
    samples = np.asarray(samples)
    if samples.ndim != 1:
        raise MediaError(f"{name}: expected mono samples of shape [n], got shape {tuple(samples.shape)}")
    if not np.issubdtype(samples.dtype, np.floating):
        raise MediaError(
            f"{name}: expected float samples, got dtype {samples.dtype} (integer PCM must be scaled first, see "
            "preprocess.audio.load_audio)"
        )
    if samples.size < cfg.min_samples:
        raise MediaError(
            f"{name}: {samples.size} samples ({1000 * samples.size / cfg.sampling_rate:.1f} ms) is shorter than the "
            f"minimum of {cfg.min_samples} samples ({1000 * cfg.min_samples / cfg.sampling_rate:.1f} ms)"
        )
    samples = samples.astype(np.float32, copy=False)
    if not np.all(np.isfinite(samples)):
        raise MediaError(f"{name}: audio holds NaN or infinite samples")
    return samples


def _log_mel_unchecked(
    samples_N: np.ndarray, cfg: WhisperFeatureConfig, filters_FM: np.ndarray, seed: int
) -> np.ndarray:
    """Whisper log-mel of float32 samples [N] (N >= min_samples) -> float32 [n_mels, N // hop_length]."""
    wave = samples_N.astype(np.float64)
    if cfg.dither != 0.0:
        wave = wave + cfg.dither * np.random.default_rng(seed).standard_normal(wave.shape)
    half = cfg.n_fft // 2
    padded = np.pad(wave, (half, half), mode="reflect")  # centred frames, like torch.stft(center=True)
    frames_TW = np.lib.stride_tricks.sliding_window_view(padded, cfg.n_fft)[:: cfg.hop_length]  # [N // hop + 1, n_fft]
    spectrum_TF = np.fft.rfft(frames_TW * hann_window(cfg.n_fft), axis=-1)
    power_TF = spectrum_TF.real**2 + spectrum_TF.imag**2
    mel_MT = np.maximum(_MEL_FLOOR, filters_FM.T @ power_TF.T)
    log_MT = np.log10(mel_MT).astype(np.float32)[:, :-1]  # the last frame is dropped
    log_MT = np.maximum(log_MT, log_MT.max() - np.float32(8.0))
    return (log_MT + np.float32(4.0)) / np.float32(4.0)


def log_mel(samples, cfg: WhisperFeatureConfig, seed: int = 0) -> np.ndarray:
    """Whisper log-mel features of one clip, float32 [n_mels, n // hop_length] for n samples.

    The features transformers' ``WhisperFeatureExtractor`` gives for this clip alone with ``padding=True`` (no
    padding for a single clip). ``samples``: mono [n] at ``cfg.sampling_rate``, cast to float32 first like the
    reference, n >= ``cfg.min_samples``. ``seed`` seeds the dither noise (only used when ``cfg.dither > 0``).
    Raises ``MediaError`` on a bad shape, a too-short clip, or NaN / infinite samples.
    """
    samples_N = _check_clip(samples, cfg, "audio clip")
    return _log_mel_unchecked(samples_N, cfg, mel_filters(cfg), seed)


def frame_mask(lengths: list[int], padded_length: int, cfg: WhisperFeatureConfig) -> np.ndarray:
    """int32 [batch, padded_length // hop_length] feature attention mask of clips of ``lengths`` samples padded
    to ``padded_length`` on ``cfg.padding_side``.

    The sample mask (1 on real samples) taken every ``hop_length`` samples, its last column dropped when
    ``padded_length % hop_length != 0``, exactly as ``WhisperFeatureExtractor`` rescales it. With right padding a
    clip of n samples gets ``min(ceil(n / hop), padded_length // hop)`` leading ones.
    """
    sample_mask_BL = np.zeros((len(lengths), padded_length), dtype=np.int32)
    for row, n in enumerate(lengths):
        if not 0 <= n <= padded_length:
            raise ValueError(f"clip length {n} is outside [0, {padded_length}]")
        if cfg.padding_side == "right":
            sample_mask_BL[row, :n] = 1
        else:
            sample_mask_BL[row, padded_length - n :] = 1
    mask_BT = sample_mask_BL[:, :: cfg.hop_length]
    if padded_length % cfg.hop_length != 0:
        mask_BT = mask_BT[:, :-1]
    return np.ascontiguousarray(mask_BT)


def batch_features(clips, cfg: WhisperFeatureConfig, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Features and feature attention mask of a batch of clips, as ``Qwen3OmniMoeProcessor`` makes them.

    ``clips``: a non-empty list of mono sample arrays [n_i] at ``cfg.sampling_rate`` (each n_i >=
    ``cfg.min_samples``). Every clip is cast to float32 and padded with ``cfg.padding_value`` to the longest one,
    L = max n_i (no truncation, no 30 s chunking: a 5-minute clip stays whole), then featurised on its own with
    :func:`log_mel`'s arithmetic (so a padded clip's max-8 clamp and the STFT frames near its end see the padding,
    as in the reference).

    Returns ``(features float32 [batch, n_mels, L // hop], feature_attention_mask int32 [batch, L // hop])``; the
    mask is :func:`frame_mask`, and ``feature_attention_mask.sum(-1)`` is what the processor feeds to
    :func:`audio_token_count`. Raises ``MediaError`` naming the clip on an empty batch, a bad shape, a too-short
    clip, or NaN / infinite samples.
    """
    if isinstance(clips, np.ndarray) and clips.ndim == 1:
        raise MediaError("batch_features expects a list of clips; got a single 1-D array (wrap it in a list)")
    clips = list(clips)
    if not clips:
        raise MediaError("no audio clips to featurise")
    checked = [_check_clip(clip, cfg, f"audio clip {i}") for i, clip in enumerate(clips)]
    lengths = [clip.size for clip in checked]
    padded_length = max(lengths)
    filters_FM = mel_filters(cfg)
    pad_value = np.float32(cfg.padding_value)

    features = np.empty((len(checked), cfg.feature_size, padded_length // cfg.hop_length), dtype=np.float32)
    for i, clip in enumerate(checked):
        pad = padded_length - clip.size
        widths = (0, pad) if cfg.padding_side == "right" else (pad, 0)
        padded = np.pad(clip, widths, mode="constant", constant_values=pad_value) if pad else clip
        features[i] = _log_mel_unchecked(padded, cfg, filters_FM, seed + i)
    return features, frame_mask(lengths, padded_length, cfg)


def audio_token_count(num_frames: int, n_window: int = QWEN3_OMNI_N_WINDOW) -> int:
    """Audio tokens the Qwen3-Omni thinker makes of ``num_frames`` feature frames (valid frames, i.e. the
    clip's ``feature_attention_mask`` sum).

    ``_get_feat_extract_output_lengths`` of ``modeling_qwen3_omni_moe.py``: the encoder cuts the frames into chunks
    of ``2 * n_window`` (100 frames = 1 s at hop 160 / 16 kHz); each full chunk gives 13 tokens (three stride-2
    convolutions: 100 -> 50 -> 25 -> 13), and the leftover r = num_frames % 100 frames give
    ``ceil(ceil(ceil(r / 2) / 2) / 2)`` tokens (0 when r = 0).
    """
    if isinstance(num_frames, bool) or not isinstance(num_frames, (int, np.integer)) or num_frames < 0:
        raise ValueError(f"num_frames must be a non-negative integer, got {num_frames!r}")
    if isinstance(n_window, bool) or not isinstance(n_window, (int, np.integer)) or n_window <= 0:
        raise ValueError(f"n_window must be a positive integer, got {n_window!r}")
    num_frames, chunk = int(num_frames), 2 * int(n_window)
    leftover = num_frames % chunk
    after_conv1 = (leftover - 1) // 2 + 1
    after_conv2 = (after_conv1 - 1) // 2 + 1
    after_conv3 = (after_conv2 - 1) // 2 + 1
    return after_conv3 + (num_frames // chunk) * 13
