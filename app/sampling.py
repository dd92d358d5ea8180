"""Next-token choice from logits: greedy, or temperature + top-k + top-p sampling (all on device).

Settings are checked when they are made (``SamplingParams``, ``check_max_new_tokens``, ``check_stops``): a bad value
raises ``SamplingError`` before any work. The top-k and top-p filters find their thresholds by a binary search over
the float32 values (a fixed 32 steps of one masked reduction over the vocabulary each), never by sorting the
vocabulary; they keep exactly the tokens a full sort would keep (ties at a threshold included), up to the float
rounding of the cumulative probability mass at the top-p boundary.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Sequence

import jax
import jax.numpy as jnp

from omnijax.common.errors import SamplingError

MAX_TOP_K = 2**31 - 1  # top_k is an int32 on device; values at or above the vocabulary size keep every token
SEED_RANGE = (-(2**63), 2**63)  # what jax.random.key takes
MAX_NEW_TOKENS = 1 << 24  # the longest context a config may state (app/config_limits.py)
MAX_STOPS = 32
MAX_SPEECH_FRAMES = 1 << 16  # codec frames of one spoken answer: 87 minutes at Qwen3-Omni's 12.5 frames a second
MAX_STOP_CHARS = 256


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _finite_number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise SamplingError(f"{name} must be a number, got {value!r}")
    try:
        value = float(value)
    except OverflowError:  # an integer beyond float's range (10**400 written out in a JSON body)
        raise SamplingError(f"{name} must be a finite number, got an integer of {value.bit_length()} bits") from None
    if not math.isfinite(value):
        raise SamplingError(f"{name} must be a finite number, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k 0 and top_p 1.0 disable those filters.

    temperature: a finite number >= 0. top_k: an integer in [0, 2**31). top_p: a number in (0, 1]. seed: an
    integer in [-2**63, 2**63). Anything else raises SamplingError (an OmnijaxError and a ValueError).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        temperature = _finite_number("temperature", self.temperature)
        if temperature < 0:
            raise SamplingError(f"temperature must be >= 0, got {self.temperature!r}")
        if not _is_int(self.top_k) or not 0 <= self.top_k <= MAX_TOP_K:
            raise SamplingError(f"top_k must be an integer in [0, {MAX_TOP_K}] (0 = off), got {self.top_k!r}")
        top_p = _finite_number("top_p", self.top_p) if not isinstance(self.top_p, bool) else None
        if top_p is None or not 0.0 < top_p <= 1.0:
            raise SamplingError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.seed) or not SEED_RANGE[0] <= self.seed < SEED_RANGE[1]:
            raise SamplingError(f"seed must be an integer that fits in 64 bits (signed), got {self.seed!r}")
        object.__setattr__(self, "temperature", temperature)
        object.__setattr__(self, "top_k", int(self.top_k))
        object.__setattr__(self, "top_p", top_p)
        object.__setattr__(self, "seed", int(self.seed))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def mode(self) -> tuple[bool, bool, bool]:
        """The static part (compiled variants): (sample, use top-k, use top-p)."""
        return (not self.greedy, not self.greedy and self.top_k > 0, not self.greedy and self.top_p < 1.0)

    def key(self) -> jax.Array:
        """The random key of ``seed``: all 64 bits count (JAX keys take 32; the high half is folded in)."""
        unsigned = self.seed % (1 << 64)
        key = jax.random.key(unsigned & 0xFFFFFFFF)
        return key if unsigned >> 32 == 0 else jax.random.fold_in(key, unsigned >> 32)

    def values(self) -> dict:
        """The traced part: changing these never recompiles."""
        return {"temperature": jnp.float32(max(self.temperature, 1e-6)), "top_k": jnp.int32(self.top_k),
                "top_p": jnp.float32(self.top_p)}


def check_max_new_tokens(value) -> int:
    """``value`` as an int when it is a whole number >= 1, else SamplingError."""
    if not _is_int(value) or not 1 <= value <= MAX_NEW_TOKENS:
        raise SamplingError(f"max_new_tokens must be an integer in [1, {MAX_NEW_TOKENS}], got {value!r}")
    return int(value)


def check_max_speech_frames(value, name: str = "max_speech_frames") -> int | None:
    """None (the default cap, 4096) or ``value`` as an int in [1, MAX_SPEECH_FRAMES]; SamplingError otherwise."""
    if value is None:
        return None
    if not _is_int(value) or not 1 <= value <= MAX_SPEECH_FRAMES:
        raise SamplingError(f"{name} must be an integer in [1, {MAX_SPEECH_FRAMES}], got {value!r}"[:300])
    return int(value)


def check_stops(stop) -> tuple[str, ...]:
    """Stop strings as a tuple (None -> ()); a single string is one stop string. Empty strings are dropped.

    At most MAX_STOPS strings of at most MAX_STOP_CHARS characters each; anything else raises SamplingError."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, Sequence) or any(not isinstance(s, str) for s in stop):
        raise SamplingError(f"stop must be a string or a list of strings, got {stop!r}"[:300])
    stops = tuple(s for s in stop if s)
    if len(stops) > MAX_STOPS:
        raise SamplingError(f"at most {MAX_STOPS} stop strings are accepted, got {len(stops)}")
    longest = max((len(s) for s in stops), default=0)
    if longest > MAX_STOP_CHARS:
        raise SamplingError(f"stop strings are limited to {MAX_STOP_CHARS} characters, got one of {longest}")
    return stops


MAX_CHOICES = 8  # n: the answers one request may ask for


def check_choices(value) -> int:
    """``n`` (how many answers one prompt gets) as an int in [1, MAX_CHOICES]; SamplingError otherwise."""
    if not _is_int(value) or not 1 <= value <= MAX_CHOICES:
        raise SamplingError(f"n must be an integer in [1, {MAX_CHOICES}], got {value!r}"[:300])
    return int(value)


def choice_seed(seed: int, index: int) -> int:
    """The seed of answer ``index`` of a request with ``n`` > 1 answers: seed + index, wrapped into the signed 64-bit
    range (answer 0 is the request's own seed; answer i of seed s draws what a lone request with seed s + i does)."""
    return (seed + index - SEED_RANGE[0]) % (1 << 64) + SEED_RANGE[0]


def check_settings(max_new_tokens, temperature, top_k, top_p, seed, stop) -> tuple[SamplingParams, int,
                                                                                    tuple[str, ...]]:
    """(SamplingParams, max_new_tokens, stop strings) after checking every value (SamplingError names a bad one)."""
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    return sampling, check_max_new_tokens(max_new_tokens), check_stops(stop)


# ---- thresholds without a sort -------------------------------------------------------------------------------

def _ordered(x: jax.Array) -> jax.Array:
    """float32 -> uint32 keys in the same order as the floats (for finite values and infinities)."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(0x80000000))


def _unordered(key: jax.Array) -> jax.Array:
    bits = jnp.where(key >> 31 == 1, key & jnp.uint32(0x7FFFFFFF), ~key)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _largest_where(pred, lo: jax.Array, hi: jax.Array) -> jax.Array:
    """The largest key k in [lo, hi] with ``pred(k)`` (pred is monotone: true up to some key; true at lo)."""

    def step(_, bounds):
        lo, hi = bounds
        gap = hi - lo
        mid = lo + gap // 2 + (gap & 1)  # upper middle, no overflow
        ok = pred(mid) & (lo < hi)
        return jnp.where(ok, mid, lo), jnp.where(ok | (lo >= hi), hi, mid - 1)

    return jax.lax.fori_loop(0, 32, step, (lo, hi))[0]


def _smallest_where(pred, lo: jax.Array, hi: jax.Array) -> jax.Array:
    """The smallest key k in [lo, hi] with ``pred(k)`` (pred is monotone: false up to some key; true at hi)."""

    def step(_, bounds):
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        ok = pred(mid)
        active = lo < hi
        return jnp.where(active & ~ok, mid + 1, lo), jnp.where(active & ok, mid, hi)

    return jax.lax.fori_loop(0, 32, step, (lo, hi))[0]


def kth_largest(logits_BV: jax.Array, k_B: jax.Array) -> jax.Array:
    """The k-th largest value of each row [batch, 1] (k in [1, vocab]), as the k-th entry of a descending sort."""
    lo = _ordered(jnp.min(logits_BV, axis=-1, keepdims=True))
    hi = _ordered(jnp.max(logits_BV, axis=-1, keepdims=True))

    k = k_B.astype(jnp.float32)  # counts in float32 are exact below 2**24 and reduce faster than integers

    def at_least_k(key):  # at least k values >= the candidate
        return jnp.sum(jnp.where(logits_BV >= _unordered(key), 1.0, 0.0), axis=-1, keepdims=True) >= k

    return _unordered(_largest_where(at_least_k, lo, hi))


def nucleus_threshold(logits_BV: jax.Array, top_p: jax.Array, floor_B: jax.Array,
                      floor_copies_B: jax.Array) -> jax.Array:
    """The smallest value T of each row [batch, 1] (>= floor) whose probability mass strictly above T is < top_p.

    It is the smallest value a descending sort keeps when it keeps the shortest prefix whose mass reaches top_p:
    the first of a run of equal values has the mass of everything larger before it. The probabilities are those
    of the sorted prefix a top-k filter leaves: every value above ``floor`` plus ``floor_copies`` copies of
    ``floor``; without top-k, floor is the row minimum and its copies are all of them.
    """
    top = jnp.max(logits_BV, axis=-1, keepdims=True)
    weights = jnp.exp(logits_BV - top)
    above_floor = jnp.sum(jnp.where(logits_BV > floor_B, weights, 0.0), axis=-1, keepdims=True)
    total = above_floor + floor_copies_B * jnp.exp(floor_B - top)

    def mass_above_below_p(key):
        mass = jnp.sum(jnp.where(logits_BV > _unordered(key), weights, 0.0), axis=-1, keepdims=True) / total
        return mass < top_p

    return _unordered(_smallest_where(mass_above_below_p, _ordered(floor_B), _ordered(top)))


def filter_logits(logits_BV: jax.Array, values: dict, mode: tuple[bool, bool, bool]) -> jax.Array:
    """Float32 logits [batch, vocab] divided by the temperature, with the tokens top-k / top-p drop set to -inf.

    Top-k keeps every token whose logit is >= the k-th largest (ties at the k-th value are kept). Top-p then
    keeps the shortest run of the (top-k) tokens, largest first, whose probability mass reaches top_p (the
    probabilities of the top-k entries), and with it every token equal to the last one kept."""
    _, use_top_k, use_top_p = mode
    logits = logits_BV / values["temperature"]
    vocab = logits.shape[-1]
    rows = logits.shape[0]
    if use_top_k:
        k = jnp.broadcast_to(jnp.clip(values["top_k"], 1, vocab), (rows, 1))
        floor = kth_largest(logits, k)  # what the k-th entry of a descending sort holds
        logits = jnp.where(logits < floor, -jnp.inf, logits)
        copies = k.astype(jnp.float32) - jnp.sum(jnp.where(logits > floor, 1.0, 0.0), axis=-1, keepdims=True)
    else:
        floor = jnp.min(logits, axis=-1, keepdims=True)
        copies = jnp.sum(jnp.where(logits == floor, 1.0, 0.0), axis=-1, keepdims=True)
    if use_top_p:
        threshold = nucleus_threshold(logits, values["top_p"], floor, copies)
        logits = jnp.where(logits < threshold, -jnp.inf, logits)
    return logits


def choose(logits_BV: jax.Array, key: jax.Array, values: dict, mode: tuple[bool, bool, bool]) -> jax.Array:
    """Token ids [batch] from float32 logits [batch, vocab]."""
    sample, _, _ = mode
    if not sample:
        return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, filter_logits(logits_BV, values, mode), axis=-1).astype(jnp.int32)


# ---- per-row settings (the serving engine: every slot its own request) ----------------------------------------

def row_settings(sampling: SamplingParams) -> dict:
    """One request's sampling settings as the per-row arrays' entries (``choose_rows``)."""
    return {"temperature": jnp.float32(sampling.temperature), "top_k": jnp.int32(sampling.top_k),
            "top_p": jnp.float32(sampling.top_p), "key": jax.random.key_data(sampling.key())}


def filtered_rows(logits_BV: jax.Array, settings: dict) -> jax.Array:
    """What each row of float32 logits [batch, vocab] is drawn from: divided by its temperature, with the tokens its
    top-k / top-p drop set to -inf (``filter_logits`` per row; ``settings`` as ``choose_rows`` takes them). The
    filters run only when some row uses them; a greedy row's values mean nothing."""
    temperature, top_k, top_p = settings["temperature"], settings["top_k"], settings["top_p"]
    sampled = temperature > 0
    logits = logits_BV / jnp.maximum(temperature, 1e-6)[:, None]
    vocab = logits.shape[-1]
    use_k = sampled & (top_k > 0)
    use_p = sampled & (top_p < 1.0)
    k = jnp.where(use_k, jnp.clip(top_k, 1, vocab), vocab)[:, None]

    def top_k_floor():
        return kth_largest(logits, k)

    floor = jax.lax.cond(jnp.any(use_k), top_k_floor, lambda: jnp.min(logits, axis=-1, keepdims=True))
    logits = jnp.where(use_k[:, None] & (logits < floor), -jnp.inf, logits)
    copies = jnp.where(use_k[:, None],
                       k.astype(jnp.float32) - jnp.sum(jnp.where(logits > floor, 1.0, 0.0), axis=-1,
                                                       keepdims=True),
                       jnp.sum(jnp.where(logits == floor, 1.0, 0.0), axis=-1, keepdims=True))

    def nucleus():
        threshold = nucleus_threshold(logits, top_p[:, None], floor, copies)
        return jnp.where(use_p[:, None] & (logits < threshold), -jnp.inf, logits)

    return jax.lax.cond(jnp.any(use_p), nucleus, lambda: logits)


def processed_rows(logits_BV: jax.Array, settings: dict) -> jax.Array:
    """The distribution each row's token is drawn from, as logits: ``filtered_rows`` for a sampled row, the logits
    as they are for a greedy one (greedy takes the largest; temperature and filters do not apply)."""
    sampled = settings["temperature"] > 0
    return jax.lax.cond(jnp.any(sampled),
                        lambda: jnp.where(sampled[:, None], filtered_rows(logits_BV, settings), logits_BV),
                        lambda: logits_BV)


def choose_rows(logits_BV: jax.Array, settings: dict, index_B: jax.Array) -> jax.Array:
    """Token ids [batch] from float32 logits [batch, vocab], each row with its own settings: ``settings`` holds
    [batch] arrays temperature (0: greedy), top_k (0: off), top_p (1: off) and key [batch, 2] (raw key data); the
    token is generated token number ``index_B`` of its request, drawn with the request's key folded with that index
    (as ``choose`` draws token i of a request alone). The filters run only when some row uses them."""
    greedy = jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
    sampled = settings["temperature"] > 0

    def draw():
        logits = filtered_rows(logits_BV, settings)
        keys = jax.vmap(lambda kd, i: jax.random.fold_in(jax.random.wrap_key_data(kd), i))(settings["key"], index_B)
        drawn = jax.vmap(lambda key, row: jax.random.categorical(key, row))(keys, logits).astype(jnp.int32)
        return jnp.where(sampled, drawn, greedy)

    return jax.lax.cond(jnp.any(sampled), draw, lambda: greedy)


def apply_bitmask(logits_RV: jax.Array, mask_RW: jax.Array) -> jax.Array:
    """``logits_RV`` with the tokens ``mask_RW`` (int32 [rows, words], app/grammar.py: bit v % 32 of word v // 32 set
    = token v allowed) does not allow at -inf; tokens past its 32 * words bits are not allowed, and its bits past the
    vocabulary are not read."""
    rows, vocab = logits_RV.shape
    words = mask_RW.shape[1]
    words_RW = jax.lax.bitcast_convert_type(mask_RW, jnp.uint32)
    bits = (words_RW[:, :, None] >> jnp.arange(32, dtype=jnp.uint32)) & 1  # [R, W, 32]
    allowed = bits.reshape(rows, words * 32)[:, :vocab] == 1
    if words * 32 < vocab:
        allowed = jnp.pad(allowed, ((0, 0), (0, vocab - words * 32)))
    return jnp.where(allowed, logits_RV, -jnp.inf)
