"""The tiny Llama 4 folders of tests/fixtures/llama4_checkpoint.py: what they hold, that transformers loads and runs them,
and that every weight is random."""

from __future__ import annotations

import json

import numpy as np
import pytest
import safetensors
import torch

import fixtures.llama4_checkpoint as lc
from fixtures.llama4_tokenizer import SPECIAL_TOKEN_IDS
from omnijax.preprocess.tokenizer import load_tokenizer

pytestmark = pytest.mark.reference


def _tensors(folder) -> dict[str, np.ndarray]:
    with safetensors.safe_open(str(folder / "model.safetensors"), "np") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _assert_all_random(tensors: dict[str, np.ndarray]) -> None:
    for name, value in tensors.items():
        assert value.dtype == np.float32, name
        assert np.unique(value).size > min(value.size // 2, 8), f"{name} looks constant"


def test_multimodal_folder(tiny_llama4_dir):
    files = {p.name for p in tiny_llama4_dir.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja", "processor_config.json"} <= files
    config = json.loads((tiny_llama4_dir / "config.json").read_text())
    assert config["model_type"] == "llama4" and config["architectures"] == ["Llama4ForConditionalGeneration"]
    text = config["text_config"]
    assert text["no_rope_layers"] == [1, 1, 1, 0]  # layer 3 is NoPE
    assert text["layer_types"] == ["chunked_attention"] * 3 + ["full_attention"]
    assert text["moe_layers"] == [1, 3] and text["attention_chunk_size"] == 32
    assert text["attn_temperature_tuning"] and text["floor_scale"] == 8
    assert text["rope_parameters"]["rope_type"] == "llama3"
    assert config["image_token_index"] == SPECIAL_TOKEN_IDS["<|patch|>"]
    tensors = _tensors(tiny_llama4_dir)
    _assert_all_random(tensors)
    assert "language_model.model.layers.1.feed_forward.shared_expert.gate_proj.weight" in tensors
    assert tensors["language_model.model.layers.1.feed_forward.experts.gate_up_proj"].shape == (4, 64, 64)
    assert "language_model.model.layers.0.feed_forward.gate_proj.weight" in tensors  # dense layer
    generation = json.loads((tiny_llama4_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [SPECIAL_TOKEN_IDS[t] for t in ("<|end_of_text|>", "<|eom|>", "<|eot|>")]


def test_text_folder(tiny_llama4_text_dir, hf_llama4_text_model):
    config = json.loads((tiny_llama4_text_dir / "config.json").read_text())
    assert config["model_type"] == "llama4_text" and config["architectures"] == ["Llama4ForCausalLM"]
    tensors = _tensors(tiny_llama4_text_dir)
    _assert_all_random(tensors)
    assert all(k.startswith(("model.", "lm_head.")) for k in tensors)
    assert not (tiny_llama4_text_dir / "processor_config.json").exists()
    # A prompt over the attention chunk (32) and the temperature-tuning floor runs in the reference.
    ids = torch.arange(40)[None] % 400
    with torch.no_grad():
        logits = hf_llama4_text_model(input_ids=ids).logits
    assert logits.shape == (1, 40, config["vocab_size"]) and torch.isfinite(logits).all()


def test_tokenizer_and_chat_template(tiny_llama4_dir):
    tokenizer = load_tokenizer(tiny_llama4_dir)
    vocab = tokenizer.get_vocab()
    for token, idx in SPECIAL_TOKEN_IDS.items():
        assert vocab[token] == idx
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."},
         {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}],
        tokenize=False, add_generation_prompt=True)
    assert text == ("<|begin_of_text|><|header_start|>system<|header_end|>\n\nBe brief.<|eot|>"
                    "<|header_start|>user<|header_end|>\n\n<|image|>What is it?<|eot|>"
                    "<|header_start|>assistant<|header_end|>\n\n")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text


def test_builds_are_deterministic(tmp_path, tiny_llama4_dir):
    again = lc.build_tiny_llama4(tmp_path / "again")
    first, second = _tensors(tiny_llama4_dir), _tensors(again)
    assert first.keys() == second.keys()
    assert all(np.array_equal(first[k], second[k]) for k in first)
    assert (tiny_llama4_dir / "tokenizer.json").read_text() == (again / "tokenizer.json").read_text()
