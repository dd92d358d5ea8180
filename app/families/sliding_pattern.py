"""Gemma's interleaving of sliding-window and full-attention layers, stated once for Gemma 3, its GGUF files and
Gemma 4."""

from __future__ import annotations

# Every 6th layer attends to the full context, the other five to a sliding window: the default of Gemma 3's and
# Gemma 4's configs, and llama.cpp's for gemma3 files that state no pattern.
GEMMA_SLIDING_PATTERN = 6


def sliding_layers(num_layers: int, pattern: int = GEMMA_SLIDING_PATTERN) -> tuple[bool, ...]:
    """Whether each layer slides: layer i attends to the full context when (i + 1) % pattern == 0."""
    if pattern < 1:
        raise ValueError(f"a sliding window pattern must be >= 1, got {pattern}")
    return tuple((i + 1) % pattern != 0 for i in range(num_layers))
