"""Which frames of a video to keep: transformers' frame samplers, as pure functions of the video's frame count and
rate, and the timestamps of the kept frames.

* :func:`qwen_frame_indices`: ``Qwen2VLVideoProcessor.sample_frames`` (Qwen3-Omni): ``fps`` frames per second
  clamped to ``[min_frames, max_frames]`` and to the frame count, rounded down to a multiple of
  ``temporal_patch_size``, taken at ``arange(0, total, total / n)`` truncated to int (torch's float32 arange).
* :func:`uniform_frame_indices`: ``video_utils.default_sample_indices_fn`` (Gemma 4): ``num_frames`` frames, or
  ``int(total / video_fps * fps)`` of them (at least one) when sampling by rate, at ``arange(n) * total // n``.

Both refuse (``MediaError``) what the reference refuses with a ValueError (more frames asked than the video has).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from omnijax.common.errors import MediaError


@dataclasses.dataclass(frozen=True)
class SampledFrames:
    """The frames kept from a video of ``total_frames`` frames at ``video_fps``: their ``indices`` (ascending) and
    what the prompt needs to know about them."""

    indices: tuple[int, ...]
    total_frames: int
    video_fps: float

    @property
    def timestamps(self) -> list[float]:
        """Seconds of each kept frame from the start: ``index / video_fps`` (``VideoMetadata.timestamps``)."""
        return [i / self.video_fps for i in self.indices]

    @property
    def sampled_fps(self) -> float:
        """Kept frames per second of video: ``len(indices) / total_frames * video_fps``
        (``VideoMetadata.sampled_fps``)."""
        return len(self.indices) / self.total_frames * self.video_fps


def qwen_frame_indices(total_frames: int, video_fps: float, *, fps: float | None, num_frames: int | None = None,
                       min_frames: int = 4, max_frames: int = 768, temporal_patch_size: int = 2) -> list[int]:
    """Frame indices ``Qwen2VLVideoProcessor.sample_frames`` picks (module docstring); all frames when neither
    ``fps`` nor ``num_frames`` is given."""
    if num_frames is not None:
        n = round(num_frames / temporal_patch_size) * temporal_patch_size
    elif fps is not None:
        most = math.floor(min(max_frames, total_frames) / temporal_patch_size) * temporal_patch_size
        n = total_frames / video_fps * fps
        n = min(max(n, min_frames), most, total_frames)
        n = math.floor(n / temporal_patch_size) * temporal_patch_size
    else:
        return list(range(total_frames))
    if n > total_frames:
        raise MediaError(f"the video has {total_frames} frames, fewer than the {n} the processor samples")
    if n <= 0:
        raise MediaError(f"a video of {total_frames} frames is too short: the processor needs at least "
                         f"{temporal_patch_size} frames")
    # torch.arange(0, total, total / n).int(): ceil(total / step) values i * step, computed in float64, stored
    # as float32, then truncated
    step = total_frames / n
    count = math.ceil(total_frames / step)
    return [int(v) for v in (np.arange(count, dtype=np.float64) * step).astype(np.float32)]


def uniform_frame_indices(total_frames: int, video_fps: float, *, num_frames: int | None = None,
                          fps: float | None = None) -> list[int]:
    """Frame indices ``default_sample_indices_fn`` picks: ``fps`` (when given) wins over ``num_frames``; neither:
    every frame."""
    if fps is not None:
        num_frames = max(1, int(total_frames / video_fps * fps))
    if num_frames is None:
        return list(range(total_frames))
    if num_frames > total_frames:
        raise MediaError(f"the video has {total_frames} frames, fewer than the {num_frames} the processor samples; "
                         f"ask for fewer frames or a lower fps")
    return [int(v) for v in np.arange(num_frames, dtype=np.int64) * total_frames // num_frames]
