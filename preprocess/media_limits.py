"""How large an input image or audio clip may be, and how large processor settings may make one.

Checked before decoding (from a file's header or an array's shape), so a small file that expands into gigabytes
(a "decompression bomb") is refused before it costs memory:

* MAX_IMAGE_PIXELS: the largest image accepted, width x height (50 MP; a 45 MP camera's photo fits).
* WORKING_IMAGE_PIXELS: a larger image than this (16.8 MP, 4096 x 4096) is reduced on load by a whole factor
  (box filter; a JPEG is decoded at the reduced scale) to at most this many pixels: no family's processor uses
  more (Qwen3-Omni's largest resize is 12.8 MP), and the full-resolution pixels are held at most once.
* MAX_AUDIO_CHANNELS: more channels than this is not an audio clip; MIN_AUDIO_RATE .. MAX_AUDIO_RATE: the sampling
  rates accepted (audio outside is not speech or music, and resampling from a rate of a few Hz does not return).
* Processor settings (image processor and feature extractor configs) are bounded by the PROCESSOR_* values: the
  size an image is resized to, the number of pan-and-scan crops, the mel bins and window of the audio features.
"""

from __future__ import annotations

import math

from omnijax.common.errors import MediaError

MAX_IMAGE_PIXELS = 50_000_000
WORKING_IMAGE_PIXELS = 4096 * 4096
MAX_AUDIO_CHANNELS = 64
MIN_AUDIO_RATE = 1000  # Hz (telephone audio: 8000)
MAX_AUDIO_RATE = 384_000

PROCESSOR_MAX_SIDE = 8192  # an image resized by a processor: at most 8192 px a side
PROCESSOR_MAX_PIXELS = 64 * 2**20  # ... and at most 64 MP (Qwen max_pixels; real: 12.8 MP)
PROCESSOR_MAX_PATCH = 1024  # patch_size
PROCESSOR_MAX_MERGE = 64  # merge_size, temporal_patch_size
PROCESSOR_MAX_CROPS = 64  # pan-and-scan crops per image (real: 4)
PROCESSOR_MAX_MEL_BINS = 1024
PROCESSOR_MAX_FFT = 65536  # n_fft and hop_length (real: 400, 160)
PROCESSOR_MAX_RATE = MAX_AUDIO_RATE  # sampling_rate in Hz
PROCESSOR_MAX_CHUNK_SECONDS = 3600


def check_image_pixels(width: int, height: int, name: str) -> None:
    """MediaError naming ``name`` when a width x height image is over MAX_IMAGE_PIXELS."""
    if width * height > MAX_IMAGE_PIXELS:
        raise MediaError(f"{name} is {width}x{height} pixels ({width * height / 1e6:.1f} MP); the largest image "
                         f"accepted is {MAX_IMAGE_PIXELS / 1e6:g} MP: scale it down first")


def reduce_factor(width: int, height: int) -> int:
    """The smallest whole factor that brings a width x height image to at most WORKING_IMAGE_PIXELS (1: none)."""
    factor = max(1, math.ceil(math.sqrt(width * height / WORKING_IMAGE_PIXELS)))
    while math.ceil(width / factor) * math.ceil(height / factor) > WORKING_IMAGE_PIXELS:
        factor += 1
    return factor


# Video files (checked from the headers before any frame is decoded; preprocess/video_decode.py) and videos as
# frame arrays: at most 3 hours, frames of at most 8192 x 4320 pixels (DCI 8K), at most a million frames in the
# file, and at most MAX_VIDEO_SAMPLED_FRAMES frames kept for the model (sampling keeps far fewer: 768 at most for
# Qwen3-Omni, 32 by default for Gemma 4).
MAX_VIDEO_SECONDS = 3 * 3600
MAX_VIDEO_FRAME_PIXELS = 8192 * 4320
MAX_VIDEO_FRAMES = 1_000_000
MAX_VIDEO_SAMPLED_FRAMES = 1024
