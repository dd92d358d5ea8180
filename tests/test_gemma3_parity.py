"""Gemma 3 end to end against transformers (float32): processor outputs, logits, greedy tokens, batching."""

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoProcessor

from omnijax.app.pipeline import Pipeline

pytestmark = pytest.mark.reference

MAX_NEW = 20


def image(seed: int, size=(53, 41)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def conversation(*parts, system=None):
    content = []
    for p in parts:
        content.append({"type": "image", "image": p} if isinstance(p, Image.Image) else {"type": "text", "text": p})
    messages = [{"role": "system", "content": [{"type": "text", "text": system}]}] if system else []
    return messages + [{"role": "user", "content": content}]


LONG_TEXT = ("The quick brown fox jumps over the lazy dog while the cat watches from the warm windowsill "
             "and the rain keeps falling on the quiet town. ") * 2

CASES = {
    "text": conversation("Write a short poem about the sea."),
    "one_image": conversation(image(1), "Describe this image."),
    "two_images": conversation("Compare", image(2), "with", image(3, (20, 70)), "please."),
    "long_with_system": conversation(LONG_TEXT, image(4), "and what follows " + LONG_TEXT, system="Be brief."),
    # over a thousand tokens: the prompt's attention runs in blocks, and an image block crosses a block boundary
    "very_long": conversation(*[x for i in range(5) for x in (LONG_TEXT * (1 + i % 2), image(10 + i))],
                              "Describe the pictures."),
    # the same pictures further on: the last image block straddles a 128-token attention block boundary
    "very_long_shifted": conversation(*[x for i in range(5) for x in (LONG_TEXT * (1 + i % 2), image(10 + i))],
                                      "Describe the pictures.", system="Answer in a few words, kindly."),
}


@pytest.fixture(scope="module")
def hf_processor(tiny_gemma3_dir):
    return AutoProcessor.from_pretrained(str(tiny_gemma3_dir))


def hf_inputs(processor, messages, **kwargs):
    return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                         return_tensors="pt", **kwargs)


@pytest.mark.parametrize("case", list(CASES))
def test_processor_parity(gemma3_pipeline, hf_processor, case):
    ours = gemma3_pipeline.prepare(CASES[case])
    ref = hf_inputs(hf_processor, CASES[case])
    np.testing.assert_array_equal(ours.token_ids, ref["input_ids"][0].numpy())
    np.testing.assert_array_equal(ours.bidirectional, ref["token_type_ids"][0].numpy() == 1)
    if "pixel_values" in ref:
        pixels = np.stack(ours.media["image"])
        assert pixels.shape == tuple(ref["pixel_values"].shape)
        assert np.abs(pixels - ref["pixel_values"].numpy()).max() <= 1e-5
    else:
        assert ours.media == {}


def test_processor_parity_pan_and_scan(tiny_gemma3_pas_dir):
    pipe_processor = Pipeline.from_pretrained(tiny_gemma3_pas_dir).processor
    ref_processor = AutoProcessor.from_pretrained(str(tiny_gemma3_pas_dir))
    messages = conversation(image(5, (200, 60)), "Read the banner.")
    ours = pipe_processor.prepare(messages)
    # transformers' Gemma3Processor overrides the saved pan-and-scan flag with its call defaults: pass it explicitly
    ref = hf_inputs(ref_processor, messages, do_pan_and_scan=True, pan_and_scan_min_crop_size=32)
    assert len(ours.media["image"]) == ref["pixel_values"].shape[0] > 1
    np.testing.assert_array_equal(ours.token_ids, ref["input_ids"][0].numpy())
    assert np.abs(np.stack(ours.media["image"]) - ref["pixel_values"].numpy()).max() <= 1e-5


def reference_logits(model, processor, messages):
    inputs = hf_inputs(processor, messages)
    with torch.no_grad():
        return model(**inputs).logits[0].numpy(), inputs


@pytest.mark.parametrize("case", list(CASES))
def test_logit_parity(gemma3_pipeline, hf_gemma3_model, hf_processor, case):
    ref, inputs = reference_logits(hf_gemma3_model, hf_processor, CASES[case])
    ours = gemma3_pipeline.prompt_logits(CASES[case])
    assert ours.shape == ref.shape
    scale = max(1.0, float(np.abs(ref).max()))
    assert np.abs(ours - ref).max() <= 1e-4 * scale


def test_long_case_exercises_the_sliding_window(gemma3_pipeline):
    window = next(l.attention.mask.size for l in gemma3_pipeline.config.decoder.layers
                  if l.attention.mask.kind == "sliding")
    ids = gemma3_pipeline.prepare(CASES["long_with_system"]).token_ids
    image_positions = np.flatnonzero(ids == gemma3_pipeline.config.media_token_id("image"))
    assert len(ids) > 3 * window
    first, last = image_positions[0], image_positions[-1]
    assert first // window != last // window  # the image block straddles a window boundary


def test_very_long_cases_run_in_several_chunks_with_image_blocks_after_the_first(gemma3_pipeline):
    """The serving engine prefills these prompts in several chunks: an image block in a later chunk attends to the
    cache the earlier chunks wrote, which is read in several 128-slot blocks (a context above 512 tokens)."""
    from omnijax.app.chunks import plan_chunks

    sched = gemma3_pipeline.scheduler
    assert sched.context > 512 and sched.context % 128 == 0
    for case in ("very_long", "very_long_shifted"):
        prompt = gemma3_pipeline.prepare(CASES[case])
        chunks = plan_chunks(0, len(prompt.token_ids), prompt.bidirectional, sched.max_batched_tokens, ())
        edges = np.flatnonzero(np.diff(np.r_[0, prompt.bidirectional.astype(np.int8), 0]))
        assert len(chunks) >= 2 and any(a >= chunks[0][1] + 128 for a in edges[::2]), case


@pytest.mark.parametrize("case", ["text", "one_image", "two_images"])
def test_greedy_generation_equals_transformers(gemma3_pipeline, hf_gemma3_model, hf_processor, case):
    inputs = hf_inputs(hf_processor, CASES[case])
    with torch.no_grad():
        ref = hf_gemma3_model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False)
    ref_new = ref[0, inputs["input_ids"].shape[1]:].tolist()
    ours = gemma3_pipeline.generate(CASES[case], max_new_tokens=MAX_NEW)
    assert len(ref_new) >= 16
    assert ours.token_ids == ref_new


def test_batch_of_different_lengths_equals_each_alone(gemma3_pipeline):
    convs = [CASES["one_image"], CASES["text"], CASES["two_images"]]
    batch = gemma3_pipeline.generate(convs, max_new_tokens=12)
    alone = [gemma3_pipeline.generate(c, max_new_tokens=12) for c in convs]
    assert [r.token_ids for r in batch] == [r.token_ids for r in alone]
    assert [r.text for r in batch] == [r.text for r in alone]


def collect(stream):
    pieces = []
    while True:
        try:
            pieces.append(next(stream))
        except StopIteration as done:
            return pieces, done.value


@pytest.mark.parametrize("case", ["one_image", "text"])
def test_stream_yields_the_generated_answer(gemma3_pipeline, case):
    full = gemma3_pipeline.generate(CASES[case], max_new_tokens=12)
    pieces, result = collect(gemma3_pipeline.stream(CASES[case], max_new_tokens=12))
    assert len(pieces) >= len(full.token_ids) - (full.finish_reason == "eos")  # a piece per token
    assert (result.text, result.token_ids, result.finish_reason, result.prompt_tokens) == \
        (full.text, full.token_ids, full.finish_reason, full.prompt_tokens)
    assert "".join(pieces) == full.text


def test_incremental_detokenizer_never_changes_text_already_returned():
    from omnijax.app.detokenize import IncrementalDetokenizer

    table = {1: b"ab", 2: b"\xe2", 3: b"\x82", 4: b"\xac", 5: b" c"}
    decode = lambda ids: b"".join(table[i] for i in ids).decode("utf-8", errors="replace")
    d = IncrementalDetokenizer(decode)
    assert [d.push(t) for t in (1, 2, 3, 4, 5)] == ["ab", "", "", "\u20ac", " c"]


def test_stop_string_cuts_the_answer(gemma3_pipeline):
    full = gemma3_pipeline.generate(CASES["text"], max_new_tokens=16)
    assert len(full.text) > 4
    stop = full.text[2:4]
    cut = gemma3_pipeline.generate(CASES["text"], max_new_tokens=16, stop=[stop])
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[:full.text.find(stop)]
    assert cut.token_ids == full.token_ids[:len(cut.token_ids)]
    pieces, result = collect(gemma3_pipeline.stream(CASES["text"], max_new_tokens=16, stop=[stop]))
    assert (result.text, result.token_ids, result.finish_reason) == (cut.text, cut.token_ids, "stop")
    assert "".join(pieces) == cut.text


def test_sampling_is_seeded(gemma3_pipeline):
    kw = dict(max_new_tokens=10, temperature=1.0, top_k=50, top_p=0.95)
    a = gemma3_pipeline.generate(CASES["text"], seed=3, **kw)
    b = gemma3_pipeline.generate(CASES["text"], seed=3, **kw)
    c = [gemma3_pipeline.generate(CASES["text"], seed=s, **kw).token_ids for s in (4, 5, 6)]
    assert a.token_ids == b.token_ids
    assert any(t != a.token_ids for t in c)


def test_sharded_checkpoint_loads_the_same_weights(gemma3_pipeline, tiny_gemma3_sharded_dir):
    import jax

    sharded = Pipeline.from_pretrained(tiny_gemma3_sharded_dir)
    a = jax.tree.leaves(gemma3_pipeline.engine.params)
    b = jax.tree.leaves(sharded.engine.params)
    assert len(a) == len(b) > 0
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b))
    assert sharded.generate(CASES["one_image"], max_new_tokens=8).token_ids == \
        gemma3_pipeline.generate(CASES["one_image"], max_new_tokens=8).token_ids


def test_new_prompt_length_in_the_same_bucket_does_not_recompile(gemma3_pipeline):
    """Every program the serving engine runs (media encoders, chunks, first token, decode steps) is counted."""
    short, longer = (gemma3_pipeline.prepare(conversation(q)) for q in
                     ("Hello there.", "A somewhat longer question about the weather today?"))
    assert len(short.token_ids) < len(longer.token_ids)
    gemma3_pipeline.generate_prepared([short], max_new_tokens=5)
    before = gemma3_pipeline.compilations()
    assert before > 0
    out = gemma3_pipeline.generate_prepared([longer], max_new_tokens=7)[0]
    assert len(out.token_ids) > 0
    assert gemma3_pipeline.compilations() == before
