"""Audio out as files: float samples -> 16-bit PCM, WAV bytes, and a WAV file written atomically."""

from __future__ import annotations

import io
import os
import pathlib
import tempfile
import wave

import numpy as np


def pcm16_bytes(samples: np.ndarray) -> bytes:
    """float samples in [-1, 1] -> 16-bit little-endian PCM (clipped, rounded to nearest)."""
    x = np.clip(np.asarray(samples, np.float32), -1.0, 1.0)
    return np.round(x * 32767.0).astype("<i2").tobytes()


def wav_bytes(samples: np.ndarray, sample_rate: int) -> bytes:
    """A whole mono 16-bit WAV file of ``samples``."""
    out = io.BytesIO()
    with wave.open(out, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(int(sample_rate))
        f.writeframes(pcm16_bytes(samples))
    return out.getvalue()


def write_wav(path, samples: np.ndarray, sample_rate: int) -> pathlib.Path:
    """Write ``samples`` as a mono 16-bit WAV file at ``path`` atomically (a temporary file beside it, then
    renamed: a reader never sees half a file, and a failure leaves what was there)."""
    path = pathlib.Path(path)
    data = wav_bytes(samples, sample_rate)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path
