"""How a prompt is cut into chunks for the serving engine: at most ``max_chunk`` tokens each, never splitting a
block of media tokens that attend to each other both ways (a chunk attends to earlier chunks only causally)."""

from __future__ import annotations

import numpy as np


def media_runs(bidirectional: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of True in ``bidirectional`` [length]."""
    flags = np.asarray(bidirectional, bool).astype(np.int8)
    edges = np.diff(np.concatenate([[0], flags, [0]]))
    return list(zip(np.nonzero(edges == 1)[0].tolist(), np.nonzero(edges == -1)[0].tolist()))


def plan_chunks(start: int, end: int, bidirectional: np.ndarray, max_chunk: int,
                cuts: tuple[int, ...] = ()) -> list[tuple[int, int]]:
    """[a, b) chunks covering [start, end): each at most ``max_chunk`` tokens, except one holding a bidirectional
    block longer than that (the block whole); a chunk that would end inside a block ends before it instead, and a
    chunk ends at each of ``cuts`` it would cross (positions outside blocks). ``start`` never falls inside a block
    (a cached prefix ends with text)."""
    if max_chunk < 1:
        raise ValueError(f"chunks need at least one token, got {max_chunk}")
    runs = [(a, b) for a, b in media_runs(bidirectional) if b > start and a < end]
    chunks, a = [], start
    while a < end:
        b = min([a + max_chunk, end] + [c for c in cuts if a < c])
        for ra, rb in runs:
            if ra < b < rb:  # b would split this block
                b = ra if ra > a else rb
                break
        chunks.append((a, b))
        a = b
    return chunks


def prefix_points(start: int, end: int, bidirectional: np.ndarray, every: int) -> tuple[int, ...]:
    """Where a prompt's keys / values are worth keeping for later prompts that start the same way, besides its end:
    after its last media block (the same picture asked another question) and at the last multiple of ``every``
    (a long shared beginning); only points in (start, end) outside media blocks."""
    runs = media_runs(bidirectional)
    points = set()
    if runs and runs[-1][1] < end:
        points.add(runs[-1][1])
    last = (end - 1) // every * every
    if last > 0 and not any(a < last < b for a, b in runs):
        points.add(last)
    return tuple(sorted(p for p in points if start < p < end))
