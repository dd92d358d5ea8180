"""Bucketed array sizes for the encoders' batched inputs: a few fixed shapes, so that a new image size or audio
length inside a bucket reuses the compiled program.

Counts (images, frames) round up to a power of two; lengths (patches per frame, attention windows) round up to a
power of two or the midpoint 1.5 x 2**k between two powers (at most a third of a bucket is padding).
"""

from __future__ import annotations


def pow2_at_least(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def length_bucket(n: int, minimum: int = 1) -> int:
    """The smallest value of {2**k, 3 * 2**(k-1)} that is >= max(n, minimum)."""
    n = max(int(n), int(minimum), 1)
    p = pow2_at_least(n)
    half = p // 2
    return half + half // 2 if half >= 2 and n <= half + half // 2 else p


def length_buckets(limit: int, minimum: int = 1) -> tuple[int, ...]:
    """Every length bucket from ``length_bucket(minimum)`` up to the first one >= ``limit``, in order."""
    out = [length_bucket(minimum)]
    while out[-1] < limit:
        out.append(length_bucket(out[-1] + 1))
    return tuple(out)
