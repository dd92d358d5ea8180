"""Keys and values of earlier prompts, reused by later prompts that start the same way.

A prompt's identity is one int64 per token (``key_ids``): the token id for text, and for a media placeholder a
value derived from the content hash of the media item whose feature row it receives and the row's index in that
item. Two prompts share a prefix only where both their tokens and their media agree, so a different image behind
the same placeholder tokens never matches.

An entry holds a slot's keys and values after ``length`` tokens (app/slots.py ``snapshot``), the prompt's last
logits when the entry ends where a prompt ended (a repeated prompt then needs no prefill at all), and is found by
the digest of its ``length`` key ids. Entries are kept least recently used first out within a byte budget.
"""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

import numpy as np

from omnijax.common.lru import BytesLRU

def key_ids(token_ids: np.ndarray, media: dict[int, list[tuple[bytes, int]]]) -> np.ndarray:
    """int64 [length]: ``token_ids`` with the positions of each placeholder id in ``media`` (placeholder id ->
    [(content hash, rows)] of its items in order) replaced by ids of (item hash, row index)."""
    ids = np.asarray(token_ids, np.int64).copy()
    for placeholder, items in media.items():
        rows = [_row_ids(digest, n) for digest, n in items]
        where = np.nonzero(ids == placeholder)[0]
        values = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        if len(values) != len(where):
            raise ValueError(f"{len(where)} placeholders of id {placeholder} for {len(values)} media rows")
        ids[where] = values
    return ids


def _row_ids(digest: bytes, rows: int) -> np.ndarray:
    """Negative ids (token ids are >= 0) for the rows of one media item."""
    base = int.from_bytes(digest[:7], "little")  # 56 bits
    return -1 - (base + np.arange(rows, dtype=np.int64) * 0x9E3779B1) % (1 << 62)


class PrefixEntry(NamedTuple):
    """saved: the keys / values (device arrays, app/slots.py ``snapshot``); length: tokens they hold; logits: the
    [1, V] logits after those tokens, or None."""

    saved: Any
    length: int
    logits: Any
    nbytes: int


class PrefixCache:
    """Entries by (length, digest of the first length key ids). budget: bytes of keys / values kept (0: off)."""

    def __init__(self, budget: int):
        self.store = BytesLRU(budget)
        self.hit_tokens = 0
        self.lookups = 0
        self.hits = 0

    @property
    def enabled(self) -> bool:
        return self.store.budget > 0

    def lookup(self, ids: np.ndarray) -> PrefixEntry | None:
        """The longest entry that ``ids`` starts with and that leaves a token to compute, or that ends where ``ids``
        ends and holds its logits."""
        if not self.enabled:
            return None
        self.lookups += 1
        n = len(ids)
        lengths = sorted({length for length, _ in self.store.keys() if length <= n})
        digests, h, done = {}, hashlib.blake2b(digest_size=16), 0
        data = np.ascontiguousarray(ids, np.int64)
        for length in lengths:
            h.update(data[done:length].tobytes())
            done = length
            digests[length] = h.copy().digest()
        for length in reversed(lengths):
            entry = self.store.get((length, digests[length]), count=False)
            if entry is not None and (length < n or entry.logits is not None):
                self.hits += 1
                self.hit_tokens += length
                return entry
        return None

    def store_entry(self, ids: np.ndarray, entry: PrefixEntry) -> None:
        """Keep ``entry`` for the first ``entry.length`` key ids of ``ids``."""
        if not self.enabled:
            return
        digest = hashlib.blake2b(np.ascontiguousarray(ids[:entry.length], np.int64).tobytes(), digest_size=16).digest()
        self.store.put((entry.length, digest), entry, entry.nbytes)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0
