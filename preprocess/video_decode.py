"""Reading video files with PyAV (FFmpeg): what the headers say, the sampled frames, and the audio track.

PyAV bundles FFmpeg in its wheels and needs no PyTorch. Work is bounded before it starts:

* :func:`probe` opens the file and reads its headers only: the first video stream's size, frame rate, frame count
  and duration. A file that is not a video, or whose headers promise more than the limits (duration, frame size,
  frame count; preprocess/media_limits.py), is a ``MediaError`` before any frame is decoded. A stream whose
  header frame count is 0 (WebM, MKV) is counted as ``duration x fps``.
* :func:`decode_frames` decodes only what the sampled frame indices need: it seeks (to the key frame before a
  sampled frame) whenever the next sampled frame is more than ``SEEK_GAP_SECONDS`` ahead, and otherwise decodes
  forward; frames between sampled ones are decoded (the codec needs them) but never converted to RGB. Each kept
  frame goes through ``convert`` (e.g. the processor's resize) at once, so only the converted frames are held.
  Decoding uses at most ``DECODE_THREADS`` threads. Frame i of a stream is the frame whose presentation time is
  i / fps from the stream's start: the i-th frame that transformers' PyAV reader (``read_video_pyav``), which
  decodes every frame from the start, would take, for a constant-rate stream.
* Interlaced streams: FFmpeg's decoders output whole frames (both fields woven), never black frames.
* :func:`decode_audio_track`: the first audio stream as mono float32 samples at the model's rate (None when the
  file has no audio stream), its rate and channels checked from the header, stopped at the duration limit.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
from typing import Callable

import numpy as np

from omnijax.common.errors import MediaError
from omnijax.preprocess.audio import MonoStream, check_channels, check_rate
from omnijax.preprocess.media_limits import MAX_VIDEO_FRAME_PIXELS, MAX_VIDEO_FRAMES, MAX_VIDEO_SECONDS

DECODE_THREADS = min(4, os.cpu_count() or 1)
SEEK_GAP_SECONDS = 2.0


@dataclasses.dataclass(frozen=True)
class VideoInfo:
    """What a video file's headers say about its first video stream.

    fps: frames per second (the stream's average rate, else its guessed rate); frames: the frame count (the
    header's, else ``duration x fps`` rounded); duration: seconds; start: the stream's first time stamp in seconds;
    has_audio: the file has an audio stream.
    """

    path: pathlib.Path
    width: int
    height: int
    fps: float
    frames: int
    duration: float
    start: float
    has_audio: bool


def _decoder_limits() -> dict[str, str]:
    """FFmpeg decoder options: no frame larger than MAX_VIDEO_FRAME_PIXELS is decoded (whatever the headers say)."""
    return {"max_pixels": str(MAX_VIDEO_FRAME_PIXELS)}


def _open(path: pathlib.Path):
    import av

    try:
        # max_pixels: FFmpeg refuses a larger frame before allocating it, also while it reads the headers
        return av.open(str(path), mode="r", options=_decoder_limits())
    except (av.error.FFmpegError, OSError, UnicodeDecodeError, ValueError) as exc:
        raise MediaError(f"cannot read video file {path} (corrupt or not a video?): {exc}") from None


def _stream_info(container, path: pathlib.Path) -> VideoInfo:
    if not container.streams.video:
        raise MediaError(f"{path} has no video stream")
    stream = container.streams.video[0]
    width, height = int(stream.codec_context.width or 0), int(stream.codec_context.height or 0)
    if width <= 0 or height <= 0:
        raise MediaError(f"video file {path}: its video stream has no frame size")
    if width * height > MAX_VIDEO_FRAME_PIXELS:
        raise MediaError(f"video file {path}: frames of {width}x{height} pixels are larger than the limit of "
                         f"{MAX_VIDEO_FRAME_PIXELS / 1e6:g} MP a frame")
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    fps = float(rate) if rate else 0.0
    if not (math.isfinite(fps) and fps > 0):
        raise MediaError(f"video file {path}: its video stream states no frame rate")
    base = float(stream.time_base) if stream.time_base else 0.0
    start = float(stream.start_time * base) if stream.start_time is not None and base else 0.0
    if stream.duration is not None and base:
        duration = float(stream.duration * base)
    elif container.duration is not None:
        duration = container.duration / 1e6  # microseconds
    else:
        duration = 0.0
    frames = int(stream.frames or 0)
    if frames <= 0:  # WebM / MKV headers often hold no frame count
        frames = int(round(duration * fps))
    elif duration <= 0:
        duration = frames / fps
    if frames <= 0:
        raise MediaError(f"video file {path}: its headers state neither a frame count nor a duration")
    if duration > MAX_VIDEO_SECONDS:
        raise MediaError(f"video file {path} lasts {duration:.1f} s, longer than the limit of {MAX_VIDEO_SECONDS:g} s")
    if frames > MAX_VIDEO_FRAMES:
        raise MediaError(f"video file {path} has {frames} frames, more than the limit of {MAX_VIDEO_FRAMES}")
    return VideoInfo(path, width, height, fps, frames, duration, start, bool(container.streams.audio))


def probe(path: pathlib.Path) -> VideoInfo:
    """The headers of the video file at ``path`` (module docstring); MediaError when unreadable or over a limit."""
    with _open(path) as container:
        return _stream_info(container, path)


def decode_frames(info: VideoInfo, indices: list[int], convert: Callable[[np.ndarray], np.ndarray]
                  ) -> tuple[list[np.ndarray], list[int]]:
    """(converted frames, their indices) for the sampled frame ``indices`` (ascending) of the file ``info`` describes.

    Each kept frame is decoded to uint8 RGB [H, W, 3] and passed through ``convert`` at once. A sampled index past
    the stream's real end (headers that overstate the frame count) is dropped; MediaError when no frame at all can
    be decoded or the file is corrupt.
    """
    import av

    wanted = sorted(set(int(i) for i in indices))
    if not wanted:
        raise MediaError(f"no frames to decode from {info.path}")
    frames: list[np.ndarray] = []
    kept: list[int] = []
    with _open(info.path) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        stream.codec_context.thread_count = DECODE_THREADS
        stream.codec_context.options = _decoder_limits()
        base = float(stream.time_base)
        k = 0  # the next wanted index
        try:
            while k < len(wanted):
                # back to the key frame at or before the next wanted frame, then forward
                container.seek(int((info.start + wanted[k] / info.fps) / base), stream=stream, backward=True,
                               any_frame=False)
                for frame in container.decode(stream):
                    seconds = (frame.pts * base if frame.pts is not None else frame.time or 0.0) - info.start
                    position = int(round(seconds * info.fps))
                    if position < wanted[k]:
                        continue
                    if frame.width * frame.height > MAX_VIDEO_FRAME_PIXELS:  # the decoder's own check, again
                        raise MediaError(f"video file {info.path}: a frame of {frame.width}x{frame.height} pixels is "
                                         f"larger than {_frame_limit()}")
                    rgb = convert(frame.to_ndarray(format="rgb24"))
                    while k < len(wanted) and wanted[k] <= position:  # a gap in the stream: this frame stands in
                        frames.append(rgb)
                        kept.append(wanted[k])
                        k += 1
                    if k == len(wanted) or (wanted[k] - position) / info.fps > SEEK_GAP_SECONDS:
                        break  # done, or far enough ahead that seeking beats decoding
                else:
                    break  # the stream ended before the remaining indices
        except av.error.ArgumentError as exc:  # what the decoder says of a frame over max_pixels, among others
            raise MediaError(f"cannot decode video file {info.path}: a frame is corrupt or larger than "
                             f"{_frame_limit()} ({exc})") from None
        except av.error.FFmpegError as exc:
            raise MediaError(f"cannot decode video file {info.path} (corrupt?): {exc}") from None
    if not frames:
        raise MediaError(f"no frame of video file {info.path} could be decoded")
    return frames, kept


def _frame_limit() -> str:
    return f"the limit of {MAX_VIDEO_FRAME_PIXELS / 1e6:g} MP a frame"


def decode_audio_track(info: VideoInfo, max_seconds: float, sampling_rate: int) -> np.ndarray | None:
    """Mono float32 samples at ``sampling_rate`` of the file's first audio stream (its channels averaged, its rate
    resampled block by block as it is decoded: :class:`MonoStream`), None when it has none. MediaError when the
    stream's rate or channel count is out of bounds (from its header, before decoding), when the track lasts longer
    than ``max_seconds`` or cannot be decoded.

    Frames are interleaved to packed float32 and read from their one buffer: PyAV's own array conversion of planar
    audio crashes the process from 8 channels on (7.1 sound, as films have)."""
    import av

    if not info.has_audio:
        return None
    name = f"the audio track of video file {info.path}"
    with _open(info.path) as container:
        stream = container.streams.audio[0]
        rate = int(stream.codec_context.sample_rate or 0)
        if rate <= 0:
            raise MediaError(f"video file {info.path}: its audio stream states no sample rate")
        check_rate(rate, name)
        check_channels(int(stream.codec_context.channels or 0), name)
        cap = int(max_seconds * rate) + 1
        mono = MonoStream(rate, sampling_rate)
        resampler = None
        try:
            for frame in container.decode(stream):
                check_channels(frame.layout.nb_channels, name)  # a frame may say other than the header
                if resampler is None:  # packed float32 at the stream's own rate and layout: samples unchanged
                    resampler = av.AudioResampler(format="flt", layout=frame.layout, rate=rate)
                for out in resampler.resample(frame):
                    _add_packed(mono, out)
                if mono.read > cap:
                    raise MediaError(f"video file {info.path}: its audio track is longer than the limit of "
                                     f"{max_seconds:g} s")
            if resampler is not None:
                for out in resampler.resample(None):
                    _add_packed(mono, out)
        except (av.error.FFmpegError, ValueError) as exc:  # ValueError: the layout or rate changes midway
            raise MediaError(f"cannot decode the audio track of {info.path} (corrupt?): {exc}") from None
    if mono.read == 0:
        return None
    return mono.finish()


def _add_packed(mono: MonoStream, frame) -> None:
    """Feed a packed float32 audio frame (one buffer of samples x channels) to ``mono`` as [channels, samples]."""
    channels = frame.layout.nb_channels
    samples_NC = np.frombuffer(frame.planes[0], np.float32, count=frame.samples * channels)
    mono.add(np.ascontiguousarray(samples_NC.reshape(frame.samples, channels).T))  # the mean of planar rows
