"""Host-side batching of Llama 4 image tiles for the image encoder (encoders/llama4/vision.py).

The tiles of all images of a batch (each image's tiles row-major, then its global tile; images in prompt order) are
concatenated and padded with zero tiles to a power of two, so a new tile count inside a bucket reuses the compiled
program. The encoder's inputs::

    "pixel_values"  [B, 3, Y, X] float32   (B tiles, Y = X the tile size)
    "num_tiles"     [] int32               tiles before the padding
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from omnijax.common.errors import MediaError
from omnijax.preprocess.buckets import pow2_at_least

# Bounds on a batch: the most tiles one encoder call takes (a prompt of 30 images of 17 tiles fits).
DEFAULT_MAX_TILES = 512


def collate(items: Sequence[Any], max_tiles: int = DEFAULT_MAX_TILES) -> dict[str, np.ndarray]:
    """Host-side batching of a prompt's images, in prompt order.

    ``items``: per image, its tiles float32 [n_i, 3, Y, X] (or a ``Llama4ImageTiles``, whose ``tiles`` are taken).
    Returns ``{"pixel_values": float32 [B, 3, Y, X], "num_tiles": int32 []}``: the tiles of all images
    concatenated, zero tiles after them up to B, the power of two >= sum(n_i). Raises ``MediaError`` for no
    items, tiles of different shapes, or more than ``max_tiles`` tiles.
    """
    arrays = [np.asarray(getattr(item, "tiles", item)) for item in items]
    if not arrays:
        raise MediaError("no images to encode")
    shapes = {a.shape[1:] for a in arrays}
    if any(a.ndim != 4 or a.shape[0] < 1 for a in arrays) or len(shapes) != 1:
        raise MediaError(f"image tiles must be [n, 3, S, S] arrays of one tile size, got shapes "
                         f"{[a.shape for a in arrays]}")
    total = sum(a.shape[0] for a in arrays)
    if total > max_tiles:
        raise MediaError(f"{total} image tiles in one prompt is over the limit of {max_tiles}")
    pixels = np.zeros((pow2_at_least(total), *arrays[0].shape[1:]), np.float32)
    pixels[:total] = np.concatenate(arrays, axis=0)
    return {"pixel_values": pixels, "num_tiles": np.asarray(total, np.int32)}
