"""Which pages of the serving engine's paged KV cache (decoder/kv_cache.py) each slot holds: the host's copy of the
page tables, and the free pages.

A request takes the pages its prompt and its answer can fill (``pages_for(prompt + max_new_tokens)``, at most a
ring's in a ring's pool) when it takes a slot, and gives them back when it ends; a request that needs more pages
than are free waits for others to end (oldest first). So the KV memory is a budget (``Slots``: ``kv_cache_mb``)
shared by what the requests hold, not a whole context and window per slot: a slot is cheap, and many short requests
run side by side. Every entry of a table that names no page of the slot's names the pool's scratch page (the last
one).
"""

from __future__ import annotations

import numpy as np

from omnijax.decoder.kv_cache import PAGE


def pages_for(tokens: int) -> int:
    """Pages that hold ``tokens`` positions."""
    return -(-int(tokens) // PAGE)


class PageTable:
    """slots rows of ``per_row`` entries over a pool of ``pages`` pages plus the scratch page (index ``pages``)."""

    def __init__(self, slots: int, per_row: int, pages: int):
        if pages < 1 or per_row < 1:
            raise ValueError(f"a page table needs pages, got {pages} pages and {per_row} per row")
        self.pages = pages
        self.per_row = per_row
        self.table = np.full((slots, per_row), pages, np.int32)
        self._free = list(range(pages - 1, -1, -1))  # taken from the end: lowest first
        self.version = 0  # grows with every change (the device copy is replaced when it is behind)

    @property
    def free(self) -> int:
        return len(self._free)

    def fits(self, tokens: int) -> bool:
        """Whether a request of ``tokens`` positions can take its pages now."""
        return pages_for(tokens) <= len(self._free)

    def take(self, slot: int, tokens: int) -> None:
        """Slot ``slot`` holds the pages of ``tokens`` positions (it held none)."""
        n = pages_for(tokens)
        if n > min(len(self._free), self.per_row):
            raise ValueError(f"{n} pages asked for slot {slot}, {len(self._free)} free (at most {self.per_row} a slot)")
        if (self.table[slot] != self.pages).any():
            raise ValueError(f"slot {slot} holds pages already")
        self.table[slot, :n] = [self._free.pop() for _ in range(n)]
        self.version += 1

    def give_back(self, slot: int) -> None:
        """Slot ``slot``'s pages are free again (nothing when it holds none)."""
        row = self.table[slot]
        held = row[row != self.pages]
        if len(held):
            self._free.extend(int(p) for p in held[::-1])
            row[:] = self.pages
            self.version += 1

    def reset(self) -> None:
        """Every page free, every slot holding none."""
        self.table[:] = self.pages
        self._free = list(range(self.pages - 1, -1, -1))
        self.version += 1


class KVPages:
    """The page tables of a paged cache, one per span of ``paged_spans`` (the context, then the local layers' rings
    that are whole pages), each over its own pool: a request takes, in each, the pages of ``min(tokens, span)``
    slots. ``pools``: the pages of each pool (its scratch page not counted)."""

    def __init__(self, slots: int, spans: tuple[int, ...], pools: tuple[int, ...]):
        self.spans = spans
        self.tables = tuple(PageTable(slots, span // PAGE, n) for span, n in zip(spans, pools))

    def _each(self, tokens: int):
        return ((t, min(int(tokens), span)) for t, span in zip(self.tables, self.spans))

    def fits(self, tokens: int) -> bool:
        """Whether a request of ``tokens`` positions can take its pages now."""
        return all(t.fits(n) for t, n in self._each(tokens))

    def take(self, slot: int, tokens: int) -> None:
        for t, n in self._each(tokens):
            t.take(slot, n)

    def give_back(self, slot: int) -> None:
        for t in self.tables:
            t.give_back(slot)

    def reset(self) -> None:
        for t in self.tables:
            t.reset()

    @property
    def version(self) -> int:
        return sum(t.version for t in self.tables)

    @property
    def pages(self) -> int:
        """Pages of all pools."""
        return sum(t.pages for t in self.tables)

    @property
    def free(self) -> int:
        """Pages of all pools that no request holds."""
        return sum(t.free for t in self.tables)
