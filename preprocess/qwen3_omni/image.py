"""Qwen3-Omni image preprocessing in pillow + numpy, the same as transformers' ``Qwen2VLImageProcessorPil``.

Qwen3-Omni checkpoints name ``Qwen2VLImageProcessor``; without torchvision transformers' ``AutoImageProcessor``
picks its PIL backend, ``Qwen2VLImageProcessorPil`` (``image_processing_pil_qwen2_vl.py``). Per image:

1. ``convert_rgb`` (alpha composited onto white), held as uint8 [3, H, W].
2. :func:`smart_resize` picks (h, w), both multiples of ``factor = patch_size * merge_size``, with h * w near
   H * W and inside [min_pixels, max_pixels]; PIL resizes the uint8 pixels to it (``resample``, BICUBIC by default).
3. Rescale in float64 then cast to float32, normalize in float32 (``(x - mean) / std``).
4. The [3, h, w] image is cut into patch_size x patch_size patches, emitted in 2-D merge-block order (all
   ``merge_size x merge_size`` patches of one block, row-major inside the block, blocks row-major), each patch
   repeated ``temporal_patch_size`` times along time and flattened as [C, T, patch, patch] (:func:`patchify`).

An image gives ``grid_thw = (1, h / patch, w / patch)``: ``h * w / patch**2`` patch rows of
``3 * temporal_patch_size * patch**2`` values, and ``grid_t * grid_h * grid_w / merge_size**2`` placeholder tokens.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import numpy as np
import PIL.Image

from omnijax.common.config_values import as_checkpoint_error, as_float, as_int, boolean, channel_floats, config_getter
from omnijax.preprocess.media_limits import PROCESSOR_MAX_MERGE, PROCESSOR_MAX_PATCH, PROCESSOR_MAX_PIXELS
from omnijax.preprocess.processor_config import processor_section
from omnijax.common.errors import CheckpointError, MediaError
from omnijax.preprocess.pixels import normalization_constants, rescale_normalize, resize, to_chw_uint8


# transformers' OPENAI_CLIP_MEAN / OPENAI_CLIP_STD: the Qwen2VLImageProcessorPil class defaults. Qwen3-Omni
# checkpoints override them with 0.5 in their processor config.
_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# smart_resize refuses images whose long side / short side is above this.
MAX_ASPECT_RATIO = 200


@dataclasses.dataclass(frozen=True)
class QwenImageConfig:
    """Settings of the Qwen2-VL / Qwen3-Omni image processor. Defaults are ``Qwen2VLImageProcessorPil``'s.

    patch_size: side of one vision patch in pixels (Qwen3-Omni: 16).
    temporal_patch_size: frames per patch; a still image is repeated this many times (2).
    merge_size: patches merged per side into one token (2), so ``patch_size * merge_size`` divides each side.
    min_pixels, max_pixels: bounds on the resized h * w (``size.shortest_edge`` / ``size.longest_edge``).
    image_mean, image_std: per-channel normalization constants, 3 each.
    resample: PIL resampling filter as an int (``PIL.Image.Resampling``; 3 is BICUBIC).
    rescale_factor: multiplies the uint8 pixel values (1/255).
    do_*: which steps run. Without ``do_resize`` each side must already be a multiple of patch_size * merge_size.
    """

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    image_mean: tuple[float, float, float] = _CLIP_MEAN
    image_std: tuple[float, float, float] = _CLIP_STD
    resample: int = int(PIL.Image.Resampling.BICUBIC)
    rescale_factor: float = 1 / 255
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True
    do_convert_rgb: bool = True

    def __post_init__(self):
        mean, std = normalization_constants(self.image_mean, self.image_std)
        for key in ("patch_size", "temporal_patch_size", "merge_size", "min_pixels", "max_pixels"):
            value = getattr(self, key)
            if isinstance(value, bool) or int(value) != value or int(value) <= 0:
                raise ValueError(f"{key} must be a positive integer, got {value!r}")
            object.__setattr__(self, key, int(value))
        bounds = {"patch_size": PROCESSOR_MAX_PATCH, "temporal_patch_size": PROCESSOR_MAX_MERGE,
                  "merge_size": PROCESSOR_MAX_MERGE, "max_pixels": PROCESSOR_MAX_PIXELS}
        for key, most in bounds.items():
            if getattr(self, key) > most:
                raise ValueError(f"{key} is {getattr(self, key)}, over the limit of {most}")
        if self.min_pixels > self.max_pixels:
            raise ValueError(f"min_pixels {self.min_pixels} is above max_pixels {self.max_pixels}")
        if int(self.resample) not in {int(r) for r in PIL.Image.Resampling}:
            raise ValueError(f"resample must be a PIL resampling filter id, got {self.resample!r}")
        object.__setattr__(self, "image_mean", mean)
        object.__setattr__(self, "image_std", std)
        object.__setattr__(self, "resample", int(self.resample))
        object.__setattr__(self, "rescale_factor", float(self.rescale_factor))

    @property
    def factor(self) -> int:
        """Each resized side is a multiple of this: ``patch_size * merge_size``."""
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        """Values per patch row of ``pixel_values``: ``3 * temporal_patch_size * patch_size**2``."""
        return 3 * self.temporal_patch_size * self.patch_size * self.patch_size

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "image processor config") -> "QwenImageConfig":
        """The config from an image processor dict as transformers writes it (``preprocessor_config.json``, or the
        ``"image_processor"`` section of ``processor_config.json``).

        Pixel bounds follow ``Qwen2VLImageProcessorPil.__init__``: ``"size": {"shortest_edge": min_pixels,
        "longest_edge": max_pixels}`` (what transformers 5 saves), overridden by top-level ``"min_pixels"`` /
        ``"max_pixels"`` (what hub checkpoints ship); with no ``"size"`` the class default size is the base. A size
        that ends up without both bounds is an error, as it is when the reference processor runs. Missing keys and
        ``null`` values take the class defaults; unknown keys (feature extractor settings sharing the file, ...)
        are ignored. Raises ``CheckpointError`` mentioning ``source`` when a value has the wrong type or range.
        """
        if not isinstance(d, dict):
            raise CheckpointError(f"{source}: expected a JSON object, got {type(d).__name__}")
        defaults = cls()
        kwargs: dict[str, Any] = {}

        get = config_getter(d, defaults)

        with as_checkpoint_error(source):
            size = d.get("size")
            if size is None:
                size = {"shortest_edge": defaults.min_pixels, "longest_edge": defaults.max_pixels}
            if not isinstance(size, dict):
                raise ValueError(f"'size' must be {{'shortest_edge': N, 'longest_edge': M}}, got {size!r}")
            min_pixels = d.get("min_pixels") if d.get("min_pixels") is not None else size.get("shortest_edge")
            max_pixels = d.get("max_pixels") if d.get("max_pixels") is not None else size.get("longest_edge")
            if not min_pixels or not max_pixels:
                raise ValueError(
                    "need the pixel bounds as 'size': {'shortest_edge': min_pixels, 'longest_edge': max_pixels} or "
                    f"as 'min_pixels' / 'max_pixels', got size={size!r}, min_pixels={d.get('min_pixels')!r}, "
                    f"max_pixels={d.get('max_pixels')!r}"
                )
            kwargs["min_pixels"] = as_int(min_pixels, "min_pixels")
            kwargs["max_pixels"] = as_int(max_pixels, "max_pixels")
            for key in ("patch_size", "temporal_patch_size", "merge_size", "resample"):
                kwargs[key] = as_int(get(key), key)
            kwargs["rescale_factor"] = as_float(get("rescale_factor"), "rescale_factor")
            for key in ("image_mean", "image_std"):
                kwargs[key] = channel_floats(get(key), key)
            for key in ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb"):
                kwargs[key] = boolean(get(key), key)
            return cls(**kwargs)

    @classmethod
    def from_folder(cls, path: str | os.PathLike) -> "QwenImageConfig":
        """The config of the checkpoint folder ``path``, found the way transformers looks for it.

        The ``"image_processor"`` section of ``processor_config.json`` wins (transformers 5 saves sub-processors
        there); otherwise ``preprocessor_config.json`` (what hub checkpoints ship, shared with the audio feature
        extractor). Raises ``CheckpointError`` naming the folder or file when neither is there, a file is not valid
        JSON, or a value is unusable.
        """
        settings, source = processor_section(path, ('image_processor',), 'image processor')
        return cls.from_dict(settings, source=source)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(h, w) an H x W image is resized to: the reference ``smart_resize``, expression for expression.

    Each side is rounded to the nearest multiple of ``factor`` with Python's ``round`` (half to even: 42 / 28 = 1.5
    rounds to 2, 70 / 28 = 2.5 rounds to 2 as well). When h * w is then above ``max_pixels`` both sides are scaled
    by ``beta = sqrt(H * W / max_pixels)`` and floored to multiples of ``factor`` (at least ``factor``); when below
    ``min_pixels`` they are scaled by ``sqrt(min_pixels / (H * W))`` and ceiled to multiples of ``factor``.

    Raises ``MediaError`` for a zero or negative side and for an aspect ratio (long / short side) above 200, which
    the reference refuses with a ValueError.
    """
    if height <= 0 or width <= 0:
        raise MediaError(f"image has no pixels ({width}x{height})")
    ratio = max(height, width) / min(height, width)
    if ratio > MAX_ASPECT_RATIO:
        raise MediaError(
            f"image of {width}x{height} pixels has aspect ratio {ratio:.1f}; Qwen image processing needs the long "
            f"side at most {MAX_ASPECT_RATIO} times the short side: crop or pad it"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def patchify(image_CHW: np.ndarray, patch_size: int, merge_size: int, temporal_patch_size: int) -> np.ndarray:
    """float32 [grid_h * grid_w, C * temporal_patch_size * patch_size**2] patch rows of one image [C, H, W].

    grid_h = H / patch_size, grid_w = W / patch_size; both must be multiples of ``merge_size``. Rows come in
    merge-block order: for each (block_row, block_col) row-major, its merge_size x merge_size patches row-major.
    Each row is the patch [C, patch, patch] repeated ``temporal_patch_size`` times, laid out [C, T, patch, patch].
    """
    image = np.asarray(image_CHW, dtype=np.float32)
    channels, height, width = image.shape
    block = patch_size * merge_size
    if height % block or width % block:
        raise MediaError(
            f"image of {width}x{height} pixels cannot be cut into {patch_size}-pixel patches merged {merge_size} x "
            f"{merge_size}: each side must be a multiple of {block} (turn do_resize on)"
        )
    grid_h, grid_w = height // patch_size, width // patch_size
    patches = image.reshape(
        channels, grid_h // merge_size, merge_size, patch_size, grid_w // merge_size, merge_size, patch_size
    )
    # [block_row, block_col, row_in_block, col_in_block, C, patch, patch]
    patches = np.transpose(patches, (1, 4, 2, 5, 0, 3, 6))
    patches = np.broadcast_to(
        patches[:, :, :, :, :, None], (*patches.shape[:5], temporal_patch_size, *patches.shape[5:])
    )
    return patches.reshape(grid_h * grid_w, channels * temporal_patch_size * patch_size * patch_size)


def image_patches(image, cfg: QwenImageConfig) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Pixel values of one image: (patches float32 [grid_h * grid_w, cfg.patch_dim], grid_thw (1, grid_h, grid_w)).

    ``image`` is a ``PIL.Image.Image`` (or any source :func:`preprocess.images.load_image` takes). Same values and
    row order as ``Qwen2VLImageProcessorPil(**cfg)(image)``; raises ``MediaError`` for unreadable images and for
    sizes smart_resize refuses.
    """
    chw = to_chw_uint8(image, cfg.do_convert_rgb)
    if cfg.do_resize:
        _, height, width = chw.shape
        new_height, new_width = smart_resize(height, width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
        chw = resize(chw, new_height, new_width, cfg.resample)
    pixels = rescale_normalize(chw, cfg)
    patches = patchify(pixels, cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size)
    grid_thw = (1, pixels.shape[1] // cfg.patch_size, pixels.shape[2] // cfg.patch_size)
    return patches, grid_thw


def process_images(images, cfg: QwenImageConfig) -> tuple[np.ndarray, np.ndarray]:
    """Qwen pixel values for ``images``, the same as ``Qwen2VLImageProcessorPil(**cfg)(images)``.

    ``images``: a list of PIL images (or other sources :func:`preprocess.images.load_image` takes), or one image.
    Returns ``(pixel_values, grid_thw)``: pixel_values float32 [sum of patches, cfg.patch_dim], the images' patch
    rows one after another; grid_thw int64 [n_images, 3], (t, h, w) in patches per image.
    """
    if isinstance(images, (PIL.Image.Image, np.ndarray)):
        images = [images]
    images = list(images)
    if not images:
        raise MediaError("process_images got no images")
    all_patches, grids = [], []
    for image in images:
        patches, grid_thw = image_patches(image, cfg)
        all_patches.append(patches)
        grids.append(grid_thw)
    return np.concatenate(all_patches, axis=0), np.asarray(grids, dtype=np.int64)


def num_image_tokens(grid_thw, merge_size: int) -> int:
    """Placeholder tokens one image takes in the prompt: ``t * h * w // merge_size**2`` for ``grid_thw`` (t, h, w)."""
    t, h, w = (int(v) for v in grid_thw)
    return t * h * w // (merge_size * merge_size)
