"""Decompression bombs and oversized inputs are refused from the header or the array shape, before they cost
memory; large images that are allowed are reduced while loading, holding the full-resolution pixels at most once.

Memory is measured as the growth of the peak resident set (VmHWM, reset through /proc/self/clear_refs) of a fresh
subprocess around one call, so each figure is deterministic and independent of the test process.
"""

from __future__ import annotations

import json
import os
import pathlib
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

from omnijax.common.errors import CheckpointError
from omnijax.preprocess.gemma3.image import Gemma3ImageConfig
from omnijax.preprocess.images import load_image
from omnijax.preprocess.media_limits import MAX_IMAGE_PIXELS, WORKING_IMAGE_PIXELS
from omnijax.preprocess.qwen3_omni.image import QwenImageConfig
from omnijax.preprocess.qwen3_omni.audio_features import WhisperFeatureConfig
from fixtures.child_path import child_python_path

MB = 2**20

PROBE = r"""
import json, sys, time
import numpy as np
from omnijax.preprocess.audio import load_audio
from omnijax.preprocess.images import load_image
from omnijax.common.errors import MediaError

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
load_image(np.zeros((8, 8, 3), np.uint8)); load_audio((np.zeros(1600, np.int16), 16000))  # warm up
setup = SETUP
open("/proc/self/clear_refs", "w").write("5")
before, start = status("VmRSS"), time.perf_counter()
try:
    out = CALL
    result = {"size": list(out.size) if hasattr(out, "mode") else list(np.shape(out))}
except MediaError as e:
    result = {"error": str(e)}
result.update(growth=status("VmHWM") - before, seconds=time.perf_counter() - start)
print(json.dumps(result))
"""


def measure(call: str, setup: str = "None") -> dict:
    """Run ``call`` (an expression; ``setup``'s value is ``setup``) in a fresh interpreter: its result or error,
    the growth of the peak resident memory in bytes, and the seconds it took."""
    code = PROBE.replace("SETUP", setup).replace("CALL", call)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=child_python_path()))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def write_png(path: pathlib.Path, width: int, height: int, channels: int) -> pathlib.Path:
    """A PNG of zeros, written row by row (the file is small however large the image)."""
    color = {1: 0, 3: 2}[channels]
    compress = zlib.compressobj(9)
    row = b"\0" * (1 + width * channels)
    data = b"".join(compress.compress(row) for _ in range(height)) + compress.flush()

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, color, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b""))
    return path


def test_a_png_bomb_is_refused_from_its_header(tmp_path):
    bomb = write_png(tmp_path / "bomb.png", 13_300, 13_300, 1)  # 177 MP in about 0.2 MB
    assert bomb.stat().st_size < MB
    got = measure(f"load_image({str(bomb)!r})")
    assert "13300x13300" in got["error"] and "largest image accepted" in got["error"]
    assert got["growth"] < 16 * MB, got
    three = measure(f"[load_image({str(bomb)!r}) for _ in range(3)]")  # one demo message with three of them
    assert three["growth"] < 16 * MB and "error" in three


def test_a_large_allowed_image_is_reduced_holding_full_resolution_once(tmp_path):
    width, height = 6000, 5000  # 30 MP RGB: over the working size, under the limit
    big = write_png(tmp_path / "big.png", width, height, 3)
    got = measure(f"load_image({str(big)!r})")
    assert got["size"] == [3000, 2500] and 3000 * 2500 <= WORKING_IMAGE_PIXELS
    full = width * height * 4  # PIL holds RGB as 4 bytes a pixel
    assert got["growth"] < full * 1.5, (got["growth"] / MB, full / MB)


def test_in_memory_images_are_capped_and_reduced_without_a_full_copy():
    over = measure("load_image(setup)", "np.zeros((9000, 6000, 3), np.uint8)")  # 54 MP
    assert "9000" in over["error"] and over["growth"] < 16 * MB
    for shape, dtype in (("(6000, 5000)", "np.uint8"), ("(6000, 5000, 3)", "np.float32"),
                         ("(6000, 5000, 3)", "np.float64")):  # zeros: the array takes no memory until written
        got = measure("load_image(setup)", f"np.zeros({shape}, {dtype})")
        assert got["size"] == [2500, 3000], got
        assert got["growth"] < 64 * MB, (dtype, got["growth"] / MB)  # the reduced image is 21 MB
    pil = measure("load_image(setup)", "__import__('PIL.Image').Image.new('RGB', (9000, 6000))")
    assert "9000x6000" in pil["error"]


def test_long_audio_is_refused_from_the_array_shape_before_conversion():
    three_hours = "np.zeros((3 * 3600 * 48000, 2), np.int16)"  # 2 GB of samples
    got = measure("load_audio((setup, 48000), max_seconds=1200)", three_hours)
    assert "10800.00 s, longer than the limit of 1200 s" in got["error"]
    assert got["growth"] < 16 * MB and got["seconds"] < 1.0, got
    bare = measure("load_audio(setup, max_seconds=1200)", "np.zeros(16000 * 7200, np.float64)")
    assert "longer than the limit" in bare["error"] and bare["growth"] < 16 * MB
    channels = measure("load_audio((setup, 16000))", "np.zeros((1000, 16000), np.float32)")
    assert "1000 channels" in channels["error"]


def test_high_rate_multichannel_audio_holds_only_the_resampled_mono(tmp_path):
    """A file and a video's sound track are averaged and resampled block by block as they are decoded: memory
    grows by about the 16 kHz mono output, not by the source's rate x channels (before: 4 bytes per sample at the
    source rate for a file, and per channel for a video's track: 369 MB for this 16 KB video)."""
    import soundfile

    from fixtures.video_files import write_sound_video

    wav = tmp_path / "high.wav"  # 40 s of stereo at 384 kHz: 61 MB of 16-bit PCM, 61 MB of float32 mono
    with soundfile.SoundFile(str(wav), "w", samplerate=384000, channels=2, subtype="PCM_16") as f:
        block = (np.sin(np.arange(384000) * 0.01)[:, None] * [0.3, -0.2] * 32767).astype(np.int16)
        for _ in range(40):
            f.write(block)
    got = measure(f"load_audio({str(wav)!r}, max_seconds=1200)")
    assert got["size"] == [40 * 16000], got
    assert got["growth"] < 24 * MB, got["growth"] / MB
    film = write_sound_video(tmp_path / "film.mkv", codec="flac", layout="7.1", rate=384000, seconds=30, silent=True)
    assert film.stat().st_size < 64 * 1024
    track = measure("__import__('omnijax.preprocess.video_decode', fromlist=['_']).decode_audio_track("
                    f"__import__('omnijax.preprocess.video_decode', fromlist=['_']).probe(setup), 1200, 16000)",
                    f"(__import__('av'), __import__('pathlib').Path({str(film)!r}))[1]")  # PyAV loaded before
    assert track["size"] == [30 * 16000], track
    assert track["growth"] < 32 * MB, track["growth"] / MB


def test_allowed_audio_converts_in_float32():
    minute = "np.zeros((60 * 48000, 2), np.int16)"
    got = measure("load_audio((setup, 48000), max_seconds=1200)", minute)
    assert got["size"] == [60 * 16000]
    stereo_float32 = 60 * 48000 * 2 * 4
    assert got["growth"] < 2 * stereo_float32, got["growth"] / MB  # no float64 copy of the samples


def test_processor_settings_are_bounded():
    with pytest.raises(CheckpointError, match="over the limit"):
        Gemma3ImageConfig.from_dict({"size": {"height": 100_000, "width": 100_000}})
    with pytest.raises(CheckpointError, match="pan_and_scan_max_num_crops"):
        Gemma3ImageConfig.from_dict({"pan_and_scan_max_num_crops": 10_000})
    with pytest.raises(CheckpointError, match="max_pixels"):
        QwenImageConfig.from_dict({"min_pixels": 3136, "max_pixels": 10**10})
    with pytest.raises(CheckpointError, match="min_pixels"):
        QwenImageConfig.from_dict({"min_pixels": 10**6, "max_pixels": 10**5})
    with pytest.raises(CheckpointError, match="patch_size"):
        QwenImageConfig.from_dict({"patch_size": 100_000})
    for bad in ({"feature_size": 100_000}, {"n_fft": 10**7}, {"sampling_rate": 10**9}):
        with pytest.raises(CheckpointError, match="over the limit"):
            WhisperFeatureConfig.from_dict(bad)


def test_limits_leave_ordinary_images_exact():
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)
    np.testing.assert_array_equal(np.asarray(load_image(pixels)), pixels)
    floats = rng.random((30, 40, 4)).astype(np.float32)
    reference = (floats.astype(np.float64) * 255).astype(np.float32).astype(np.uint8)
    alpha = reference[..., 3:4] / 255
    expected = np.round(alpha * reference[..., :3] + (1 - alpha) * 255).astype(np.uint8)
    np.testing.assert_array_equal(np.asarray(load_image(floats)), expected)
    assert MAX_IMAGE_PIXELS == 50_000_000
