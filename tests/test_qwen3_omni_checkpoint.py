"""The tiny Qwen3-Omni checkpoint folders of ``qwen3_omni_checkpoint``: they load in transformers with every tensor
accounted for and random, the tokenizer and chat template match the Qwen3-Omni layout, the processor expands one
image and one audio clip to the right number of placeholders, and the reference thinker runs and generates."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import PIL.Image
import pytest
import safetensors
import torch
from transformers import (AutoProcessor, AutoTokenizer, Qwen3OmniMoeForConditionalGeneration, Qwen3OmniMoeProcessor,
                          Qwen3OmniMoeThinkerForConditionalGeneration)
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

import fixtures.qwen3_omni_checkpoint as qc
import fixtures.qwen3_omni_tokenizer as qt

pytestmark = pytest.mark.reference

SR = 16000
SYSTEM = "You are a helpful assistant."
QUESTION = "What is in the picture?"




def _image() -> PIL.Image.Image:
    """A 64 x 48 (width x height) random RGB image."""
    return PIL.Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8))


def _clip(seconds: float = 1.0) -> np.ndarray:
    """Random noise at 16 kHz, float32 [seconds * 16000]."""
    return (0.1 * np.random.default_rng(1).standard_normal(int(seconds * SR))).astype(np.float32)


def _messages(image, clip) -> list[dict]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [{"type": "image", "image": image}, {"type": "audio", "audio": clip},
                                     {"type": "text", "text": QUESTION}]},
    ]


def _inputs(processor, image=None, clip=None):
    return processor.apply_chat_template(_messages(image or _image(), _clip() if clip is None else clip),
                                         add_generation_prompt=True, tokenize=True, return_dict=True,
                                         return_tensors="pt")


def _tensors(path) -> dict[str, torch.Tensor]:
    with safetensors.safe_open(str(path / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


# ---------------------------------------------------------------------------------------------------------------
# tokenizer, chat template, configs


def test_tokenizer_training_is_deterministic():
    assert qt._train_tokenizer().to_str() == qt._train_tokenizer().to_str()
    # Every run (a new process, new hash seeds) learns the same merges.
    assert qc.role_token_ids() == {"system": 425, "user": 296, "assistant": 305}
    assert qc.build_tokenizer().encode("The river town wakes early.").ids == [297, 371, 411, 77, 337, 74, 275, 387,
                                                                             271, 75, 88, 13]


def test_special_token_ids_follow_the_qwen3_omni_order():
    ids = qc.SPECIAL_TOKEN_IDS
    assert ids["<|endoftext|>"] == 448 and ids["<|audio_pad|>"] == 480 == qc.VOCAB_SIZE - 1
    # Offsets from <|endoftext|> are the real vocabulary's (151643 -> 151655 for <|image_pad|>, ...).
    real = {"<|im_start|>": 151644, "<|im_end|>": 151645, "<|vision_start|>": 151652, "<|vision_end|>": 151653,
            "<|image_pad|>": 151655, "<|video_pad|>": 151656, "<|audio_start|>": 151669, "<|audio_end|>": 151670,
            "<tts_pad>": 151671, "<tts_text_bos>": 151672, "<tts_text_eod>": 151673, "<|audio_pad|>": 151675}
    for tok, real_id in real.items():
        assert ids[tok] - ids["<|endoftext|>"] == real_id - 151643, tok
    roles = qc.role_token_ids()
    assert len(set(roles.values())) == 3 and all(i < 448 for i in roles.values())


def test_hf_tokenizer_matches_the_tokenizers_pipeline(tiny_qwen_dir):
    hf = AutoTokenizer.from_pretrained(tiny_qwen_dir)
    raw = qc.build_tokenizer()
    assert type(hf).__name__ == "Qwen2Tokenizer"
    assert len(hf) == qc.VOCAB_SIZE
    text = ("<|im_start|>user\nThe river town wakes early, at 7:15! Ünïcode déjà vu 雨.<|image_pad|>"
            "<|audio_start|><|audio_pad|><|audio_end|><|im_end|>\n<|im_start|>assistant\n")
    ids = hf(text, add_special_tokens=False)["input_ids"]
    assert ids == raw.encode(text, add_special_tokens=False).ids
    assert hf.decode(ids) == text
    for attr, tok in qt._MODEL_SPECIFIC_TOKENS.items():
        assert getattr(hf, attr) == tok
        assert getattr(hf, attr + "_id") == qc.SPECIAL_TOKEN_IDS[tok]
    assert hf.eos_token == "<|im_end|>" and hf.pad_token == "<|endoftext|>" and hf.bos_token is None
    assert hf.convert_ids_to_tokens(qc.role_token_ids()["assistant"]) == "assistant"


def test_chat_template_renders_system_image_audio_and_text(hf_qwen_processor):
    processor = hf_qwen_processor
    text = processor.apply_chat_template(_messages(_image(), _clip()), add_generation_prompt=True, tokenize=False)
    assert text == (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
        f"<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|><|audio_start|><|audio_pad|><|audio_end|>"
        f"{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    )
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
             {"role": "user", "content": [{"type": "text", "text": "Bye"}]}]
    assert processor.apply_chat_template(turns, tokenize=False) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
    )


def test_configs_hold_the_tokenizer_ids(tiny_qwen_dir, tiny_qwen_full_dir):
    thinker = json.loads((tiny_qwen_dir / "config.json").read_text())
    assert thinker["model_type"] == "qwen3_omni_moe_thinker"
    assert thinker["text_config"]["vocab_size"] == qc.VOCAB_SIZE
    assert thinker["image_token_id"] == qc.SPECIAL_TOKEN_IDS["<|image_pad|>"]
    assert thinker["audio_token_id"] == qc.SPECIAL_TOKEN_IDS["<|audio_pad|>"]
    assert thinker["vision_start_token_id"] == qc.SPECIAL_TOKEN_IDS["<|vision_start|>"]
    assert thinker["audio_start_token_id"] == qc.SPECIAL_TOKEN_IDS["<|audio_start|>"]
    assert thinker["audio_config"]["num_mel_bins"] == qc.FEATURE_EXTRACTOR_CONFIG["feature_size"]
    full = json.loads((tiny_qwen_full_dir / "config.json").read_text())
    assert full["model_type"] == "qwen3_omni_moe"
    full_text = full["thinker_config"]["text_config"]
    assert {k: full_text[k] for k in thinker["text_config"]} == thinker["text_config"]
    assert full["user_token_id"] == qc.role_token_ids()["user"] == thinker["user_token_id"]
    gen = json.loads((tiny_qwen_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [qc.SPECIAL_TOKEN_IDS["<|im_end|>"], qc.SPECIAL_TOKEN_IDS["<|endoftext|>"]]


# ---------------------------------------------------------------------------------------------------------------
# weights


def _assert_all_random(tensors: dict[str, torch.Tensor]) -> None:
    for name, t in tensors.items():
        assert t.dtype == torch.float32, name
        assert t.numel() == 1 or float(t.std()) > 0, f"{name} is constant"
        assert not bool((t == 0).any()) and not bool((t == 1).any()), f"{name} keeps a 0 or 1 initialisation"


def test_thinker_folder_loads_with_every_tensor_and_random_weights(tiny_qwen_dir):
    tensors = _tensors(tiny_qwen_dir)
    assert {k.split(".")[0] for k in tensors} == {"model", "visual", "audio_tower", "lm_head"}
    assert "model.layers.0.mlp.experts.7.gate_proj.weight" in tensors  # experts saved one by one
    assert "model.layers.1.mlp.gate_proj.weight" in tensors  # the dense layer
    _assert_all_random(tensors)
    model, info = Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained(tiny_qwen_dir, output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set() and info["mismatched_keys"] == set()
    norms = model.model.language_model.layers[0].input_layernorm.weight.detach()
    assert abs(float(norms.mean()) - 1.0) < 0.1  # weight-times-x norms centred on 1


def test_full_folder_loads_and_shares_the_thinker_weights(tiny_qwen_dir, tiny_qwen_full_dir):
    tensors = _tensors(tiny_qwen_full_dir)
    assert {k.split(".")[0] for k in tensors} == {"thinker", "talker", "code2wav"}
    _assert_all_random(tensors)
    _, info = Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_qwen_full_dir, output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set() and info["mismatched_keys"] == set()
    # Same seed, same parameter order: the full model's thinker is the thinker folder's model.
    thinker = _tensors(tiny_qwen_dir)
    assert {k[len("thinker."):] for k in tensors if k.startswith("thinker.")} == set(thinker)
    for k, t in thinker.items():
        assert torch.equal(tensors["thinker." + k], t), k
    model, processor = qc.load_reference(tiny_qwen_full_dir)
    assert type(model).__name__ == "Qwen3OmniMoeThinkerForConditionalGeneration" and not model.training
    assert torch.equal(model.lm_head.weight, thinker["lm_head.weight"])
    assert isinstance(processor, Qwen3OmniMoeProcessor)


# ---------------------------------------------------------------------------------------------------------------
# processor and reference model


def test_processor_expands_one_image_and_one_audio_clip(hf_qwen_processor):
    processor = hf_qwen_processor
    inputs = _inputs(processor)
    ids = inputs["input_ids"][0]
    grid = inputs["image_grid_thw"]
    assert grid.tolist() == [[1, 12, 16]]  # 48 x 64 pixels in 4-pixel patches
    assert int((ids == qc.SPECIAL_TOKEN_IDS["<|image_pad|>"]).sum()) == int(grid.prod()) // 4 == 48
    assert tuple(inputs["pixel_values"].shape) == (192, 3 * 2 * 4 * 4)
    assert tuple(inputs["input_features"].shape) == (1, 128, 100)
    frames = inputs["feature_attention_mask"].sum(-1)
    assert int((ids == qc.SPECIAL_TOKEN_IDS["<|audio_pad|>"]).sum()) == int(_get_feat_extract_output_lengths(frames))
    assert int(_get_feat_extract_output_lengths(frames)) == 13
    for start, end in (("<|vision_start|>", "<|vision_end|>"), ("<|audio_start|>", "<|audio_end|>")):
        assert int((ids == qc.SPECIAL_TOKEN_IDS[start]).sum()) == int((ids == qc.SPECIAL_TOKEN_IDS[end]).sum()) == 1


def test_a_12_second_clip_spans_several_encoder_windows(hf_qwen_thinker, hf_qwen_processor):
    inputs = _inputs(hf_qwen_processor, clip=_clip(12.0))
    assert tuple(inputs["input_features"].shape) == (1, 128, 1200)
    # 12 chunks of 100 frames, 13 tokens each.
    assert int((inputs["input_ids"][0] == qc.SPECIAL_TOKEN_IDS["<|audio_pad|>"]).sum()) == 156
    seen = []
    layer = hf_qwen_thinker.model.audio_tower.layers[0]
    handle = layer.register_forward_pre_hook(lambda module, args: seen.append(args[1].clone()))
    try:
        with torch.no_grad():
            audio = hf_qwen_thinker.get_audio_features(inputs["input_features"],
                                                       feature_attention_mask=inputs["feature_attention_mask"])
    finally:
        handle.remove()
    assert tuple(audio.pooler_output.shape) == (156, 64)
    # Attention windows of n_window_infer = 200 frames: 6 windows of 26 tokens.
    assert torch.diff(seen[0]).tolist() == [26] * 6


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None, reason="torchvision is installed")
def test_without_torchvision_the_processor_leaves_video_out(tiny_qwen_dir, hf_qwen_processor):
    with pytest.raises(ImportError, match="(?i)torchvision"):
        AutoProcessor.from_pretrained(tiny_qwen_dir)
    assert type(hf_qwen_processor).__name__ == "Qwen3OmniMoeProcessorWithoutVideo"
    assert isinstance(hf_qwen_processor, Qwen3OmniMoeProcessor)
    assert type(hf_qwen_processor.image_processor).__name__ == "Qwen2VLImageProcessorPil"
    assert hf_qwen_processor.feature_extractor.feature_size == 128


def test_reference_thinker_forward_and_greedy_generate(hf_qwen_thinker, hf_qwen_processor):
    model, processor = hf_qwen_thinker, hf_qwen_processor
    inputs = _inputs(processor)
    with torch.no_grad():
        logits = model(**inputs).logits
        other_image = model(**_inputs(processor, image=_image().transpose(PIL.Image.Transpose.FLIP_LEFT_RIGHT))).logits
        other_clip = model(**_inputs(processor, clip=_clip()[::-1].copy())).logits
    length = inputs["input_ids"].shape[1]
    assert tuple(logits.shape) == (1, length, qc.VOCAB_SIZE)
    assert bool(torch.isfinite(logits).all())
    assert 0.05 < float(logits.std()) < 10.0  # moderate logits
    # The image and the audio both reach the last position.
    assert float((other_image[0, -1] - logits[0, -1]).abs().max()) > 0.1
    assert float((other_clip[0, -1] - logits[0, -1]).abs().max()) > 0.01

    out = model.generate(**inputs, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    new = out[0, length:]
    assert new.shape == (8,)
    assert int(new[0]) == int(logits[0, -1].argmax())
