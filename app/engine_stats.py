"""The serving engine's counters (app/scheduler.py keeps one ``Stats``; ``omnijax serve`` exports them on /metrics,
demo/metrics.py)."""

from __future__ import annotations

import collections
import dataclasses

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclasses.dataclass
class Stats:
    """Counters since start: requests by how they ended, tokens, decode steps, the most requests in the slots at
    once, and the time to first token of
    every request as a histogram (cumulative counts per ``TTFT_BUCKETS`` bound, their sum and count)."""

    finished: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    failed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    steps: int = 0
    peak_running: int = 0  # the most requests that held a slot at once
    ttft_counts: list = dataclasses.field(default_factory=lambda: [0] * len(TTFT_BUCKETS))
    ttft_sum: float = 0.0
    ttft_count: int = 0

    def first_token(self, seconds: float) -> None:
        for i, bound in enumerate(TTFT_BUCKETS):
            if seconds <= bound:
                self.ttft_counts[i] += 1
        self.ttft_sum += seconds
        self.ttft_count += 1
