"""Scoring text: the log-probability of each token given the ones before it (perplexity, evaluation harnesses).

A text's token ids are cut into windows of at most ``window`` tokens; the first window scores every token after its
first, each later one starts ``window - stride`` tokens before the first token it scores (those earlier tokens are
its context only). Each window runs as one prompt through the decoder, whose ``token_logprobs`` builds the
log-softmax at the next token on the device, a few positions at a time, so only [1, window] floats come back.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from omnijax.common.errors import PromptError
from omnijax.common.sharding import host_array, use_mesh
from omnijax.decoder.model import Prompt

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
    """Token log-probabilities of prepared token ids with an engine's loaded model (its parameters, mesh and
    shape buckets), one window per compiled call."""

    def __init__(self, engine, window: int | None = None):
        self.engine = engine
        self.window = min(window or DEFAULT_WINDOW, engine.max_context - 1)
        if self.window < 2:
            raise PromptError(f"the context budget of {engine.max_context} tokens is too small to score text")
        self.stride = max(1, self.window // 2)
        self._logprobs = jax.jit(self._impl, static_argnames=("cache_len",))

    def _impl(self, params, tokens_BL, lengths_B, rope_pos_ABL, *, cache_len):
        engine = self.engine
        dec = nnx.merge(engine.graphdef, params).decoder
        prompt = Prompt(tokens_BL, lengths_B, rope_pos_ABL, jnp.zeros(tokens_BL.shape, bool), {}, None)
        return dec.token_logprobs(prompt, cache_len=cache_len, cache_dtype=engine.dtype,
                                  attention=engine.attention)

    def _window(self, ids: np.ndarray) -> np.ndarray:
        """[len(ids)] float32: position t holds log p(ids[t + 1] | ids[:t + 1]) (the last is meaningless)."""
        from omnijax.app.generation import bucket_for

        engine = self.engine
        length = bucket_for(len(ids), engine.buckets)
        tokens = np.full((1, length), engine.cfg.pad_id, np.int32)
        tokens[0, :len(ids)] = ids
        rope = np.zeros((engine.cfg.decoder.rope_axes, 1, length), np.int32)
        rope[:, 0, :len(ids)] = np.arange(len(ids))
        with use_mesh(engine.mesh):
            out = self._logprobs(engine.params, engine._put(tokens, ("batch", "length")),
                                 engine._put(np.array([len(ids)], np.int32), ("batch",)),
                                 engine._put(rope, (None, "batch", "length")), cache_len=length)
        return host_array(out)[0, :len(ids)]

    def score(self, ids: np.ndarray) -> np.ndarray:
        """float32 [len(ids) - 1]: the natural-log probability of each token after the first given those before."""
        ids = np.asarray(ids, np.int32)
        if len(ids) < 2:
            return np.zeros((0,), np.float32)
        out = np.empty(len(ids) - 1, np.float32)
        for start, end, first in windows(len(ids), self.window, self.stride):
            logp = self._window(ids[start:end])  # position t scores token start + t + 1
            out[first - 1:end - 1] = logp[first - 1 - start:end - 1 - start]
        return out


def perplexity(logprobs: list[np.ndarray]) -> float:
    """exp(-mean log-probability) over every scored token of every text (nan when none was scored)."""
    total = sum(float(np.sum(x, dtype=np.float64)) for x in logprobs)
    count = sum(len(x) for x in logprobs)
    return math.exp(-total / count) if count else float("nan")
