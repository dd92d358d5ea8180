"""A video content part -> its frames (sampled and resized the way the family's processor says) and audio track.

A part is ``{"type": "video", "video": <file path | uint8 array [frames, H, W, 3]>, ...}`` with optional keys:

* ``"fps"``: for an array, the rate its frames were taken at (required: the prompt's timestamps and time-aware
  positions depend on it); for a file, the rate to sample at instead of the checkpoint's.
* ``"audio"``: ``(waveform, sample_rate)`` beside an array of frames: its sound track.
* ``"use_audio_in_video"``: ``False`` leaves the file's audio track (or ``"audio"``) out.

An array is used as given (transformers' ``do_sample_frames=False``); a file is probed, sampled with the family's
sampler and decoded by seeking (preprocess/video_decode.py). Every kept frame is resized at once by the family's
``resize`` (frame size -> target size; all frames of a video share one size), so only resized frames are held.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Callable

import numpy as np

from omnijax.common.errors import MediaError, PromptError
from omnijax.preprocess.audio import load_audio
from omnijax.preprocess.media_limits import MAX_VIDEO_FRAME_PIXELS, MAX_VIDEO_SAMPLED_FRAMES
from omnijax.preprocess.resize_uint8 import resize_uint8
from omnijax.preprocess.sources import local_path
from omnijax.preprocess.video_decode import decode_audio_track, decode_frames, probe
from omnijax.preprocess.video_sampling import SampledFrames

AUDIO_RATE = 16000
VIDEO_KEYS = ("video", "path", "url")
# File name extensions the front ends take as videos (containers FFmpeg reads).
VIDEO_EXTENSIONS = frozenset({".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".mpg", ".mpeg", ".ts", ".3gp"})


@dataclasses.dataclass
class Video:
    """A loaded video: ``frames`` uint8 [F, h, w, 3] (resized), which frames of the source they are, and its sound
    (mono float32 at 16 kHz) when asked for and present."""

    frames: np.ndarray
    sampled: SampledFrames
    audio: np.ndarray | None = None


def check_video_part(part: dict, where: str) -> None:
    """PromptError naming ``where`` for a malformed video part (checked before anything is read)."""
    value = next((part.get(k) for k in VIDEO_KEYS if part.get(k) is not None), None)
    if value is None:
        raise PromptError(f"{where}: a video part needs its 'video' value (a file path or a uint8 array "
                          f"[frames, height, width, 3])")
    fps = part.get("fps")
    if fps is not None and (isinstance(fps, bool) or not isinstance(fps, (int, float, np.integer, np.floating))
                            or not math.isfinite(float(fps)) or float(fps) <= 0):
        raise PromptError(f"{where}: 'fps' must be a positive number, got {fps!r}")
    if isinstance(value, np.ndarray) and fps is None:
        raise PromptError(f"{where}: a video given as an array of frames needs its 'fps' (the rate the frames were "
                          f"taken at)")
    flag = part.get("use_audio_in_video")
    if flag is not None and not isinstance(flag, bool):
        raise PromptError(f"{where}: 'use_audio_in_video' must be true or false, got {flag!r}")
    audio = part.get("audio")
    if audio is not None and not (isinstance(audio, (tuple, list)) and len(audio) == 2):
        raise PromptError(f"{where}: a video's 'audio' must be (waveform, sample_rate)")
    if audio is not None and not isinstance(value, np.ndarray):
        raise PromptError(f"{where}: 'audio' goes beside an array of frames; a file's own audio track is read from "
                          f"the file")


def video_value(part: dict):
    return next(part.get(k) for k in VIDEO_KEYS if part.get(k) is not None)


def _frames_array(value: np.ndarray) -> np.ndarray:
    if value.dtype != np.uint8 or value.ndim != 4 or value.shape[-1] != 3:
        raise MediaError(f"a video array must be uint8 [frames, height, width, 3], got {value.dtype} of shape "
                         f"{tuple(value.shape)}")
    frames, height, width, _ = value.shape
    if min(frames, height, width) == 0:
        raise MediaError(f"a video array has no pixels: shape {tuple(value.shape)}")
    if frames > MAX_VIDEO_SAMPLED_FRAMES:
        raise MediaError(f"a video array of {frames} frames is over the limit of {MAX_VIDEO_SAMPLED_FRAMES}: sample "
                         f"it first")
    if height * width > MAX_VIDEO_FRAME_PIXELS:
        raise MediaError(f"video frames of {width}x{height} pixels are larger than the limit of "
                         f"{MAX_VIDEO_FRAME_PIXELS / 1e6:g} MP a frame")
    return value


def load_video(part: dict, *, sample: Callable[[int, float, float | None], list[int]],
               target_size: Callable[[int, int], tuple[int, int]], resample: int, with_audio: bool,
               max_audio_seconds: float) -> Video:
    """The frames (and, with ``with_audio`` and unless the part says ``"use_audio_in_video": False``, the sound) of
    one checked video part.

    sample: (frame count, video fps, the part's fps or None) -> frame indices for a file; target_size: (height,
    width) of a frame -> the (height, width) the processor resizes it to; resample: the resize filter (PIL ids).
    """
    value = video_value(part)
    with_audio = with_audio and part.get("use_audio_in_video", True)
    fps = None if part.get("fps") is None else float(part["fps"])
    if isinstance(value, np.ndarray):
        frames = _frames_array(value)
        height, width = target_size(frames.shape[1], frames.shape[2])
        frames = np.stack([resize_uint8(f, height, width, resample) for f in frames])
        sampled = SampledFrames(tuple(range(len(frames))), len(frames), fps)
        audio = None
        if with_audio and part.get("audio") is not None:
            audio = load_audio(tuple(part["audio"]), AUDIO_RATE, max_seconds=max_audio_seconds)
        return Video(frames, sampled, audio)
    if not isinstance(value, (str, os.PathLike)):
        raise MediaError(f"unsupported video source of type {type(value).__name__}; expected a file path or a uint8 "
                         f"array [frames, height, width, 3]")
    path = local_path(value, "video")
    if not path.is_file():
        raise MediaError(f"video file not found: {path}")
    info = probe(path)
    indices = sample(info.frames, info.fps, fps)
    if len(indices) > MAX_VIDEO_SAMPLED_FRAMES:
        raise MediaError(f"sampling {path} keeps {len(indices)} frames, over the limit of {MAX_VIDEO_SAMPLED_FRAMES}: "
                         f"ask for a lower fps")
    height, width = target_size(info.height, info.width)
    frames, kept = decode_frames(info, indices, lambda f: resize_uint8(f, height, width, resample))
    audio = None
    if with_audio:
        track = decode_audio_track(info, max_audio_seconds, AUDIO_RATE)
        if track is not None:
            audio = load_audio(track, AUDIO_RATE, max_seconds=max_audio_seconds)  # checked: finite, within the limit
    return Video(np.stack(frames), SampledFrames(tuple(kept), info.frames, info.fps), audio)


def load_video_parts(messages: list[dict], load: Callable[[dict], Video], *, sound_as_audio_part: bool = False
                     ) -> list[dict]:
    """``messages`` with each video part's value replaced by its loaded :class:`Video` (``load``); with
    ``sound_as_audio_part``, a video's sound also becomes an audio part right after it (what transformers'
    ``apply_chat_template(..., load_audio_from_video=True)`` does) and leaves the video."""
    out = []
    for message in messages:
        content = []
        for part in message["content"]:
            if part["type"] != "video":
                content.append(part)
                continue
            video = load(part)
            if sound_as_audio_part and video.audio is not None:
                content += [{"type": "video", "video": dataclasses.replace(video, audio=None)},
                            {"type": "audio", "audio": video.audio}]
            else:
                content.append({"type": "video", "video": video})
        out.append({**message, "content": content})
    return out
