"""Qwen3-Omni's audio encoder for the generation engine: the audio tower on bucketed window blocks.

The host lays the processor's items ({"features": [n_mels, frames]}) out as attention-window blocks, one block per
attention window of every clip, the window count and the chunks per block bucketed
(preprocess/qwen3_omni/audio_batch.py). Frame counts and the batch's longest chunk are data, so clips of new lengths
inside a bucket reuse the compiled program. Parameter tree: ("tower", ...) as ``QwenAudioTower``.

Inputs (B window blocks of U chunk slots, M mel bins)::

    "features"       [B, U, M, 2*n_window] float32   each chunk's frames, zeros after them and in empty slots
    "chunk_frames"   [B, U] int32                    frames of each chunk, 0 for an empty slot
    "padded_frames"  [] int32                        the batch's longest chunk (the reference pads to it)

Output: ``EncoderOutput(features [B*U*chunk_tokens, output_dim], valid, extras=())``; the valid rows are the clips'
tokens in order (``audio_tokens_from_frames(frames)`` per clip, preprocess/qwen3_omni/mrope.py).
"""

from __future__ import annotations

import jax
from flax import nnx

from omnijax.encoders.output import EncoderOutput
from omnijax.encoders.qwen3_omni.audio import QwenAudioConfig, QwenAudioTower


class QwenAudioEncoder(nnx.Module):
    """Audio items -> (tokens [rows, output_dim], valid)."""

    def __init__(self, cfg: QwenAudioConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.tower = QwenAudioTower(cfg, rngs=rngs)

    def __call__(self, inputs: dict[str, jax.Array]) -> EncoderOutput:
        tokens, valid = self.tower.encode(inputs["features"], inputs["chunk_frames"], inputs["padded_frames"])
        return EncoderOutput(tokens, valid, ())
