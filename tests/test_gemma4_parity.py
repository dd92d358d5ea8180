"""Gemma 4 end to end against transformers (float32) on the tiny random checkpoints of tests/fixtures/gemma4_checkpoint.py:
processor outputs (token ids, pixels, positions, mel features, bidirectional flags), vision and audio features,
prompt logits, greedy tokens, batching, the KV cache of KV-sharing layers, the text-only class, bad input.

Folders: ``small`` (per-layer embeddings, KV sharing, global head dim, image + audio, causal image tokens), ``moe``
(experts beside the MLP, k_eq_v full layers with their own kv heads, image blocks bidirectional on sliding layers),
``text`` (Gemma4ForCausalLM). The sliding window is 16 tokens, so every image prompt runs past it.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from omnijax.common.errors import CheckpointError, MediaError, PromptError

pytestmark = [pytest.mark.reference, pytest.mark.slow]

SR = 16000
NEW = 16


def image(seed: int, size=(50, 80)) -> Image.Image:
    """A random RGB image of size (width, height)."""
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def clip(seed: int, seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    noise = 0.05 * np.random.default_rng(seed).standard_normal(t.shape)
    return (0.3 * np.sin(2 * np.pi * (180 + 60 * seed) * t) + noise).astype(np.float32)


def user(*parts, system=None):
    content = []
    for p in parts:
        if isinstance(p, Image.Image):
            content.append({"type": "image", "image": p})
        elif isinstance(p, np.ndarray):
            content.append({"type": "audio", "audio": p})
        else:
            content.append({"type": "text", "text": p})
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]


LONG_TEXT = ("The farmer walks the fences every morning to see which posts the winter has pushed over, and his "
             "daughter follows with a hammer and a bag of nails. ")

CASES = {
    "text": user("Tell me about the sea."),
    "image": user(image(1), "What is in the picture?"),
    "audio": user(clip(1, 1.2), "What do you hear?"),
    "image_audio": user(image(2, (40, 56)), clip(2, 0.6), "Answer the spoken question about this image.",
                        system="Be brief."),
    "two_images": user("Compare", image(3, (30, 90)), "with", image(4, (64, 64)), "please."),
    # past the 16-token window on both sides of the image, and past the dense-attention limit (blocked attention)
    "long_image": user(LONG_TEXT * 2, image(5, (72, 40)), "and then " + LONG_TEXT * 2, system="Answer kindly."),
}
SMALL = list(CASES)
MOE = ["text", "image", "two_images", "long_image"]
PARAMS = [("small", c) for c in SMALL] + [("moe", c) for c in MOE]


@pytest.fixture(scope="module")
def models(gemma4_small_pipeline, gemma4_moe_pipeline, hf_gemma4_small, hf_gemma4_moe):
    """{folder kind: (our pipeline, reference model, reference processor)}."""
    return {"small": (gemma4_small_pipeline, *hf_gemma4_small), "moe": (gemma4_moe_pipeline, *hf_gemma4_moe)}


def media(messages, kind):
    return [p[kind] for m in messages if isinstance(m["content"], list) for p in m["content"] if p["type"] == kind]


def hf_inputs(processor, messages):
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    kwargs = {}
    if media(messages, "image"):
        kwargs["images"] = [media(messages, "image")]
    if media(messages, "audio"):
        kwargs["audio"] = media(messages, "audio")
    return processor(text=[text], return_tensors="pt", **kwargs)


@pytest.fixture(scope="module")
def prepared(models):
    """{(kind, case): (our PreparedPrompt, reference processor outputs)}, computed once."""
    out = {}
    for kind, case in PARAMS:
        pipe, _, processor = models[kind]
        out[kind, case] = (pipe.prepare(CASES[case]), hf_inputs(processor, CASES[case]))
    return out


# ---- processor ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind,case", PARAMS)
def test_processor_parity(models, prepared, kind, case):
    pipe, model, _ = models[kind]
    ours, ref = prepared[kind, case]
    np.testing.assert_array_equal(ours.token_ids, ref["input_ids"][0].numpy())
    bidirectional = model.config.text_config.use_bidirectional_attention == "vision"
    np.testing.assert_array_equal(ours.bidirectional, (ref["mm_token_type_ids"][0].numpy() == 1) & bidirectional)
    assert ours.bidirectional.any() == (bidirectional and "image" in ours.media)
    if "pixel_values" in ref:
        assert len(ours.media["image"]) == ref["pixel_values"].shape[0]
        for item, pixels, positions in zip(ours.media["image"], ref["pixel_values"].numpy(),
                                           ref["image_position_ids"].numpy()):
            n = item.pixel_values.shape[0]
            np.testing.assert_array_equal(item.pixel_values, pixels[:n])
            np.testing.assert_array_equal(item.position_ids, positions[:n])
            assert not pixels[n:].any() and (positions[n:] == -1).all()
    else:
        assert "image" not in ours.media
    if "input_features" in ref:
        mask = ref["input_features_mask"].numpy().astype(bool)
        assert len(ours.media["audio"]) == len(mask)
        for frames, feats, m in zip(ours.media["audio"], ref["input_features"].numpy(), mask):
            assert frames.shape == feats[m].shape
            assert np.abs(frames - feats[m]).max() <= 1e-5 * max(1.0, np.abs(feats[m]).max())
    else:
        assert "audio" not in ours.media


def test_long_case_runs_past_the_window_with_the_image_inside(models, prepared):
    from omnijax.decoder.attention_op import DENSE_LIMIT

    for kind in ("small", "moe"):
        pipe = models[kind][0]
        ours, _ = prepared[kind, "long_image"]
        window = next(l.attention.mask.size for l in pipe.config.decoder.layers if l.attention.mask.kind == "sliding")
        where = np.flatnonzero(ours.token_ids == pipe.config.media_token_id("image"))
        assert where[0] > 2 * window and len(ours.token_ids) - where[-1] > 2 * window
        assert where[-1] - where[0] + 1 > window  # the block itself is wider than the window
        assert len(ours.token_ids) > DENSE_LIMIT  # the prompt attends in blocks


# ---- encoders ------------------------------------------------------------------------------------------------


def _close(ours: np.ndarray, ref: np.ndarray, rel: float = 1e-5) -> float:
    assert ours.shape == ref.shape
    err = float(np.abs(ours - ref).max()) / max(1.0, float(np.abs(ref).max()))
    assert err <= rel, err
    return err


@pytest.mark.parametrize("kind", ["small", "moe"])
def test_vision_features_parity(models, prepared, kind):
    """The images of all the folder's cases in one batch (several sizes and aspect ratios) against the reference."""
    pipe, model, _ = models[kind]
    cases = [c for c in (SMALL if kind == "small" else MOE) if "pixel_values" in prepared[kind, c][1]]
    items = [item for c in cases for item in prepared[kind, c][0].media["image"]]
    assert len(items) >= 4 and len({item.size for item in items}) >= 3
    features, valid, extras = pipe.engine.encode({"image": items})["image"]
    assert extras == ()
    expected = []
    with torch.no_grad():
        for c in cases:
            ref = prepared[kind, c][1]
            out = model.model.get_image_features(ref["pixel_values"], ref["image_position_ids"])
            expected += [t.numpy() for t in out.pooler_output]
    _close(np.asarray(features)[np.asarray(valid)], np.concatenate(expected))


def test_audio_features_parity(models, prepared):
    """The clips of two cases in one batch against the reference, clip by clip."""
    pipe, model, _ = models["small"]
    cases = ["audio", "image_audio"]
    items = [item for c in cases for item in prepared["small", c][0].media["audio"]]
    features, valid, _ = pipe.engine.encode({"audio": items})["audio"]
    expected = []
    with torch.no_grad():
        for c in cases:
            ref = prepared["small", c][1]
            out = model.model.get_audio_features(ref["input_features"], ref["input_features_mask"])
            expected.append(out.pooler_output[out.attention_mask].numpy())
    _close(np.asarray(features)[np.asarray(valid)], np.concatenate(expected))
    tokens = sum(int((prepared["small", c][0].token_ids == pipe.config.media_token_id("audio")).sum()) for c in cases)
    assert tokens == sum(len(e) for e in expected)


# ---- decoder -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scores(models, prepared):
    """{kind: our logits of every case} (``Pipeline.prompt_logits``: the serving engine's chunked prefill)."""
    out = {}
    for kind in ("small", "moe"):
        cases = SMALL if kind == "small" else MOE
        logits = models[kind][0].prompt_logits([prepared[kind, c][0] for c in cases])
        out[kind] = dict(zip(cases, logits))
    return out


@pytest.mark.parametrize("kind,case", PARAMS)
def test_logit_parity(models, prepared, scores, kind, case):
    """Each prompt's logits (scored in a batch of all the folder's prompts) against the reference alone."""
    _, model, _ = models[kind]
    _, ref_inputs = prepared[kind, case]
    with torch.no_grad():
        ref = model(**ref_inputs).logits[0].numpy()
    logits = scores[kind][case]
    assert logits.shape == ref.shape
    assert np.abs(logits - ref).max() <= 1e-4 * max(1.0, float(np.abs(ref).max()))


def _reference_tokens(model, inputs, **kwargs) -> list[int]:
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW, do_sample=False, **kwargs)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def _through_eos(tokens: list[int], eos) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[:i + 1]
    return tokens


@pytest.fixture(scope="module")
def generated(models, prepared):
    """{kind: (16 greedy tokens per case past any EOS, the API's answers)}: every case of the folder in one batch
    (text, image, audio, several images, the long prompt side by side), through ``Pipeline.generate_prepared``
    (end ids ignored) and ``Pipeline.generate``."""
    out = {}
    for kind in ("small", "moe"):
        pipe = models[kind][0]
        cases = SMALL if kind == "small" else MOE
        full = pipe.generate_prepared([prepared[kind, c][0] for c in cases], max_new_tokens=NEW, ignore_eos=True)
        answers = pipe.generate([CASES[c] for c in cases], max_new_tokens=NEW)
        out[kind] = {c: (row.token_ids, answer) for c, row, answer in zip(cases, full, answers)}
    return out


@pytest.mark.parametrize("kind,case", PARAMS)
def test_greedy_tokens_equal_transformers(models, prepared, generated, kind, case):
    """16 greedy tokens past any EOS (both sides keep going), and the API's answer ends at the first EOS; ours come
    from a batch of mixed prompts, the reference's from the prompt alone."""
    pipe, model, _ = models[kind]
    _, inputs = prepared[kind, case]
    ref = _reference_tokens(model, inputs, eos_token_id=None)
    assert len(ref) == NEW
    full, answer = generated[kind][case]
    assert full == ref
    assert answer.token_ids == _through_eos(ref, pipe.config.eos_ids)
    assert answer.finish_reason == ("eos" if len(answer.token_ids) < NEW or ref[-1] in pipe.config.eos_ids
                                    else "length")


@pytest.mark.parametrize("kind,cases", [("small", ["text", "image_audio"]),
                                        ("moe", ["image", "long_image"])])
def test_batch_of_mixed_prompts_equals_each_alone(models, generated, kind, cases):
    pipe = models[kind][0]
    for case in cases:
        alone = pipe.generate(CASES[case], max_new_tokens=NEW)
        batched = generated[kind][case][1]
        assert (alone.token_ids, alone.text, alone.finish_reason) == \
            (batched.token_ids, batched.text, batched.finish_reason)


def test_kv_shared_layers_allocate_no_cache(models, prepared):
    from omnijax.decoder.kv_cache import PAGE, cache_index

    pipe = models["small"][0]
    spec = pipe.config.decoder
    owners = [i for i in range(spec.num_layers) if spec.owns_kv(i)]
    assert owners == [0, 1, 2] and [spec.kv_layer(i) for i in (3, 4, 5)] == [1, 1, 2]
    assert cache_index(spec) == (0, 1, 2, None, None, None)
    slots = pipe.scheduler.slots  # the serving engine's cache: a ring per slot, or a pool of pages (full layers)
    slots.ensure_allocated()
    k, v = slots.cache["k"], slots.cache["v"]
    assert len(k) == len(v) == len(owners)
    assert slots.spans == (slots.cache_len,)  # the windows are not whole pages: rows
    pool = slots.pages.tables[0].pages + 1  # and the scratch page

    def shapes(i):  # keys and values of layer i: its window per slot on sliding layers, pages on full ones
        att = spec.layers[i].attention
        if att.mask.local and att.mask.size < slots.cache_len:
            w = att.mask.size
            return (slots.slots, att.kv_heads, att.head_dim, w), (slots.slots, att.kv_heads, w, att.head_dim)
        return (pool, att.kv_heads, att.head_dim, PAGE), (pool, att.kv_heads, PAGE, att.head_dim)

    assert {len(shapes(i)[0]) and shapes(i)[0][-1] == PAGE for i in owners} == {True, False}  # both kinds
    expected = 0
    for entry, i in enumerate(owners):
        assert (k[entry].shape, v[entry].shape) == shapes(i)
        expected += 2 * math.prod(shapes(i)[0]) * 4
    assert sum(a.nbytes for a in k + v) == expected
    # what one cache per layer would hold: the three sharing layers would add more than a third again
    every = expected + sum(2 * math.prod(shapes(i)[0]) * 4 for i in (3, 4, 5))
    assert every > 1.3 * expected


def test_moe_layers_hold_experts_beside_the_mlp(models):
    layers = models["moe"][0].config.decoder.layers
    assert all(l.options.moe is not None and l.ffn.kind == "dense" for l in layers)
    full = [l.attention for l in layers if l.attention.mask.kind == "full"]
    assert all(a.k_eq_v and a.num_kv_heads == 1 and a.head_dim == 32 for a in full)
    assert all(l.attention.mask.media_bidirectional == (l.attention.mask.kind == "sliding") for l in layers)


# ---- text-only class ----------------------------------------------------------------------------------------


def test_text_only_class_matches_transformers(gemma4_text_pipeline, hf_gemma4_text):
    pipe = gemma4_text_pipeline
    assert pipe.family == "gemma4" and pipe.config.modalities == ()
    messages = user("Tell me about the sea.", system="Be brief.")
    ours = pipe.prepare(messages)
    text = pipe.processor.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = torch.tensor([pipe.processor.tokenizer(text, add_special_tokens=False)["input_ids"]])
    np.testing.assert_array_equal(ours.token_ids, ids[0].numpy())
    with torch.no_grad():
        ref = hf_gemma4_text(input_ids=ids).logits[0].numpy()
    assert np.abs(pipe.prompt_logits(ours) - ref).max() <= 1e-4 * max(1.0, float(np.abs(ref).max()))
    tokens = _reference_tokens(hf_gemma4_text, {"input_ids": ids}, eos_token_id=None)
    assert pipe.generate_prepared([ours], max_new_tokens=NEW, ignore_eos=True)[0].token_ids == tokens
    assert pipe.generate(messages, max_new_tokens=NEW).token_ids == _through_eos(tokens, pipe.config.eos_ids)
    with pytest.raises(PromptError, match="no image input"):
        pipe.prepare(user(image(1), "What is it?"))


# ---- bad input ------------------------------------------------------------------------------------------------


def test_audio_past_the_model_limit_is_refused(models, tiny_gemma4_small_dir):
    from omnijax.app.families.gemma4.spec import make_processor

    pipe = models["small"][0]
    long_clip = np.zeros(480_001, np.float32)
    with pytest.raises(MediaError, match="longer than the limit of 30 s"):
        pipe.prepare(user(long_clip, "What is it?"))
    assert len(pipe.prepare(user(long_clip[:480_000] + 0.1, "What is it?")).media["audio"][0]) == 2999
    shorter = make_processor(tiny_gemma4_small_dir, pipe.config, max_audio_seconds=2.0)
    with pytest.raises(MediaError, match="longer than the limit of 2 s"):
        shorter.prepare(user(clip(1, 2.5), "What is it?"))
    assert make_processor(tiny_gemma4_small_dir, pipe.config, max_audio_seconds=600).max_audio_seconds == 30.0


def test_media_the_checkpoint_cannot_read_is_refused(models):
    with pytest.raises(PromptError, match="no audio input"):
        models["moe"][0].prepare(user(clip(1, 1.0), "What is it?"))
    with pytest.raises(MediaError):
        models["small"][0].prepare(user(clip(1, 0.005), "Too short?"))
    # a marker typed in the text is text: no image placeholder, no media, no error
    pipe = models["small"][0]
    typed = pipe.prepare(user("A literal <|image|> marker without an image."))
    for kind in ("image", "audio"):
        assert not np.any(typed.token_ids == pipe.config.media_token_id(kind))
    assert not typed.media.get("image")


def test_bad_configs_are_refused(tiny_gemma4_moe_dir):
    from omnijax.app.families.gemma4.spec import parse_config

    hf = json.loads((tiny_gemma4_moe_dir / "config.json").read_text())
    for change, match in [({"use_bidirectional_attention": "all"}, "cannot generate"),
                          ({"num_kv_shared_layers": 6}, "num_kv_shared_layers"),
                          ({"layer_types": ["sliding_attention"] * 3}, "layer_types"),
                          ({"rope_parameters": {"full_attention": {"rope_type": "yarn"}}}, "yarn"),
                          ({"num_experts": None}, "Gemma 4")]:
        broken = dict(hf, text_config=dict(hf["text_config"], **change))
        with pytest.raises(CheckpointError, match=match):
            parse_config(broken)
