"""Encoded media, kept by content: the same image or clip (after preprocessing) is encoded once.

Each media item of a prompt (what the processor made of it: pixel values, mel features, ...) is encoded alone and
its feature rows (the valid ones, with any extra feature maps) are kept on the host under a hash of the item's
whole content, least recently used first out past a byte budget. ``MediaCache.rows`` returns, per item, its
rows and its content hash: the prefix cache keys placeholder tokens by that hash, so a different image behind the
same placeholder tokens never reuses another image's keys and values.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, NamedTuple

import numpy as np

from omnijax.common.lru import BytesLRU


def content_hash(item: Any) -> bytes:
    """A 16-byte digest of everything in ``item``: arrays (dtype, shape and bytes), mappings, sequences, named
    tuples, dataclasses and scalars, recursively."""
    h = hashlib.blake2b(digest_size=16)

    def feed(x):
        if isinstance(x, np.ndarray) or hasattr(x, "__array__") and not isinstance(x, (str, bytes)):
            a = np.ascontiguousarray(np.asarray(x))
            h.update(f"a{a.dtype.str}{a.shape}".encode())
            h.update(a.tobytes())
        elif isinstance(x, dict):
            h.update(f"d{len(x)}".encode())
            for k in sorted(x, key=repr):
                h.update(repr(k).encode())
                feed(x[k])
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            feed({f.name: getattr(x, f.name) for f in dataclasses.fields(x)})
        elif isinstance(x, (list, tuple)):
            h.update(f"{type(x).__name__}{len(x)}".encode())
            for y in x:
                feed(y)
        else:
            h.update(repr(x).encode())

    feed(item)
    return h.digest()


class EncodedItem(NamedTuple):
    """One media item's encoder output: features [rows, D] and extra feature maps [rows, D] (host arrays)."""

    features: np.ndarray
    extras: tuple[np.ndarray, ...]

    @property
    def nbytes(self) -> int:
        return self.features.nbytes + sum(e.nbytes for e in self.extras)


class MediaCache:
    """``encode(modality, items)`` -> ``EncodedItem`` (or None) per item, through ``encode_one(modality, item)``
    (the engine's encoder on one item) for items not kept yet. budget: bytes of encoder output kept."""

    def __init__(self, encode_one, budget: int):
        self.encode_one = encode_one
        self.store = BytesLRU(budget)

    def rows(self, modality: str, items: list) -> list[tuple[bytes, EncodedItem]]:
        """(content hash, encoded rows) of each item, in order."""
        out = []
        for item in items:
            key = content_hash((modality, item))
            found = self.store.get(key)
            if found is None:
                found = self.encode_one(modality, item)
                self.store.put(key, found, found.nbytes)
            out.append((key, found))
        return out
