"""Log probabilities of generated tokens, as the OpenAI API reports them: computed on the device, beside the token.

``token_logprobs`` is a pure function of a step's float32 logits, the tokens drawn from them and the rows' sampling
settings: the chosen token's log probability and the ``TOP`` most likely tokens with theirs, under two
distributions side by side: the model's own (``RAW``: the log-softmax of the logits, before temperature, top-k,
top-p and a structured output's constraint: what OpenAI and vLLM report by default), and the one the token was
drawn from (``PROCESSED``: after the constraint and the row's temperature, top-k and top-p, the tokens they drop at
-inf; a greedy unconstrained row's is the model's own), which a request may ask for instead
(``Request.logprobs_mode``). ``TOP`` is fixed (``jax.lax.top_k`` with k = 20 always), so a request asking for 3
alternatives and one asking for 20 run the same program; the host keeps the first ``top_logprobs`` of them. The
serving engine's insert and decode programs call it only in their variant compiled for a step where some request
asks for log probabilities (app/slots.py); a step without one runs no part of it.

``check_logprobs`` checks the Python API's ``logprobs`` setting; ``TokenLogprob`` is one token's host-side record.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from omnijax.app.sampling import processed_rows
from omnijax.common.errors import SamplingError

TOP = 20  # the alternatives computed per token: what OpenAI's top_logprobs allows at most


MODES = ("raw", "processed")  # Request.logprobs_mode: the index into StepLogprobs' leading axis
RAW, PROCESSED = 0, 1


class StepLogprobs(NamedTuple):
    """One step's log probabilities (device arrays, float32 / int32), each under the two distributions of ``MODES``
    (the leading axis of 2): ``chosen`` [2, B] of each row's drawn token, ``top_ids`` / ``top`` [2, B, K] the K =
    min(TOP, vocab) most likely tokens, most likely first (ties: lower id first)."""

    chosen: jax.Array
    top_ids: jax.Array
    top: jax.Array


def _logprobs(logits_BV: jax.Array, tokens_B: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    logp = jax.nn.log_softmax(logits_BV.astype(jnp.float32), axis=-1)
    chosen = jnp.take_along_axis(logp, tokens_B.astype(jnp.int32)[:, None], axis=-1)[:, 0]
    top, top_ids = jax.lax.top_k(logp, min(TOP, logp.shape[-1]))
    return chosen, top_ids.astype(jnp.int32), top


def token_logprobs(logits_BV: jax.Array, tokens_B: jax.Array, settings: dict,
                   drawn_BV: jax.Array | None = None) -> StepLogprobs:
    """The natural-log probabilities of ``tokens_B`` and of the TOP most likely tokens under the log-softmax of the
    float32 ``logits_BV`` (``RAW``) and of what the rows' ``settings`` (as ``sampling.choose_rows`` takes them) draw
    from (``PROCESSED``): ``drawn_BV``, the logits the tokens were drawn from before the settings (a constraint's
    mask applied: app/grammar.py; default ``logits_BV``)."""
    raw = _logprobs(logits_BV, tokens_B)
    processed = _logprobs(processed_rows(logits_BV if drawn_BV is None else drawn_BV, settings), tokens_B)
    return StepLogprobs(*(jnp.stack(pair) for pair in zip(raw, processed)))


@dataclasses.dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log probability and its ``top`` alternatives ((token id, log probability) pairs, most
    likely first; as many as the request asked for)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def host_rows(step: StepLogprobs, tokens, keep: list[int | None],
              modes: list[int] | None = None) -> list[TokenLogprob | None]:
    """Per row, the ``TokenLogprob`` of its token with the first ``keep[row]`` alternatives (None where a row asks
    for none), under the distribution ``modes[row]`` (``RAW`` or ``PROCESSED``; default all ``RAW``). ``step`` holds
    host arrays."""
    chosen, ids, top = (np.asarray(a) for a in step)
    out: list[TokenLogprob | None] = []
    for row, k in enumerate(keep):
        if k is None:
            out.append(None)
            continue
        m = RAW if modes is None else modes[row]
        alternatives = tuple(zip(ids[m, row, :k].tolist(), top[m, row, :k].tolist()))
        out.append(TokenLogprob(int(tokens[row]), float(chosen[m, row]), alternatives))
    return out


def check_logprobs(value, name: str = "logprobs") -> int | None:
    """``value`` (the setting ``name``) as the number of alternatives a request keeps per token (0..TOP), or None
    (no log probabilities); True means 0 (the chosen token's only). SamplingError otherwise."""
    if value is None or value is False:
        return None
    if value is True:
        return 0
    if not isinstance(value, numbers.Integral) or not 0 <= value <= TOP:
        raise SamplingError(f"{name} must be None, a boolean or an integer in [0, {TOP}] (the alternatives per "
                            f"token), got {value!r}"[:300])
    return int(value)


def check_logprobs_mode(value) -> int:
    """``value`` ("raw" or "processed", see ``MODES``) as its index; SamplingError otherwise."""
    if not isinstance(value, str) or value not in MODES:
        raise SamplingError(f"logprobs_mode must be one of {', '.join(map(repr, MODES))}, got {value!r}"[:300])
    return MODES.index(value)
