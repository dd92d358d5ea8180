"""Scoring text: the log-probability of each token given the ones before it (perplexity, evaluation harnesses).

A text's token ids are cut into windows of at most ``window`` tokens; the first window scores every token after its
first, each later one starts ``window - stride`` tokens before the first token it scores (those earlier tokens are
its context only). Each window is a request to the serving engine that asks for its prompt's log-probabilities
(``Request.prompt_logprobs``): it is prefilled in chunks by the same programs as every prompt, and the
log-softmax at each next token is taken on the device, so only one float per token comes back. Up to a slot's
worth of a text's windows run side by side on the engine (fewer while its queue is full).
"""

from __future__ import annotations

import collections
import math

import numpy as np

from omnijax.app.requests import Request
from omnijax.app.scheduler import QueueFullError
from omnijax.common.errors import PromptError
from omnijax.preprocess.processor import PreparedPrompt

DEFAULT_WINDOW = 1024


def windows(n: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(start, end, first scored position) of the windows over ``n`` token ids: token ids [start, end) run through
    the model, and the log-probabilities of tokens first..end-1 are taken from it (each token after the first is
    scored exactly once)."""
    if window < 2 or not 1 <= stride <= window - 1:
        raise ValueError(f"a scoring window of {window} tokens needs 1 <= stride <= {window - 1}, got {stride}")
    if n <= window:
        return [(0, n, 1)]
    out, scored = [], 1
    while scored < n:
        end = min(n, scored + stride) if out else window
        start = max(0, end - window)
        out.append((start, end, scored))
        scored = end
    return out


class Scorer:
    """Token log-probabilities of prepared token ids with a pipeline's serving engine (its scheduler, and its
    ``_wait``, which drives the engine where it has no thread of its own)."""

    def __init__(self, pipe, window: int | None = None):
        self.pipe = pipe
        context = pipe.scheduler.context
        self.window = min(window or DEFAULT_WINDOW, context - 1)  # a request holds its prompt and one new token
        if self.window < 2:
            raise PromptError(f"the context budget of {context} tokens is too small to score text")
        self.stride = max(1, self.window // 2)

    def score(self, ids: np.ndarray) -> np.ndarray:
        """float32 [len(ids) - 1]: the natural-log probability of each token after the first given those before."""
        ids = np.asarray(ids, np.int32)
        if len(ids) < 2:
            return np.zeros((0,), np.float32)
        out = np.empty(len(ids) - 1, np.float32)
        scheduler = self.pipe.scheduler
        flight: collections.deque = collections.deque()  # (window, handle), oldest first

        def finish_oldest():
            (start, end, first), handle = flight.popleft()
            logp = self.pipe._wait([handle])[0].prompt_logprobs  # position t scores token start + t + 1
            out[first - 1:end - 1] = logp[first - 1 - start:end - 1 - start]

        try:
            for start, end, first in windows(len(ids), self.window, self.stride):
                prompt = PreparedPrompt(ids[start:end], {}, np.zeros(end - start, bool))
                request = Request(prompt, 1, ignore_eos=True, prompt_logprobs=0)
                while True:
                    if len(flight) >= scheduler.slots.slots:  # a slot's worth of windows in flight at most
                        finish_oldest()
                    try:
                        flight.append(((start, end, first), scheduler.submit(request)))
                        break
                    except QueueFullError:  # a busy engine: wait for a window of ours, else give up
                        if not flight:
                            raise
                        finish_oldest()
            while flight:
                finish_oldest()
        except BaseException:
            for _, handle in flight:
                handle.cancel()
            raise
        return out


def perplexity(logprobs: list[np.ndarray]) -> float:
    """exp(-mean log-probability) over every scored token of every text (nan when none was scored)."""
    total = sum(float(np.sum(x, dtype=np.float64)) for x in logprobs)
    count = sum(len(x) for x in logprobs)
    return math.exp(-total / count) if count else float("nan")
