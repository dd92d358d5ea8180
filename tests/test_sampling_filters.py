"""Top-k / top-p without a sort keep exactly the tokens the full-sort filters kept; bad settings fail fast."""

from __future__ import annotations

import math
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from omnijax.app.sampling import (SamplingParams, check_max_new_tokens, check_stops, choose, filter_logits,
                          kth_largest)
from omnijax.common.errors import OmnijaxError, SamplingError


def sorted_filter(logits_BV, values, mode):
    """The filters as they were written with a full descending sort of the vocabulary (the reference)."""
    _, use_top_k, use_top_p = mode
    logits = logits_BV / values["temperature"]
    sorted_desc = -jnp.sort(-logits, axis=-1)
    if use_top_k:
        k = jnp.clip(values["top_k"], 1, logits.shape[-1])
        kth = jnp.take_along_axis(sorted_desc, jnp.full((logits.shape[0], 1), k - 1), axis=-1)
        logits = jnp.where(logits < kth, -jnp.inf, logits)
        sorted_desc = jnp.where(jnp.arange(logits.shape[-1])[None] < k, sorted_desc, -jnp.inf)
    if use_top_p:
        probs = jax.nn.softmax(sorted_desc, axis=-1)
        cum = jnp.cumsum(probs, axis=-1)
        keep = (cum - probs) < values["top_p"]
        threshold = jnp.min(jnp.where(keep, sorted_desc, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < threshold, -jnp.inf, logits)
    return logits


def random_logits(rng, rows, vocab, kind):
    if kind == "normal":
        return rng.normal(0, 3, (rows, vocab)).astype(np.float32)
    if kind == "ties":  # few distinct values: long runs of equal logits at every threshold
        return rng.integers(-4, 5, (rows, vocab)).astype(np.float32) * 0.75
    if kind == "peaked":  # one or two dominant tokens, a long flat tail
        x = rng.normal(0, 0.1, (rows, vocab)).astype(np.float32)
        x[:, rng.integers(0, vocab, 2)] += 9.0
        return x
    # negative and positive values, exact zeros and repeated extremes
    x = rng.normal(0, 5, (rows, vocab)).astype(np.float32)
    x[:, :7] = 0.0
    x[:, 7:11] = x.max()
    x[:, 11:15] = x.min()
    return x


CASES = [(kind, temperature, top_k, top_p)
         for kind in ("normal", "ties", "peaked", "edges")
         for temperature, top_k, top_p in ((1.0, 1, 1.0), (0.7, 5, 1.0), (1.3, 40, 1.0), (1.0, 0, 0.5),
                                          (1.0, 0, 0.9), (2.0, 0, 0.999), (1.0, 17, 0.8), (0.5, 3, 0.3),
                                          (1.0, 200, 0.95), (1.0, 10_000, 0.6), (1.0, 2**31 - 1, 0.7))]


@pytest.mark.parametrize("kind,temperature,top_k,top_p", CASES)
def test_filters_keep_the_same_tokens_as_a_full_sort(kind, temperature, top_k, top_p):
    rng = np.random.default_rng(zlib.crc32(repr((kind, temperature, top_k, top_p)).encode()))
    logits = jnp.asarray(random_logits(rng, 3, 300, kind))
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    new = np.asarray(jax.jit(filter_logits, static_argnums=2)(logits, params.values(), params.mode()))
    old = np.asarray(jax.jit(sorted_filter, static_argnums=2)(logits, params.values(), params.mode()))
    np.testing.assert_array_equal(np.isfinite(new), np.isfinite(old))
    np.testing.assert_array_equal(new, old)
    for seed in range(3):  # the same draw: the categorical sample sees identical logits
        key = jax.random.key(seed)
        assert jax.random.categorical(key, new).tolist() == jax.random.categorical(key, old).tolist()


def test_kth_largest_is_the_kth_entry_of_a_descending_sort():
    rng = np.random.default_rng(0)
    x = jnp.asarray(random_logits(rng, 4, 257, "ties"))
    want = -np.sort(-np.asarray(x), axis=-1)
    kth = jax.jit(kth_largest)
    for k in (1, 2, 30, 256, 257):
        got = kth(x, jnp.full((4, 1), k, jnp.int32))
        np.testing.assert_array_equal(np.asarray(got)[:, 0], want[:, k - 1])


def test_no_sort_in_the_compiled_sampler():
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.9)
    hlo = jax.jit(choose, static_argnums=3).lower(jnp.zeros((2, 4096)), jax.random.key(0), params.values(),
                                                   params.mode()).as_text()
    assert "sort" not in hlo.lower()


@pytest.mark.parametrize("kwargs", [dict(temperature=-1), dict(temperature=float("nan")),
                                    dict(temperature=float("inf")), dict(temperature="1"), dict(top_k=-2),
                                    dict(top_k=2**31), dict(top_k=1.5), dict(top_k=True), dict(top_p=0.0),
                                    dict(top_p=1.5), dict(top_p=float("nan")), dict(seed=2**63),
                                    dict(seed=-(2**63) - 1), dict(seed=1.0), dict(temperature=10**400),
                                    dict(top_p=-(10**400))])
def test_bad_sampling_settings_raise_a_sampling_error(kwargs):
    with pytest.raises(SamplingError) as info:
        SamplingParams(**kwargs)
    assert isinstance(info.value, OmnijaxError) and isinstance(info.value, ValueError)
    name = next(iter(kwargs))
    assert name in str(info.value)


def test_max_new_tokens_and_stop_checks():
    assert check_max_new_tokens(5) == 5 and check_max_new_tokens(np.int64(3)) == 3
    for bad in (0, -1, 2.0, 2.5, "4", None, True, 2**40):
        with pytest.raises(SamplingError, match="max_new_tokens"):
            check_max_new_tokens(bad)
    assert check_stops(None) == () and check_stops("x") == ("x",) and check_stops(["a", "", "b"]) == ("a", "b")
    for bad in (5, [1], ["a", None], ["x"] * 33, ["y" * 257]):
        with pytest.raises(SamplingError, match="stop"):
            check_stops(bad)


def test_settings_are_checked_before_any_work(gemma3_pipeline, monkeypatch):
    def no_work(*args, **kwargs):
        raise AssertionError("the prompt was prepared before the settings were checked")

    monkeypatch.setattr(gemma3_pipeline, "prepare", no_work)
    messages = [{"role": "user", "content": "Hi"}]
    for kwargs in (dict(temperature=math.nan), dict(top_p=2.0), dict(top_k=-1), dict(seed=2**64),
                   dict(max_new_tokens=1.5), dict(max_new_tokens=0), dict(stop=[3])):
        with pytest.raises(SamplingError):
            gemma3_pipeline.generate(messages, **kwargs)
        with pytest.raises(SamplingError):
            next(gemma3_pipeline.stream(messages, **kwargs))


def test_every_bit_of_the_seed_counts():
    import jax

    from omnijax.app.sampling import SamplingParams

    keys = [jax.random.key_data(SamplingParams(seed=s).key()).tolist() for s in (0, 1 << 32, -1, (1 << 32) - 1)]
    assert len({tuple(k) for k in keys}) == 4
    assert jax.random.key_data(SamplingParams(seed=7).key()).tolist() == jax.random.key_data(jax.random.key(7)).tolist()
