"""What a request asks of its own prompt, gathered chunk by chunk as the serving engine prefills it: the logits at
every prompt position (``Request.prompt_logits``), and each prompt token's log probability given the ones before it
with its most likely alternatives there (``Request.prompt_logprobs``, computed on the device:
app/slots.py ``Slots.logprobs``).

``PromptScores.add`` takes one prefilled chunk's last-layer output; ``result`` gives the ``GenerationResult`` fields
once the request ends (a request cancelled before its first chunk gets empty arrays).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from omnijax.common.sharding import host_array


def _rows(chunks: list[np.ndarray], row_shape: tuple) -> np.ndarray:
    """The rows of a request's prefilled chunks in order (none for a request cancelled before its first)."""
    return np.concatenate(chunks) if chunks else np.zeros((0, *row_shape), np.float32)


@dataclasses.dataclass
class PromptScores:
    """One request's rows so far: ``logits`` (host, one array per chunk) and ``logprobs`` (device, per chunk a
    tuple: the log probabilities, and with alternatives asked for the top ids and their log probabilities)."""

    logits: list = dataclasses.field(default_factory=list)
    logprobs: list = dataclasses.field(default_factory=list)

    def add(self, slots, request, pad_id: int, a: int, b: int, hidden) -> None:
        """After a step ran prompt tokens a..b-1 of ``request`` in ``slots`` (``hidden`` [1, T, D]: that chunk's
        last-layer output): the rows it asked for."""
        if request.prompt_logits:
            self.logits.append(host_array(slots.head(hidden))[0, :b - a])
        if request.prompt_logprobs is not None:  # position t scores token t + 1 (past the prompt: a pad, cut off)
            following = request.prompt.token_ids[a + 1:b + 1]
            targets = np.full(hidden.shape[1], pad_id, np.int32)
            targets[:len(following)] = following
            scored = slots.logprobs(hidden, targets, top=request.prompt_logprobs > 0)
            self.logprobs.append(tuple(x[0, :b - a] for x in scored))

    def result(self, request, vocab_size: int) -> dict:
        """The ``GenerationResult`` fields ``request`` asked for: ``prompt_logits`` [prompt tokens, vocab],
        ``prompt_logprobs`` [prompt tokens - 1] and ``prompt_top`` (per such token its ``request.prompt_logprobs`` most
        likely (id, log probability) pairs; absent when none are asked for)."""
        out = {}
        if request.prompt_logits:
            out["prompt_logits"] = _rows(self.logits, (vocab_size,))
        if request.prompt_logprobs is not None:
            n = len(request.prompt.token_ids) - 1
            parts = [[host_array(x) for x in chunk] for chunk in self.logprobs]
            out["prompt_logprobs"] = _rows([p[0] for p in parts], ())[:n]
            if k := request.prompt_logprobs:
                ids = _rows([p[1][:, :k] for p in parts], (k,))[:n].tolist()
                top = _rows([p[2][:, :k] for p in parts], (k,))[:n].tolist()
                out["prompt_top"] = [tuple(zip(i, v)) for i, v in zip(ids, top)]
        return out
