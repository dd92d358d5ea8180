"""Loading audio into mono float32 sample arrays at the model's sampling rate (16 kHz for Whisper-style encoders).

A file is decoded exactly as ``librosa.load(path, sr=sampling_rate, mono=True)`` decodes it, which is also what
``transformers.audio_utils.load_audio`` does without torchcodec (its ``"soundfile"`` backend): libsndfile decodes
to float32 (integer PCM divided by 2**15 / 2**31), channels are averaged (``np.mean`` over the channel axis, in
float32), and a different rate is resampled with ``soxr.resample(quality="soxr_hq")`` and zero-padded or trimmed to
``ceil(n * sampling_rate / source_rate)`` samples. These steps are written out here with soundfile and soxr
(librosa's own dependencies) so that loading does not import librosa. libsndfile reads wav, flac, ogg (vorbis,
opus), mp3 and more; when it cannot and audioread has a decoder beyond the standard library's wav / aiff readers
(ffmpeg, gstreamer, mad), the file goes through ``librosa.load``'s audioread fallback.

An in-memory ``(array, rate)`` pair goes through the same downmix and resampling (``librosa.resample`` with its
default ``soxr_hq``); a bare 1-D array is taken to be at ``sampling_rate`` already, as transformers' feature
extractors take it.
"""

from __future__ import annotations

import math
import os
import pathlib
import warnings

import numpy as np

from omnijax.common.errors import MediaError
from omnijax.preprocess.media_limits import MAX_AUDIO_CHANNELS, MAX_AUDIO_RATE, MIN_AUDIO_RATE
from omnijax.preprocess.sources import local_path

# Scale of integer PCM arrays, as libsndfile reads them into floats: x / 2**(bits - 1).
_INT_SCALE = {np.dtype(np.int16): 2.0**15, np.dtype(np.int32): 2.0**31}


def check_rate(rate: float, name: str) -> None:
    """MediaError unless ``rate`` (Hz) is within [MIN_AUDIO_RATE, MAX_AUDIO_RATE]: the resampler is not used outside
    (below a few Hz it does not return)."""
    if not MIN_AUDIO_RATE <= rate <= MAX_AUDIO_RATE:
        raise MediaError(f"{name}: sampling rate {rate:g} Hz is outside [{MIN_AUDIO_RATE}, {MAX_AUDIO_RATE}] Hz")


def check_channels(channels: int, name: str) -> None:
    """MediaError when ``channels`` is over MAX_AUDIO_CHANNELS."""
    if channels > MAX_AUDIO_CHANNELS:
        raise MediaError(f"{name}: {channels} channels; at most {MAX_AUDIO_CHANNELS} are accepted")


def _check_duration(num_samples: int, rate: float, max_seconds: float | None, name: str) -> None:
    """Raise ``MediaError`` when ``num_samples`` at ``rate`` Hz lasts longer than ``max_seconds``."""
    if max_seconds is None:
        return
    seconds = num_samples / rate
    if seconds > max_seconds:
        raise MediaError(f"{name}: audio lasts {seconds:.2f} s, longer than the limit of {max_seconds:g} s")


def downmix(samples_CN: np.ndarray) -> np.ndarray:
    """float32 [n] mean of float32 channels [C, n] (``librosa.to_mono``); [1, n] is returned as its one row."""
    if samples_CN.shape[0] == 1:
        return samples_CN[0]
    return np.mean(samples_CN, axis=0)


def resample(samples_N: np.ndarray, source_rate: float, target_rate: int) -> np.ndarray:
    """float32 [ceil(n * target_rate / source_rate)] resampling of float32 [n], the same samples as
    ``librosa.resample(samples_N, orig_sr=source_rate, target_sr=target_rate)`` (soxr_hq, then zero-padded or
    trimmed to length). Equal rates return the input."""
    if source_rate == target_rate:
        return samples_N
    stream = MonoStream(source_rate, target_rate)  # one resampler: the whole clip as one block
    stream.add(samples_N[None])
    return stream.finish()


class MonoStream:
    """Audio arriving block by block -> mono float32 at ``target_rate``: each float32 block [channels, n] is averaged
    to mono (:func:`downmix`) and fed through soxr's stream resampler, so only the output is held (at 16 kHz, a
    fraction of a high-rate multichannel source). The samples are exactly :func:`resample` of :func:`downmix` of the
    whole (the mean is per sample; soxr's stream gives ``soxr.resample``'s samples)."""

    def __init__(self, source_rate: float, target_rate: int):
        self.source_rate, self.target_rate = source_rate, target_rate
        self.read = 0  # source samples (per channel) taken so far
        self._blocks: list[np.ndarray] = []
        self._stream = None
        if source_rate != target_rate:
            import soxr

            self._stream = soxr.ResampleStream(source_rate, target_rate, 1, dtype="float32", quality="soxr_hq")

    def add(self, block_CN: np.ndarray) -> None:
        mono = np.ascontiguousarray(downmix(block_CN), dtype=np.float32)
        self.read += mono.shape[0]
        self._blocks.append(mono if self._stream is None else self._stream.resample_chunk(mono, last=False))

    def finish(self) -> np.ndarray:
        """float32 [ceil(read * target_rate / source_rate)] (zero-padded or trimmed as :func:`resample`)."""
        if self._stream is not None:
            self._blocks.append(self._stream.resample_chunk(np.zeros(0, np.float32), last=True))
        out = np.concatenate(self._blocks) if self._blocks else np.zeros(0, np.float32)
        self._blocks = []
        if self._stream is None:
            return out
        n_out = int(np.ceil(self.read * (float(self.target_rate) / self.source_rate)))
        if out.shape[0] < n_out:
            out = np.pad(out, (0, n_out - out.shape[0]))
        return out[:n_out]


def _layout(array: np.ndarray, name: str) -> tuple[int, int]:
    """(channels, samples) of a [n], [channels, n] or [n, channels] array, from its shape alone (2-D arrays are
    channels-first when ``shape[0] <= shape[1]``, librosa's layout). Raises ``MediaError`` on other ranks, empty
    arrays and more than MAX_AUDIO_CHANNELS channels."""
    if array.ndim == 1:
        channels, samples = 1, array.shape[0]
    elif array.ndim == 2:
        if min(array.shape) == 0:
            raise MediaError(f"{name}: audio array has no samples, shape {tuple(array.shape)}")
        channels, samples = (array.shape if array.shape[0] <= array.shape[1] else array.shape[::-1])
    else:
        raise MediaError(
            f"{name}: expected audio of shape [samples], [channels, samples] or [samples, channels], got shape "
            f"{tuple(array.shape)}"
        )
    if samples == 0:
        raise MediaError(f"{name}: audio has no samples")
    check_channels(channels, name)
    return channels, samples


def _to_mono_float32(array: np.ndarray, name: str) -> np.ndarray:
    """A mono float32 [n] array from [n], [channels, n] or [n, channels] float / int16 / int32 samples.

    Two-dimensional arrays are taken channels-first when ``shape[0] <= shape[1]`` (librosa's layout), otherwise
    channels-last. Integer PCM is scaled to [-1, 1) as libsndfile scales it (in float32: int16 converts exactly,
    and for int32 rounding then scaling by a power of two equals scaling in float64 then rounding). Raises
    ``MediaError`` on other dtypes, other ranks, no samples, or NaN / infinity. Check the length with ``_layout``
    first: this makes copies of the samples.
    """
    if array.dtype not in _INT_SCALE and not np.issubdtype(array.dtype, np.floating):
        raise MediaError(f"{name}: expected float, int16 or int32 audio samples, got dtype {array.dtype}")
    _layout(array, name)
    scale = _INT_SCALE.get(array.dtype)
    if scale is not None:
        array = array.astype(np.float32)
        array *= np.float32(1.0 / scale)  # a power of two: exact
    else:
        array = array.astype(np.float32, copy=False)
    if array.ndim == 2:
        array = downmix(array if array.shape[0] <= array.shape[1] else array.T)
    if not np.all(np.isfinite(array)):
        raise MediaError(f"{name}: audio holds NaN or infinite samples")
    return array


def _has_extra_audioread_decoder() -> bool:
    """Whether audioread can decode more than the standard library's wav / aiff readers (which libsndfile covers)."""
    try:
        with warnings.catch_warnings():  # audioread imports the standard library's deprecated aifc / sunau / audioop
            warnings.simplefilter("ignore", DeprecationWarning)
            import audioread
            from audioread import rawread
    except ImportError:
        return False
    return any(backend is not rawread.RawAudioFile for backend in audioread.available_backends())


def _decode_file(path: pathlib.Path, sampling_rate: int, max_seconds: float | None) -> np.ndarray:
    """float32 [n] mono samples at ``sampling_rate`` of the file at ``path`` (``librosa.load``'s steps)."""
    import soundfile

    try:
        with soundfile.SoundFile(str(path)) as f:
            rate = f.samplerate
            check_rate(rate, f"audio file {path}")
            # Refuse an over-long file from its header, before decoding it.
            if f.frames > 0:
                _check_duration(f.frames, rate, max_seconds, f"audio file {path}")
            check_channels(f.channels, f"audio file {path}")
            # Read block by block, averaging the channels of each block and resampling it as it comes (the same
            # numbers as doing both to the whole: MonoStream), so only the output is kept; never more than the
            # limit plus one block.
            cap = None if max_seconds is None else int(max_seconds * rate) + 1
            mono = MonoStream(rate, sampling_rate)
            for block_NC in f.blocks(blocksize=1 << 16, dtype="float32", always_2d=True):
                mono.add(block_NC.T)
                if cap is not None and mono.read > cap:
                    break
    except soundfile.SoundFileError as exc:
        if not _has_extra_audioread_decoder():
            raise MediaError(f"cannot decode audio file {path} (corrupt or unsupported format?): {exc}") from exc
        import librosa

        try:
            with warnings.catch_warnings():  # audioread is deprecated in librosa, which warns on every use
                warnings.simplefilter("ignore")
                samples, _ = librosa.load(str(path), sr=sampling_rate, mono=True,
                                          duration=None if max_seconds is None else max_seconds + 1.0)
        except Exception as fallback_exc:  # audioread's decoders raise many unrelated types
            raise MediaError(
                f"cannot decode audio file {path} (corrupt or unsupported format?): {exc}; audioread: "
                f"{fallback_exc or type(fallback_exc).__name__}"
            ) from fallback_exc
        return np.asarray(samples, dtype=np.float32)

    if mono.read == 0:
        raise MediaError(f"audio file {path} holds no samples")
    _check_duration(mono.read, rate, max_seconds, f"audio file {path}")
    return mono.finish()


def _load_file(path: pathlib.Path, sampling_rate: int, max_seconds: float | None) -> np.ndarray:
    """Decode and check the audio file at ``path``: mono float32 [n] at ``sampling_rate``."""
    if not path.exists():
        raise MediaError(f"audio file not found: {path}")
    if not path.is_file():
        raise MediaError(f"audio path is not a file: {path}")
    samples = _decode_file(path, sampling_rate, max_seconds)
    if samples.ndim != 1:
        raise MediaError(f"audio file {path}: decoded to shape {tuple(samples.shape)}, expected mono samples")
    if samples.size == 0:
        raise MediaError(f"audio file {path} holds no samples")
    if not np.all(np.isfinite(samples)):
        raise MediaError(f"audio file {path} holds NaN or infinite samples")
    _check_duration(samples.size, sampling_rate, max_seconds, f"audio file {path}")
    return np.ascontiguousarray(samples, dtype=np.float32)


def load_audio(source, sampling_rate: int = 16000, max_seconds: float | None = None) -> np.ndarray:
    """Mono float32 samples [n] at ``sampling_rate`` Hz, n >= 1, all finite, from ``source``.

    ``source`` is one of:
      * a path (``str`` or ``os.PathLike``) to an audio file (wav, flac, ogg, mp3, ...): decoded, averaged to
        mono and resampled like ``librosa.load(path, sr=sampling_rate, mono=True)`` (see the module docstring);
      * a tuple ``(array, rate)``: ``array`` is [n], [channels, n] or [n, channels], float or int16 / int32 PCM
        (scaled to [-1, 1)); channels are averaged and a ``rate`` other than ``sampling_rate`` is resampled with
        ``librosa.resample``'s soxr_hq;
      * a 1-D float numpy array, taken to be at ``sampling_rate`` already.

    ``max_seconds``: when given, audio longer than this many seconds is refused.

    Raises ``MediaError`` naming the file or the problem: missing file, undecodable or corrupt file, no samples,
    NaN / infinite samples, unsupported shape, dtype or rate, audio over ``max_seconds``, unsupported source type
    (URLs are not fetched).
    """
    if isinstance(sampling_rate, bool) or not isinstance(sampling_rate, int) or sampling_rate <= 0:
        raise ValueError(f"sampling_rate must be a positive integer, got {sampling_rate!r}")
    if max_seconds is not None and not max_seconds > 0:
        raise ValueError(f"max_seconds must be positive or None, got {max_seconds!r}")

    if isinstance(source, tuple):
        if len(source) != 2:
            raise MediaError(f"audio tuple must be (array, sampling_rate), got a tuple of {len(source)} items")
        array, rate = source
        name = "audio array"
        if not isinstance(array, np.ndarray):
            raise MediaError(f"{name}: expected a numpy array in (array, sampling_rate), got {type(array).__name__}")
        if isinstance(rate, bool) or not isinstance(rate, (int, float, np.integer, np.floating)):
            raise MediaError(f"{name}: sampling rate must be a number, got {rate!r}")
        if not (math.isfinite(float(rate)) and rate > 0):
            raise MediaError(f"{name}: sampling rate must be positive, got {rate!r}")
        check_rate(float(rate), name)
        rate = float(rate) if float(rate) != int(rate) else int(rate)
        if array.dtype not in _INT_SCALE and not np.issubdtype(array.dtype, np.floating):
            raise MediaError(f"{name}: expected float, int16 or int32 audio samples, got dtype {array.dtype}")
        _check_duration(_layout(array, name)[1], rate, max_seconds, name)  # before any copy is made
        samples = _to_mono_float32(array, name)
        try:
            samples = resample(samples, rate, sampling_rate)
        except (ValueError, RuntimeError) as exc:
            raise MediaError(f"{name}: cannot resample audio from {rate} Hz to {sampling_rate} Hz: {exc}") from exc
        if samples.size == 0:
            raise MediaError(f"{name}: no samples left after resampling from {rate} Hz to {sampling_rate} Hz")
        return np.ascontiguousarray(samples, dtype=np.float32)

    if isinstance(source, np.ndarray):
        name = "audio array"
        if source.ndim != 1:
            raise MediaError(
                f"{name}: a bare array must be mono [samples] at {sampling_rate} Hz, got shape {tuple(source.shape)}; "
                "pass (array, sampling_rate) for multi-channel audio"
            )
        if not np.issubdtype(source.dtype, np.floating):
            raise MediaError(
                f"{name}: a bare array must hold float samples, got dtype {source.dtype}; pass (array, sampling_rate) "
                "for integer PCM"
            )
        _check_duration(_layout(source, name)[1], sampling_rate, max_seconds, name)
        samples = _to_mono_float32(source, name)
        return np.ascontiguousarray(samples, dtype=np.float32)

    if isinstance(source, (str, os.PathLike)):
        return _load_file(local_path(source, "audio"), sampling_rate, max_seconds)

    raise MediaError(
        f"unsupported audio source of type {type(source).__name__}; expected a path, (array, sampling_rate) or a "
        "1-D numpy array"
    )
