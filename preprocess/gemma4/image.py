"""Gemma 4 image preprocessing in pillow + numpy, the same as transformers' ``Gemma4ImageProcessorPil``.

Gemma 4 checkpoints name ``Gemma4ImageProcessor``; without torchvision transformers' ``AutoImageProcessor`` picks
its PIL backend (``image_processing_pil_gemma4.py``). Per image:

1. ``convert_rgb`` (alpha composited onto white), held as uint8 [3, H, W].
2. :func:`aspect_ratio_preserving_size` picks (h, w): the largest sizes keeping the aspect ratio whose sides are
   multiples of ``pooling_kernel_size * patch_size`` (k * p) and that give at most ``max_patches =
   max_soft_tokens * k**2`` patches (very thin images keep one k * p side and as much of the other as the budget
   allows). PIL resizes the uint8 pixels to it (``resample``, BICUBIC) unless the size is already right.
3. Rescale in float64 then cast to float32 (pixels in [0, 1]); normalize only with ``do_normalize`` (off in the
   published checkpoints: the model itself maps x to 2 (x - 0.5)).
4. The [3, h, w] image is cut into p x p patches, row-major over the (h/p) x (w/p) grid, each flattened as
   (row in patch, column in patch, channel) (:func:`patchify`), with the patch's (x, y) = (column, row) grid
   position (:func:`patch_positions`).
5. The reference pads every image to ``max_patches`` rows: zero pixels and position (-1, -1) (:func:`pad_patches`).

An image gives ``(h / p) * (w / p) / k**2`` soft tokens (:func:`num_soft_tokens`), at most ``max_soft_tokens``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import numpy as np
import PIL.Image

from omnijax.common.config_values import as_checkpoint_error, as_float, as_int, boolean, channel_floats, config_getter
from omnijax.common.errors import CheckpointError, MediaError
from omnijax.preprocess.pixels import normalization_constants, rescale_normalize, resize, to_chw_uint8
from omnijax.preprocess.processor_config import processor_section

# The soft-token budgets Gemma 4 supports (``_SUPPORTED_SOFT_TOKENS`` of the reference).
SUPPORTED_SOFT_TOKENS = (70, 140, 280, 560, 1120)
# Bounds on the other settings: the published ones are patch 16, kernel 3 (10080 patches of 768 values at most).
MAX_PATCH_SIZE = 64
MAX_POOLING_KERNEL_SIZE = 8
# At most this many float32 values per padded image (128 MiB): max_patches * 3 * patch_size**2.
MAX_VALUES_PER_IMAGE = 1 << 25


@dataclasses.dataclass(frozen=True)
class Gemma4ImageConfig:
    """Settings of the Gemma 4 image processor. Defaults are ``Gemma4ImageProcessorPil``'s (the published ones).

    patch_size: side of one vision patch in pixels (16).
    max_soft_tokens: the per-image soft-token budget, one of :data:`SUPPORTED_SOFT_TOKENS` (280).
    pooling_kernel_size: patches pooled per side into one soft token (3).
    resample: PIL resampling filter as an int (``PIL.Image.Resampling``; 3 is BICUBIC).
    rescale_factor: multiplies the uint8 pixel values (1/255).
    image_mean, image_std: per-channel normalization constants, used only with ``do_normalize``.
    do_*: which steps run. Without ``do_resize`` each side must already be a multiple of
    ``pooling_kernel_size * patch_size`` and the image must fit the patch budget.
    """

    patch_size: int = 16
    max_soft_tokens: int = 280
    pooling_kernel_size: int = 3
    resample: int = int(PIL.Image.Resampling.BICUBIC)
    rescale_factor: float = 1 / 255
    image_mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    image_std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = False
    do_convert_rgb: bool = True

    def __post_init__(self):
        mean, std = normalization_constants(self.image_mean, self.image_std)
        for key in ("patch_size", "max_soft_tokens", "pooling_kernel_size"):
            value = getattr(self, key)
            if isinstance(value, bool) or int(value) != value or int(value) <= 0:
                raise ValueError(f"{key} must be a positive integer, got {value!r}")
            object.__setattr__(self, key, int(value))
        if self.max_soft_tokens not in SUPPORTED_SOFT_TOKENS:
            raise ValueError(f"max_soft_tokens must be one of {SUPPORTED_SOFT_TOKENS}, got {self.max_soft_tokens}")
        if self.patch_size > MAX_PATCH_SIZE:
            raise ValueError(f"patch_size {self.patch_size} is above the supported maximum {MAX_PATCH_SIZE}")
        if self.pooling_kernel_size > MAX_POOLING_KERNEL_SIZE:
            raise ValueError(f"pooling_kernel_size {self.pooling_kernel_size} is above the supported maximum "
                             f"{MAX_POOLING_KERNEL_SIZE}")
        if self.max_patches * self.patch_dim > MAX_VALUES_PER_IMAGE:
            raise ValueError(
                f"max_soft_tokens {self.max_soft_tokens} x pooling_kernel_size**2 {self.pooling_kernel_size ** 2} "
                f"patches of {self.patch_dim} values is {self.max_patches * self.patch_dim} values per image, above "
                f"the limit of {MAX_VALUES_PER_IMAGE}")
        if int(self.resample) not in {int(r) for r in PIL.Image.Resampling}:
            raise ValueError(f"resample must be a PIL resampling filter id, got {self.resample!r}")
        object.__setattr__(self, "image_mean", mean)
        object.__setattr__(self, "image_std", std)
        object.__setattr__(self, "resample", int(self.resample))
        object.__setattr__(self, "rescale_factor", float(self.rescale_factor))

    @property
    def max_patches(self) -> int:
        """Patch rows of every (padded) image: ``max_soft_tokens * pooling_kernel_size**2``."""
        return self.max_soft_tokens * self.pooling_kernel_size ** 2

    @property
    def side_multiple(self) -> int:
        """Both resized sides are multiples of this many pixels: ``pooling_kernel_size * patch_size``."""
        return self.pooling_kernel_size * self.patch_size

    @property
    def patch_dim(self) -> int:
        """Values per patch row: ``3 * patch_size**2``."""
        return 3 * self.patch_size ** 2

    def with_max_soft_tokens(self, max_soft_tokens: int) -> "Gemma4ImageConfig":
        """The same settings with another soft-token budget (what the processor's ``max_soft_tokens`` call
        argument does). Raises ``MediaError`` for a budget outside :data:`SUPPORTED_SOFT_TOKENS`."""
        try:
            return dataclasses.replace(self, max_soft_tokens=max_soft_tokens)
        except ValueError as exc:
            raise MediaError(str(exc)) from exc

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "image processor config") -> "Gemma4ImageConfig":
        """The config from an image processor dict as transformers writes it (the ``"image_processor"`` section of
        ``processor_config.json``, or ``preprocessor_config.json``).

        Missing keys and ``null`` values take the defaults. ``size`` (which the published files may carry) and
        unknown keys are ignored: Gemma 4 sizes images by the patch budget. Raises ``CheckpointError`` mentioning
        ``source`` when a value has the wrong type or range.
        """
        if not isinstance(d, dict):
            raise CheckpointError(f"{source}: expected a JSON object, got {type(d).__name__}")
        get = config_getter(d, cls())
        with as_checkpoint_error(source):
            kwargs: dict[str, Any] = {
                "patch_size": as_int(get("patch_size"), "patch_size"),
                "max_soft_tokens": as_int(get("max_soft_tokens"), "max_soft_tokens"),
                "pooling_kernel_size": as_int(get("pooling_kernel_size"), "pooling_kernel_size"),
                "resample": as_int(get("resample"), "resample"),
                "rescale_factor": as_float(get("rescale_factor"), "rescale_factor"),
            }
            for key in ("image_mean", "image_std"):
                kwargs[key] = channel_floats(get(key), key)
            for key in ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb"):
                kwargs[key] = boolean(get(key), key)
            return cls(**kwargs)

    @classmethod
    def from_folder(cls, path: str | os.PathLike) -> "Gemma4ImageConfig":
        """The config of the checkpoint folder ``path``: the ``"image_processor"`` section of
        ``processor_config.json``, else ``preprocessor_config.json``. Raises ``CheckpointError`` naming the folder or
        file when neither is there, a file is not valid JSON, or a value is unusable."""
        settings, source = processor_section(path, ("image_processor",), "image processor")
        return cls.from_dict(settings, source=source)


@dataclasses.dataclass(frozen=True)
class Gemma4ImagePatches:
    """One preprocessed image, unpadded.

    pixel_values: float32 [n_patches, 3 * patch_size**2], patches row-major over the grid.
    position_ids: int32 [n_patches, 2], each patch's (x, y) = (column, row) in the patch grid.
    num_soft_tokens: the image's soft tokens (placeholders in the prompt): n_patches / pooling_kernel_size**2.
    size: (height, width) in pixels after the resize.
    """

    pixel_values: np.ndarray
    position_ids: np.ndarray
    num_soft_tokens: int
    size: tuple[int, int]


def aspect_ratio_preserving_size(height: int, width: int, patch_size: int, max_patches: int,
                                 pooling_kernel_size: int) -> tuple[int, int]:
    """(target_height, target_width) of the reference's aspect-ratio-preserving resize of an H x W image.

    With s = pooling_kernel_size * patch_size, both sides are the largest multiples of s at the scale
    sqrt(max_patches * patch_size**2 / (H * W)), rounded down; a side that rounds to 0 becomes s, and the other side
    then is ``min(floor(long / short) * s, (max_patches // pooling_kernel_size**2) * s)``. The arithmetic (Python
    floats, floor) is the reference's. Raises ``MediaError`` for an empty image or a size the budget cannot hold.
    """
    height, width = int(height), int(width)
    if height <= 0 or width <= 0:
        raise MediaError(f"image has zero size ({width}x{height})")
    total_px = height * width
    target_px = max_patches * (patch_size ** 2)
    factor = math.sqrt(target_px / total_px)
    ideal_height = factor * height
    ideal_width = factor * width
    side_mult = pooling_kernel_size * patch_size

    target_height = int(math.floor(ideal_height / side_mult)) * side_mult
    target_width = int(math.floor(ideal_width / side_mult)) * side_mult
    if target_height == 0 and target_width == 0:
        raise MediaError(f"a {width}x{height} image cannot be resized to sides that are multiples of {side_mult} "
                         f"within {max_patches} patches")
    max_side_length = (max_patches // pooling_kernel_size ** 2) * side_mult
    if target_height == 0:
        target_height = side_mult
        target_width = min(int(math.floor(width / height)) * side_mult, max_side_length)
    elif target_width == 0:
        target_width = side_mult
        target_height = min(int(math.floor(height / width)) * side_mult, max_side_length)
    if target_height * target_width > target_px:
        raise MediaError(f"resizing a {width}x{height} image to {target_width}x{target_height} exceeds "
                         f"{max_patches} patches of {patch_size} pixels")
    return target_height, target_width


def num_soft_tokens(height: int, width: int, cfg: Gemma4ImageConfig) -> int:
    """Soft tokens of an H x W image (the placeholders ``Gemma4Processor`` writes for it), without processing it.

    With ``do_resize`` off the size is taken as it is (it must fit, as :func:`process_image` requires)."""
    if cfg.do_resize:
        height, width = aspect_ratio_preserving_size(height, width, cfg.patch_size, cfg.max_patches,
                                                     cfg.pooling_kernel_size)
    else:
        _check_unresized(height, width, cfg)
    return (height // cfg.patch_size) * (width // cfg.patch_size) // cfg.pooling_kernel_size ** 2


def _check_unresized(height: int, width: int, cfg: Gemma4ImageConfig) -> None:
    side = cfg.side_multiple
    if height <= 0 or width <= 0 or height % side or width % side:
        raise MediaError(f"with do_resize off, both sides of an image must be positive multiples of "
                         f"pooling_kernel_size * patch_size = {side} pixels, got {width}x{height}")
    patches = (height // cfg.patch_size) * (width // cfg.patch_size)
    if patches > cfg.max_patches:
        raise MediaError(f"with do_resize off, a {width}x{height} image has {patches} patches, above the budget of "
                         f"{cfg.max_patches} (max_soft_tokens {cfg.max_soft_tokens})")


def patchify(image_CHW: np.ndarray, patch_size: int) -> np.ndarray:
    """[(H/p) * (W/p), p * p * C] patch rows of one image [C, H, W] (same dtype): patches row-major over the grid,
    each flattened in (row in patch, column in patch, channel) order, as the reference's
    ``convert_image_to_patches``. H and W must be multiples of p."""
    channels, height, width = image_CHW.shape
    if height % patch_size or width % patch_size:
        raise MediaError(f"a {width}x{height} image cannot be cut into {patch_size}-pixel patches")
    grid_h, grid_w = height // patch_size, width // patch_size
    patches = image_CHW.reshape(channels, grid_h, patch_size, grid_w, patch_size)
    patches = patches.transpose(1, 3, 2, 4, 0)  # [grid_h, grid_w, row, col, C]
    return patches.reshape(grid_h * grid_w, patch_size * patch_size * channels)


def patch_positions(grid_h: int, grid_w: int) -> np.ndarray:
    """int32 [grid_h * grid_w, 2]: (x, y) = (column, row) of every patch, row-major over the grid."""
    ys, xs = np.meshgrid(np.arange(grid_h), np.arange(grid_w), indexing="ij")
    return np.stack([xs, ys], axis=-1).reshape(grid_h * grid_w, 2).astype(np.int32)


def pad_patches(pixel_values: np.ndarray, position_ids: np.ndarray, max_patches: int) -> tuple[np.ndarray, np.ndarray]:
    """(pixel_values [max_patches, D], position_ids [max_patches, 2]): the rows padded with zero pixels and position
    (-1, -1), as the reference pads each image. Raises ``MediaError`` when there are more rows than ``max_patches``."""
    n = pixel_values.shape[0]
    if n > max_patches or position_ids.shape[0] != n:
        raise MediaError(f"{n} patches (with {position_ids.shape[0]} positions) do not fit a budget of "
                         f"{max_patches} patches")
    pixels = np.zeros((max_patches, pixel_values.shape[1]), dtype=pixel_values.dtype)
    pixels[:n] = pixel_values
    positions = np.full((max_patches, 2), -1, dtype=position_ids.dtype)
    positions[:n] = position_ids
    return pixels, positions


def process_image(image, cfg: Gemma4ImageConfig) -> Gemma4ImagePatches:
    """One image (a ``PIL.Image.Image`` or any source :func:`preprocess.images.load_image` takes) as its unpadded
    patches and positions. Raises ``MediaError`` for unreadable images and sizes that cannot be processed."""
    chw = to_chw_uint8(image, cfg.do_convert_rgb)
    _, height, width = chw.shape
    if cfg.do_resize:
        new_height, new_width = aspect_ratio_preserving_size(height, width, cfg.patch_size, cfg.max_patches,
                                                             cfg.pooling_kernel_size)
        if (new_height, new_width) != (height, width):
            chw = resize(chw, new_height, new_width, cfg.resample)
    else:
        _check_unresized(height, width, cfg)
    pixels = rescale_normalize(chw, cfg)
    _, height, width = pixels.shape
    patches = patchify(pixels, cfg.patch_size)
    grid_h, grid_w = height // cfg.patch_size, width // cfg.patch_size
    return Gemma4ImagePatches(
        pixel_values=np.ascontiguousarray(patches, dtype=np.float32),
        position_ids=patch_positions(grid_h, grid_w),
        num_soft_tokens=patches.shape[0] // cfg.pooling_kernel_size ** 2,
        size=(height, width),
    )


def process_images(images, cfg: Gemma4ImageConfig) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Gemma 4 pixel values for ``images``, the same as ``Gemma4ImageProcessorPil(**cfg)(images)``.

    ``images``: a list of images (or one). Returns ``(pixel_values, position_ids, num_soft_tokens)``:
    pixel_values float32 [n_images, cfg.max_patches, cfg.patch_dim]; position_ids int64 [n_images,
    cfg.max_patches, 2], (x, y) per patch and (-1, -1) for padding; num_soft_tokens one int per image.
    """
    if isinstance(images, (PIL.Image.Image, np.ndarray)):
        images = [images]
    images = list(images)
    if not images:
        raise MediaError("process_images got no images")
    pixel_values, position_ids, counts = [], [], []
    for image in images:
        item = process_image(image, cfg)
        pixels, positions = pad_patches(item.pixel_values, item.position_ids, cfg.max_patches)
        pixel_values.append(pixels)
        position_ids.append(positions.astype(np.int64))
        counts.append(item.num_soft_tokens)
    return np.stack(pixel_values), np.stack(position_ids), counts
