"""The compiled decode step updates every layer's KV cache in place: no per-step copy of any cache buffer.

A copy of every cache buffer at every generated token costs time proportional to the cache length; it appears when
the compiler cannot order the cache write after the cache reads of the same step. Checked for a step over the first
slot only (a lone request decodes at batch 1 while the other slots stay put) on a long cache, and for a step over
every slot on a short one: each kind of step and each kind of cache read once.
"""

import pytest

from omnijax.app.scheduler import Scheduler
from omnijax.common.matmul_policy import products_setting


@pytest.mark.parametrize("rows, context", [(4, 256), (1, 1024)])
def test_decode_step_writes_the_cache_in_place(gemma3_pipeline, rows, context):
    """Short caches are read whole, long ones (over 512 slots) in blocks as far as they are held."""
    engine = gemma3_pipeline.engine
    slots = Scheduler(engine, gemma3_pipeline.processor, slots=4, context=context).slots
    slots.ensure_allocated()
    compiled = slots._decode.lower(engine.params, slots.cache, slots.state, engine.eos_ids, rows=rows,
                                   products=products_setting()).compile()
    hlo = compiled.as_text()
    shapes = {f"[{','.join(map(str, a.shape))}]" for a in slots.cache["k"] + slots.cache["v"]}
    assert len({a.shape[-1] for a in slots.cache["k"]}) == 2  # full-length and sliding-window (ring) caches
    for shape in shapes:
        assert shape in hlo, f"the step does not touch the cache {shape}"
    copies = [line.strip()[:120] for line in hlo.splitlines()
              if " copy(" in line and any(shape in line for shape in shapes)]
    assert not copies, f"{len(copies)} cache copies per decode step, e.g. {copies[:2]}"


def test_prompt_chunk_writes_the_cache_in_place(gemma3_pipeline):
    """The chunk program (the same forward, one row of many tokens) on a long cache read in blocks."""
    import numpy as np

    engine = gemma3_pipeline.engine
    slots = Scheduler(engine, gemma3_pipeline.processor, slots=4, context=1024).slots
    slots.ensure_allocated()
    cfg, chunk = engine.cfg, 64
    media = slots._media_inputs(None, chunk, chunk)
    compiled = slots._extend.lower(engine.params, slots.cache, np.full((1, chunk), cfg.pad_id, np.int32),
                                   np.int32(chunk), np.int32(0), np.int32(2),
                                   np.zeros((cfg.decoder.rope_axes, 1, chunk), np.float32), np.zeros((1, chunk), bool),
                                   *media, products=products_setting()).compile()
    hlo = compiled.as_text()
    shapes = {f"[{','.join(map(str, a.shape))}]" for a in slots.cache["k"] + slots.cache["v"]}
    copies = [line.strip()[:120] for line in hlo.splitlines()
              if " copy(" in line and any(shape in line for shape in shapes)]
    assert not copies, f"{len(copies)} cache copies per chunk, e.g. {copies[:2]}"
