"""Host-side batching of Gemma 4 audio clips for the audio encoder (encoders/gemma4/audio.py): fixed shape budgets,
true lengths as data.

Each clip's features (``preprocess.gemma4.audio_features.clip_features``: its valid frames, float32 [frames, mels])
are zero-padded to a frame bucket shared by the batch, and the clip count is rounded up to a power of two with
empty clips (0 frames). Frame buckets are 128 x 2^k and 192 x 2^k frames (128, 192, 256, 384, 512, 768, 1024, 1536,
2048, 3072, ...): at most 1.5x padding, a handful of compiled programs (a 30 s clip has 2999 frames -> 3072), and
every bucket is a multiple of 4, so a bucket of L frames gives exactly L / 4 token rows per clip.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MIN_FRAME_BUCKET = 128


def frame_bucket(num_frames: int) -> int:
    """The smallest bucket (128 x 2^k or 192 x 2^k, at least 128) holding ``num_frames`` frames."""
    if isinstance(num_frames, bool) or not isinstance(num_frames, (int, np.integer)) or num_frames < 0:
        raise ValueError(f"num_frames must be a non-negative integer, got {num_frames!r}")
    bucket = MIN_FRAME_BUCKET
    while True:
        if num_frames <= bucket:
            return bucket
        if num_frames <= bucket * 3 // 2:
            return bucket * 3 // 2
        bucket *= 2


def clip_bucket(num_clips: int) -> int:
    """Clips per batch rounded up to a power of two (at least 1)."""
    if isinstance(num_clips, bool) or not isinstance(num_clips, (int, np.integer)) or num_clips < 1:
        raise ValueError(f"num_clips must be a positive integer, got {num_clips!r}")
    return 1 << (int(num_clips) - 1).bit_length()


def token_rows_per_clip(frames_bucket: int) -> int:
    """Token rows the encoder gives each clip of a batch padded to ``frames_bucket`` frames (two stride-2
    subsamplings): ``ceil(ceil(F / 2) / 2)``."""
    return ((frames_bucket + 1) // 2 + 1) // 2


def collate(items: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """Batch clips' features for ``Gemma4AudioEncoder``.

    ``items``: one float array [frames_i, mels] per clip, in placeholder order (frames_i >= 1, all with the same
    mels). Returns ``{"features": float32 [B, L, mels], "num_frames": int32 [B]}`` where B =
    ``clip_bucket(len(items))`` and L = ``frame_bucket(max frames_i)``; rows past a clip's frames and padding clips
    are zeros, padding clips have 0 frames. Raises ValueError on an empty list or badly shaped items.
    """
    items = list(items)
    if not items:
        raise ValueError("no audio clips to batch")
    mels = None
    for i, item in enumerate(items):
        if not isinstance(item, np.ndarray) or item.ndim != 2 or item.shape[0] < 1:
            shape = getattr(item, "shape", None)
            raise ValueError(f"audio clip {i}: expected features [frames >= 1, mels], got shape {shape}")
        if mels is None:
            mels = item.shape[1]
        elif item.shape[1] != mels:
            raise ValueError(f"audio clip {i} has {item.shape[1]} mel bins, clip 0 has {mels}")
    frames = max(item.shape[0] for item in items)
    features = np.zeros((clip_bucket(len(items)), frame_bucket(frames), mels), dtype=np.float32)
    num_frames = np.zeros((features.shape[0],), dtype=np.int32)
    for i, item in enumerate(items):
        features[i, : item.shape[0]] = item
        num_frames[i] = item.shape[0]
    return {"features": features, "num_frames": num_frames}
