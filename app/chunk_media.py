"""A prompt's encoded media as the serving engine's prompt chunks take them (host arrays).

``prompt_media`` joins one modality's encoded items into the prompt's feature rows (placeholder order) and their
deepstack maps; ``chunk_media`` cuts the rows of the placeholders inside one chunk out of them.
"""

from __future__ import annotations

import numpy as np

from omnijax.app.media_cache import EncodedItem
from omnijax.app.slots import ChunkMedia


def prompt_media(items: list[EncodedItem], layers: int, deepstack: bool) -> tuple[np.ndarray, np.ndarray]:
    """One modality's feature rows of the whole prompt [R, D] (float32, in placeholder order), and the extra
    feature maps added after the first decoder layers [E, R, D] (E = ``layers``, the decoder's deepstack layers;
    zeros unless ``deepstack``: a modality whose encoder has none)."""
    features = np.concatenate([i.features for i in items]).astype(np.float32)
    extras = np.zeros((layers,) + features.shape, np.float32)
    if deepstack:
        for i, maps in enumerate(zip(*(item.extras for item in items))):
            extras[i] = np.concatenate(maps)
    return features, extras


def chunk_media(ids: np.ndarray, media: dict, a: int, b: int) -> ChunkMedia | None:
    """The media of prompt tokens a..b-1 of the prompt ``ids`` ({placeholder id: ``prompt_media``}): each
    placeholder's feature row (its item's rows in placeholder order across the prompt) and deepstack rows; None when
    the chunk holds no placeholder."""
    out = None
    for token_id, (features, extras) in media.items():
        at = np.flatnonzero(ids[a:b] == token_id)
        if not len(at):
            continue
        if out is None:
            out = ChunkMedia(np.zeros((b - a, features.shape[1]), np.float32), np.zeros(b - a, bool),
                             np.zeros((extras.shape[0], b - a, features.shape[1]), np.float32))
        first = int(np.sum(ids[:a] == token_id))
        out.rows[at] = features[first:first + len(at)]
        out.is_media[at] = True
        out.deepstack[:, at] = extras[:, first:first + len(at)]
    return out
