"""The tiny random Gemma 3 folders of fixtures.tiny_gemma3 against what transformers 5.23 writes and loads."""

from __future__ import annotations

import hashlib
import json
import pathlib

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open
from transformers import AutoConfig, AutoProcessor, AutoTokenizer, Gemma3ForConditionalGeneration

from fixtures import tiny_gemma3 as dm

pytestmark = pytest.mark.reference

BOI, EOI, IMG = dm.BOI_TOKEN, dm.EOI_TOKEN, dm.IMAGE_TOKEN


def _disk_shapes(folder: pathlib.Path) -> dict[str, tuple[int, ...]]:
    files = sorted(folder.glob("*.safetensors"))
    out = {}
    for f in files:
        with safe_open(str(f), "np") as h:
            for k in h.keys():
                assert k not in out, f"{k} in two files"
                out[k] = tuple(h.get_slice(k).get_shape())
    return out


def _image(h=48, w=40, seed=0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def np_dir(tmp_path_factory):
    return dm.build_tiny_gemma3(tmp_path_factory.mktemp("np_gemma3"), seed=0)


# ------------------------------------------------------------------------------------------------ (a) keys, shapes


def test_special_ids_and_vocab_layout():
    vocab, merges = dm.tokenizer_vocab()
    ids = dm.SPECIAL_TOKEN_IDS
    assert [ids[t] for t in ("<pad>", "<eos>", "<bos>", "<unk>")] == [0, 1, 2, 3]
    assert ids[IMG] == len(vocab) - 1 == max(vocab.values())
    assert sorted(vocab.values()) == list(range(len(vocab)))
    assert 300 <= len(vocab) <= 512 and len(merges) == 128
    cfg = dm.TINY_GEMMA3_CONFIG
    assert cfg["image_token_index"] == ids[IMG] == cfg["text_config"]["vocab_size"]
    assert cfg["boi_token_index"] == ids[BOI] and cfg["eoi_token_index"] == ids[EOI]
    assert dm.TINY_GEMMA3_GENERATION_CONFIG["eos_token_id"] == [ids["<eos>"], ids["<end_of_turn>"]]


def without_incidental(config: dict) -> dict:
    """``config`` without the metadata a save writes incidentally (the writing library's version), at any depth."""
    return {k: without_incidental(v) if isinstance(v, dict) else v for k, v in config.items()
            if k != "transformers_version"}


def test_config_matches_hf_to_dict(tiny_gemma3_dir):
    """TINY_GEMMA3_CONFIG is exactly the config.json transformers writes for it."""
    saved = json.loads((tiny_gemma3_dir / "config.json").read_text())
    assert without_incidental(saved) == without_incidental(dm.TINY_GEMMA3_CONFIG)
    text = dm.TINY_GEMMA3_CONFIG["text_config"]
    assert text["layer_types"] == ["sliding_attention", "full_attention"]


def test_keys_and_shapes_match_hf_save(np_dir, tiny_gemma3_dir):
    ours = _disk_shapes(np_dir)
    theirs = _disk_shapes(tiny_gemma3_dir)
    assert ours == theirs
    assert ours == dm.gemma3_weight_shapes(dm.TINY_GEMMA3_CONFIG)


@pytest.mark.parametrize("overrides", [
    {"tie_word_embeddings": False, "vision_config": {"vision_use_head": True}},
    {"text_config": {"attention_bias": True, "num_hidden_layers": 2, "sliding_window": 8}},
])
def test_keys_and_shapes_match_hf_save_variants(tmp_path, overrides, make_hf_gemma3_fn):
    folder = dm.build_tiny_gemma3(tmp_path / "np", config_overrides=overrides)
    config = json.loads((folder / "config.json").read_text())
    make_hf_gemma3_fn(config).save_pretrained(tmp_path / "hf")
    assert _disk_shapes(folder) == _disk_shapes(tmp_path / "hf")


# ------------------------------------------------------------------------------------------------ (b) HF loads it


@pytest.mark.parametrize("variant", ["single", "sharded", "hub"])
def test_hf_loads_numpy_folder(tmp_path, variant):
    kwargs = {"single": {}, "sharded": {"shards": 3}, "hub": {"shards": 2, "layout": "hub"}}[variant]
    folder = dm.build_tiny_gemma3(tmp_path / variant, seed=0, **kwargs)
    model, info = Gemma3ForConditionalGeneration.from_pretrained(
        folder, output_loading_info=True, attn_implementation="eager", dtype=torch.float32)
    assert not any(info.values()), info
    assert AutoConfig.from_pretrained(folder).model_type == "gemma3"

    processor = AutoProcessor.from_pretrained(folder)
    msgs = [{"role": "user", "content": [{"type": "image", "image": _image()}, {"type": "text", "text": "Describe."}]}]
    inputs = processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True,
                                           return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (1, inputs["input_ids"].shape[1], dm.TINY_GEMMA3_CONFIG["text_config"]["vocab_size"])
    assert torch.isfinite(logits).all() and 0.05 < float(logits.std()) < 5.0


def test_hf_fixture_weights_are_all_randomised(hf_gemma3_model):
    for name, p in hf_gemma3_model.named_parameters():
        assert float(p.detach().std()) > 1e-3 or p.numel() == 1, name
        if name.endswith("norm.weight") and "vision_tower" not in name:  # Gemma RMSNorm, used as 1 + w
            assert float(p.detach().abs().mean()) < 0.5, name


# ------------------------------------------------------------------------------------------------ (c) processor


def test_processor_chat_template_and_image_expansion(np_dir):
    processor = AutoProcessor.from_pretrained(np_dir)
    assert type(processor).__name__ == "Gemma3Processor"
    tok = processor.tokenizer
    ids = dm.SPECIAL_TOKEN_IDS
    assert (tok.boi_token, tok.eoi_token, tok.image_token) == (BOI, EOI, IMG)
    assert (tok.boi_token_id, tok.eoi_token_id, tok.image_token_id) == (ids[BOI], ids[EOI], ids[IMG])
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id) == (2, 1, 0, 3)
    assert len(tok) == ids[IMG] + 1
    assert processor.image_seq_length == 16

    msgs = [{"role": "user", "content": [{"type": "image", "image": _image()}, {"type": "text", "text": "Describe."}]}]
    text = processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "<bos><start_of_turn>user\n<start_of_image>Describe.<end_of_turn>\n<start_of_turn>model\n"

    out = processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True,
                                        return_tensors="np")
    assert out["pixel_values"].shape == (1, 3, 64, 64)
    decoded = tok.decode(out["input_ids"][0])
    image_seq = f"\n\n{BOI}{IMG * 16}{EOI}\n\n"
    assert decoded == f"<bos><start_of_turn>user\n{image_seq}Describe.<end_of_turn>\n<start_of_turn>model\n"
    row = list(out["input_ids"][0])
    assert row.count(ids[IMG]) == 16 and row.count(ids["<bos>"]) == 1
    assert list(out["token_type_ids"][0]) == [int(t == ids[IMG]) for t in row]


def test_chat_template_system_and_turns(np_dir):
    tok = AutoTokenizer.from_pretrained(np_dir)
    msgs = [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": "  Hi there. "},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello!"}]},
        {"role": "user", "content": [{"type": "text", "text": "Bye"}]},
    ]
    text = tok.apply_chat_template(msgs, add_generation_prompt=False, tokenize=False)
    assert text == ("<bos><start_of_turn>user\nBe brief.\n\nHi there.<end_of_turn>\n"
                    "<start_of_turn>model\nHello!<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n")
    assert (np_dir / "chat_template.jinja").read_text() == dm.GEMMA3_CHAT_TEMPLATE


@pytest.mark.parametrize("text", [
    "The cat sat on the mat.",
    "  two leading spaces, and  double  spaces inside ",
    "Line one\nLine two\n\nafter a blank line\n",
    "Numbers 9:30, symbols {}[]<>|~ and unicode: café, naïve, 日本語, 🙂",
    "",
])
def test_tokenizer_round_trip(np_dir, text):
    tok = AutoTokenizer.from_pretrained(np_dir)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    with_bos = tok(text)["input_ids"]
    assert with_bos[0] == dm.SPECIAL_TOKEN_IDS["<bos>"] and with_bos[1:] == ids
    assert all(i < dm.SPECIAL_TOKEN_IDS[IMG] for i in ids)
    raw = dm.build_tokenizer()
    assert raw.encode(text, add_special_tokens=False).ids == ids


def test_processor_files_equal_hf_resave(np_dir, tmp_path):
    """Loading our files and saving them again with transformers gives the same files back."""
    AutoProcessor.from_pretrained(np_dir).save_pretrained(tmp_path)
    for name in ("processor_config.json", "tokenizer.json"):
        assert json.loads((tmp_path / name).read_text()) == json.loads((np_dir / name).read_text()), name
    # A loaded tokenizer also records where it came from and the named extra tokens it was given.
    resaved = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert resaved.pop("model_specific_special_tokens") == {"boi_token": BOI, "eoi_token": EOI, "image_token": IMG}
    resaved.pop("is_local", None)
    resaved.pop("local_files_only", None)
    assert resaved == json.loads((np_dir / "tokenizer_config.json").read_text())
    assert (tmp_path / "chat_template.jinja").read_text() == (np_dir / "chat_template.jinja").read_text()


def test_pan_and_scan_folder(tiny_gemma3_pas_dir):
    processor = AutoProcessor.from_pretrained(tiny_gemma3_pas_dir)
    ip = processor.image_processor
    assert ip.do_pan_and_scan is True and ip.pan_and_scan_min_crop_size == 32
    wide = _image(64, 160)
    out = processor(text=[f"{BOI} Describe."], images=[wide], return_tensors="np",
                    do_pan_and_scan=True, pan_and_scan_min_crop_size=32)
    assert out["pixel_values"].shape == (4, 3, 64, 64)  # the image and 3 crops
    assert list(out["input_ids"][0]).count(dm.SPECIAL_TOKEN_IDS[IMG]) == 4 * 16


# ------------------------------------------------------------------------------------------------ (d) sharding


def test_sharded_index_is_consistent(tmp_path, tiny_gemma3_sharded_dir):
    for folder in (dm.build_tiny_gemma3(tmp_path / "np", shards=4), tiny_gemma3_sharded_dir):
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        files = sorted(p.name for p in folder.glob("*.safetensors"))
        assert len(files) > 1 and not (folder / "model.safetensors").exists()
        assert sorted(set(index["weight_map"].values())) == files
        total = 0
        for fname in files:
            with safe_open(str(folder / fname), "np") as h:
                keys = set(h.keys())
                total += sum(h.get_tensor(k).nbytes for k in keys)
            assert keys == {k for k, f in index["weight_map"].items() if f == fname}
        assert index["metadata"]["total_size"] == total
    ours = json.loads((tmp_path / "np" / "model.safetensors.index.json").read_text())
    assert sorted(ours["weight_map"]) == sorted(dm.gemma3_weight_shapes(dm.TINY_GEMMA3_CONFIG))
    assert len(set(ours["weight_map"].values())) == 4


# ------------------------------------------------------------------------------------------------ (e) determinism


def _digest(folder: pathlib.Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_builds_are_deterministic(tmp_path):
    a = _digest(dm.build_tiny_gemma3(tmp_path / "a", seed=3))
    b = _digest(dm.build_tiny_gemma3(tmp_path / "b", seed=3))
    c = _digest(dm.build_tiny_gemma3(tmp_path / "c", seed=4))
    assert a == b
    assert a["model.safetensors"] != c["model.safetensors"]
    assert a["tokenizer.json"] == c["tokenizer.json"]


def test_config_overrides_are_nested(tmp_path):
    folder = dm.build_tiny_gemma3(tmp_path, config_overrides={"text_config": {"sliding_window": 8}})
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["text_config"]["sliding_window"] == 8
    assert cfg["text_config"]["hidden_size"] == 64 and cfg["vision_config"]["hidden_size"] == 32
    assert dm.TINY_GEMMA3_CONFIG["text_config"]["sliding_window"] == 16
