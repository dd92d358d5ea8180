"""Qwen3-Omni's audio encoder for the generation engine: the audio tower on bucketed window blocks.

``collate`` lays the processor's items ({"features": [n_mels, frames]}) out as attention-window blocks
(:func:`encoders.qwen3_omni.audio.audio_window_blocks`): one block per attention window of every clip, the window
count rounded up to a length bucket (powers of two and their 1.5x midpoints) and the chunks per block to a power
of two (at most ``chunks_per_window``, n_window_infer // (2 * n_window)). Frame counts and the batch's longest
chunk are data, so clips of new lengths inside a bucket reuse the compiled program. Parameter tree: ("tower", ...)
as ``QwenAudioTower``.

Inputs (``collate``; W windows, C chunks per window)::

    "features"       [W, C, n_mels, 2*n_window] float32   each chunk's frames, zeros after them and in empty slots
    "chunk_frames"   [W, C] int32                         frames of each chunk, 0 for an empty slot
    "padded_frames"  [] int32                             the batch's longest chunk (the reference pads to it)

Output: ``EncoderOutput(features [W*C*chunk_tokens, output_dim], valid, extras=())``; the valid rows are the clips'
tokens in order (``audio_output_length(frames)`` per clip).
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from omnijax.common.errors import MediaError
from omnijax.encoders.buckets import length_bucket, pow2_at_least
from omnijax.encoders.output import EncoderOutput
from omnijax.encoders.qwen3_omni.audio import QwenAudioConfig, QwenAudioTower, audio_window_blocks, audio_windows

# 1200 s of 100-frame-per-second log-mel features (Whisper features at 16 kHz, hop 160): the default clip limit.
DEFAULT_MAX_FRAMES = 120_000


def collate_qwen_audio(items: list[dict], cfg: QwenAudioConfig, max_frames: int) -> dict[str, np.ndarray]:
    """The processor's audio items -> the encoder's inputs (module docstring). Raises MediaError, before any device
    work, for a malformed item or a clip longer than ``max_frames`` frames."""
    if not items:
        raise ValueError("no audio clips to collate")
    lengths, packed = [], []
    for i, item in enumerate(items):
        feats = np.asarray(item.get("features") if isinstance(item, dict) else None)
        if feats.ndim != 2 or feats.shape[0] != cfg.num_mel_bins:
            raise MediaError(f"audio clip {i}: expected log-mel features [{cfg.num_mel_bins}, frames], got "
                             f"{feats.shape}")
        if feats.shape[1] < 1:
            raise MediaError(f"audio clip {i} has no feature frames")
        if feats.shape[1] > max_frames:
            raise MediaError(f"audio clip {i} has {feats.shape[1]} feature frames, more than the limit of "
                             f"{max_frames}")
        lengths.append(int(feats.shape[1]))
        packed.append(feats.astype(np.float32, copy=False))
    lengths = tuple(lengths)
    windows = audio_windows(lengths, cfg.n_window, cfg.n_window_infer)
    per_block = min(cfg.chunks_per_window, pow2_at_least(max(len(w) for w in windows)))
    blocks = audio_window_blocks(lengths, cfg.n_window, windows, length_bucket(len(windows)), per_block)
    packed.append(np.zeros((cfg.num_mel_bins, 1), np.float32))
    frames = np.concatenate(packed, axis=1)[:, blocks["source"]]  # [n_mels, W, C, chunk_frames]
    return {"features": np.ascontiguousarray(np.transpose(frames, (1, 2, 0, 3))),
            "chunk_frames": blocks["chunk_frames"], "padded_frames": blocks["padded_frames"]}


class QwenAudioEncoder(nnx.Module):
    """Audio items -> (tokens [rows, output_dim], valid)."""

    def __init__(self, cfg: QwenAudioConfig, *, max_frames: int = DEFAULT_MAX_FRAMES, rngs: nnx.Rngs):
        if max_frames < 1:
            raise ValueError(f"max_frames must be positive, got {max_frames}")
        self.cfg = cfg
        self.max_frames = int(max_frames)
        self.tower = QwenAudioTower(cfg, rngs=rngs)

    def collate(self, items: list[dict]) -> dict[str, np.ndarray]:
        """Host side only (reads the config, never the parameters): see :func:`collate_qwen_audio`."""
        return collate_qwen_audio(items, self.cfg, self.max_frames)

    def __call__(self, inputs: dict[str, jax.Array]) -> EncoderOutput:
        tokens, valid = self.tower.encode(inputs["features"], inputs["chunk_frames"], inputs["padded_frames"])
        return EncoderOutput(tokens, valid, ())
