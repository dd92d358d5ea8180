"""Llama 4 end to end against transformers (float32) on the tiny random checkpoints of tests/fixtures/llama4_checkpoint.py:
processor outputs, prompt logits, greedy tokens, batching, the text-only folder, the front ends, config reading and
the expert weight layout.

The reference processor needs torchvision, so it runs once per session in a worker (the ``llama4_reference``
fixture, cases ``llama4_reference.CHAT_CASES``); the reference model runs here, on the worker's token ids and pixel
values.
"""

from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import pytest
import torch

import fixtures.llama4_checkpoint as lc
import fixtures.llama4_reference as lr
from omnijax.app.families.llama4 import spec as fam
from omnijax.common.errors import CheckpointError, PromptError
from fixtures.llama4_tokenizer import SPECIAL_TOKEN_IDS

pytestmark = [pytest.mark.reference, pytest.mark.slow]

CASES = {name: (messages, images) for name, messages, images in lr.CHAT_CASES}
MAX_NEW = 16
PATCH_ID = SPECIAL_TOKEN_IDS["<|patch|>"]


def filled(case: str, paths) -> list[dict]:
    """A copy of the case's messages with each image part given its PNG path, in order."""
    messages, names = copy.deepcopy(CASES[case])
    it = iter(names)
    out = []
    for m in messages:
        content = m["content"]
        if not isinstance(content, str):
            content = [{"type": "image", "image": str(paths[next(it)])} if p["type"] == "image" else p
                       for p in content]
        out.append({"role": m["role"], "content": content})
    return out


def reference_inputs(reference, case: str) -> dict:
    inputs = {"input_ids": torch.tensor(reference[f"{case}/input_ids"][None].astype(np.int64))}
    if f"{case}/pixel_values" in reference:
        inputs["pixel_values"] = torch.tensor(reference[f"{case}/pixel_values"])
    return inputs


def assert_logits_close(ours: np.ndarray, ref: np.ndarray) -> float:
    """max |ours - ref| <= 1e-4 x the logit scale; returns the difference relative to that scale."""
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    scale = max(1.0, float(np.abs(ref).max()))
    err = float(np.abs(ours - ref).max()) / scale
    assert err <= 1e-4, f"logits differ by {err * scale} at scale {scale}"
    return err


# ---- processor --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", list(CASES))
def test_processor_parity(llama4_pipeline, llama4_reference, llama4_image_paths, case):
    ours = llama4_pipeline.prepare(filled(case, llama4_image_paths))
    ids = llama4_reference[f"{case}/input_ids"]
    np.testing.assert_array_equal(ours.token_ids, ids)
    assert not ours.bidirectional.any() and ours.bidirectional.shape == ids.shape
    names = CASES[case][1]
    if not names:
        assert ours.media == {}
        return
    tiles = ours.media["image"]
    assert len(tiles) == len(names)
    np.testing.assert_array_equal(np.concatenate(tiles), llama4_reference[f"{case}/pixel_values"])  # bf16 values
    for item, (rows, cols) in zip(tiles, llama4_reference[f"{case}/aspect_ratios"]):  # the tile layout
        assert item.shape[0] == rows * cols + (rows * cols > 1)


def test_each_image_lands_in_its_own_placeholder_run(llama4_pipeline, llama4_image_paths):
    """Several images (of different tile counts) in one prompt: one <|image_start|> .. <|image_end|> run each,
    holding exactly that image's tiles' tokens, in prompt order (not one run for all of them)."""
    prompt = llama4_pipeline.prepare(filled("mixed_tiles", llama4_image_paths))
    ids = prompt.token_ids
    starts = np.flatnonzero(ids == SPECIAL_TOKEN_IDS["<|image_start|>"])
    ends = np.flatnonzero(ids == SPECIAL_TOKEN_IDS["<|image_end|>"])
    per_tile = llama4_pipeline.config.encoder_config("image").tokens_per_tile
    counts = [int((ids[a:b] == PATCH_ID).sum()) for a, b in zip(starts, ends)]
    assert counts == [t.shape[0] * per_tile for t in prompt.media["image"]]
    assert len(set(counts)) == 3 and (ids == PATCH_ID).sum() == sum(counts)
    assert all(b < a for a, b in zip(starts[1:], ends[:-1]))  # runs do not nest or overlap


# ---- logits and tokens against the reference model --------------------------------------------------------------

@pytest.mark.parametrize("case", list(CASES))
def test_logit_parity(llama4_pipeline, hf_llama4_model, llama4_reference, llama4_image_paths, case):
    with torch.no_grad():
        ref = hf_llama4_model(**reference_inputs(llama4_reference, case)).logits[0].numpy()
    ours = llama4_pipeline.prompt_logits(filled(case, llama4_image_paths))
    assert_logits_close(ours, ref)


def test_cases_exercise_chunks_nope_layers_and_several_prefill_chunks(llama4_pipeline, llama4_image_paths):
    from omnijax.app.chunks import plan_chunks

    layers = llama4_pipeline.config.decoder.layers
    chunk = layers[0].attention.mask.size
    assert [l.attention.mask.kind for l in layers] == ["chunked"] * 3 + ["full"]
    assert [l.attention.rope is None for l in layers] == [False] * 3 + [True]
    assert [l.ffn.kind for l in layers] == ["dense", "moe", "dense", "moe"]
    prompt = llama4_pipeline.prepare(filled("long_chunks", llama4_image_paths))
    patches = np.flatnonzero(prompt.token_ids == PATCH_ID)
    assert patches[0] // chunk != patches[-1] // chunk  # the image run straddles a chunk boundary
    sched = llama4_pipeline.scheduler  # the serving engine prefills it in several chunks (each after the cache)
    assert len(plan_chunks(0, len(prompt.token_ids), prompt.bidirectional, sched.max_batched_tokens, ())) >= 2
    small = llama4_pipeline.prepare(filled("one_small", llama4_image_paths))
    assert len(small.token_ids) < chunk < len(small.token_ids) + MAX_NEW  # decoding crosses a chunk boundary


@pytest.mark.parametrize("case", ["text_only", "one_small", "one_large", "two_images", "long_chunks"])
def test_greedy_generation_equals_transformers(llama4_pipeline, hf_llama4_model, llama4_reference,
                                               llama4_image_paths, case):
    inputs = reference_inputs(llama4_reference, case)
    with torch.no_grad():
        ref = hf_llama4_model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False)
    ref_new = ref[0, inputs["input_ids"].shape[1]:].tolist()
    ours = llama4_pipeline.generate(filled(case, llama4_image_paths), max_new_tokens=MAX_NEW)
    assert len(ref_new) == MAX_NEW
    assert ours.token_ids == ref_new


def test_mixed_batch_equals_each_alone(llama4_pipeline, llama4_image_paths):
    convs = [filled(c, llama4_image_paths) for c in ("one_large", "text_only", "two_images", "one_small")]
    batch = llama4_pipeline.generate(convs, max_new_tokens=MAX_NEW)
    alone = [llama4_pipeline.generate(c, max_new_tokens=MAX_NEW) for c in convs]
    assert [r.token_ids for r in batch] == [r.token_ids for r in alone]


def test_new_prompt_length_in_the_same_bucket_does_not_recompile(llama4_pipeline, llama4_image_paths):
    """Every program the serving engine runs (media encoders, chunks, first token, decode steps) is counted. The
    first two questions about the image compile what such requests need (the second's image comes from the prefix
    cache: its chunk is text only, another program); later questions of other lengths compile nothing."""
    def ask(text):
        conv = filled("one_small", llama4_image_paths)
        conv[0]["content"][1]["text"] = text
        return llama4_pipeline.prepare(conv)

    first, second, *later = [ask(t) for t in ("What is this?", "What is in this picture, and where was it taken?",
                                               "Which colours do you see in it, and how many shapes?",
                                               "Is it day or night in this picture, do you think?")]
    assert len({len(p.token_ids) for p in [first, second, *later]}) == 4
    llama4_pipeline.generate_prepared([first], max_new_tokens=5)
    llama4_pipeline.generate_prepared([second], max_new_tokens=5)
    before = llama4_pipeline.compilations()
    assert before > 0
    for p in later:
        assert len(llama4_pipeline.generate_prepared([p], max_new_tokens=5)[0].token_ids) > 0
    assert llama4_pipeline.compilations() == before


# ---- the text-only folder ---------------------------------------------------------------------------------------

TEXT_PROMPTS = {
    "chat": CASES["text_only"][0],
    "long": [{"role": "user", "content": lr.LONG_TEXT + " " + lr.LONG_TEXT}],  # several chunks, past floor_scale
}


@pytest.mark.parametrize("name", list(TEXT_PROMPTS))
def test_text_only_folder_matches_transformers(llama4_text_pipeline, hf_llama4_text_model, name):
    prompt = llama4_text_pipeline.prepare(TEXT_PROMPTS[name])
    ids = torch.tensor(prompt.token_ids[None].astype(np.int64))
    with torch.no_grad():
        ref = hf_llama4_text_model(input_ids=ids).logits[0].numpy()
        ref_new = hf_llama4_text_model.generate(input_ids=ids, max_new_tokens=MAX_NEW, do_sample=False)
    assert_logits_close(llama4_text_pipeline.prompt_logits(prompt), ref)
    assert llama4_text_pipeline.generate(TEXT_PROMPTS[name], max_new_tokens=MAX_NEW).token_ids == \
        ref_new[0, ids.shape[1]:].tolist()
    assert llama4_text_pipeline.config.modalities == ()


def test_text_only_folder_refuses_images(llama4_text_pipeline, llama4_image_paths):
    with pytest.raises(PromptError, match="text-only"):
        llama4_text_pipeline.prepare(filled("one_small", llama4_image_paths))


def test_prompt_errors(llama4_pipeline, llama4_image_paths):
    # an <|image|> typed in the text is text: the prompt holds the one real image's run of patch tokens
    with_image = [{"role": "user", "content": [{"type": "image", "image": str(llama4_image_paths["small"])},
                                               {"type": "text", "text": "What is this?"}]}]
    typed = [{"role": "user", "content": [{"type": "image", "image": str(llama4_image_paths["small"])},
                                          {"type": "text", "text": "and <|image|> this?"}]}]
    image_id = llama4_pipeline.config.media_token_id("image")
    expected = int((llama4_pipeline.prepare(with_image).token_ids == image_id).sum())
    prepared = llama4_pipeline.prepare(typed)
    assert expected > 0 and int((prepared.token_ids == image_id).sum()) == expected
    assert len(prepared.media["image"]) == 1
    with pytest.raises(PromptError, match="no audio"):
        llama4_pipeline.prepare([{"role": "user", "content": [{"type": "audio", "audio": "x.wav"}]}])


def test_eos_ids_come_from_generation_config(llama4_pipeline):
    assert llama4_pipeline.config.eos_ids == tuple(lc.TINY_LLAMA4_GENERATION_CONFIG["eos_token_id"])


# ---- front ends -------------------------------------------------------------------------------------------------

def test_cli_with_two_images_matches_the_api(tiny_llama4_dir, llama4_pipeline, llama4_image_paths, capsys):
    from omnijax.app.cli import main

    images = [str(llama4_image_paths["large"]), str(llama4_image_paths["wide"])]
    code = main(["generate", "--model", str(tiny_llama4_dir), "--image", images[0], "--image", images[1],
                 "--prompt", "Compare them.", "--max-new-tokens", "8", "--no-stream"])
    assert code == 0
    expected = llama4_pipeline.generate([{"role": "user", "content": [
        {"type": "image", "image": images[0]}, {"type": "image", "image": images[1]},
        {"type": "text", "text": "Compare them."}]}], max_new_tokens=8)
    assert capsys.readouterr().out == expected.text + "\n"


def test_web_demo_streams_the_generate_answer(llama4_pipeline, llama4_image_paths):
    from omnijax.demo.web import make_responder

    image = str(llama4_image_paths["odd"])
    expected = llama4_pipeline.generate([{"role": "user", "content": [
        {"type": "image", "image": image}, {"type": "text", "text": "Describe this image."}]}], max_new_tokens=8)
    outputs = list(make_responder(llama4_pipeline)({"text": "Describe this image.", "files": [image]}, [], 8,
                                                   0.0, 1.0, 0, 0))
    assert outputs[-1][0]["content"][0]["text"] == expected.text


def test_captioner_matches_generate(llama4_pipeline, llama4_image_paths, tmp_path):
    from omnijax.demo.caption import CaptionOptions, messages_for, prompt_text, run_captions
    from omnijax.demo.caption_items import CaptionItem, discover

    folder = tmp_path / "pictures"
    folder.mkdir()
    for name in ("small", "large", "wide"):
        shutil.copy(llama4_image_paths[name], folder / f"{name}.png")
    out = tmp_path / "captions.jsonl"
    options = CaptionOptions(max_new_tokens=6, batch_size=2, workers=1, progress=False)
    summary = run_captions(llama4_pipeline, discover(str(folder)), out, options, log=None)
    assert (summary.done, summary.failed) == (3, 0)
    rows = {r["path"]: r for r in map(json.loads, out.read_text().splitlines())}
    for name in ("small", "large", "wide"):
        path = str(folder / f"{name}.png")
        item = CaptionItem(path, "image")
        want = llama4_pipeline.generate(messages_for(item, prompt_text(item, options)), max_new_tokens=6)
        assert rows[path]["caption"] == want.text and rows[path]["new_tokens"] == len(want.token_ids)


# ---- config reading ---------------------------------------------------------------------------------------------

def _published_like(layout: str) -> dict:
    """Text configs with the structure of the published checkpoints (older export style: rope_theta +
    rope_scaling), at their real sizes."""
    base = {"attention_bias": False, "attention_chunk_size": 8192, "attn_scale": 0.1, "attn_temperature_tuning": True,
            "eos_token_id": [200001, 200007, 200008], "floor_scale": 8192, "head_dim": 128, "hidden_act": "silu",
            "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
            "max_position_embeddings": 10485760, "num_attention_heads": 40, "num_hidden_layers": 48,
            "num_key_value_heads": 8, "num_experts_per_tok": 1, "pad_token_id": 200018, "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0, "vocab_size": 202048, "model_type": "llama4_text"}
    if layout == "scout":  # 16 experts on every layer, qk norm, llama3 scaling with equal low/high factors
        return {**base, "num_local_experts": 16, "interleave_moe_layer_step": 1, "use_qk_norm": True,
                "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                                 "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
    return {**base, "num_local_experts": 128, "interleave_moe_layer_step": 2, "use_qk_norm": False,  # maverick
            "rope_scaling": None, "max_position_embeddings": 1048576}


@pytest.mark.parametrize("layout", ["tiny", "scout", "maverick"])
def test_decoder_spec_follows_the_reference_config(layout):
    from transformers import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextRotaryEmbedding

    tc = copy.deepcopy(lc.TINY_LLAMA4_TEXT_CONFIG) if layout == "tiny" else _published_like(layout)
    ref = Llama4TextConfig(**{k: v for k, v in tc.items() if k != "model_type"})
    spec = fam.decoder_config(tc)
    assert spec.num_layers == ref.num_hidden_layers
    for i, layer in enumerate(spec.layers):
        att, uses_rope = layer.attention, bool(ref.no_rope_layers[i])
        assert (att.rope is not None) == uses_rope
        assert att.mask.kind == {"chunked_attention": "chunked", "full_attention": "full"}[ref.layer_types[i]]
        assert att.mask.size == (ref.attention_chunk_size if att.mask.kind == "chunked" else None)
        assert att.qk_norm == ("l2" if ref.use_qk_norm and uses_rope else "none")
        assert att.temperature == (None if uses_rope else (ref.floor_scale, ref.attn_scale))
        assert (att.num_heads, att.num_kv_heads, att.head_dim) == (ref.num_attention_heads, ref.num_key_value_heads,
                                                                   ref.head_dim)
        if i in ref.moe_layers:
            assert (layer.ffn.kind, layer.ffn.num_experts, layer.ffn.top_k, layer.ffn.router) == \
                ("moe", ref.num_local_experts, ref.num_experts_per_tok, "sigmoid_input")
            assert layer.ffn.intermediate == layer.ffn.shared_intermediate == ref.intermediate_size
        else:
            assert (layer.ffn.kind, layer.ffn.intermediate) == ("dense", ref.intermediate_size_mlp)
    assert (spec.embed_scale, spec.norm_plus_one, spec.tie_embeddings) == (1.0, False, False)
    rope = next(l.attention.rope for l in spec.layers if l.attention.rope is not None)
    assert rope.interleaved
    with np.errstate(divide="ignore", invalid="ignore"):  # equal low/high factors: an unused 0/0 branch
        ours = rope.inverse_frequencies(ref.head_dim)
    np.testing.assert_allclose(ours, Llama4TextRotaryEmbedding(ref).inv_freq.numpy(), rtol=1e-6)


def test_scout_layout_reads_whole(tmp_path):
    """A Scout-shaped multimodal config.json (real sizes) parses: image token, vision tower, EOS."""
    hf = {"model_type": "llama4", "image_token_index": 200092, "text_config": _published_like("scout"),
          "vision_config": {"hidden_size": 1408, "image_size": 336, "intermediate_size": 5632,
                            "num_attention_heads": 16, "num_hidden_layers": 34, "patch_size": 14,
                            "pixel_shuffle_ratio": 0.5, "projector_input_dim": 4096, "projector_output_dim": 4096,
                            "vision_output_dim": 4096, "rope_theta": 10000}}
    cfg = fam.parse_config(hf)
    assert cfg.media_token_ids == (("image", 200092),) and cfg.encoder_config("image").tokens_per_tile == 144
    assert cfg.eos_ids == (200001, 200007, 200008) and cfg.pad_id == 200018
    assert all(l.ffn.kind == "moe" for l in cfg.decoder.layers)


@pytest.mark.parametrize("change, message", [
    ({"layer_types": ["chunked_attention"] * 3}, "layer_types"),
    ({"layer_types": ["sliding_attention"] * 4}, "layer_types"),
    ({"attention_chunk_size": None}, "attention_chunk_size"),
    ({"moe_layers": [1, 7]}, "moe_layers"),
    ({"no_rope_layers": [1, 2, 1, 0]}, "no_rope_layers"),
    ({"num_experts_per_tok": 5}, "top_k"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}}, "yarn"),
    ({"num_hidden_layers": 0}, "num_hidden_layers"),
])
def test_bad_text_configs_are_checkpoint_errors(change, message):
    hf = lc.tiny_llama4_config(text_config=change)
    hf["model_type"] = "llama4"
    with pytest.raises(CheckpointError, match=message):
        fam.parse_config(hf)


def test_processor_checks_tiles_against_the_vision_tower(tiny_llama4_dir, tmp_path):
    cfg = fam.parse_config(json.loads((tiny_llama4_dir / "config.json").read_text()))
    for name, change, message in (("tile", {"size": {"height": 42, "width": 42}}, "tile size 42"),
                                  ("patch", {"patch_size": 12}, "tokens per tile")):
        folder = tmp_path / name
        shutil.copytree(tiny_llama4_dir, folder, ignore=shutil.ignore_patterns("*.safetensors"))
        processor = json.loads((folder / "processor_config.json").read_text())
        if "size" in change:
            processor["image_processor"].update(change)
        else:
            processor.update(change)
        (folder / "processor_config.json").write_text(json.dumps(processor))
        with pytest.raises(CheckpointError, match=message):
            fam.make_processor(folder, cfg)


# ---- expert weight layout ---------------------------------------------------------------------------------------

def test_fused_expert_halves():
    fused = np.arange(2 * 3 * 8, dtype=np.float32).reshape(2, 3, 8)  # [E, hidden, 2 * I], I = 4
    np.testing.assert_array_equal(fam.expert_gate_half(fused), fused[:, :, :4])
    np.testing.assert_array_equal(fam.expert_up_half(fused), fused[:, :, 4:])
    assert fam.expert_gate_half(fused).flags.c_contiguous
    with pytest.raises(ValueError, match="experts, hidden, 2 \\* width"):
        fam.expert_gate_half(np.zeros((2, 3, 5), np.float32))


def test_moe_weight_map_reads_the_fused_tensors():
    wm = fam.moe_weight_map("p.")
    assert wm[("gate_proj",)].keys == wm[("up_proj",)].keys == ("p.experts.gate_up_proj",)
    assert wm[("down_proj",)].keys == ("p.experts.down_proj",)
    assert wm[("router", "weight")].keys == ("p.router.weight",)
    assert wm[("shared", "gate_up_proj")].keys == ("p.shared_expert.gate_proj.weight", "p.shared_expert.up_proj.weight")
    assert wm[("shared", "down_proj", "kernel")].keys == ("p.shared_expert.down_proj.weight",)


def test_expert_weights_load_as_the_reference_splits_them(llama4_pipeline, hf_llama4_model):
    """gate = the first half of the fused columns, up = the second, down as stored; experts on the "expert" axis."""
    experts = hf_llama4_model.language_model.model.layers[1].feed_forward.experts
    fused, down = experts.gate_up_proj.detach().numpy(), experts.down_proj.detach().numpy()
    width = fused.shape[-1] // 2
    mlp = llama4_pipeline.engine.params["decoder"]["layers"][1]["mlp"]
    np.testing.assert_array_equal(np.asarray(mlp["gate_proj"]), fused[..., :width])
    np.testing.assert_array_equal(np.asarray(mlp["up_proj"]), fused[..., width:])
    np.testing.assert_array_equal(np.asarray(mlp["down_proj"]), down)
