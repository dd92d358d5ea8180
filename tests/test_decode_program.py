"""The compiled decode loop updates every layer's KV cache in place: no per-step copy of any cache buffer.

A copy of every cache buffer at every generated token costs time proportional to the cache length; it appears when
the compiler cannot order the cache write after the cache reads of the same step.
"""

import re

import jax
import jax.numpy as jnp

from omnijax.app.sampling import SamplingParams


def _computation(hlo: str, name: str) -> str:
    start = hlo.index(f"\n{name} ")
    return hlo[start:hlo.index("\n}\n", start)]


def test_decode_loop_writes_the_cache_in_place(gemma3_pipeline):
    engine = gemma3_pipeline.engine
    prompt = gemma3_pipeline.prepare([{"role": "user", "content": "Count to ten."}])
    pre = engine.prefill([prompt], 8)
    sp = SamplingParams()
    compiled = engine._decode.lower(engine.params, pre.cache, pre.logits, jnp.asarray(pre.batch.rope_delta),
                                    jnp.int32(8), jax.random.key(0), sp.values(), engine.eos_ids,
                                    mode=sp.mode(), cache_len=pre.cache_len).compile()
    hlo = compiled.as_text()
    bodies = re.findall(r"while\(.*?body=(%[\w.\-]+)", hlo)
    assert bodies, "no while loop in the decode program"
    body = "\n".join(_computation(hlo, name) for name in bodies)
    shapes = {f"[{','.join(map(str, a.shape))}]" for a in pre.cache["k"] + pre.cache["v"]}
    assert len({a.shape[-1] for a in pre.cache["k"]}) == 2  # full-length and sliding-window (ring) caches
    for shape in shapes:
        assert shape in body, f"the loop body does not touch the cache {shape}"
    copies = [line.strip()[:120] for line in body.splitlines()
              if " copy(" in line and any(shape in line for shape in shapes)]
    assert not copies, f"{len(copies)} cache copies per decode step, e.g. {copies[:2]}"
