"""Qwen3-Omni's image encoder for the generation engine: the vision tower on bucketed frame blocks.

``collate`` lays the processor's items ({"patches": [t*h*w, C*T*p*p], "grid": (t, h, w)}) out as frame blocks
(:func:`encoders.qwen3_omni.vision.vision_frame_blocks`): one block per frame of every image, the frame count
rounded up to a power of two and the block length (patches per frame) to a length bucket of merged tokens
(powers of two and their 1.5x midpoints, at least ``MIN_FRAME_TOKENS``) times merge**2. Every grid-dependent value
is data, so images of new sizes inside a bucket reuse the compiled program. Parameter tree: ("tower", ...) as
``QwenVisionTower``.

Inputs (``collate``; F frames, L patches per frame)::

    "patches"      [F, L, C*T*p*p] float32   each frame's patches in merge-block order, zeros for padding
    "pos_index"    [F, L, 4] int32           learned-position interpolation taps (flattened side x side table)
    "pos_weight"   [F, L, 4] float32         their bilinear weights
    "rope_pos"     [F, L, 2] int32           (row, col) of each patch for the 2-D RoPE
    "patch_valid"  [F, L] bool

Output: ``EncoderOutput(features [F*L/merge**2, out_hidden], valid, extras)``, extras holding one deepstack feature
map per deepstack layer, row-aligned with ``features``; the valid rows are the images' tokens in order.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from omnijax.common.errors import MediaError
from omnijax.encoders.buckets import length_bucket, length_buckets, pow2_at_least
from omnijax.encoders.output import EncoderOutput
from omnijax.encoders.qwen3_omni.vision import QwenVisionConfig, QwenVisionTower, check_grid, vision_frame_blocks

# The smallest block, in merged tokens per frame.
MIN_FRAME_TOKENS = 16
# The published Qwen3-Omni image processor's bound on the resized h * w (``max_pixels``).
DEFAULT_MAX_PIXELS = 12845056


def frame_token_buckets(cfg: QwenVisionConfig, max_pixels: int) -> tuple[int, ...]:
    """Block lengths in merged tokens per frame, up to the first one holding a frame of ``max_pixels`` pixels."""
    return length_buckets(max_frame_patches(cfg, max_pixels) // cfg.merge_unit, MIN_FRAME_TOKENS)


def max_frame_patches(cfg: QwenVisionConfig, max_pixels: int) -> int:
    """The most patches one frame of at most ``max_pixels`` pixels has (whole merge blocks)."""
    return max_pixels // (cfg.patch_size * cfg.spatial_merge_size) ** 2 * cfg.merge_unit


def collate_qwen_images(items: list[dict], cfg: QwenVisionConfig, max_pixels: int) -> dict[str, np.ndarray]:
    """The processor's image items -> the encoder's inputs (module docstring). Raises MediaError, before any device
    work, for a malformed item or a frame of more patches than ``max_pixels`` allows."""
    if not items:
        raise ValueError("no images to collate")
    merge, limit = cfg.spatial_merge_size, max_frame_patches(cfg, max_pixels)
    grids, packed = [], []
    for i, item in enumerate(items):
        try:
            (grid,) = check_grid((item["grid"],), merge)
        except (KeyError, TypeError, ValueError) as e:
            raise MediaError(f"image {i}: bad patch grid: {e}") from None
        t, h, w = grid
        if h * w > limit:
            raise MediaError(f"image {i}: a {h}x{w}-patch frame ({h * w} patches) is larger than the {limit} patches "
                             f"of max_pixels {max_pixels}")
        patches = np.asarray(item.get("patches"))
        if patches.shape != (t * h * w, cfg.patch_dim):
            raise MediaError(f"image {i}: expected patches [{t * h * w}, {cfg.patch_dim}] for grid {grid}, got "
                             f"{patches.shape}")
        grids.append(grid)
        packed.append(patches.astype(np.float32, copy=False))
    frames = sum(t for t, _, _ in grids)
    tokens = length_bucket(max(h * w for _, h, w in grids) // cfg.merge_unit, MIN_FRAME_TOKENS)
    blocks = vision_frame_blocks(tuple(grids), cfg.num_grid_per_side, merge, pow2_at_least(frames),
                                 tokens * cfg.merge_unit)
    source = blocks.pop("source")
    packed.append(np.zeros((1, cfg.patch_dim), np.float32))
    return {"patches": np.concatenate(packed)[source], **blocks}


class QwenImageEncoder(nnx.Module):
    """Image items -> (tokens [rows, out_hidden], valid, deepstack features)."""

    def __init__(self, cfg: QwenVisionConfig, *, max_pixels: int = DEFAULT_MAX_PIXELS, rngs: nnx.Rngs):
        if max_pixels < (cfg.patch_size * cfg.spatial_merge_size) ** 2:
            raise ValueError(f"max_pixels {max_pixels} is smaller than one merge block of patches")
        self.cfg = cfg
        self.max_pixels = int(max_pixels)
        self.tower = QwenVisionTower(cfg, rngs=rngs)

    def collate(self, items: list[dict]) -> dict[str, np.ndarray]:
        """Host side only (reads the config, never the parameters): see :func:`collate_qwen_images`."""
        return collate_qwen_images(items, self.cfg, self.max_pixels)

    def __call__(self, inputs: dict[str, jax.Array]) -> EncoderOutput:
        valid = jnp.asarray(inputs["patch_valid"], bool)
        embeds, deepstack = self.tower.encode(inputs["patches"], inputs["pos_index"], inputs["pos_weight"],
                                              inputs["rope_pos"], valid)
        return EncoderOutput(embeds, valid[:, ::self.cfg.merge_unit].reshape(-1), tuple(deepstack))
