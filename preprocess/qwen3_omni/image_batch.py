"""Host-side batching of Qwen3-Omni images for the image encoder (encoders/qwen3_omni/image_encoder.py): frame
blocks, in numpy.

Attention in the vision tower is restricted to each frame of each image (``cu_seqlens`` in the reference: t segments
of h*w patches per grid entry), so every frame of the batch gets its own block of a [frames, frame_patches] array:
its patches first, in the processor's 2x2 spatial-merge-block order, then padding (:func:`vision_frame_blocks`).
Everything that depends on the grids is data laid out the same way: learned-position interpolation taps and
weights, 2-D RoPE positions, a valid mask. :func:`collate` rounds the frame count up to a power of two and the
block length (patches per frame) to a length bucket of merged tokens (powers of two and their 1.5x midpoints, at
least ``MIN_FRAME_TOKENS``) times merge**2, so images of new sizes inside a bucket reuse the compiled program.

The encoder's inputs (B frame blocks of L patches, F = C*t*p*p values per patch; letters as in
encoders/__init__.py)::

    "patches"      [B, L, F] float32   each frame's patches in merge-block order, zeros for padding
    "pos_index"    [B, L, 4] int32     learned-position interpolation taps (flattened side x side table)
    "pos_weight"   [B, L, 4] float32   their bilinear weights
    "rope_pos"     [B, L, 2] int32     (row, col) of each patch for the 2-D RoPE
    "patch_valid"  [B, L] bool
"""

from __future__ import annotations

import dataclasses

import numpy as np

from omnijax.common.errors import MediaError
from omnijax.preprocess.buckets import length_bucket, length_buckets, pow2_at_least

Grid = tuple[tuple[int, int, int], ...]

# The smallest block, in merged tokens per frame.
MIN_FRAME_TOKENS = 16


@dataclasses.dataclass(frozen=True)
class VisionInput:
    """The vision tower's input layout, from its config: the patch side in pixels, the values of one flattened
    patch (C * T * p * p), the patches merged per side into one token, and the side of the learned position grid."""

    patch_size: int
    patch_dim: int
    merge_size: int
    grid_side: int

    @property
    def merge_unit(self) -> int:
        return self.merge_size ** 2

    def max_frame_patches(self, max_pixels: int) -> int:
        """The most patches one frame of at most ``max_pixels`` pixels has (whole merge blocks)."""
        return max_pixels // (self.patch_size * self.merge_size) ** 2 * self.merge_unit


def check_grid(grid_thw, merge: int) -> Grid:
    """``grid_thw`` as a tuple of (t, h, w) Python ints; h and w must be multiples of the merge size."""
    try:
        grid = tuple((int(t), int(h), int(w)) for t, h, w in grid_thw)
    except (TypeError, ValueError):
        raise ValueError(f"grid_thw must be a sequence of (t, h, w) triples, got {grid_thw!r}") from None
    if not grid:
        raise ValueError("grid_thw is empty: at least one image is needed")
    for t, h, w in grid:
        if t < 1 or h < 1 or w < 1:
            raise ValueError(f"grid {(t, h, w)} has a non-positive size")
        if h % merge or w % merge:
            raise ValueError(f"grid {(t, h, w)}: h and w must be multiples of spatial_merge_size {merge}")
    return grid


def vision_patch_count(grid_thw: Grid) -> int:
    return sum(t * h * w for t, h, w in grid_thw)


def vision_token_count(grid_thw: Grid, merge: int) -> int:
    """Merged tokens for all grids: sum(t*h*w) / merge**2."""
    return vision_patch_count(grid_thw) // (merge * merge)


def vision_segments(grid_thw: Grid) -> tuple[int, ...]:
    """Attention segment lengths: each of the t frames of each grid entry is one segment of h*w patches."""
    return tuple(h * w for t, h, w in grid_thw for _ in range(t))


def _merge_block_rows_cols(h: int, w: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of each of one frame's h*w patches, in spatial-merge-block order."""
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    shape = (h // merge, merge, w // merge, merge)
    return (rows.reshape(shape).transpose(0, 2, 1, 3).reshape(-1),
            cols.reshape(shape).transpose(0, 2, 1, 3).reshape(-1))


def vision_rope_positions(grid_thw: Grid, merge: int) -> np.ndarray:
    """[total_patches, 2] int32 (row, col) of every patch, frames repeating the same positions."""
    out = []
    for t, h, w in grid_thw:
        rows, cols = _merge_block_rows_cols(h, w, merge)
        out.append(np.tile(np.stack([rows, cols], axis=-1), (t, 1)))
    return np.concatenate(out, axis=0).astype(np.int32)


def _axis_taps(index: np.ndarray, size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Bilinear (align_corners=True) taps [n, 2] into a ``side``-long axis and their float32 weights [n, 2], with
    the reference's float32 operation order (``index * (side-1) / max(size-1, 1)``, border clamping)."""
    index = index.astype(np.float32)
    src = index * np.float32(side - 1) / np.float32(max(size - 1, 1))
    floor = np.floor(src)
    offsets = np.arange(2)
    taps = np.clip(floor.astype(np.int64)[:, None] + offsets, 0, side - 1)
    distance = np.abs(src[:, None] - floor[:, None] - offsets.astype(np.float32))
    weights = np.maximum(np.float32(1) - distance, np.float32(0)).astype(np.float32)
    return taps, weights


def vision_pos_interpolation(grid_thw: Grid, side: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices [total_patches, 4] int32 into the flattened (side x side) learned position table and float32 weights
    [total_patches, 4] that resample it bilinearly (align_corners=True) to each grid, in merge-block order."""
    indices, weights = [], []
    for t, h, w in grid_thw:
        rows, cols = _merge_block_rows_cols(h, w, merge)
        h_taps, h_w = _axis_taps(rows, h, side)
        w_taps, w_w = _axis_taps(cols, w, side)
        idx = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4)
        wts = (h_w[:, :, None] * w_w[:, None, :]).reshape(-1, 4)
        indices.append(np.tile(idx, (t, 1)))
        weights.append(np.tile(wts, (t, 1)))
    return np.concatenate(indices).astype(np.int32), np.concatenate(weights).astype(np.float32)


def vision_frame_blocks(grid_thw: Grid, side: int, merge: int, frames: int, frame_patches: int) -> dict:
    """Frame-block layout of the images ``grid_thw``: frame f of the batch (the frames of each image in order)
    fills row f of [frames, frame_patches] patch slots with its h*w patches (merge-block order), then padding.

    ``frames`` >= the number of frames, ``frame_patches`` >= the largest h*w and a multiple of merge**2. Returns
    numpy arrays:
      source [frames, frame_patches] int32: index of each slot's patch in the packed [total_patches, ...] input,
          ``total_patches`` for padding;
      pos_index [frames, frame_patches, 4] int32, pos_weight [..., 4] float32: bilinear taps into the flattened
          (side x side) learned position table (:func:`vision_pos_interpolation`), 0 / 0.0 for padding;
      rope_pos [frames, frame_patches, 2] int32: (row, col) RoPE positions, 0 for padding;
      patch_valid [frames, frame_patches] bool.
    """
    segments = vision_segments(grid_thw)
    if len(segments) > frames or max(segments) > frame_patches or frame_patches % (merge * merge):
        raise ValueError(f"{len(segments)} frames of up to {max(segments)} patches do not fit {frames} blocks of "
                         f"{frame_patches} patches (a multiple of {merge * merge})")
    total = sum(segments)
    source = np.full((frames, frame_patches), total, np.int32)
    pos_index = np.zeros((frames, frame_patches, 4), np.int32)
    pos_weight = np.zeros((frames, frame_patches, 4), np.float32)
    rope_pos = np.zeros((frames, frame_patches, 2), np.int32)
    valid = np.zeros((frames, frame_patches), bool)
    f, start = 0, 0
    for t, h, w in grid_thw:
        one = ((1, h, w),)
        idx, wts = vision_pos_interpolation(one, side, merge)
        rope = vision_rope_positions(one, merge)
        n = h * w
        for _ in range(t):
            source[f, :n] = np.arange(start, start + n)
            pos_index[f, :n], pos_weight[f, :n], rope_pos[f, :n], valid[f, :n] = idx, wts, rope, True
            f, start = f + 1, start + n
    return dict(source=source, pos_index=pos_index, pos_weight=pos_weight, rope_pos=rope_pos, patch_valid=valid)


def frame_token_buckets(vision: VisionInput, max_pixels: int) -> tuple[int, ...]:
    """Block lengths in merged tokens per frame, up to the first one holding a frame of ``max_pixels`` pixels."""
    return length_buckets(vision.max_frame_patches(max_pixels) // vision.merge_unit, MIN_FRAME_TOKENS)


def collate(items: list[dict], vision: VisionInput, max_pixels: int) -> dict[str, np.ndarray]:
    """The processor's image items ({"patches": [t*h*w, F], "grid": (t, h, w)}) -> the encoder's inputs
    (module docstring). Raises MediaError, before any device work, for a malformed item or a frame of more patches
    than ``max_pixels`` allows."""
    if not items:
        raise ValueError("no images to collate")
    merge, limit = vision.merge_size, vision.max_frame_patches(max_pixels)
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
        if patches.shape != (t * h * w, vision.patch_dim):
            raise MediaError(f"image {i}: expected patches [{t * h * w}, {vision.patch_dim}] for grid {grid}, got "
                             f"{patches.shape}")
        grids.append(grid)
        packed.append(patches.astype(np.float32, copy=False))
    frames = sum(t for t, _, _ in grids)
    tokens = length_bucket(max(h * w for _, h, w in grids) // vision.merge_unit, MIN_FRAME_TOKENS)
    blocks = vision_frame_blocks(tuple(grids), vision.grid_side, merge, pow2_at_least(frames),
                                 tokens * vision.merge_unit)
    source = blocks.pop("source")
    packed.append(np.zeros((1, vision.patch_dim), np.float32))
    return {"patches": np.concatenate(packed)[source], **blocks}
