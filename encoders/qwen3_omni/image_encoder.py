"""Qwen3-Omni's image encoder for the generation engine: the vision tower on bucketed frame blocks.

The host lays the processor's items ({"patches": [t*h*w, F], "grid": (t, h, w)}) out as frame blocks, one
block per frame of every image, the frame count and the block length bucketed (preprocess/qwen3_omni/image_batch.py).
Every grid-dependent value is data, so images of new sizes inside a bucket reuse the compiled program. Parameter
tree: ("tower", ...) as ``QwenVisionTower``.

Inputs (B frame blocks of L patches, F = C*t*p*p values per patch)::

    "patches"      [B, L, F] float32   each frame's patches in merge-block order, zeros for padding
    "pos_index"    [B, L, 4] int32     learned-position interpolation taps (flattened side x side table)
    "pos_weight"   [B, L, 4] float32   their bilinear weights
    "rope_pos"     [B, L, 2] int32     (row, col) of each patch for the 2-D RoPE
    "patch_valid"  [B, L] bool

Output: ``EncoderOutput(features [B*L/merge**2, out_hidden], valid, extras)``, extras holding one deepstack feature
map per deepstack layer, row-aligned with ``features``; the valid rows are the images' tokens in order.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from omnijax.encoders.output import EncoderOutput
from omnijax.encoders.qwen3_omni.vision import QwenVisionConfig, QwenVisionTower


class QwenImageEncoder(nnx.Module):
    """Image items -> (tokens [rows, out_hidden], valid, deepstack features)."""

    def __init__(self, cfg: QwenVisionConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.tower = QwenVisionTower(cfg, rngs=rngs)

    def __call__(self, inputs: dict[str, jax.Array]) -> EncoderOutput:
        valid = jnp.asarray(inputs["patch_valid"], bool)
        embeds, deepstack = self.tower.encode(inputs["patches"], inputs["pos_index"], inputs["pos_weight"],
                                              inputs["rope_pos"], valid)
        return EncoderOutput(embeds, valid[:, ::self.cfg.merge_unit].reshape(-1), tuple(deepstack))
