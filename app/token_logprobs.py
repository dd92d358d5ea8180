"""Log probabilities of generated tokens, as the OpenAI API reports them: computed on the device, beside the token.

``token_logprobs`` is a pure function of a step's float32 logits and the tokens drawn from them: the log-softmax of
the model's own distribution (before temperature, top-k and top-p: what OpenAI and vLLM report), the chosen token's
value, and the ``TOP`` most likely tokens with theirs. ``TOP`` is fixed (``jax.lax.top_k`` with k = 20 always), so a
request asking for 3 alternatives and one asking for 20 run the same program; the host keeps the first
``top_logprobs`` of them. The serving engine's insert and decode programs call it only in their variant compiled for
a step where some request asks for log probabilities (app/slots.py); a step without one runs no part of it.

``check_logprobs`` checks the Python API's ``logprobs`` setting; ``TokenLogprob`` is one token's host-side record.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from omnijax.common.errors import SamplingError

TOP = 20  # the alternatives computed per token: what OpenAI's top_logprobs allows at most


class StepLogprobs(NamedTuple):
    """One step's log probabilities (device arrays, float32 / int32): ``chosen`` [B] of each row's drawn token,
    ``top_ids`` / ``top`` [B, K] the K = min(TOP, vocab) most likely tokens, most likely first (ties: lower id
    first)."""

    chosen: jax.Array
    top_ids: jax.Array
    top: jax.Array


def token_logprobs(logits_BV: jax.Array, tokens_B: jax.Array) -> StepLogprobs:
    """The natural-log probabilities of ``tokens_B`` and of the TOP most likely tokens under the log-softmax of the
    float32 ``logits_BV`` (the model's distribution, no sampling setting applied)."""
    logp = jax.nn.log_softmax(logits_BV.astype(jnp.float32), axis=-1)
    chosen = jnp.take_along_axis(logp, tokens_B.astype(jnp.int32)[:, None], axis=-1)[:, 0]
    top, top_ids = jax.lax.top_k(logp, min(TOP, logp.shape[-1]))
    return StepLogprobs(chosen, top_ids.astype(jnp.int32), top)


@dataclasses.dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log probability and its ``top`` alternatives ((token id, log probability) pairs, most
    likely first; as many as the request asked for)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def host_rows(step: StepLogprobs, tokens, keep: list[int | None]) -> list[TokenLogprob | None]:
    """Per row, the ``TokenLogprob`` of its token with the first ``keep[row]`` alternatives (None where a row asks
    for none). ``step`` holds host arrays."""
    chosen, ids, top = (np.asarray(a) for a in step)
    out: list[TokenLogprob | None] = []
    for row, k in enumerate(keep):
        if k is None:
            out.append(None)
            continue
        alternatives = tuple(zip(ids[row, :k].tolist(), top[row, :k].tolist()))
        out.append(TokenLogprob(int(tokens[row]), float(chosen[row]), alternatives))
    return out


def check_logprobs(value) -> int | None:
    """``value`` as the number of alternatives a request keeps per token (0..TOP), or None (no log probabilities);
    True means 0 (the chosen token's only). SamplingError otherwise."""
    if value is None or value is False:
        return None
    if value is True:
        return 0
    if not isinstance(value, numbers.Integral) or not 0 <= value <= TOP:
        raise SamplingError(f"logprobs must be None, a boolean or an integer in [0, {TOP}] (the alternatives per "
                            f"token), got {value!r}"[:300])
    return int(value)
