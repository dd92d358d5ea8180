"""Figures of the decoder core's shape budgets, measured on a loaded omnijax pipeline:

- prefill compile time for prompts of 500 and 4,000 tokens (a fresh compile each, the persistent cache off), and
  the prefill program's temporary memory for prompts of 512 to 4,096 tokens (XLA's memory analysis: it should grow
  at most linearly with the prompt);
- the KV cache a 32k-token context budget allocates, against the minimum (full layers x full length + local
  layers x window): ring caches for sliding / chunked layers, none for layers that share keys/values.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from omnijax.decoder.kv_cache import init_cache


def _prefill_args(engine, length: int):
    """Abstract-free concrete inputs for one text prompt of ``length`` tokens (bucketed as the engine would)."""
    from omnijax.preprocess.processor import PreparedPrompt
    from omnijax.app.generation import make_batch

    tokens = np.full(length, 1, np.int32)
    prompt = PreparedPrompt(tokens, {}, np.zeros(length, bool))
    bucket, cache_len = engine.plan([prompt], 1)
    batch = make_batch([prompt], bucket, engine.cfg.pad_id, engine.cfg.decoder.rope_axes)
    rope_pos = jnp.asarray(batch.rope_pos)
    return (engine.params, jnp.asarray(batch.tokens), jnp.asarray(batch.lengths), jnp.asarray(batch.bidirectional),
            rope_pos, engine._rope(engine.params, rope_pos), {}), cache_len


def prefill_compile(engine, length: int) -> dict:
    """Seconds to lower and compile the prefill program for a ``length``-token prompt, and its temporary bytes."""
    args, cache_len = _prefill_args(engine, length)
    enabled = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        start = time.perf_counter()
        compiled = engine._prefill.lower(*args, cache_len=cache_len).compile()
        seconds = time.perf_counter() - start
    finally:
        jax.config.update("jax_enable_compilation_cache", enabled)
    memory = compiled.memory_analysis()
    return {"tokens": length, "bucket": int(args[1].shape[1]), "compile_s": seconds,
            "temp_bytes": int(getattr(memory, "temp_size_in_bytes", 0))}


def kv_cache_figures(spec, context: int, itemsize: int = 4) -> dict:
    """Bytes the cache of a ``context``-token budget allocates (batch 1) against the minimum."""
    shapes = jax.eval_shape(lambda: init_cache(spec, 1, context, jnp.float32))
    allocated = sum(int(np.prod(x.shape)) * itemsize for x in jax.tree.leaves(shapes) if x.ndim == 4)
    minimum = 0
    for layer in spec.layers:
        att = layer.attention
        if att.kv_source is not None:
            continue
        slots = min(att.mask.size, context) if att.mask.local else context
        minimum += 2 * att.num_kv_heads * att.head_dim * slots * itemsize
    return {"context": context, "allocated_bytes": allocated, "minimum_bytes": minimum,
            "ratio": allocated / minimum,
            "full_length_cache_bytes": sum(2 * l.attention.num_kv_heads * l.attention.head_dim * context * itemsize
                                           for l in spec.layers)}


def scaling_figures(pipe, *, short: int = 500, long: int = 4000, memory_lengths=(512, 1024, 2048, 4096)) -> dict:
    """Compile time of a ``short`` and a ``long`` prompt, temporary memory at ``memory_lengths``, and the KV cache
    of a 32k budget (the smoke run passes smaller lengths; the keys stay the same)."""
    engine = pipe.engine
    first, second = prefill_compile(engine, short), prefill_compile(engine, long)
    memory = [prefill_compile(engine, n) for n in memory_lengths]
    growth = [b["temp_bytes"] / a["temp_bytes"] for a, b in zip(memory, memory[1:]) if a["temp_bytes"]]
    return {"compile_500": first, "compile_4000": second, "compile_ratio": second["compile_s"] / first["compile_s"],
            "prefill_temp_memory": memory, "temp_growth_per_doubling": growth,
            "kv_cache_32k": kv_cache_figures(pipe.config.decoder, 32768)}
