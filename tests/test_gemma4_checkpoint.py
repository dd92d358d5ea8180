"""The tiny Gemma 4 folders of ``gemma4_checkpoint``: published config layouts that transformers loads, every tensor
random, the layout-specific tensors present, the tokenizer / chat template / processor / generation files, and the
reference models running on an image (and audio) prompt longer than the sliding window."""

from __future__ import annotations

import json

import numpy as np
import PIL.Image
import pytest
import safetensors
import torch
from transformers import AutoTokenizer
from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

import fixtures.gemma4_checkpoint as g4
import fixtures.gemma4_tokenizer as gt

pytestmark = pytest.mark.reference


def _tensors(folder) -> dict[str, np.ndarray]:
    with safetensors.safe_open(str(folder / "model.safetensors"), "np") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _config(folder) -> dict:
    return json.loads((folder / "config.json").read_text())


def test_tokenizer_is_deterministic_and_ordered():
    assert gt._learned_vocab() == gt._learned_vocab()
    ids = g4.SPECIAL_TOKEN_IDS
    assert (ids["<pad>"], ids["<eos>"], ids["<bos>"]) == (0, 1, 2)
    # The real vocabulary's order: <|tool_response>(50) < <|turn>(105) < <turn|>(106) < <|image>(255999) <
    # <|audio>(256000) < <|image|>(258880) < <|audio|> < <image|> < <audio|> < <|video|>(258884), the last id.
    order = ["<|tool_response>", "<|turn>", "<turn|>", "<|image>", "<|audio>", "<|image|>", "<|audio|>", "<image|>",
             "<audio|>", "<|video|>"]
    assert [ids[t] for t in order] == sorted(ids[t] for t in order)
    assert ids["<|video|>"] == g4.VOCAB_SIZE - 1 and ids["<|image|>"] - ids["<|image>"] == 2


def test_published_config_layouts(tiny_gemma4_small_dir, tiny_gemma4_moe_dir, tiny_gemma4_text_dir):
    from transformers import AutoConfig

    small, moe, text = (_config(f) for f in (tiny_gemma4_small_dir, tiny_gemma4_moe_dir, tiny_gemma4_text_dir))
    assert small["architectures"] == ["Gemma4ForConditionalGeneration"] and small["model_type"] == "gemma4"
    assert text["architectures"] == ["Gemma4ForCausalLM"] and text["model_type"] == "gemma4_text"
    for tc in (small["text_config"], moe["text_config"], text):
        assert "per_layer_config" not in tc and tc["global_head_dim"] == 32 and tc["head_dim"] == 16
        assert tc["sliding_window"] == 16 and tc["final_logit_softcapping"] == 4.0
    assert small["text_config"]["num_global_key_value_heads"] is None and not small["text_config"]["attention_k_eq_v"]
    assert moe["text_config"]["num_global_key_value_heads"] == 1 and moe["text_config"]["attention_k_eq_v"]
    assert small["audio_config"]["model_type"] == "gemma4_audio" and moe.get("audio_config") is None
    assert small["vision_config"]["use_clipped_linears"] and not small["vision_config"]["standardize"]
    assert moe["vision_config"]["standardize"] and not moe["vision_config"]["use_clipped_linears"]
    assert small["image_token_id"] == g4.SPECIAL_TOKEN_IDS["<|image|>"]
    assert small["eoa_token_index"] == small["eoa_token_id"] == g4.SPECIAL_TOKEN_IDS["<audio|>"]
    # transformers rebuilds the full layers' own sizes from the published keys.
    for folder, sliding_kv, full_kv in ((tiny_gemma4_small_dir, 1, 1), (tiny_gemma4_moe_dir, 2, 1)):
        tc = AutoConfig.from_pretrained(folder).get_text_config()
        for i, layer_type in enumerate(tc.layer_types):
            layer = tc.per_layer_config[i]
            full = layer_type == "full_attention"
            assert (layer.head_dim, layer.num_key_value_heads) == ((32, full_kv) if full else (16, sliding_kv))


def test_every_tensor_is_random(tiny_gemma4_small_dir, tiny_gemma4_moe_dir, tiny_gemma4_text_dir):
    for folder in (tiny_gemma4_small_dir, tiny_gemma4_moe_dir, tiny_gemma4_text_dir):
        for name, value in _tensors(folder).items():
            assert np.isfinite(value).all(), name
            if value.size > 1:
                assert np.unique(value).size > value.size // 2, name
            else:
                assert value.item() not in (0.0, 1.0, -1.0), name
    clip = {k: v.item() for k, v in _tensors(tiny_gemma4_small_dir).items() if k.endswith(("_min", "_max"))}
    assert clip and all((v < 0) == k.endswith("_min") for k, v in clip.items())


def test_layout_tensors(tiny_gemma4_small_dir, tiny_gemma4_moe_dir, tiny_gemma4_text_dir):
    small, moe, text = (_tensors(f) for f in (tiny_gemma4_small_dir, tiny_gemma4_moe_dir, tiny_gemma4_text_dir))
    lm = "model.language_model."
    # Small: per-layer embeddings; layers 3..5 reuse keys / values (no k / v projections) and have double-wide MLPs.
    assert small[f"{lm}embed_tokens_per_layer.weight"].shape == (g4.VOCAB_SIZE, 6 * 8)
    for i in range(6):
        shared = i >= 3
        assert (f"{lm}layers.{i}.self_attn.k_proj.weight" in small) != shared
        assert small[f"{lm}layers.{i}.mlp.gate_proj.weight"].shape == ((192 if shared else 96), 64)
    assert small[f"{lm}layers.2.self_attn.q_proj.weight"].shape == (4 * 32, 64)  # full layer: global head dim
    assert any(k.startswith("model.audio_tower.") for k in small)
    assert "model.embed_audio.embedding_projection.weight" in small
    # MoE: full layers take values from their keys (no v_proj) with 1 kv head of 32; experts in parallel.
    assert f"{lm}layers.2.self_attn.v_proj.weight" not in moe and f"{lm}layers.1.self_attn.v_proj.weight" in moe
    assert moe[f"{lm}layers.2.self_attn.k_proj.weight"].shape == (32, 64)
    assert moe[f"{lm}layers.0.experts.gate_up_proj"].shape == (8, 2 * 16, 64)
    assert moe[f"{lm}layers.0.router.per_expert_scale"].shape == (8,)
    assert not any(k.startswith(("model.audio_tower.", "model.embed_audio.")) for k in moe)
    assert not any("per_layer" in k for k in moe)
    # Text only: Gemma4ForCausalLM keys, the small layout's text tensors, tied head.
    assert {k.replace("model.", lm, 1) for k in text} == {k for k in small if k.startswith(lm)}
    assert "lm_head.weight" not in text


def test_tokenizer_template_and_generation_files(tiny_gemma4_small_dir, tiny_gemma4_text_dir):
    for folder in (tiny_gemma4_small_dir, tiny_gemma4_text_dir):
        tok = AutoTokenizer.from_pretrained(folder)
        assert tok.image_token == "<|image|>" and tok.boa_token == "<|audio>" and tok.eot_token == "<turn|>"
        assert tok("Describe the picture.")["input_ids"][0] != g4.SPECIAL_TOKEN_IDS["<bos>"]  # no added <bos>
        messages = [{"role": "system", "content": " Be brief. "},
                    {"role": "user", "content": [{"type": "image"}, {"type": "audio"},
                                                 {"type": "text", "text": " What is this? "}]},
                    {"role": "assistant", "content": "<|channel>thought\nhmm<channel|>A cat."},
                    {"role": "user", "content": "Sure?"}]
        assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
            "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\n<|image|><|audio|>What is this?<turn|>\n"
            "<|turn>model\nA cat.<turn|>\n<|turn>user\nSure?<turn|>\n<|turn>model\n")
        generation = json.loads((folder / "generation_config.json").read_text())
        ids = g4.SPECIAL_TOKEN_IDS
        assert generation["eos_token_id"] == [ids["<eos>"], ids["<turn|>"], ids["<|tool_response>"]]
    assert not (tiny_gemma4_text_dir / "processor_config.json").exists()


def test_processor_files(hf_gemma4_small):
    _, processor = hf_gemma4_small
    assert isinstance(processor.image_processor, Gemma4ImageProcessorPil)
    assert (processor.image_processor.patch_size, processor.image_processor.max_soft_tokens) == (4, 70)
    assert processor.image_seq_length == 70 and processor.audio_seq_length == 750
    fe = processor.feature_extractor
    published = Gemma4AudioFeatureExtractor()
    assert isinstance(fe, Gemma4AudioFeatureExtractor)
    for key in ("feature_size", "sampling_rate", "frame_length", "hop_length", "fft_length", "mel_floor",
                "min_frequency", "max_frequency", "preemphasis", "dither", "input_scale_factor"):
        assert getattr(fe, key) == getattr(published, key), key


def test_reference_models_run_past_the_sliding_window(hf_gemma4_small, hf_gemma4_moe):
    image = PIL.Image.fromarray(np.random.default_rng(0).integers(0, 256, (60, 60, 3), np.uint8))
    clip = (0.1 * np.random.default_rng(1).standard_normal(16000)).astype(np.float32)
    for (model, processor), with_audio in ((hf_gemma4_small, True), (hf_gemma4_moe, False)):
        content = [{"type": "image"}] + ([{"type": "audio"}] if with_audio else []) + [
            {"type": "text", "text": "What is this?"}]
        text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                             tokenize=False)
        inputs = processor(text=[text], images=[[image]], audio=[clip] if with_audio else None, return_tensors="pt")
        n_image = int((inputs["input_ids"] == g4.SPECIAL_TOKEN_IDS["<|image|>"]).sum())
        assert n_image > model.config.text_config.sliding_window
        with torch.no_grad():
            logits = model(**inputs).logits
        assert logits.shape == (1, inputs["input_ids"].shape[1], g4.VOCAB_SIZE)
        assert torch.isfinite(logits).all() and logits.abs().max() <= 4.0  # the final softcap
