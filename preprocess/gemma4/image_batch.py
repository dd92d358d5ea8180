"""Host-side batching of Gemma 4 images for the vision encoder (encoders/gemma4/vision.py), in pure numpy.

:func:`collate`: the images of a batch (``preprocess.gemma4.image.Gemma4ImagePatches``, unpadded) ->
``{"pixel_values": float32 [B, L, 3 p**2], "position_ids": int32 [B, L, 2], "num_soft_tokens": int32 [B]}``. Every
image is padded to the patch budget of the settings' ``max_soft_tokens`` (L = ``max_patches = max_soft_tokens *
k**2``; zero pixels, position (-1, -1)) and the image count to B, the next power of two (padding images have no
patches and 0 soft tokens). True sizes are data, so new image sizes and aspect ratios reuse one compiled program;
only a new B bucket compiles again.

:func:`collate_smallest_budget`: :func:`collate` at the smallest supported soft-token budget
(:data:`preprocess.gemma4.image.SUPPORTED_SOFT_TOKENS`) that holds the batch's largest image (:func:`budget_for`),
what the engine batches with: a batch of small images runs a small program, and the encoder's result does not
depend on the budget (padding patches are masked out and pool into nothing).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from omnijax.common.errors import MediaError
from omnijax.preprocess.gemma4.image import SUPPORTED_SOFT_TOKENS, Gemma4ImageConfig, Gemma4ImagePatches

# The most images one collated batch may hold (before padding to a power of two).
MAX_IMAGES_PER_BATCH = 256


def padded_image_count(n: int) -> int:
    """The image-count bucket for n images: the next power of two (at least 1)."""
    return 1 << max(0, int(n) - 1).bit_length()


def collate(items: Sequence[Gemma4ImagePatches], image_cfg: Gemma4ImageConfig) -> dict[str, np.ndarray]:
    """The encoder's inputs for ``items`` (one per image, in prompt order) at ``image_cfg``'s patch budget: see
    the module docstring.

    Raises ``MediaError`` for no images, too many images, or an item that does not match ``image_cfg``."""
    items = list(items)
    if not items:
        raise MediaError("no images to encode")
    if len(items) > MAX_IMAGES_PER_BATCH:
        raise MediaError(f"{len(items)} images in one batch, above the limit of {MAX_IMAGES_PER_BATCH}")
    n = padded_image_count(len(items))
    max_patches, patch_dim, k2 = image_cfg.max_patches, image_cfg.patch_dim, image_cfg.pooling_kernel_size ** 2
    pixel_values = np.zeros((n, max_patches, patch_dim), np.float32)
    position_ids = np.full((n, max_patches, 2), -1, np.int32)
    num_soft_tokens = np.zeros((n,), np.int32)
    for i, item in enumerate(items):
        rows = item.pixel_values.shape[0]
        if (item.pixel_values.ndim != 2 or item.pixel_values.shape[1] != patch_dim or rows > max_patches
                or item.position_ids.shape != (rows, 2) or item.num_soft_tokens * k2 != rows or rows == 0):
            raise MediaError(
                f"image {i}: {tuple(item.pixel_values.shape)} patches with {tuple(item.position_ids.shape)} positions "
                f"and {item.num_soft_tokens} soft tokens do not fit patches of {patch_dim} values, at most "
                f"{max_patches} of them, {k2} per soft token")
        pixel_values[i, :rows] = item.pixel_values
        position_ids[i, :rows] = item.position_ids
        num_soft_tokens[i] = item.num_soft_tokens
    return {"pixel_values": pixel_values, "position_ids": position_ids, "num_soft_tokens": num_soft_tokens}


def budget_for(items: Sequence[Gemma4ImagePatches], image_cfg: Gemma4ImageConfig) -> Gemma4ImageConfig:
    """The image settings whose padded patch budget batches ``items``: ``image_cfg``'s patch and pooling sizes and
    the smallest supported ``max_soft_tokens`` holding the largest item. Raises ``MediaError`` when an item has more
    soft tokens than the largest supported budget."""
    largest = max((int(item.num_soft_tokens) for item in items), default=0)
    for budget in SUPPORTED_SOFT_TOKENS:
        if largest <= budget:
            return Gemma4ImageConfig(patch_size=image_cfg.patch_size,
                                     pooling_kernel_size=image_cfg.pooling_kernel_size, max_soft_tokens=budget)
    raise MediaError(f"an image of {largest} soft tokens is above the largest supported budget of "
                     f"{SUPPORTED_SOFT_TOKENS[-1]}")


def collate_smallest_budget(items: Sequence[Gemma4ImagePatches], image_cfg: Gemma4ImageConfig
                            ) -> dict[str, np.ndarray]:
    """:func:`collate` at the budget :func:`budget_for` picks (the engine's batching of Gemma 4 images)."""
    return collate(items, budget_for(items, image_cfg))
