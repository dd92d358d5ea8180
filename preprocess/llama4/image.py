"""Llama 4 image preprocessing in numpy, value for value the same as transformers' ``Llama4ImageProcessor``.

The reference (``image_processing_llama4.py`` on the torchvision backend) does, per image:

1. ``convert_rgb`` (alpha composited onto white), held as uint8 [3, H, W].
2. :func:`best_canvas`: among the canvases of rows x cols tiles with rows * cols <= ``max_patches``
   (:func:`supported_canvases`), the one needing the smallest upscale >= 1 (with ``resize_to_max_canvas``: the
   largest), or, when every canvas needs a downscale, the largest downscale; ties go to the least area. The scales
   are float32, as the reference computes them in torch.
3. :func:`resized_size`: the largest size that fits the canvas without distortion, never upscaling past one tile
   side (unless ``resize_to_max_canvas``). The image is resized to it (:func:`resize_uint8`: torch's antialiased
   uint8 resampling on CPU, the path torchvision takes) and padded with zeros on the right and bottom to the canvas.
4. Rescale and normalize in bfloat16, the reference's quirk (:func:`rescale_normalize_bf16`): the output values are
   bfloat16 numbers, returned as float32.
5. :func:`split_tiles`: the canvas cut into rows x cols tiles of ``tile_size``, row-major. When there is more than
   one tile, a global tile (the whole original image resized to tile x tile, distorted) goes last.

:func:`image_tiles` runs these steps for one image and returns tiles float32 [n_tiles, 3, tile, tile] with the
(rows, cols) layout; n_tiles = rows * cols, plus 1 for the global tile when rows * cols > 1.

Resampling: torchvision resizes a uint8 tensor on CPU with torch's native uint8 kernel (x86 with AVX2 or AVX-512,
and ARM): separable passes (horizontal, then vertical, each rounded to uint8) with int16 fixed-point weights.
:func:`resize_uint8` reproduces that integer arithmetic exactly. (On an x86 CPU without AVX2 torch takes a float
path instead, which can differ by one grey level.)
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import numpy as np
import PIL.Image

from omnijax.common.config_values import (as_checkpoint_error, as_float, as_int, boolean, channel_floats, config_getter,
                                  height_width)
from omnijax.common.errors import CheckpointError, MediaError
from omnijax.preprocess.pixels import normalization_constants, to_chw_uint8
from omnijax.preprocess.processor_config import processor_section
from omnijax.preprocess.resize_uint8 import BICUBIC, BILINEAR, axis_weights
from omnijax.preprocess.resize_uint8 import resize_uint8 as resize_hwc

_STANDARD_MEAN = (0.5, 0.5, 0.5)
_STANDARD_STD = (0.5, 0.5, 0.5)

# Bounds on the settings: real checkpoints use 336-pixel tiles and 16 tiles.
MAX_TILE_SIZE = 2048
MAX_PATCHES_LIMIT = 256
MAX_CANVAS_PIXELS = 1 << 26
# Bound on an input image (decoded pixels), about 134 million.
MAX_IMAGE_PIXELS = 1 << 27
# Rows (or columns) resampled at a time, so a pass over a large image holds a bounded int32 buffer.

_RESAMPLE_FILTERS = {int(PIL.Image.Resampling.BILINEAR): "bilinear", int(PIL.Image.Resampling.BICUBIC): "bicubic"}


@dataclasses.dataclass(frozen=True)
class Llama4ImageConfig:
    """Settings of the Llama 4 image processor. Defaults are ``Llama4ImageProcessor``'s class defaults.

    tile_size: side of a (square) tile in pixels (``size`` {"height": 336, "width": 336}).
    max_patches: the most tiles a canvas may have (16).
    resize_to_max_canvas: pick the canvas allowing the largest upscale instead of the smallest.
    resample: PIL resampling id as the reference maps it to torchvision: 2 (BILINEAR) or 3 (BICUBIC).
    rescale_factor: multiplies the uint8 pixel values (1/255).
    image_mean, image_std: per-channel normalization constants, 3 each.
    do_rescale, do_normalize, do_convert_rgb: which steps run (the reference always resizes; ``do_resize`` false is
        refused as it is there).
    """

    tile_size: int = 336
    max_patches: int = 16
    resize_to_max_canvas: bool = False
    resample: int = int(PIL.Image.Resampling.BILINEAR)
    rescale_factor: float = 1 / 255
    image_mean: tuple[float, float, float] = _STANDARD_MEAN
    image_std: tuple[float, float, float] = _STANDARD_STD
    do_rescale: bool = True
    do_normalize: bool = True
    do_convert_rgb: bool = True

    def __post_init__(self):
        mean, std = normalization_constants(self.image_mean, self.image_std)
        for key, low, high in (("tile_size", 1, MAX_TILE_SIZE), ("max_patches", 1, MAX_PATCHES_LIMIT)):
            value = getattr(self, key)
            if isinstance(value, bool) or int(value) != value or not low <= int(value) <= high:
                raise ValueError(f"{key} must be an integer in [{low}, {high}], got {value!r}")
            object.__setattr__(self, key, int(value))
        if self.max_patches * self.tile_size ** 2 > MAX_CANVAS_PIXELS:
            raise ValueError(f"max_patches {self.max_patches} tiles of {self.tile_size}x{self.tile_size} pixels "
                             f"exceed the canvas limit of {MAX_CANVAS_PIXELS} pixels")
        if int(self.resample) not in _RESAMPLE_FILTERS:
            raise ValueError(f"resample must be 2 (bilinear) or 3 (bicubic), got {self.resample!r}")
        if self.do_normalize and not self.do_rescale:
            raise ValueError("do_normalize without do_rescale is not supported (the reference cannot normalize "
                             "uint8 pixels either)")
        object.__setattr__(self, "image_mean", mean)
        object.__setattr__(self, "image_std", std)
        object.__setattr__(self, "resample", int(self.resample))
        object.__setattr__(self, "rescale_factor", float(self.rescale_factor))

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "image processor config") -> "Llama4ImageConfig":
        """The config from an image processor dict as transformers writes it (``preprocessor_config.json``, or the
        ``"image_processor"`` section of ``processor_config.json``).

        ``"size"`` is ``{"height": T, "width": T}`` (square; an int means a square too). Missing keys and ``null``
        values take the class defaults; unknown keys are ignored. Raises ``CheckpointError`` mentioning ``source``
        when a value has the wrong type or range, the size is not square, or ``do_resize`` is false.
        """
        if not isinstance(d, dict):
            raise CheckpointError(f"{source}: expected a JSON object, got {type(d).__name__}")
        defaults = cls()
        get = config_getter(d, defaults)
        kwargs: dict[str, Any] = {}
        with as_checkpoint_error(source):
            height, width = height_width(
                d.get("size"), (defaults.tile_size, defaults.tile_size), "{'height': T, 'width': T} for Llama 4"
            )
            if height != width:
                raise ValueError(f"Llama 4 tiles must be square, got size {height}x{width}")
            kwargs["tile_size"] = height
            if d.get("do_resize") is False:
                raise ValueError("do_resize is false, but Llama 4 always resizes images to a canvas of tiles")
            kwargs["max_patches"] = as_int(get("max_patches"), "max_patches")
            kwargs["resample"] = as_int(get("resample"), "resample")
            kwargs["rescale_factor"] = as_float(get("rescale_factor"), "rescale_factor")
            for key in ("image_mean", "image_std"):
                kwargs[key] = channel_floats(get(key), key)
            for key in ("resize_to_max_canvas", "do_rescale", "do_normalize", "do_convert_rgb"):
                kwargs[key] = boolean(get(key), key)
            return cls(**kwargs)

    @classmethod
    def from_folder(cls, path: str | os.PathLike) -> "Llama4ImageConfig":
        """The config of the checkpoint folder ``path``: the ``"image_processor"`` section of
        ``processor_config.json`` (what transformers 5 saves), else ``preprocessor_config.json`` (what hub
        checkpoints ship). Raises ``CheckpointError`` naming the folder or file when neither is there or a value is
        unusable."""
        settings, source = processor_section(path, ("image_processor",), "image processor")
        return cls.from_dict(settings, source=source)


@dataclasses.dataclass(frozen=True)
class Llama4ImageTiles:
    """One image's pixel values: ``tiles`` float32 [n_tiles, 3, tile, tile] (row-major canvas tiles, then the
    global tile when rows * cols > 1) and the canvas layout ``rows`` x ``cols`` in tiles."""

    tiles: np.ndarray
    rows: int
    cols: int

    @property
    def num_tiles(self) -> int:
        return int(self.tiles.shape[0])


# ---------------------------------------------------------------------------------------------------------------
# Canvas choice.


def supported_canvases(max_patches: int) -> list[tuple[int, int]]:
    """Every (rows, cols) with rows * cols <= ``max_patches``, in the reference's order.

    ``find_supported_resolutions``: for n = max_patches down to 1, the factor pairs (f, n / f) with f ascending,
    grouped by aspect ratio rows / cols in order of first appearance. The order decides ties between canvases of
    equal scale and area.
    """
    if isinstance(max_patches, bool) or int(max_patches) != max_patches or not 1 <= max_patches <= MAX_PATCHES_LIMIT:
        raise ValueError(f"max_patches must be an integer in [1, {MAX_PATCHES_LIMIT}], got {max_patches!r}")
    by_ratio: dict[float, list[tuple[int, int]]] = {}
    for n in range(int(max_patches), 0, -1):
        for f in sorted({f for i in range(1, math.isqrt(n) + 1) if n % i == 0 for f in (i, n // i)}):
            by_ratio.setdefault(f / (n // f), []).append((f, n // f))
    return [canvas for group in by_ratio.values() for canvas in group]


def _f32_div(a: int, b: int) -> np.float32:
    """``torch.tensor(a) / b`` for integers: both cast to float32, divided in float32."""
    return np.float32(a) / np.float32(b)


def best_canvas(height: int, width: int, tile_size: int, max_patches: int,
                resize_to_max_canvas: bool = False) -> tuple[int, int]:
    """(rows, cols) of the canvas an H x W image is fitted into: the reference ``get_best_fit``.

    Each canvas (rows * tile, cols * tile) gets the scale min(rows * tile / H, cols * tile / W) in float32. If some
    scales are >= 1, the smallest of them is chosen (the largest with ``resize_to_max_canvas``); otherwise the
    largest scale. Among canvases with exactly that scale, the least area wins (the first in
    :func:`supported_canvases` order on a tie).
    """
    if height <= 0 or width <= 0:
        raise MediaError(f"image has no pixels ({width}x{height})")
    canvases = supported_canvases(max_patches)
    scales = [min(_f32_div(r * tile_size, height), _f32_div(c * tile_size, width)) for r, c in canvases]
    upscales = [s for s in scales if s >= 1]
    if upscales:
        selected = max(upscales) if resize_to_max_canvas else min(upscales)
    else:
        selected = max(scales)
    chosen = [canvas for canvas, s in zip(canvases, scales) if s == selected]
    return min(chosen, key=lambda rc: rc[0] * rc[1])  # min keeps the first of equal areas, as torch.argmin


def resized_size(height: int, width: int, canvas: tuple[int, int], tile_size: int,
                 resize_to_max_canvas: bool = False) -> tuple[int, int]:
    """(h, w) the H x W image is resized to before padding to ``canvas`` (rows, cols), as the reference computes it.

    The target is the canvas itself with ``resize_to_max_canvas``, else each canvas side capped at
    max(image side, tile_size) (no upscaling past one tile). ``get_max_res_without_distortion`` then fits the
    image into the target: the side with the smaller scale fills the target, the other is floored. The reference
    holds a target side as a torch int64 scalar when it comes from the canvas and as a Python int otherwise; its
    scales, comparison and product are then float32 or float64 accordingly, which this function follows.
    """
    canvas_h, canvas_w = canvas[0] * tile_size, canvas[1] * tile_size

    def target(side: int, canvas_side: int) -> tuple[int, bool]:  # (value, held as a torch tensor)
        if resize_to_max_canvas:
            return canvas_side, True
        cap = max(side, tile_size)
        return (canvas_side, True) if canvas_side < cap else (cap, False)

    (th, th_t), (tw, tw_t) = target(height, canvas_h), target(width, canvas_w)
    scale_w = _f32_div(tw, width) if tw_t else tw / width
    scale_h = _f32_div(th, height) if th_t else th / height
    if tw_t or th_t:
        width_limits = np.float32(scale_w) < np.float32(scale_h)
    else:
        width_limits = scale_w < scale_h
    if width_limits:
        scaled = np.float32(height) * scale_w if tw_t else height * scale_w
        new_h, new_w = min(math.floor(scaled), th), tw
    else:
        scaled = np.float32(width) * scale_h if th_t else width * scale_h
        new_h, new_w = th, min(math.floor(scaled), tw)
    return max(int(new_h), 1), max(int(new_w), 1)


# ---------------------------------------------------------------------------------------------------------------
# Resampling: torch's uint8 antialiased kernel.


def resample_weights(in_size: int, out_size: int, kind: str = "bilinear") -> tuple[np.ndarray, np.ndarray, int]:
    """One axis of torch's uint8 antialiased resize: (first input index [out], int16 weights [out, k], precision)
    (``preprocess.resize_uint8.axis_weights``, the steps written out there). Output pixel i is
    (sum_j w[i, j] * x[xmin[i] + j] + 2**(precision - 1)) >> precision, clipped to uint8."""
    return axis_weights(in_size, out_size, {"bilinear": BILINEAR, "bicubic": BICUBIC}[kind])


def resize_uint8(image: np.ndarray, height: int, width: int, resample: int = int(PIL.Image.Resampling.BILINEAR)
                 ) -> np.ndarray:
    """uint8 [3, height, width]: uint8 ``image`` [3, H, W] resized as torchvision resizes a uint8 tensor on CPU
    (``antialias=True``; preprocess/resize_uint8.py): columns first, then rows, each pass rounded to uint8. A size
    that does not change is returned as is."""
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[0] != 3:
        raise MediaError(f"resize expects a uint8 [3, H, W] array, got {image.dtype} of shape {tuple(image.shape)}")
    if height <= 0 or width <= 0:
        raise MediaError(f"cannot resize to {width}x{height}")
    if (height, width) == image.shape[1:]:
        return image
    return np.ascontiguousarray(np.moveaxis(resize_hwc(np.moveaxis(image, 0, -1), height, width, resample), -1, 0))


# ---------------------------------------------------------------------------------------------------------------


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 ``x`` rounded to the nearest bfloat16 value (ties to even), kept as float32."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def rescale_normalize_bf16(image: np.ndarray, cfg: Llama4ImageConfig) -> np.ndarray:
    """float32 [3, H, W] from uint8 ``image`` [3, H, W], as ``Llama4ImageProcessor.rescale_and_normalize``.

    With rescale and normalize (the checkpoints' setting) every step is rounded to bfloat16: x = bf16(x *
    float32(rescale_factor)), then bf16(x - bf16(mean)), then bf16(. / bf16(std)). Rescale alone is float32
    (x * float32(rescale_factor)); neither leaves the pixel values (0 .. 255) as they are.
    """
    x = image.astype(np.float32)
    if cfg.do_rescale and cfg.do_normalize:
        x = round_bf16(x * np.float32(cfg.rescale_factor))
        mean = round_bf16(np.asarray(cfg.image_mean, np.float32))[:, None, None]
        std = round_bf16(np.asarray(cfg.image_std, np.float32))[:, None, None]
        return round_bf16(round_bf16(x - mean) / std)
    if cfg.do_rescale:
        return x * np.float32(cfg.rescale_factor)
    return x


def split_tiles(image: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """[rows * cols, C, H / rows, W / cols]: the tiles of ``image`` [C, H, W], row-major."""
    c, h, w = image.shape
    if h % rows or w % cols:
        raise MediaError(f"a {w}x{h} canvas does not split into {rows}x{cols} tiles")
    tiles = image.reshape(c, rows, h // rows, cols, w // cols).transpose(1, 3, 0, 2, 4)
    return tiles.reshape(rows * cols, c, h // rows, w // cols)


def image_tiles(image, cfg: Llama4ImageConfig) -> Llama4ImageTiles:
    """The pixel values of one image, the same as ``Llama4ImageProcessor(**cfg)(image)``.

    ``image``: a ``PIL.Image.Image`` (or any source :func:`preprocess.images.load_image` takes). Raises
    ``MediaError`` for unreadable or oversized images.
    """
    chw = to_chw_uint8(image, cfg.do_convert_rgb)
    _, height, width = chw.shape
    if height * width > MAX_IMAGE_PIXELS:
        raise MediaError(f"image of {width}x{height} pixels is over the limit of {MAX_IMAGE_PIXELS} pixels")
    tile = cfg.tile_size
    rows, cols = best_canvas(height, width, tile, cfg.max_patches, cfg.resize_to_max_canvas)
    new_h, new_w = resized_size(height, width, (rows, cols), tile, cfg.resize_to_max_canvas)
    resized = resize_uint8(chw, new_h, new_w, cfg.resample)
    canvas = np.zeros((3, rows * tile, cols * tile), np.uint8)
    canvas[:, :new_h, :new_w] = resized
    tiles = split_tiles(rescale_normalize_bf16(canvas, cfg), rows, cols)
    if rows * cols > 1:
        whole = rescale_normalize_bf16(resize_uint8(chw, tile, tile, cfg.resample), cfg)
        tiles = np.concatenate([tiles, whole[None]], axis=0)
    return Llama4ImageTiles(tiles=np.ascontiguousarray(tiles, dtype=np.float32), rows=rows, cols=cols)


def process_images(images, cfg: Llama4ImageConfig) -> list[Llama4ImageTiles]:
    """:func:`image_tiles` of each image (a list of PIL images or other sources, or one image)."""
    if isinstance(images, (PIL.Image.Image, np.ndarray)):
        images = [images]
    images = list(images)
    if not images:
        raise MediaError("process_images got no images")
    return [image_tiles(image, cfg) for image in images]
