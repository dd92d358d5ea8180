"""Loading images into RGB ``PIL.Image.Image`` objects, with the conversions transformers applies.

Which conversion an input gets depends on its kind, the same way it does in transformers' PIL image processors:

* A file path is opened the way ``transformers.image_utils.load_image`` opens one (what an image processor does
  with a path or URL string): the EXIF orientation is applied (``ImageOps.exif_transpose``), then
  ``Image.convert("RGB")``. Transparency is dropped, not composited (an RGBA PNG keeps its stored RGB values).
* A ``PIL.Image.Image`` goes through ``convert_rgb`` (transformers' ``image_transforms.convert_to_rgb``): an image
  with an alpha band or a ``transparency`` entry is alpha-composited onto white, anything else is
  ``Image.convert("RGB")``. No EXIF transpose: an in-memory image is taken as it is.
* A numpy array follows transformers' numpy branch of ``convert_to_rgb``: one channel is repeated three times, four
  channels are blended onto white in float64 and rounded (``np.round``), three channels are used as they are.

Every kind is size-checked before it is decoded or converted (preprocess/media_limits.py): over
``MAX_IMAGE_PIXELS`` is refused, over ``WORKING_IMAGE_PIXELS`` is reduced by a whole factor (box filter) while
loading, so the full-resolution pixels are held at most once. Smaller images are loaded exactly as described.
"""

from __future__ import annotations

import os
import pathlib
import warnings

import numpy as np
import PIL.Image
import PIL.ImageOps

from omnijax.common.errors import MediaError
from omnijax.preprocess.media_limits import MAX_IMAGE_PIXELS, check_image_pixels, reduce_factor
from omnijax.preprocess.sources import local_path


def convert_rgb(image: PIL.Image.Image) -> PIL.Image.Image:
    """``image`` in mode RGB, transparency composited onto an opaque white background.

    Same arithmetic as ``transformers.image_transforms.convert_to_rgb`` for PIL inputs: when the image has an "A"
    band or a ``transparency`` info entry it is converted to RGBA and ``Image.alpha_composite``-d over a white RGBA
    image, then converted to RGB; otherwise it is ``image.convert("RGB")``. An RGB image is returned as a copy.
    """
    has_alpha = "A" in image.getbands() or image.info.get("transparency") is not None
    if has_alpha:
        rgba = image.convert("RGBA")
        background = PIL.Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return PIL.Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


_STRIP_PIXELS = 1 << 18  # arrays are converted a strip of about this many pixels at a time


def _strip_rgb(strip: np.ndarray, channels: int) -> np.ndarray:
    """uint8 [rows, W, 3] from a strip [rows, W, C] of a checked uint8 or float image array."""
    if strip.dtype != np.uint8:
        strip = (strip.astype(np.float64) * 255).astype(np.float32).astype(np.uint8)
    if channels == 1:
        return np.repeat(strip, 3, axis=-1)
    if channels == 4:
        # transformers' numpy branch of convert_to_rgb: blend onto white in float64, round, back to uint8.
        alpha = strip[..., 3:4] / 255
        return np.round(alpha * strip[..., :3] + (1 - alpha) * 255).astype(np.uint8)
    return strip


def _box_reduce(rgb: np.ndarray, factor: int) -> np.ndarray:
    """uint8 [ceil(rows / f), ceil(W / f), 3]: ``rgb`` [rows, W, 3] reduced by PIL's box filter (``Image.reduce``)."""
    return np.asarray(PIL.Image.fromarray(np.ascontiguousarray(rgb), mode="RGB").reduce(factor))


def _array_to_rgb(array: np.ndarray, name: str) -> PIL.Image.Image:
    """A numpy image [H, W] or [H, W, C] (C in 1, 3, 4) as an RGB PIL image.

    uint8 arrays are used as they are. Float arrays must hold values in [0, 1]; they are scaled the way transformers
    turns a float image into uint8 before a PIL resize: ``(x.astype(float64) * 255).astype(float32).astype(uint8)``
    (truncation, not rounding), so a float array gives the same pixels as transformers' processor run on it with
    ``do_rescale=False``. The size is checked from the shape before anything is converted (``MAX_IMAGE_PIXELS``);
    an array over ``WORKING_IMAGE_PIXELS`` is reduced by a whole factor (box filter) strip by strip, so no
    full-resolution copy is made.
    """
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3:
        raise MediaError(
            f"{name}: expected an image array of shape [H, W] or [H, W, C] with C in (1, 3, 4), got shape "
            f"{tuple(array.shape)}"
        )
    height, width, channels = array.shape
    if channels not in (1, 3, 4):
        raise MediaError(
            f"{name}: expected 1, 3 or 4 channels in the last axis of an [H, W, C] image array, got shape "
            f"{tuple(array.shape)} (channels-first arrays are not accepted)"
        )
    if height == 0 or width == 0:
        raise MediaError(f"{name}: image array has zero size, shape {tuple(array.shape)}")
    check_image_pixels(width, height, name)
    if array.dtype != np.uint8 and not np.issubdtype(array.dtype, np.floating):
        raise MediaError(f"{name}: expected a uint8 (or float in [0, 1]) image array, got dtype {array.dtype}")

    factor = reduce_factor(width, height)
    rows = max(factor, _STRIP_PIXELS // width // factor * factor)
    if np.issubdtype(array.dtype, np.floating):
        low, high = np.inf, -np.inf
        for top in range(0, height, rows):
            strip = array[top:top + rows]
            if not np.all(np.isfinite(strip)):
                raise MediaError(f"{name}: float image array holds NaN or infinite values")
            low, high = min(low, float(strip.min())), max(high, float(strip.max()))
        if low < 0.0 or high > 1.0:
            raise MediaError(
                f"{name}: float image arrays must hold values in [0, 1], got values in [{low}, {high}]"
            )
    if factor == 1 and array.dtype == np.uint8 and channels == 3:
        return PIL.Image.fromarray(np.ascontiguousarray(array), mode="RGB")
    out = np.empty((-(-height // factor), -(-width // factor), 3), np.uint8)
    for top in range(0, height, rows):
        rgb = _strip_rgb(array[top:top + rows], channels)
        out[top // factor:top // factor + -(-rgb.shape[0] // factor)] = _box_reduce(rgb, factor) if factor > 1 \
            else rgb
    return PIL.Image.fromarray(out, mode="RGB")


def _reduced(image: PIL.Image.Image) -> PIL.Image.Image:
    """``image`` reduced by a whole factor (box filter) to at most WORKING_IMAGE_PIXELS, or itself when it is not
    larger. Modes without a reduce (palette, 1-bit, 16-bit) are converted first."""
    factor = reduce_factor(*image.size)
    if factor == 1:
        return image
    if image.mode not in ("L", "LA", "RGB", "RGBA", "I", "F"):
        image = image.convert("RGBA" if "A" in image.getbands() or "transparency" in image.info else "RGB")
    return image.reduce(factor)


def _open_path(path: pathlib.Path) -> PIL.Image.Image:
    """Open, check the size from the header, decode (reduced when large), EXIF-transpose and convert the image
    file at ``path`` to RGB."""
    if not path.exists():
        raise MediaError(f"image file not found: {path}")
    if not path.is_file():
        raise MediaError(f"image path is not a file: {path}")
    try:
        with warnings.catch_warnings():  # PIL warns about large images; the size is checked just below
            warnings.simplefilter("ignore", PIL.Image.DecompressionBombWarning)
            image = PIL.Image.open(path)
    except PIL.UnidentifiedImageError as exc:
        raise MediaError(f"cannot identify an image format in file {path}: {exc}") from exc
    except PIL.Image.DecompressionBombError as exc:
        raise MediaError(f"image file {path} is too large: {exc}; the largest image accepted is "
                         f"{MAX_IMAGE_PIXELS / 1e6:g} MP") from exc
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        raise MediaError(f"cannot decode image file {path} (corrupt or truncated?): {exc}") from exc
    try:
        width, height = image.size
        check_image_pixels(width, height, f"image file {path}")
        factor = reduce_factor(width, height)
        if factor > 1:  # a JPEG decodes at 1/2, 1/4 or 1/8 scale directly
            image.draft("RGB", (-(-width // factor), -(-height // factor)))
        # Decode now so that a truncated or corrupt file fails here, not later in a resize.
        image.load()
        reduced = _reduced(image)
        if reduced is not image:
            image.close()  # the full-resolution pixels go before anything else is made from them
            image = reduced
        transposed = PIL.ImageOps.exif_transpose(image)
        rgb = transposed.convert("RGB")
        rgb.load()
    except MediaError:
        raise
    except (OSError, ValueError, SyntaxError, EOFError, PIL.Image.DecompressionBombError) as exc:
        raise MediaError(f"cannot decode image file {path} (corrupt or truncated?): {exc}") from exc
    finally:
        image.close()
    return rgb


def load_image(source) -> PIL.Image.Image:
    """An RGB ``PIL.Image.Image`` of size (W, H) with W, H >= 1 from ``source``.

    ``source`` is one of:
      * a path (``str`` or ``os.PathLike``) to an image file: opened, decoded, EXIF-transposed, ``convert("RGB")``;
      * a ``PIL.Image.Image``: converted with :func:`convert_rgb` (transparency composited onto white);
      * a numpy array [H, W] or [H, W, C] with C in (1, 3, 4), dtype uint8 (or float in [0, 1], see
        ``_array_to_rgb``): grey is repeated to RGB, RGBA blended onto white.

    Raises ``MediaError`` naming the file or the problem: missing file, undecodable or truncated file, zero-size
    image, bad array shape or dtype, unsupported source type (URLs are not fetched).
    """
    if isinstance(source, PIL.Image.Image):
        width, height = source.size
        if width == 0 or height == 0:
            raise MediaError(f"image has zero size ({width}x{height})")
        check_image_pixels(width, height, "PIL image")
        try:
            source.load()
            rgb = convert_rgb(_reduced(source))
        except (OSError, ValueError, SyntaxError, EOFError) as exc:
            raise MediaError(f"cannot decode PIL image {getattr(source, 'filename', '') or ''}: {exc}") from exc
        return rgb

    if isinstance(source, np.ndarray):
        return _array_to_rgb(source, "numpy image")

    if isinstance(source, (str, os.PathLike)):
        path = local_path(source, "image")
        rgb = _open_path(path)
        width, height = rgb.size
        if width == 0 or height == 0:
            raise MediaError(f"image file {path} has zero size ({width}x{height})")
        return rgb

    raise MediaError(
        f"unsupported image source of type {type(source).__name__}; expected a path, a PIL.Image.Image or a numpy "
        "array"
    )
