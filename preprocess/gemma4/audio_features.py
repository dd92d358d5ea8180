"""Gemma 4 log-mel audio features in numpy, as transformers' ``Gemma4AudioFeatureExtractor`` computes them, and the
number of ``<|audio|>`` soft tokens ``Gemma4Processor`` gives a clip.

The reference (``feature_extraction_gemma4.py``, called by the processor with its call defaults
``padding="longest", max_length=480_000, truncation=True, pad_to_multiple_of=128``):

1. Each clip (float32) is truncated to its first ``max_length`` = 480 000 samples (30 s at 16 kHz, whatever the
   sampling rate), then every clip is right-padded with ``padding_value`` to the longest one rounded up to a multiple
   of 128 samples; a sample mask marks the real samples.
2. Per clip: ``frame_length // 2`` zeros are prepended ("semicausal" padding) to the samples and to the mask; frames
   of ``frame_length + 1`` samples every ``hop_length`` are cut; a frame keeps its first ``frame_length`` samples
   (or, with pre-emphasis, ``x[1:] - p * x[:-1]``, or HTK's ``[x0 (1 - p), x[1:-1] - p x[:-2]]``), is multiplied by
   a periodic Hann window of ``frame_length`` (float32) and zero-padded to ``fft_length`` = the next power of two
   (doubled with ``fft_overdrive``) for ``np.fft.rfft``; the magnitude (float32) times HTK mel filters without
   normalisation (0 to 8000 Hz, float64) gives ``log(mel + mel_floor)`` in float64, minus ``per_bin_mean`` and
   divided by ``per_bin_stddev`` when configured, cast to float32.
3. A frame is valid when the LAST sample of its ``frame_length + 1`` window is a real sample: frame i of a clip of n
   samples is valid iff ``i * hop + frame_length - frame_length // 2 < n``. Invalid frames are zeroed. Valid frames
   are a prefix, and their values depend only on the clip itself (never on the padding of a batch).

The processor then replaces each ``<|audio|>`` with ``<|audio>`` + ``<|audio|>`` x n + ``<audio|>``, n being the
valid frames after two stride-2 subsamplings of the frame mask (``Gemma4Processor.replace_audio_token``).

With the published settings (16 kHz, 20 ms / 10 ms frames, 128 bins): frames of 320 samples every 160, 160 zeros
prepended, ``rfft`` of 512, a clip of n samples has ``(n - 1) // 160`` valid frames and
``ceil(ceil(frames / 2) / 2)`` tokens, at most 750 (30 s).

The reference dithers with unseeded ``np.random.randn``; here dither noise comes from a generator seeded by
``seed``, so only dither 0 (the published setting) can match it value for value.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import numpy as np

from omnijax.common.config_values import as_float, as_int, config_getter
from omnijax.common.errors import CheckpointError, MediaError
from omnijax.preprocess.audio import load_audio
from omnijax.preprocess.processor_config import processor_section

# Gemma4AudioFeatureExtractor.__call__ defaults, which Gemma4Processor keeps (its audio kwargs set none of them).
REFERENCE_MAX_SAMPLES = 480_000
REFERENCE_PAD_TO_MULTIPLE_OF = 128
FEATURE_EXTRACTOR_TYPE = "Gemma4AudioFeatureExtractor"


@dataclasses.dataclass(frozen=True)
class Gemma4AudioFeatureConfig:
    """Settings of a ``Gemma4AudioFeatureExtractor`` (names as in its ``__init__``); defaults are that class's.

    Frame and hop lengths come from ``frame_length_ms`` / ``hop_length_ms`` like in the reference, which ignores
    the ``frame_length`` / ``hop_length`` / ``fft_length`` values it writes into its own config file.
    ``max_samples``: clips are truncated to this many samples (the reference call's ``max_length``).
    """

    feature_size: int = 128
    sampling_rate: int = 16000
    padding_value: float = 0.0
    frame_length_ms: float = 20.0
    hop_length_ms: float = 10.0
    min_frequency: float = 0.0
    max_frequency: float = 8000.0
    preemphasis: float = 0.0
    preemphasis_htk_flavor: bool = True
    fft_overdrive: bool = False
    dither: float = 0.0
    input_scale_factor: float = 1.0
    mel_floor: float = 1e-3
    per_bin_mean: tuple[float, ...] | None = None
    per_bin_stddev: tuple[float, ...] | None = None
    max_samples: int = REFERENCE_MAX_SAMPLES

    def __post_init__(self):
        for key in ("feature_size", "sampling_rate", "max_samples"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"'{key}' must be a positive integer, got {value!r}")
        for key in ("padding_value", "min_frequency", "max_frequency", "preemphasis", "dither", "input_scale_factor",
                    "mel_floor", "frame_length_ms", "hop_length_ms"):
            if not math.isfinite(getattr(self, key)):
                raise ValueError(f"'{key}' must be finite, got {getattr(self, key)!r}")
        if self.frame_length < 2:
            raise ValueError(f"frame_length_ms {self.frame_length_ms} gives a frame of {self.frame_length} samples "
                             f"at {self.sampling_rate} Hz; at least 2 are needed")
        if self.hop_length < 1:
            raise ValueError(f"hop_length_ms {self.hop_length_ms} gives a hop of {self.hop_length} samples at "
                             f"{self.sampling_rate} Hz; at least 1 is needed")
        if not 0 <= self.min_frequency < self.max_frequency:
            raise ValueError(f"need 0 <= min_frequency < max_frequency, got {self.min_frequency} and "
                             f"{self.max_frequency}")
        if self.mel_floor <= 0:
            raise ValueError(f"'mel_floor' must be positive, got {self.mel_floor!r}")
        if self.dither < 0:
            raise ValueError(f"'dither' must be >= 0, got {self.dither!r}")
        for key in ("per_bin_mean", "per_bin_stddev"):
            values = getattr(self, key)
            if values is not None and (len(values) != self.feature_size
                                       or not all(math.isfinite(v) for v in values)):
                raise ValueError(f"'{key}' must hold {self.feature_size} finite numbers, got {len(values)} values")
        if self.per_bin_stddev is not None and any(v == 0 for v in self.per_bin_stddev):
            raise ValueError("'per_bin_stddev' holds a zero")

    @property
    def frame_length(self) -> int:
        """Samples per frame: ``int(round(sampling_rate * frame_length_ms / 1000))`` (Python's round)."""
        return int(round(self.sampling_rate * self.frame_length_ms / 1000.0))

    @property
    def hop_length(self) -> int:
        """Samples between frames: ``int(round(sampling_rate * hop_length_ms / 1000))``."""
        return int(round(self.sampling_rate * self.hop_length_ms / 1000.0))

    @property
    def fft_length(self) -> int:
        """``2 ** ceil(log2(frame_length))``, doubled with ``fft_overdrive``."""
        return 2 ** math.ceil(math.log2(self.frame_length)) * (2 if self.fft_overdrive else 1)

    @property
    def pad_left(self) -> int:
        """Zeros prepended to every clip ("semicausal" padding): ``frame_length // 2``."""
        return self.frame_length // 2

    @property
    def min_samples(self) -> int:
        """Fewest samples giving one valid frame (and so one audio token): ``frame_length - pad_left + 1``."""
        return self.frame_length - self.pad_left + 1

    @property
    def max_seconds(self) -> float:
        """Seconds kept of a clip; anything after is cut off like the reference does."""
        return self.max_samples / self.sampling_rate

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "feature extractor config") -> "Gemma4AudioFeatureConfig":
        """The config from a feature extractor dict as transformers writes it (``preprocessor_config.json`` or the
        ``"feature_extractor"`` section of ``processor_config.json``).

        Missing keys and ``null`` values take the defaults; keys the reference recomputes or does not read
        (``frame_length``, ``hop_length``, ``fft_length``, ``return_attention_mask``, image settings, ...) are
        ignored. Raises ``CheckpointError`` mentioning ``source`` on a wrong type or range, a feature extractor
        other than ``Gemma4AudioFeatureExtractor``, or left padding (the valid-frame prefix and the token count
        assume right padding, the reference's default).
        """
        if not isinstance(d, dict):
            raise CheckpointError(f"{source}: expected a JSON object, got {type(d).__name__}")
        kind = d.get("feature_extractor_type")
        if kind is not None and kind != FEATURE_EXTRACTOR_TYPE:
            raise CheckpointError(f"{source}: expected feature_extractor_type {FEATURE_EXTRACTOR_TYPE!r}, got {kind!r}")
        side = d.get("padding_side")
        if side is not None and side != "right":
            raise CheckpointError(f"{source}: padding_side {side!r} is not supported (only 'right')")
        get = config_getter(d, cls())
        try:
            kwargs: dict[str, Any] = {}
            for key in ("feature_size", "sampling_rate"):
                kwargs[key] = as_int(get(key), key)
            for key in ("padding_value", "frame_length_ms", "hop_length_ms", "min_frequency", "max_frequency",
                        "preemphasis", "dither", "input_scale_factor", "mel_floor"):
                kwargs[key] = as_float(get(key), key)
            for key in ("preemphasis_htk_flavor", "fft_overdrive"):
                value = get(key)
                if not isinstance(value, bool):
                    raise ValueError(f"'{key}' must be true or false, got {value!r}")
                kwargs[key] = value
            for key in ("per_bin_mean", "per_bin_stddev"):
                value = get(key)
                kwargs[key] = None if value is None else _flat_numbers(value, key)
            return cls(**kwargs)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{source}: {exc}") from exc

    @classmethod
    def from_folder(cls, path: str | os.PathLike) -> "Gemma4AudioFeatureConfig":
        """The config of the checkpoint folder ``path``: the ``"feature_extractor"`` (or ``"audio_processor"``)
        section of ``processor_config.json``, else ``preprocessor_config.json``. Raises ``CheckpointError`` naming
        the folder or file when neither is there, a file is not valid JSON, or a value is unusable."""
        settings, source = processor_section(path, ("feature_extractor", "audio_processor"), "feature extractor")
        return cls.from_dict(settings, source=source)


def _flat_numbers(value, key: str) -> tuple[float, ...]:
    """The numbers of a (possibly nested) list, in order: transformers saves ``per_bin_mean`` as the [1, 1, bins]
    array it reshaped, and reads any nesting back with ``np.array(value).reshape(1, 1, bins)``."""
    if isinstance(value, (list, tuple)):
        return tuple(x for v in value for x in _flat_numbers(v, key))
    return (as_float(value, key),)


# ---------------------------------------------------------------------------------------------------------------
# Filters and window


def _hertz_to_mel_htk(freq_hz):
    return 2595.0 * np.log10(1.0 + (np.asarray(freq_hz, dtype=np.float64) / 700.0))


def _mel_to_hertz_htk(mels):
    return 700.0 * (np.power(10, np.asarray(mels, dtype=np.float64) / 2595.0) - 1.0)


def mel_filters(cfg: Gemma4AudioFeatureConfig) -> np.ndarray:
    """Triangular HTK mel filters without normalisation, float64 [fft_length // 2 + 1, feature_size].

    The matrix of ``transformers.audio_utils.mel_filter_bank(num_frequency_bins=fft_length // 2 + 1,
    num_mel_filters=feature_size, min_frequency, max_frequency, sampling_rate, norm=None, mel_scale="htk")``:
    feature_size + 2 points evenly spaced on the HTK mel scale, FFT bins at ``linspace(0, sampling_rate // 2,
    n_bins)``, triangles in Hz.
    """
    n_bins = cfg.fft_length // 2 + 1
    mel_points = np.linspace(_hertz_to_mel_htk(cfg.min_frequency), _hertz_to_mel_htk(cfg.max_frequency),
                             cfg.feature_size + 2)
    edges_hz = _mel_to_hertz_htk(mel_points)  # [M + 2]
    fft_hz = np.linspace(0, cfg.sampling_rate // 2, n_bins)  # [n_bins]
    edge_gaps = np.diff(edges_hz)
    slopes_FE = edges_hz[None, :] - fft_hz[:, None]  # [n_bins, M + 2]
    down_FM = -slopes_FE[:, :-2] / edge_gaps[:-1]
    up_FM = slopes_FE[:, 2:] / edge_gaps[1:]
    return np.maximum(np.zeros(1), np.minimum(down_FM, up_FM))


def hann_window(frame_length: int) -> np.ndarray:
    """Periodic Hann window, float32 [frame_length] (``window_function(frame_length)`` cast to float32)."""
    return np.hanning(frame_length + 1)[:-1].astype(np.float32)


# ---------------------------------------------------------------------------------------------------------------
# Frame and token counts


def valid_frame_count(num_samples: int, cfg: Gemma4AudioFeatureConfig) -> int:
    """Valid feature frames of a clip of ``num_samples`` samples (after truncation to ``cfg.max_samples``): the
    frames i whose window ends on a real sample, ``i * hop + frame_length - pad_left < n``."""
    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 0:
        raise ValueError(f"num_samples must be a non-negative integer, got {num_samples!r}")
    n = min(int(num_samples), cfg.max_samples)
    reach = cfg.frame_length - cfg.pad_left  # samples a frame's window reaches past its start, last one included
    return max(0, (n - reach - 1) // cfg.hop_length + 1)


def tokens_from_frames(num_frames: int) -> int:
    """Audio tokens from ``num_frames`` valid feature frames: ``Gemma4Processor.replace_audio_token`` subsamples
    the frame mask twice with stride 2 (``mask[::2][:(t + 2 - 3) // 2 + 1]``) and counts the ones; for a prefix
    mask that is ``ceil(ceil(num_frames / 2) / 2)``. The audio tower's output mask is the same subsampling."""
    if isinstance(num_frames, bool) or not isinstance(num_frames, (int, np.integer)) or num_frames < 0:
        raise ValueError(f"num_frames must be a non-negative integer, got {num_frames!r}")
    t = int(num_frames)
    for _ in range(2):
        t = (t + 1) // 2
    return t


def audio_token_count(num_samples: int, cfg: Gemma4AudioFeatureConfig) -> int:
    """``<|audio|>`` soft tokens ``Gemma4Processor`` inserts for a mono clip of ``num_samples`` samples at
    ``cfg.sampling_rate`` (longer clips count as truncated to ``cfg.max_samples``); 0 below ``cfg.min_samples``."""
    return tokens_from_frames(valid_frame_count(num_samples, cfg))


# ---------------------------------------------------------------------------------------------------------------
# Features


def _check_clip(samples, cfg: Gemma4AudioFeatureConfig, name: str, max_seconds: float | None) -> np.ndarray:
    """float32 [n] after checking rank, dtype, length bounds and finiteness (``MediaError``); truncated to
    ``cfg.max_samples``."""
    samples = np.asarray(samples)
    if samples.ndim != 1:
        raise MediaError(f"{name}: expected mono samples of shape [n], got shape {tuple(samples.shape)}")
    if not np.issubdtype(samples.dtype, np.floating):
        raise MediaError(f"{name}: expected float samples, got dtype {samples.dtype} (integer PCM must be scaled "
                         "first, see preprocess.audio.load_audio)")
    seconds = samples.size / cfg.sampling_rate
    if max_seconds is not None and seconds > max_seconds:
        raise MediaError(f"{name}: audio lasts {seconds:.2f} s, longer than the limit of {max_seconds:g} s")
    if samples.size < cfg.min_samples:
        raise MediaError(f"{name}: {samples.size} samples ({1000 * seconds:.1f} ms) is shorter than the minimum of "
                         f"{cfg.min_samples} samples ({1000 * cfg.min_samples / cfg.sampling_rate:.1f} ms) that "
                         "gives one audio token")
    samples = samples[: cfg.max_samples].astype(np.float32, copy=False)
    if not np.all(np.isfinite(samples)):
        raise MediaError(f"{name}: audio holds NaN or infinite samples")
    return samples


def _log_mel_frames(padded: np.ndarray, num_frames: int, cfg: Gemma4AudioFeatureConfig, filters_FM: np.ndarray,
                    window: np.ndarray, seed: int) -> np.ndarray:
    """float32 [num_frames, feature_size] log-mel of the first ``num_frames`` frames of float32 samples ``padded``
    (a clip, possibly followed by padding), in the reference's dtypes and operation order."""
    wave = padded
    if cfg.dither > 0.0:
        wave = wave + cfg.dither * np.random.default_rng(seed).standard_normal(wave.shape).astype(wave.dtype)
    if cfg.input_scale_factor != 1.0:
        wave = wave * cfg.input_scale_factor
    wave = np.pad(wave, (cfg.pad_left, 0))
    width = cfg.frame_length + 1
    frames_TW = np.lib.stride_tricks.sliding_window_view(wave, width)[:: cfg.hop_length][:num_frames]
    p = cfg.preemphasis
    if p > 0.0:
        if cfg.preemphasis_htk_flavor:
            frames_TW = np.concatenate([frames_TW[:, :1] * (1.0 - p), frames_TW[:, 1:-1] - p * frames_TW[:, :-2]],
                                       axis=-1)
        else:
            frames_TW = frames_TW[:, 1:] - p * frames_TW[:, :-1]
    else:
        frames_TW = frames_TW[:, :-1]
    spectrum_TF = np.fft.rfft(frames_TW * window, n=cfg.fft_length, axis=-1)  # complex64 from float32
    log_mel_TM = np.log(np.matmul(np.abs(spectrum_TF), filters_FM) + np.float64(cfg.mel_floor))  # float64
    if cfg.per_bin_mean is not None:
        log_mel_TM = log_mel_TM - np.asarray(cfg.per_bin_mean, dtype=np.float64)
    if cfg.per_bin_stddev is not None:
        log_mel_TM = log_mel_TM / np.asarray(cfg.per_bin_stddev, dtype=np.float64)
    return log_mel_TM.astype(np.float32)


def clip_features(samples, cfg: Gemma4AudioFeatureConfig, max_seconds: float | None = None,
                  seed: int = 0) -> np.ndarray:
    """The valid feature frames of one clip, float32 [valid_frames, feature_size].

    ``samples``: mono float [n] at ``cfg.sampling_rate`` (cast to float32 like the reference). Clips longer than
    ``cfg.max_samples`` are truncated to their start, as the reference does; ``max_seconds`` (before truncation)
    refuses longer ones instead. The rows equal the reference's features of this clip in any batch, up to its
    ``input_features_mask.sum()``; their count is :func:`valid_frame_count` and ``tokens_from_frames(rows)`` is the
    clip's token count. Raises ``MediaError`` on a bad shape or dtype, NaN / infinity, fewer than
    ``cfg.min_samples`` samples (no audio token), or a clip over ``max_seconds``.
    """
    clip = _check_clip(samples, cfg, "audio clip", max_seconds)
    return _log_mel_frames(clip, valid_frame_count(clip.size, cfg), cfg, mel_filters(cfg),
                           hann_window(cfg.frame_length), seed)


def load_clip_features(source, cfg: Gemma4AudioFeatureConfig, max_seconds: float | None = None) -> np.ndarray:
    """:func:`clip_features` of an audio source (a path, an ``(array, sampling_rate)`` pair or a mono array at
    ``cfg.sampling_rate``) loaded by :func:`preprocess.audio.load_audio`: decoded, averaged to mono and resampled to
    ``cfg.sampling_rate``; ``max_seconds`` bounds it (``MediaError``) before it is decoded where the format allows."""
    samples = load_audio(source, sampling_rate=cfg.sampling_rate, max_seconds=max_seconds)
    # load_audio bounded the source's duration; resampling may add a fraction of a sample, so no second check.
    return clip_features(samples, cfg)


def batch_features(clips, cfg: Gemma4AudioFeatureConfig, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Features and frame mask of a batch exactly as the reference's ``__call__`` lays them out.

    Each clip is truncated to ``cfg.max_samples``; all are padded with ``cfg.padding_value`` to the longest rounded
    up to a multiple of 128 samples, L. Returns ``(input_features float32 [batch, frames, feature_size],
    input_features_mask bool [batch, frames])`` with frames = ``(L + pad_left - frame_length - 1) // hop + 1``;
    invalid frames are zero. Raises ``MediaError`` like :func:`clip_features`, or on an empty batch.
    """
    if isinstance(clips, np.ndarray) and clips.ndim == 1:
        raise MediaError("batch_features expects a list of clips; got a single 1-D array (wrap it in a list)")
    clips = [_check_clip(clip, cfg, f"audio clip {i}", None) for i, clip in enumerate(clips)]
    if not clips:
        raise MediaError("no audio clips to featurise")
    multiple = REFERENCE_PAD_TO_MULTIPLE_OF
    padded_length = -(-max(c.size for c in clips) // multiple) * multiple
    num_frames = (padded_length + cfg.pad_left - cfg.frame_length - 1) // cfg.hop_length + 1
    filters_FM, window = mel_filters(cfg), hann_window(cfg.frame_length)
    features = np.zeros((len(clips), num_frames, cfg.feature_size), dtype=np.float32)
    mask = np.zeros((len(clips), num_frames), dtype=bool)
    for i, clip in enumerate(clips):
        valid = valid_frame_count(clip.size, cfg)
        padded = np.pad(clip, (0, padded_length - clip.size), constant_values=np.float32(cfg.padding_value))
        features[i, :valid] = _log_mel_frames(padded, valid, cfg, filters_FM, window, seed + i)
        mask[i, :valid] = True
    return features, mask
