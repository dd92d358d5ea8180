"""What ``Pipeline.stream(..., speak=True)`` yields: text pieces and audio chunks, in the order they are ready.

Plain data (numpy only), so front ends and servers can import it without JAX.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class TextPiece:
    """A piece of the answer's text (the pieces joined are the result's ``text``)."""

    text: str


@dataclasses.dataclass(frozen=True)
class AudioChunk:
    """The next samples of the spoken answer: ``samples`` float32 mono in [-1, 1] at ``sample_rate`` Hz, and the
    codec ``codes`` int32 [frames, code groups] they complete (the chunks joined are the result's ``audio`` and
    ``audio_codes``)."""

    samples: np.ndarray
    sample_rate: int
    codes: np.ndarray

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.sample_rate
