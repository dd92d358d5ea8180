"""The compiled decode step updates every layer's KV cache in place: no per-step copy of any cache buffer.

A copy of every cache buffer at every generated token costs time proportional to the cache length; it appears when
the compiler cannot order the cache write after the cache reads of the same step. Checked for a step over the first
slot only (a lone request decodes at batch 1 while the other slots stay put) on a long cache, and for a step over
every slot on a short one: each kind of step and each kind of cache read once (the full layers' pools of pages and
the sliding layers' rings).
"""

import pytest

from omnijax.app.scheduler import Scheduler
from omnijax.decoder.kv_cache import paged_entries


@pytest.mark.parametrize("rows, context", [(4, 256), (1, 1024)])
def test_decode_step_writes_the_cache_in_place(gemma3_pipeline, rows, context):
    """Short caches are read whole, long ones (over 512 slots) in blocks as far as they are held."""
    engine = gemma3_pipeline.engine
    slots = Scheduler(engine, gemma3_pipeline.processor, slots=4, context=context).slots
    slots.ensure_allocated()
    compiled = slots.lower_step(rows).compile()
    hlo = compiled.as_text()
    shapes = {f"[{','.join(map(str, a.shape))}]" for a in slots.cache["k"] + slots.cache["v"]}
    assert len({a.shape[-1] for a in slots.cache["k"]}) == 2  # full-length and sliding-window (ring) caches
    for shape in shapes:
        assert shape in hlo, f"the step does not touch the cache {shape}"
    copies = [line.strip()[:120] for line in hlo.splitlines()
              if " copy(" in line and any(shape in line for shape in shapes)]
    assert not copies, f"{len(copies)} cache copies per decode step, e.g. {copies[:2]}"
    if context > 512:  # nor of the rows a long cache is read from (page by page): the step's temporary memory
        # stays below one row's whole context of one paged layer
        paged = paged_entries(engine.cfg.decoder, slots.cache)
        assert 0 in paged  # the context's pool
        row_bytes = min(a[0].nbytes * slots.pages.tables[0].per_row for a, p in zip(slots.cache["k"], paged) if p == 0)
        temp = compiled.memory_analysis().temp_size_in_bytes
        assert temp < row_bytes, f"{temp} temporary bytes per decode step; one cache row is {row_bytes}"


def test_prompt_chunk_writes_the_cache_in_place(gemma3_pipeline):
    """The step with prompt chunks (the same forward: every slot's decode row and two chunks of 64 tokens) on a long
    cache read in blocks."""
    engine = gemma3_pipeline.engine
    slots = Scheduler(engine, gemma3_pipeline.processor, slots=4, context=1024).slots
    compiled = slots.lower_step(slots.decode_rows_with_chunks, (2, 64)).compile()
    hlo = compiled.as_text()
    shapes = {f"[{','.join(map(str, a.shape))}]" for a in slots.cache["k"] + slots.cache["v"]}
    copies = [line.strip()[:120] for line in hlo.splitlines()
              if " copy(" in line and any(shape in line for shape in shapes)]
    assert not copies, f"{len(copies)} cache copies per chunk, e.g. {copies[:2]}"
