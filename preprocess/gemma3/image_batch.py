"""Host-side batching of Gemma 3 images for the image encoder (encoders/gemma3/image_encoder.py).

Every image (or pan-and-scan crop) is one fixed-size [C, Y, X] pixel array (C channels, Y = X the vision tower's
``image_size``) giving the same number of soft tokens, so the only size that varies is the number of images:
:func:`collate` rounds it up to a power of two. The encoder's inputs::

    "pixels"       [B, C, Y, X] float32   (B images, zeros for padding images)
    "image_valid"  [B] bool
"""

from __future__ import annotations

import numpy as np

from omnijax.common.errors import MediaError
from omnijax.preprocess.buckets import pow2_at_least


def collate(items: list, pixel_shape: tuple[int, int, int]) -> dict[str, np.ndarray]:
    """Pixel values of ``pixel_shape`` (C, Y, X) per image -> the encoder's inputs, the image count rounded up to a
    power of two. Raises MediaError for an item of another shape (before any device work)."""
    if not items:
        raise ValueError("no images to collate")
    shape = tuple(pixel_shape)
    for i, item in enumerate(items):
        if np.shape(item) != shape:
            raise MediaError(f"image {i}: expected pixel values of shape {shape}, got {np.shape(item)}")
    pixels = np.zeros((pow2_at_least(len(items)),) + shape, np.float32)
    pixels[:len(items)] = np.stack(items)
    valid = np.arange(len(pixels)) < len(items)
    return {"pixels": pixels, "image_valid": valid}
