"""Pixel arrays shared by the image processors: uint8 [3, H, W] from images, PIL resizing, rescale + normalize.

transformers' PIL image processors (Gemma 3's, Qwen2-VL's) resize the uint8 pixels through PIL and rescale and
normalize in float32 the same way; the family processors build on these pure functions.
"""

from __future__ import annotations

import numpy as np
import PIL.Image

from omnijax.common.errors import MediaError
from omnijax.preprocess.images import load_image


def to_chw_uint8(image, do_convert_rgb: bool = True) -> np.ndarray:
    """uint8 [3, H, W] from a ``PIL.Image.Image`` (or any source :func:`preprocess.images.load_image` takes).

    PIL images go through ``convert_rgb`` when ``do_convert_rgb``; without it they must already be RGB.
    """
    if not isinstance(image, PIL.Image.Image) or do_convert_rgb:
        image = load_image(image)
    elif image.mode != "RGB":
        raise MediaError(f"image mode is {image.mode!r}; with do_convert_rgb off images must already be RGB")
    width, height = image.size
    if width == 0 or height == 0:
        raise MediaError(f"image has zero size ({width}x{height})")
    return np.moveaxis(np.asarray(image, dtype=np.uint8), -1, 0)


def resize(
    image: np.ndarray, height: int, width: int, resample: int = int(PIL.Image.Resampling.BILINEAR)
) -> np.ndarray:
    """uint8 [3, height, width]: uint8 ``image`` [3, H, W] resized by PIL (``Image.resize((width, height), resample)``).

    The reference resizes the uint8 pixels through PIL (not a float array), so the result is uint8.
    """
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[0] != 3:
        raise MediaError(f"resize expects a uint8 [3, H, W] array, got {image.dtype} of shape {tuple(image.shape)}")
    pil = PIL.Image.fromarray(np.ascontiguousarray(np.moveaxis(image, 0, -1)), mode="RGB")
    resized = pil.resize((int(width), int(height)), resample=int(resample))
    return np.moveaxis(np.asarray(resized, dtype=np.uint8), -1, 0)


def normalization_constants(image_mean, image_std) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) of an image-processor config as float tuples; ``ValueError`` unless each has 3 values and no std
    is 0 (a config's ``__post_init__`` check)."""
    mean = tuple(float(v) for v in image_mean)
    std = tuple(float(v) for v in image_std)
    if len(mean) != 3 or len(std) != 3:
        raise ValueError(f"image_mean and image_std need 3 values each, got {mean} and {std}")
    if any(v == 0.0 for v in std):
        raise ValueError(f"image_std must not contain 0, got {std}")
    return mean, std


def rescale_normalize(image: np.ndarray, cfg) -> np.ndarray:
    """float32 [3, H, W] from ``image`` [3, H, W] (uint8 or float) with the reference's dtypes.

    ``cfg``: an image-processor config with ``do_rescale``, ``rescale_factor``, ``do_normalize``, ``image_mean``
    and ``image_std``. Rescale: ``(image.astype(float64) * cfg.rescale_factor).astype(float32)``. Normalize: in
    float32 (a non-float input is cast to float32 first), ``(x - mean) / std`` with mean and std as float32 arrays
    per channel. transformers' PIL image processors all do these two steps this way.
    """
    if image.ndim != 3 or image.shape[0] != 3:
        raise MediaError(f"rescale_normalize expects a [3, H, W] array, got shape {tuple(image.shape)}")
    out = image
    if cfg.do_rescale:
        out = (out.astype(np.float64) * cfg.rescale_factor).astype(np.float32)
    if cfg.do_normalize:
        if not np.issubdtype(out.dtype, np.floating):
            out = out.astype(np.float32)
        mean = np.asarray(cfg.image_mean, dtype=out.dtype)[:, None, None]
        std = np.asarray(cfg.image_std, dtype=out.dtype)[:, None, None]
        out = (out - mean) / std
    return out.astype(np.float32, copy=False)
