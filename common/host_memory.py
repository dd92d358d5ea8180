"""Giving freed host memory back to the system.

glibc's allocator keeps memory freed by small and medium allocations in its heaps, where it still counts as the
process's resident memory. Building a large tokenizer (a 262k-token vocabulary with 515k merges, parsed from a
33 MB JSON file) frees ~180 MB of such scratch; ``release_free_memory`` (``malloc_trim``) returns it, so the weights
that follow do not stack on top of it. A no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_free_memory() -> None:
    """Return the C heap's free memory to the system (glibc ``malloc_trim(0)``)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
