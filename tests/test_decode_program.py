"""The compiled decode loop updates the KV cache in place: no per-step copy of any cache buffer.

A copy of every cache buffer at every generated token costs time proportional to the cache length; it appears when
the compiler cannot order the cache write after the cache reads of the same step.
"""

import re

import jax.numpy as jnp

from app.sampling import SamplingParams


def _computation(hlo: str, name: str) -> str:
    start = hlo.index(f"\n{name} ")
    return hlo[start:hlo.index("\n}\n", start)]


def test_decode_loop_writes_the_cache_in_place(gemma3_pipeline):
    engine = gemma3_pipeline.engine
    prompt = gemma3_pipeline.prepare([{"role": "user", "content": "Count to ten."}])
    batch, length, cache_len, max_new, logits, cache = engine.prefill([prompt], 8)
    sp = SamplingParams()
    compiled = engine._decode.lower(engine.params, cache, logits, jnp.asarray(batch.lengths),
                                    jnp.asarray(batch.rope_delta), jnp.int32(length), jnp.int32(max_new),
                                    __import__("jax").random.key(0), sp.values(), engine.eos_ids,
                                    mode=sp.mode(), steps_cap=cache_len - length).compile()
    hlo = compiled.as_text()
    bodies = re.findall(r"while\(.*?body=(%[\w.\-]+)", hlo)
    assert bodies, "no while loop in the decode program"
    dec = engine.cfg.decoder
    key_shape = f"[1,{dec.num_kv_heads},{dec.head_dim},{cache_len}]"
    value_shape = f"[1,{dec.num_kv_heads},{cache_len},{dec.head_dim}]"
    body = "\n".join(_computation(hlo, name) for name in bodies)
    assert key_shape in body and value_shape in body, "the loop body does not touch the cache"
    copies = [line.strip()[:120] for line in body.splitlines()
              if " copy(" in line and (key_shape in line or value_shape in line)]
    assert not copies, f"{len(copies)} cache copies per decode step, e.g. {copies[:2]}"
