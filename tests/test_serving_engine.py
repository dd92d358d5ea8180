"""The serving engine (app/scheduler.py, app/slots.py) on the tiny Gemma 3 checkpoint: requests joining and leaving
between steps give the tokens they give alone, with their own sampling settings; chunked prefill; cancellation
frees a slot; the prefix and media caches; no recompiles; several threads; several devices.

Every "alone" answer is the same request run when nothing else is inside the engine; the pipeline's own answers
(``gemma3_pipeline``, prompts in one chunk) are checked too, and they equal transformers' in test_gemma3_parity.
"""

from __future__ import annotations

import pathlib
import threading
import time

import jax
import numpy as np
import pytest

from omnijax.app.chunks import media_runs, plan_chunks, prefix_points
from omnijax.app.media_cache import content_hash
from omnijax.app.prefix_cache import key_ids
from omnijax.app.requests import Request
from omnijax.app.sampling import SamplingParams
from omnijax.app.scheduler import ClosedError, QueueFullError, Scheduler
from omnijax.common.lru import BytesLRU
from test_gemma3_parity import LONG_TEXT, conversation, image
from fixtures.four_devices import run_on_four_devices

ROOT = pathlib.Path(__file__).resolve().parents[1]
WAIT_S = 600  # a bound on waiting for one request, far above its real time: a hang fails instead of blocking CI

PROMPTS = [
    conversation("Write a short poem about the sea."),
    conversation(image(1), "Describe this image."),
    conversation("Hi!"),
    # longer than the sliding window (16) and than a chunk (32), an image block inside: chunks must not split it
    conversation(LONG_TEXT, image(4), "and what follows " + LONG_TEXT, system="Be brief."),
    conversation("Compare", image(2), "with", image(3, (20, 70)), "please."),
    conversation("Tell me about winds and tides, at length, in several sentences."),
]
MAX_NEW = [12, 9, 20, 7, 16, 5]


def request(pipe, messages, max_new=8, **sampling) -> Request:
    return Request(pipe.prepare(messages), max_new, SamplingParams(**sampling), ignore_eos=True)


@pytest.fixture(scope="module")
def sched(gemma3_pipeline):
    """4 slots, 32-token chunks, no caches: the engine under test (the pipeline's own runs prompts in one chunk)."""
    s = Scheduler(gemma3_pipeline.engine, gemma3_pipeline.processor, slots=4, context=512, max_batched_tokens=32,
                  prefix_cache_mb=0, media_cache_mb=0)
    yield s
    s.close()


@pytest.fixture(scope="module")
def alone(gemma3_pipeline, sched):
    """Each prompt's greedy tokens, run alone on ``sched``."""
    return [sched.submit(request(gemma3_pipeline, p, n)).result(WAIT_S).token_ids for p, n in zip(PROMPTS, MAX_NEW)]


@pytest.mark.slow
def test_requests_together_give_their_tokens_alone(gemma3_pipeline, sched, alone):
    """Six requests on four slots, each with its own length: requests join as others leave, and every answer is
    the one it gives alone and the pipeline's (one chunk per prompt)."""
    handles = [sched.submit(request(gemma3_pipeline, p, n)) for p, n in zip(PROMPTS, MAX_NEW)]
    together = [h.result(WAIT_S).token_ids for h in handles]
    assert [len(t) for t in together] == MAX_NEW
    assert together == alone
    pipeline = gemma3_pipeline.generate_prepared([gemma3_pipeline.prepare(p) for p in PROMPTS], max_new_tokens=20,
                                                 ignore_eos=True)
    assert [r.token_ids[:n] for r, n in zip(pipeline, MAX_NEW)] == alone


def test_each_request_samples_with_its_own_settings(gemma3_pipeline, sched, alone):
    """Greedy and sampled requests (temperature, top-k, top-p, seed) decode in one step; each gives what it gives
    alone, a sampled request depends on its seed only."""
    settings = [dict(), dict(temperature=0.9, top_k=5, seed=3), dict(temperature=1.2, top_p=0.8, seed=4),
                dict(temperature=0.7, top_k=7, top_p=0.9, seed=-5)]
    prompts = PROMPTS[:4]
    solo = [sched.submit(request(gemma3_pipeline, p, 10, **s)).result(WAIT_S).token_ids
            for p, s in zip(prompts, settings)]
    handles = [sched.submit(request(gemma3_pipeline, p, 10, **s)) for p, s in zip(prompts, settings)]
    assert [h.result(WAIT_S).token_ids for h in handles] == solo
    assert solo[0] == alone[0][:10]
    other_seed = sched.submit(request(gemma3_pipeline, prompts[1], 10, temperature=0.9, top_k=5, seed=30))
    assert other_seed.result(WAIT_S).token_ids != solo[1]


def test_chunked_prefill_keeps_media_blocks_whole_and_cuts_at_prefix_points():
    bidir = np.zeros(100, bool)
    bidir[30:46] = True  # a 16-token image block
    bidir[60:90] = True  # a 30-token one, longer than a chunk of 20
    assert media_runs(bidir) == [(30, 46), (60, 90)]
    chunks = plan_chunks(0, 100, bidir, 20)
    assert chunks == [(0, 20), (20, 30), (30, 50), (50, 60), (60, 90), (90, 100)]
    assert plan_chunks(46, 100, bidir, 64) == [(46, 100)]
    assert plan_chunks(40, 100, bidir, 30) == [(40, 60), (60, 90), (90, 100)]
    assert plan_chunks(5, 5, bidir, 8) == []
    assert plan_chunks(0, 100, bidir, 64, cuts=(50, 90)) == [(0, 50), (50, 90), (90, 100)]
    assert prefix_points(0, 100, bidir, 64) == (90,)  # after the last block; 64 falls inside a block
    assert prefix_points(0, 100, bidir, 48) == (90, 96) and prefix_points(95, 100, bidir, 48) == (96,)


def test_a_chunk_group_takes_the_smallest_row_count_that_holds_its_chunks():
    """1, 2 or 4 rows by default (at most one past the slots); with fewer counts (tests/fixtures/step_shapes.py) a
    step compiles fewer programs and pads more, or the scheduler plans fewer chunks a step."""
    from types import SimpleNamespace

    from omnijax.app.slots import Slots, chunk_row_counts

    assert [chunk_row_counts(n) for n in (1, 2, 3, 8)] == [(1,), (1, 2), (1, 2, 4), (1, 2, 4)]
    rows = lambda counts, n: Slots.chunk_rows(SimpleNamespace(chunk_counts=counts), n)  # noqa: E731
    assert [rows((1, 2, 4), n) for n in (1, 2, 3, 4, 6)] == [1, 2, 4, 4, 4]
    assert [rows((1,), n) for n in (1, 3)] == [1, 1] and rows((1, 4), 2) == 4


def test_a_chunk_step_decodes_the_first_eight_slots_until_a_later_one_is_taken():
    """Beside prompt chunks the decode group is the first 8 slots, or every slot once a later one is taken: two
    programs per chunk shape at most, and a few requests do not pay for every slot's row."""
    from types import SimpleNamespace

    from omnijax.app.slots import Slots

    tiers = lambda most: Slots.chunk_tiers.fget(SimpleNamespace(decode_rows_with_chunks=most))  # noqa: E731
    assert tiers(32) == (8, 32) and tiers(4) == (4,) and tiers(8) == (8,) and tiers(0) == ()
    beside = lambda highest: Slots.rows_beside_chunks(SimpleNamespace(chunk_tiers=(8, 32)), highest)  # noqa: E731
    assert [beside(h) for h in (0, 7, 8, 31)] == [8, 8, 32, 32]


def test_requests_wait_for_kv_pages_and_give_their_tokens_alone(gemma3_pipeline, alone):
    """A KV budget of four pages (decoder/kv_cache.py: one context of 512 tokens) for four slots: requests of two
    pages each run two at a time while the others wait for pages, none holds a page another holds, and every answer
    begins with the one it gives alone."""
    from omnijax.app.kv_pages import pages_for

    engine, processor = gemma3_pipeline.engine, gemma3_pipeline.processor
    page_bytes = Scheduler(engine, processor, slots=4, context=512).slots.page_bytes()
    assert len(page_bytes) == 1  # the sliding window is not whole pages: the context's pool only
    s = Scheduler(engine, processor, slots=4, context=512, max_batched_tokens=32, prefix_cache_mb=0,
                  media_cache_mb=0, kv_cache_mb=4.5 * page_bytes[0] / 2**20, threaded=False)
    pages = s.slots.pages.tables[0]
    assert pages.pages == 4
    picked = [0, 1, 2, 5]
    requests = [request(gemma3_pipeline, PROMPTS[i], 140) for i in picked]
    assert all(pages_for(len(r.prompt.token_ids) + r.max_new_tokens) == 2 for r in requests)
    handles = [s.submit(r) for r in requests]
    running = []
    while not all(h.done for h in handles):
        s.step()
        running.append(s.running)
        held = pages.table[pages.table != pages.pages]
        assert len(held) == len(set(held.tolist())) == 2 * s.running  # two pages each, none shared
    assert max(running) == 2 and running.count(2) > 1
    assert [h.result(0).token_ids[:MAX_NEW[i]] for h, i in zip(handles, picked)] == [alone[i] for i in picked]
    assert pages.free == 4
    s.close()


def test_cancel_frees_the_slot_at_the_next_step(gemma3_pipeline, sched):
    """Four long requests fill the slots and a fifth waits; cancelling one lets the fifth run to its end while the
    other three are still far from theirs."""
    long = [sched.submit(request(gemma3_pipeline, PROMPTS[i % 3], 200)) for i in range(4)]
    short = sched.submit(request(gemma3_pipeline, PROMPTS[2], 4))
    next(long[0].events(timeout=WAIT_S))  # the first long request is decoding
    long[0].cancel()
    assert short.result(WAIT_S).finish_reason == "length"
    assert long[0].result(WAIT_S).finish_reason == "cancelled"
    assert not any(h.done for h in long[1:])  # still generating: the short one took the freed slot
    for h in long[1:]:
        h.cancel()
    assert [h.result(WAIT_S).finish_reason for h in long[1:]] == ["cancelled"] * 3
    assert sched.running == 0


def test_stop_strings_and_stream_pieces(gemma3_pipeline, sched, alone):
    """A stop string ends a request early (its slot freed for the next); streamed pieces join to the answer."""
    full = gemma3_pipeline.processor.decode(alone[2])
    stop = full[len(full) // 2:len(full) // 2 + 3]
    assert stop
    handle = sched.submit(Request(gemma3_pipeline.prepare(PROMPTS[2]), 20, stop=(stop,)))
    pieces = "".join(e.text for e in handle.events(timeout=WAIT_S))
    result = handle.result(WAIT_S)
    assert result.finish_reason == "stop" and stop not in result.text and pieces == result.text
    assert full.startswith(result.text)


@pytest.mark.slow
def test_prefix_and_media_caches(gemma3_pipeline):
    """A prompt starting like an earlier one reuses its keys / values and gives the same tokens; the same image is
    encoded once; a different image behind the same text reuses only the text before it."""
    pipe = gemma3_pipeline
    cached = Scheduler(pipe.engine, pipe.processor, slots=2, context=512, max_batched_tokens=32)
    plain = Scheduler(pipe.engine, pipe.processor, slots=2, context=512, max_batched_tokens=32, prefix_cache_mb=0,
                      media_cache_mb=0)
    try:
        head = [LONG_TEXT, image(7), "What is in this picture?"]
        first = conversation(*head)
        follow = first + [{"role": "assistant", "content": "A picture."},
                          {"role": "user", "content": [{"type": "text", "text": "And the colours?"}]}]
        other = conversation(LONG_TEXT, image(8), "What is in this picture?")  # the same token ids as ``first``
        again = conversation(LONG_TEXT, image(7), "Which shapes do you see?")
        runs = {}
        for name, messages in (("first", first), ("follow", follow), ("repeat", first), ("other", other),
                               ("again", again)):
            runs[name] = (cached.submit(request(pipe, messages, 6)).result(WAIT_S),
                          plain.submit(request(pipe, messages, 6)).result(WAIT_S))
        for name, (hit, miss) in runs.items():
            assert hit.token_ids == miss.token_ids, name
            assert miss.cached_tokens == 0
        n_first = runs["first"][0].prompt_tokens
        assert runs["first"][0].cached_tokens == 0
        assert runs["follow"][0].cached_tokens >= n_first  # the whole first turn (and its answer)
        assert runs["repeat"][0].cached_tokens == n_first  # the whole prompt, its logits too
        ids = pipe.prepare(other).token_ids
        np.testing.assert_array_equal(ids, pipe.prepare(first).token_ids)
        image_at = np.nonzero(ids == pipe.config.media_token_id("image"))[0]
        assert runs["other"][0].cached_tokens <= image_at[0]  # nothing past the first token of another image
        assert runs["again"][0].cached_tokens > image_at[-1]  # the same picture asked another question
        assert cached.media.store.hits >= 3 and cached.media.store.misses == 2  # two images, each encoded once
        assert cached.prefix.hits == 3
    finally:
        cached.close()
        plain.close()


def test_caches_are_bounded():
    lru = BytesLRU(100)
    assert lru.put("a", 1, 60) and lru.put("b", 2, 30)
    assert lru.get("a") == 1  # a is now the most recent: c evicts b
    assert lru.put("c", 3, 40) and "b" not in lru and lru.bytes == 100 and lru.evictions == 1
    assert not lru.put("huge", 4, 101) and "huge" not in lru
    assert (lru.hits, lru.misses) == (1, 0)


def test_key_ids_tell_media_apart():
    ids = np.array([5, 7, 99, 99, 99, 8, 99, 99])
    a, b = content_hash(np.zeros((2, 3))), content_hash(np.ones((2, 3)))
    assert a != b and content_hash({"x": np.zeros((2, 3))}) != content_hash({"x": np.zeros((3, 2))})
    one = key_ids(ids, {99: [(a, 3), (b, 2)]})
    two = key_ids(ids, {99: [(a, 3), (a, 2)]})
    assert list(one[:2]) == [5, 7] and one[5] == 8 and (one[[2, 3, 4, 6, 7]] < 0).all()
    assert len(set(one[[2, 3, 4, 6, 7]].tolist())) == 5
    assert list(one[:6]) == list(two[:6]) and list(one[6:]) != list(two[6:])
    with pytest.raises(ValueError):
        key_ids(ids, {99: [(a, 2)]})


def test_requests_coming_and_going_compile_nothing_new(gemma3_pipeline, sched, alone):
    """Once the engine has run each step shape (``warm_up``: every decode row count and chunk group; how many
    prompts share a step depends on when they arrive), new prompt lengths, media, slots and settings compile
    nothing."""
    while not sched.idle:  # the requests before have finished; their last step read back
        time.sleep(0.01)
    sched.warm_up()
    before = sched.compilations()
    prompts = [conversation("Name three colours of the rainbow."), conversation(image(9), "What is this?"),
               conversation("Why is the sky blue? Tell me briefly please.")]
    handles = [sched.submit(request(gemma3_pipeline, p, 6, temperature=0.5 * i, seed=i)) for i, p in
               enumerate(prompts)]
    assert all(len(h.result(WAIT_S).token_ids) == 6 for h in handles)
    assert sched.compilations() == before


def test_queue_full_is_refused(gemma3_pipeline):
    """Past ``max_queue`` requests waiting with no free slot, submit refuses at once; the ones queued still run.
    Requests that arrive while a slot is free are not counted against the queue (the next step takes them)."""
    s = Scheduler(gemma3_pipeline.engine, gemma3_pipeline.processor, slots=1, context=512, max_queue=2,
                  threaded=False)
    handles = [s.submit(request(gemma3_pipeline, PROMPTS[2], 2)) for _ in range(3)]  # one for the free slot
    with pytest.raises(QueueFullError, match="queue is full"):
        s.submit(request(gemma3_pipeline, PROMPTS[2], 2))
    s.step()  # the first takes the slot: two wait, the queue is still full
    with pytest.raises(QueueFullError, match="queue is full"):
        s.submit(request(gemma3_pipeline, PROMPTS[2], 2))
    s.run(handles)
    assert [len(h.result().token_ids) for h in handles] == [2, 2, 2]


def test_a_closed_engine_ends_what_it_held_and_refuses_more(gemma3_pipeline):
    """close() ends the requests inside (cancelled; none left waiting for ever); a request after it is refused at
    once with ClosedError, never queued to an engine that no longer runs."""
    s = Scheduler(gemma3_pipeline.engine, gemma3_pipeline.processor, slots=1, context=512, max_queue=4)
    held = [s.submit(request(gemma3_pipeline, PROMPTS[2], 200)) for _ in range(3)]  # one decodes, two wait
    next(held[0].events())  # the engine runs
    s.close()
    results = [h.result(WAIT_S) for h in held]
    assert all(r.finish_reason == "cancelled" for r in results), [r.finish_reason for r in results]
    assert len(results[0].token_ids) < 200
    with pytest.raises(ClosedError, match="closed"):
        s.submit(request(gemma3_pipeline, PROMPTS[2], 2))


def test_a_failing_listener_ends_its_own_request_only(gemma3_pipeline, sched, alone):
    """A stream consumer whose callback raises (a closed event loop, a bug) cancels its request; the others in
    the engine run to their end with the tokens they get alone."""
    def broken():
        raise RuntimeError("the consumer is gone")

    failing = sched.submit(request(gemma3_pipeline, PROMPTS[0], 12), listener=broken)
    others = [sched.submit(request(gemma3_pipeline, p, MAX_NEW[i])) for i, p in enumerate(PROMPTS[1:3], start=1)]
    assert failing.result(WAIT_S).finish_reason == "cancelled"
    assert [h.result(WAIT_S).token_ids for h in others] == alone[1:3]


def test_a_failing_request_ends_alone_and_a_lost_device_state_is_rebuilt(gemma3_pipeline, alone):
    """One request's prompt chunk fails: it alone ends, with the error; the others give their tokens alone. Then a
    decode step fails after its program took the donated cache: the requests in the slots end with the error, the
    one still waiting and one submitted later are answered from a fresh cache, as alone."""
    s = Scheduler(gemma3_pipeline.engine, gemma3_pipeline.processor, slots=2, context=512, max_batched_tokens=32,
                  prefix_cache_mb=0, media_cache_mb=0, threaded=False)
    bad = request(gemma3_pipeline, PROMPTS[3], 4)  # the long prompt: several chunks, the second one fails
    make_chunk, calls = s._chunk, []

    def failing_chunk(live, a, b):
        calls.append(a)
        if a > 0 and live.request is bad:
            raise ValueError("a broken chunk")
        return make_chunk(live, a, b)

    s._chunk = failing_chunk
    handles = [s.submit(r) for r in (request(gemma3_pipeline, PROMPTS[0], MAX_NEW[0]), bad,
                                     request(gemma3_pipeline, PROMPTS[2], MAX_NEW[2]))]
    s.run(handles)
    with pytest.raises(RuntimeError, match="engine error: a broken chunk"):
        handles[1].result(0)
    assert [handles[0].result(0).token_ids, handles[2].result(0).token_ids] == [alone[0], alone[2]]
    assert s.stats.failed == 1

    step = s.slots.step
    lost = []

    def step_losing_the_cache(rows, chunks=None, **kwargs):
        if not lost and rows and s.running == 2 and all(x.decoding for x in s._slot_of):
            # the first step decoding both slots: as a program that failed after its inputs were donated
            lost.append(rows)
            for a in jax.tree.leaves((s.slots.cache, s.slots.state)):
                a.delete()
            raise RuntimeError("the device failed")
        return step(rows, chunks, **kwargs)

    s.slots.step = step_losing_the_cache
    first = [s.submit(request(gemma3_pipeline, p, n)) for p, n in zip(PROMPTS[:3], MAX_NEW[:3])]
    s.run(first)
    for h in first[:2]:  # in the two slots when the step failed
        with pytest.raises(RuntimeError, match="the device failed"):
            h.result(0)
    assert first[2].result(0).token_ids == alone[2]  # it was waiting
    later = s.submit(request(gemma3_pipeline, PROMPTS[1], MAX_NEW[1]))
    s.run([later])
    assert later.result(0).token_ids == alone[1]


def test_a_prompt_request_cancelled_before_its_first_chunk_ends_cleanly(gemma3_pipeline, alone):
    """A scoring (prompt log-probabilities) request cancelled after its first chunk and a prompt-logits request
    cancelled while waiting for its first end as cancelled (the second with no rows); the request after them is
    answered as alone."""
    s = Scheduler(gemma3_pipeline.engine, gemma3_pipeline.processor, slots=1, context=512, max_batched_tokens=32,
                  prefix_cache_mb=0, media_cache_mb=0, threaded=False)
    prompt = gemma3_pipeline.prepare(PROMPTS[3])
    scored = s.submit(Request(prompt, 1, prompt_logprobs=0))
    logits = s.submit(Request(prompt, 1, prompt_logits=True))
    other = s.submit(request(gemma3_pipeline, PROMPTS[2], MAX_NEW[2]))
    s.step()  # the first takes the slot and runs one chunk; the second waits
    scored.cancel()
    logits.cancel()
    s.run([scored, logits, other])
    assert scored.result(0).finish_reason == logits.result(0).finish_reason == "cancelled"
    assert logits.result(0).prompt_logits.shape[0] == 0
    assert scored.result(0).prompt_logprobs.ndim == 1 and scored.result(0).prompt_logprobs.shape[0] >= 1
    assert other.result(0).token_ids == alone[2]


def test_scoring_waits_its_turn_on_a_busy_engine(gemma3_pipeline):
    """A long text's windows on an engine of one slot and a queue of one, with another request inside: the scores
    are the pipeline's own."""
    from omnijax.app.scoring import Scorer

    s = Scheduler(gemma3_pipeline.engine, gemma3_pipeline.processor, slots=1, context=512, max_batched_tokens=32,
                  prefix_cache_mb=0, media_cache_mb=0, max_queue=1, threaded=False)

    class Busy:
        scheduler = s

        @staticmethod
        def _wait(handles):
            s.run(handles)
            return [h.result(0) for h in handles]

    ids = gemma3_pipeline.prepare_raw(LONG_TEXT).token_ids
    s.submit(request(gemma3_pipeline, PROMPTS[2], 4))  # takes the slot at the next step
    got = Scorer(Busy, window=16).score(ids)
    np.testing.assert_allclose(got, Scorer(gemma3_pipeline, window=16).score(ids), rtol=0, atol=1e-5)


def test_threads_share_the_pipeline(gemma3_pipeline, alone):
    """Pipeline.generate from four threads at once: each gets its own answer."""
    out: dict[int, list] = {}

    def ask(i):
        out[i] = gemma3_pipeline.generate_prepared([gemma3_pipeline.prepare(PROMPTS[i])], max_new_tokens=MAX_NEW[i],
                                                   ignore_eos=True)[0].token_ids

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert [out[i] for i in range(4)] == alone[:4]


MESH_SCRIPT = r"""
import json, sys
import jax
from omnijax.app.pipeline import Pipeline
from omnijax.common.sharding import make_mesh
sys.path.insert(0, sys.argv[2])
from test_serving_engine import MAX_NEW, PROMPTS
pipe = Pipeline.from_pretrained(sys.argv[1], mesh=make_mesh(2), max_batch=4, max_context=512, max_batched_tokens=32)
results = pipe.generate_prepared([pipe.prepare(p) for p in PROMPTS[:4]], max_new_tokens=12, ignore_eos=True)
print("RESULT" + json.dumps({"tokens": [r.token_ids for r in results], "mesh": dict(pipe.engine.mesh.shape),
                             "cache_spec": str(pipe.scheduler.slots.cache["k"][0].sharding.spec)}))
"""


@pytest.mark.multidevice
def test_four_devices_split_slots_and_weights(tiny_gemma3_dir, sched, gemma3_pipeline):
    """On a (data 2, model 2) mesh of 4 simulated devices the slots are split over the data axis and the weights
    over the model axis; the answers equal one device's."""
    out = run_on_four_devices(MESH_SCRIPT, tiny_gemma3_dir, ROOT / "tests", timeout=1200, torch=True)
    assert out["mesh"] == {"data": 2, "model": 2}
    assert out["cache_spec"] == "P('data', 'model', None, None)"  # slots over data, kv heads over model
    one = [sched.submit(request(gemma3_pipeline, p, 12)).result(WAIT_S).token_ids for p in PROMPTS[:4]]
    assert out["tokens"] == one


def test_warm_up_compiles_what_text_requests_need(gemma3_pipeline, sched):
    """After ``warm_up``, text requests of any length (several chunks included) on any slots compile nothing."""
    while not sched.idle:
        time.sleep(0.01)
    sched.warm_up()  # (nothing new when the test above has warmed it up)
    before = sched.compilations()
    prompts = [conversation("Hi."), conversation(LONG_TEXT, system="Be brief."), conversation("Why? " * 9)]
    handles = [sched.submit(request(gemma3_pipeline, p, 5, temperature=0.3 * i, seed=i)) for i, p in enumerate(prompts)]
    assert [len(h.result(WAIT_S).token_ids) for h in handles] == [5, 5, 5]
    assert sched.compilations() == before


def test_a_new_request_starts_at_the_next_step_beside_a_long_prompt(gemma3_pipeline, alone):
    """A long prompt is being prefilled (several steps of its chunks) when a short request arrives: the next step
    runs the short one's prompt beside the long one's next chunk (sharing the step's prompt tokens), the short one
    answers before the long one has finished its prompt, and both give their tokens alone."""
    s = Scheduler(gemma3_pipeline.engine, gemma3_pipeline.processor, slots=2, context=512, max_batched_tokens=32,
                  prefix_cache_mb=0, media_cache_mb=0, threaded=False)
    long = s.submit(request(gemma3_pipeline, PROMPTS[3], MAX_NEW[3]))
    s.step()
    long_live = s._slot_of[0]
    assert long_live.done == 32 and long_live.prefilling
    short = s.submit(request(gemma3_pipeline, PROMPTS[2], 3))
    s.step()
    short_live = s._slot_of[1]
    assert short_live.request is short.request and short_live.done > 0
    assert long_live.done > 32  # its next chunk ran in the same step
    while not short.done:
        s.step()
    assert long_live.prefilling  # still prefilling its prompt when the short one has answered
    s.run([long, short])
    assert [long.result(0).token_ids, short.result(0).token_ids] == [alone[3], alone[2][:3]]
