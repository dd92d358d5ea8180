"""A least-recently-used store bounded by bytes, with hit and miss counts."""

from __future__ import annotations

import collections
import threading
from typing import Any, Hashable


class BytesLRU:
    """key -> value, each with its size in bytes; ``put`` evicts the least recently used entries until the total is
    within ``budget`` (a value larger than the whole budget is not kept). Thread-safe."""

    def __init__(self, budget: int):
        if budget < 0:
            raise ValueError(f"a cache budget must be >= 0 bytes, got {budget}")
        self.budget = int(budget)
        self._items: collections.OrderedDict[Hashable, tuple[Any, int]] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def get(self, key: Hashable, count: bool = True):
        """The value (now the most recently used) or None; counted as a hit or a miss unless ``count`` is False."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self.misses += count
                return None
            self._items.move_to_end(key)
            self.hits += count
            return item[0]

    def put(self, key: Hashable, value: Any, nbytes: int) -> bool:
        """Keep ``value`` (replacing one under the same key); False when it is larger than the budget."""
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            if nbytes > self.budget:
                return False
            self._items[key] = (value, int(nbytes))
            self.bytes += int(nbytes)
            while self.bytes > self.budget:
                _, (_, size) = self._items.popitem(last=False)
                self.bytes -= size
                self.evictions += 1
            return True

    def keys(self) -> list:
        with self._lock:
            return list(self._items)

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0
