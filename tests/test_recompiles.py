"""Shape budgets: new media sizes, prompt lengths and max_new_tokens inside their buckets compile nothing new.

Every compiled program of the serving engine is counted (media encoders, and the slots' chunk, insert, decode and
cache programs).
Each case first generates once (compiling what that bucket needs), then checks that further inputs of other sizes
in the same buckets add no compilation, while their answers still follow their own inputs.
"""

import numpy as np

from omnijax.app.generation import bucket_for
from test_qwen3_omni_parity import clip, image, user


def _bucket(pipe, prompt) -> int:
    """The length the serving engine pads this prompt to (each prompt here is one prefill chunk)."""
    assert len(prompt.token_ids) <= pipe.scheduler.max_batched_tokens
    return bucket_for(len(prompt.token_ids), pipe.engine.buckets)


def _first_then_same_bucket(pipe, conversations, max_new_tokens=(8, 8, 8, 8)):
    engine = pipe.engine
    prompts = [pipe.prepare(c) for c in conversations]
    buckets = {_bucket(pipe, p) for p in prompts}
    assert len(buckets) == 1, f"the inputs span prompt buckets {buckets}: the test's premise fails"
    media = {tuple((m, k, v.shape) for m, items in p.media.items() for k, v in engine._collate[m](items).items())
             for p in prompts}
    assert len(media) == 1, f"the inputs span media buckets {media}: the test's premise fails"
    first = pipe.generate_prepared(prompts[:1], max_new_tokens=max_new_tokens[0])
    before = pipe.compilations()
    rest = [pipe.generate_prepared([p], max_new_tokens=n)[0] for p, n in zip(prompts[1:], max_new_tokens[1:])]
    new = pipe.compilations() - before
    last = [logits[-1] for logits in pipe.prompt_logits(prompts)]  # each prompt's own next-token logits
    assert all(np.abs(a - b).max() > 1e-4 for i, a in enumerate(last) for b in last[i + 1:])
    return first + rest, new, prompts


def test_three_new_audio_lengths_compile_nothing(qwen_pipeline):
    convs = [user(clip(i, seconds), "What do you hear?") for i, seconds in enumerate((1.3, 1.45, 1.6, 1.75))]
    results, new, prompts = _first_then_same_bucket(qwen_pipeline, convs)
    frames = [p.media["audio"][0]["features"].shape[1] for p in prompts]
    assert len(set(frames)) == 4  # four different clip lengths
    assert new == 0


def test_three_new_image_sizes_compile_nothing(qwen_pipeline):
    convs = [user(image(i, size), "What is in the picture?")
             for i, size in enumerate(((80, 40), (48, 72), (56, 56), (72, 48)))]
    results, new, prompts = _first_then_same_bucket(qwen_pipeline, convs)
    grids = [p.media["image"][0]["grid"] for p in prompts]
    assert len(set(grids)) == 4  # four different patch grids
    assert new == 0


def test_new_prompt_lengths_and_max_new_tokens_in_a_bucket_compile_nothing(qwen_pipeline):
    convs = [user("Hello there."), user("A somewhat longer question about the sea?"), user("Why?"),
             user("Tell me three things about winds and tides.")]
    results, new, _ = _first_then_same_bucket(qwen_pipeline, convs, max_new_tokens=(8, 5, 11, 3))
    assert new == 0
    assert [len(r.token_ids) <= n for r, n in zip(results, (8, 5, 11, 3))] == [True] * 4
