"""Gemma 4 videos: frames -> per-frame patches for the vision tower, and the prompt text a video becomes
(transformers' ``Gemma4VideoProcessor`` + ``Gemma4Processor.replace_video_token``).

Settings (:class:`Gemma4VideoConfig`): the checkpoint's ``"video_processor"`` section of ``processor_config.json``
(or ``video_preprocessor_config.json``), missing keys taking ``Gemma4VideoProcessor``'s defaults (70 soft tokens
a frame, 3 x 3 pooling, 32 frames, bicubic, pixels / 255). A file is sampled uniformly: ``num_frames`` frames, or
the part's ``fps`` frames a second when it names one (``default_sample_indices_fn``); a video shorter than
``num_frames`` frames gives all its frames (transformers raises a ValueError).

Each frame (all of one size) is resized to the aspect-ratio-preserving size of the frame budget (torchvision's
uint8 bicubic, preprocess/resize_uint8.py), rescaled and normalized the torchvision way (preprocess/video_pixels.py)
and cut into patches like an image (``Gemma4ImagePatches``); a frame of n soft tokens reads
``MM:SS <|image>`` + ``<|video|>`` x n + ``<image|>``, the frames of a video joined by spaces, the timestamp being
the frame's index / the video's fps (an array's frames: i / its fps).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

import numpy as np

from omnijax.common.config_values import as_checkpoint_error, as_int
from omnijax.preprocess.gemma4.image import Gemma4ImageConfig, Gemma4ImagePatches, aspect_ratio_preserving_size, \
    patch_positions, patchify
from omnijax.preprocess.processor_config import PROCESSOR_CONFIG_NAME, read_json
from omnijax.preprocess.video_pixels import rescale_normalize_frames
from omnijax.preprocess.video_sampling import uniform_frame_indices
from omnijax.preprocess.video_source import Video

VIDEO_CONFIG_NAME = "video_preprocessor_config.json"
# Gemma4VideoProcessor's class defaults, where they differ from the image processor's.
VIDEO_DEFAULTS = {"max_soft_tokens": 70, "do_normalize": True, "image_mean": [0.0, 0.0, 0.0],
                  "image_std": [1.0, 1.0, 1.0]}
DEFAULT_NUM_FRAMES = 32


@dataclasses.dataclass(frozen=True)
class Gemma4VideoConfig:
    """The per-frame pixel settings (as an image config) and how many frames a file gives (``num_frames``)."""

    pixels: Gemma4ImageConfig
    num_frames: int = DEFAULT_NUM_FRAMES

    @classmethod
    def from_folder(cls, path: str | os.PathLike) -> "Gemma4VideoConfig":
        folder = pathlib.Path(path)
        section, source = {}, f"{folder} (Gemma4VideoProcessor defaults)"
        processor_file, video_file = folder / PROCESSOR_CONFIG_NAME, folder / VIDEO_CONFIG_NAME
        if processor_file.is_file() and isinstance(read_json(processor_file), dict) and \
                isinstance(read_json(processor_file).get("video_processor"), dict):
            section, source = read_json(processor_file)["video_processor"], f"{processor_file} ['video_processor']"
        elif video_file.is_file():
            section, source = read_json(video_file), str(video_file)
        settings = {**VIDEO_DEFAULTS, **{k: v for k, v in section.items() if v is not None}}
        pixels = Gemma4ImageConfig.from_dict(settings, source)
        with as_checkpoint_error(source):
            num_frames = as_int(settings.get("num_frames", DEFAULT_NUM_FRAMES), "num_frames")
            if num_frames < 1:
                raise ValueError(f"num_frames must be positive, got {num_frames}")
        return cls(pixels, num_frames)

    def frame_indices(self, total_frames: int, video_fps: float, fps: float | None) -> list[int]:
        """``num_frames`` frames, or ``fps`` frames a second when the part names a rate. A video with fewer frames
        than ``num_frames`` gives all of them (transformers raises)."""
        count = None if fps else min(self.num_frames, total_frames)
        return uniform_frame_indices(total_frames, video_fps, num_frames=count, fps=fps)

    def target_size(self, height: int, width: int) -> tuple[int, int]:
        p = self.pixels
        if not p.do_resize:
            return height, width
        return aspect_ratio_preserving_size(height, width, p.patch_size, p.max_patches, p.pooling_kernel_size)


def frame_patches(video: Video, cfg: Gemma4ImageConfig) -> list[Gemma4ImagePatches]:
    """One ``Gemma4ImagePatches`` per (resized) frame of ``video``."""
    pixels = rescale_normalize_frames(np.ascontiguousarray(np.transpose(video.frames, (0, 3, 1, 2))), cfg)
    _, _, height, width = pixels.shape
    grid_h, grid_w = height // cfg.patch_size, width // cfg.patch_size
    positions = patch_positions(grid_h, grid_w)
    out = []
    for frame in pixels:
        patches = np.ascontiguousarray(patchify(frame, cfg.patch_size), dtype=np.float32)
        out.append(Gemma4ImagePatches(patches, positions, patches.shape[0] // cfg.pooling_kernel_size ** 2,
                                      (height, width)))
    return out


def timestamp(seconds: float) -> str:
    """``MM:SS`` as the reference writes a frame's time."""
    return f"{int(seconds // 60):02d}:{int(seconds % 60):02d}"


def video_replacement(timestamps: list[float], tokens_per_frame: int, boi: str, video_token: str, eoi: str) -> str:
    return " ".join(f"{timestamp(t)} {boi}{video_token * tokens_per_frame}{eoi}" for t in timestamps)
