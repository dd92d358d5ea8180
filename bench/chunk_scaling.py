"""Figures of the decoder core's shape budgets, measured on a loaded omnijax pipeline:

- the serving engine's step with a prompt chunk (the program every prompt, prompt-logits and scoring request runs, a
  chunk at a time): its compile time into a cache of a short and a long context (it reads the cache in blocks, so
  the program should not grow with the context), and its temporary memory for chunks of 64 to 512 tokens (XLA's
  memory analysis);
- the KV cache a 32k-token context budget allocates, against the minimum (full layers x full length + local
  layers x window): ring caches for sliding / chunked layers, none for layers that share keys/values.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from omnijax.app.slots import Slots
from omnijax.decoder.kv_cache import init_cache


def chunk_compile(engine, chunk: int, context: int) -> dict:
    """Seconds to lower and compile the chunk program for a ``chunk``-token text chunk into one slot of a
    ``context``-token cache (a fresh compile, the persistent cache off), and its temporary bytes."""
    slots = Slots(engine, slots=1, context=context)
    enabled = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        start = time.perf_counter()
        compiled = slots.lower_step(slots.decode_rows_with_chunks, (1, chunk)).compile()
        seconds = time.perf_counter() - start
    finally:
        jax.config.update("jax_enable_compilation_cache", enabled)
    memory = compiled.memory_analysis()
    return {"chunk": chunk, "context": slots.context, "compile_s": seconds,
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


def scaling_figures(pipe, *, chunk: int = 512, short: int = 1024, long: int = 8192,
                    chunk_lengths=(64, 128, 256, 512)) -> dict:
    """Compile time of the ``chunk``-token chunk program into a ``short`` and a ``long`` context, its temporary
    memory at ``chunk_lengths`` (``long`` context), and the KV cache of a 32k budget (the smoke run passes smaller
    sizes; the keys stay the same)."""
    engine = pipe.engine
    first, second = chunk_compile(engine, chunk, short), chunk_compile(engine, chunk, long)
    memory = [chunk_compile(engine, n, long) for n in chunk_lengths]
    growth = [b["temp_bytes"] / a["temp_bytes"] for a, b in zip(memory, memory[1:]) if a["temp_bytes"]]
    return {"compile_short_context": first, "compile_long_context": second,
            "compile_ratio": second["compile_s"] / first["compile_s"], "chunk_temp_memory": memory,
            "temp_growth_per_doubling": growth, "kv_cache_32k": kv_cache_figures(pipe.config.decoder, 32768)}
