"""Qwen3-Omni videos: frames -> temporal patches the vision tower reads, and the prompt run a video takes, with its
sound track interleaved in time (transformers' ``Qwen2VLVideoProcessor`` + ``Qwen3OmniMoeProcessor``).

Settings (:class:`QwenVideoConfig`): the checkpoint's video processor section (``processor_config.json``'s
``"video_processor"`` or ``video_preprocessor_config.json``), else its image processor settings. Frame size: by
default (``size="processor"``) the pixel bounds ``Qwen3OmniMoeProcessor`` gives its video processor whenever the
caller names no size, 128 x 32 x 32 .. 768 x 32 x 32 pixels a frame (``PROCESSOR_VIDEO_SIZE``), in place of the
video processor's saved ``size``: a video's prompt is then the one transformers makes from the same checkpoint by
default. ``size="checkpoint"`` keeps the saved bounds (as the video processor alone, or a caller passing that
``size``, resizes). A file is sampled at the part's ``fps``, else the config's ``fps``, else 2 frames a second
(qwen-omni-utils' default), clamped to ``[min_frames, max_frames]`` (``Qwen2VLVideoProcessor.sample_frames``).

Frames (all of one size): ``smart_resize`` to multiples of patch x merge (torchvision's uint8 bicubic,
preprocess/resize_uint8.py), fused rescale + normalize (preprocess/video_pixels.py), the frame count padded to a
multiple of ``temporal_patch_size`` by repeating the last frame, then cut into patches of
[C, temporal_patch_size, patch, patch] in merge-block order: grid (t, h, w), t * h * w / merge**2 tokens.

With its sound (a file's audio track, or ``"audio"`` beside an array), the ``<|video_pad|>`` marker becomes
``<|audio_start|>`` + video and audio tokens interleaved + ``<|audio_end|>``: frame group g (its h * w / merge**2
tokens) sits at time ``g * seconds_per_grid * position_id_per_seconds`` and goes before the audio tokens of index
>= that time (audio token k sits at time k). ``seconds_per_grid = temporal_patch_size / fps``, fps being the
sampled frames' rate (the array's fps, or ``SampledFrames.sampled_fps`` for a file).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

import numpy as np

from omnijax.common.config_values import as_checkpoint_error, as_float, as_int
from omnijax.common.errors import CheckpointError
from omnijax.preprocess.processor_config import PROCESSOR_CONFIG_NAME, read_json
from omnijax.preprocess.qwen3_omni.image import QwenImageConfig, smart_resize
from omnijax.preprocess.video_pixels import rescale_normalize_frames
from omnijax.preprocess.video_sampling import qwen_frame_indices
from omnijax.preprocess.video_size import VIDEO_SIZES
from omnijax.preprocess.video_source import Video

PROCESSOR_VIDEO_SIZE = {"shortest_edge": 128 * 32 * 32, "longest_edge": 768 * 32 * 32}
VIDEO_CONFIG_NAME = "video_preprocessor_config.json"
DEFAULT_FPS = 2.0


@dataclasses.dataclass(frozen=True)
class QwenVideoConfig:
    """Video processor settings: the pixel settings (patch sizes, pixel bounds, normalization, resample) as an
    image config, and frame sampling: ``fps`` / ``num_frames`` (None: unset), ``min_frames``, ``max_frames``."""

    pixels: QwenImageConfig
    fps: float | None = None
    num_frames: int | None = None
    min_frames: int = 4
    max_frames: int = 768

    @classmethod
    def from_dict(cls, d: dict, source: str) -> "QwenVideoConfig":
        pixels = QwenImageConfig.from_dict(d, source)
        with as_checkpoint_error(source):
            fps = None if d.get("fps") is None else as_float(d["fps"], "fps")
            num_frames = None if d.get("num_frames") is None else as_int(d["num_frames"], "num_frames")
            min_frames = as_int(d.get("min_frames", 4), "min_frames")
            max_frames = as_int(d.get("max_frames", 768), "max_frames")
            if (fps is not None and not fps > 0) or min_frames < 1 or max_frames < min_frames:
                raise ValueError(f"bad frame sampling settings: fps {fps}, min_frames {min_frames}, max_frames "
                                 f"{max_frames}")
        return cls(pixels, fps, num_frames, min_frames, max_frames)

    @classmethod
    def from_folder(cls, path: str | os.PathLike, image_cfg: QwenImageConfig,
                    size: str = "processor") -> "QwenVideoConfig":
        """The folder's video processor settings (``image_cfg`` when it has none), its frames bounded by
        ``size``'s pixel bounds (module docstring)."""
        if size not in VIDEO_SIZES:
            raise ValueError(f"video size {size!r} is not one of {', '.join(VIDEO_SIZES)}")
        folder = pathlib.Path(path)
        processor_file, video_file = folder / PROCESSOR_CONFIG_NAME, folder / VIDEO_CONFIG_NAME
        section = read_json(processor_file) if processor_file.is_file() else None
        if isinstance(section, dict) and isinstance(section.get("video_processor"), dict):
            cfg = cls.from_dict(section["video_processor"], f"{processor_file} ['video_processor']")
        elif video_file.is_file():
            cfg = cls.from_dict(read_json(video_file), str(video_file))
        else:  # no saved video size: the processor's whichever is asked
            return cls(image_cfg).with_processor_size()
        return cfg.with_processor_size() if size == "processor" else cfg

    def with_processor_size(self) -> "QwenVideoConfig":
        """These settings with ``Qwen3OmniMoeProcessor``'s default frame size bounds."""
        return dataclasses.replace(self, pixels=dataclasses.replace(
            self.pixels, min_pixels=PROCESSOR_VIDEO_SIZE["shortest_edge"],
            max_pixels=PROCESSOR_VIDEO_SIZE["longest_edge"]))

    def frame_indices(self, total_frames: int, video_fps: float, fps: float | None) -> list[int]:
        """The frames of a file to keep: at ``fps`` (the part's), else the config's rate or count, else 2 a second."""
        rate = fps if fps is not None else self.fps
        count = None if fps is not None else self.num_frames
        if rate is None and count is None:
            rate = DEFAULT_FPS
        return qwen_frame_indices(total_frames, video_fps, fps=rate, num_frames=count, min_frames=self.min_frames,
                                  max_frames=self.max_frames, temporal_patch_size=self.pixels.temporal_patch_size)

    def target_size(self, height: int, width: int) -> tuple[int, int]:
        p = self.pixels
        return smart_resize(height, width, p.factor, p.min_pixels, p.max_pixels) if p.do_resize else (height, width)


def video_patches(frames_FHWC: np.ndarray, cfg: QwenImageConfig) -> tuple[np.ndarray, tuple[int, int, int]]:
    """(patches float32 [t * h * w, C * T * p * p], grid (t, h, w)) of resized uint8 frames [F, H, W, C]: the
    reference's ``rescale_and_normalize`` then ``patchify`` (module docstring)."""
    x = rescale_normalize_frames(np.ascontiguousarray(np.transpose(frames_FHWC, (0, 3, 1, 2))), cfg)
    tp, p, m = cfg.temporal_patch_size, cfg.patch_size, cfg.merge_size
    pad = -x.shape[0] % tp
    if pad:
        x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)])
    frames, channels, height, width = x.shape
    if height % (p * m) or width % (p * m):
        raise CheckpointError(f"video frames of {width}x{height} pixels are not multiples of {p * m} (turn "
                              f"do_resize on)")
    t, gh, gw = frames // tp, height // p, width // p
    patches = x.reshape(t, tp, channels, gh // m, m, p, gw // m, m, p).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(patches.reshape(t * gh * gw, channels * tp * p * p)), (t, gh, gw)


def seconds_per_grid(video: Video, temporal_patch_size: int) -> float:
    """Seconds one temporal patch spans: ``temporal_patch_size / fps`` of the sampled frames."""
    return temporal_patch_size / video.sampled.sampled_fps


def interleaved_order(grid: tuple[int, int, int], seconds: float, audio_tokens: int, per_second: float,
                      merge: int) -> list[bool]:
    """Token kinds of a video with sound, in prompt order: True for a video token, False for an audio token
    (``Qwen3OmniMoeProcessor.replace_video_with_audio_token``, its float64 times)."""
    t, h, w = grid
    per_frame = (h // merge) * (w // merge)
    video_times = np.repeat(np.arange(t), per_frame) * seconds * per_second
    out, v, a = [], 0, 0
    while v < len(video_times) and a < audio_tokens:
        if video_times[v] <= a:
            out.append(True)
            v += 1
        else:
            out.append(False)
            a += 1
    return out + [True] * (len(video_times) - v) + [False] * (audio_tokens - a)


def video_replacement(grid: tuple[int, int, int], seconds: float, audio_tokens: int | None, per_second: float,
                      merge: int, tokens: dict[str, str]) -> str:
    """The text a ``<|video_pad|>`` marker becomes; ``tokens``: the "video", "audio", "audio_start" and
    "audio_end" strings."""
    if audio_tokens is None:
        t, h, w = grid
        return tokens["video"] * (t * h * w // merge ** 2)
    order = interleaved_order(grid, seconds, audio_tokens, per_second, merge)
    return tokens["audio_start"] + "".join(tokens["video"] if v else tokens["audio"] for v in order) + \
        tokens["audio_end"]
