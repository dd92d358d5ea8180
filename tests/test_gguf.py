"""GGUF files: the header reader against gguf's own reader, dequantization per ggml type, name mapping, the
metadata -> config rules, a tiny gemma3 file end to end against transformers' GGUF loader, and bad files."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from omnijax.app.checkpoint_source import open_checkpoint
from omnijax.app.gguf.arch import GGUFMetadata, gguf_tensor_name, unpermute_rotary_rows
from omnijax.app.gguf.dequant import dequantize_tensor
from omnijax.app.gguf.file import GGUFFile, StringArray
from omnijax.app.pipeline import Pipeline
from omnijax.common.errors import CheckpointError, PromptError, UnsupportedModelError
from fixtures.tiny_gguf import DEFAULT_TYPES, write_tiny_gemma3_gguf
from fixtures.step_shapes import few_step_shapes

pytestmark = pytest.mark.reference

CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
                 "{{ m['content'] if m['content'] is string else m['content'][0]['text'] }}<end_of_turn>\n"
                 "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
PROMPTS = ["the quick brown fox", "a long walk along the river bank, past the old mill and the quiet houses"]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A tiny gemma3 GGUF (every type of DEFAULT_TYPES) without a chat template (a base model), alone in its
    folder."""
    return write_tiny_gemma3_gguf(tmp_path_factory.mktemp("tiny_gguf") / "tiny-gemma3.gguf")


@pytest.fixture(scope="module")
def tiny_gguf_pipe(tiny_gguf):
    return few_step_shapes(Pipeline.from_pretrained(tiny_gguf))


@pytest.fixture(scope="module")
def chat_gguf(tmp_path_factory):
    """The same model with a chat template in its metadata."""
    return write_tiny_gemma3_gguf(tmp_path_factory.mktemp("chat_gguf") / "chat.gguf", chat_template=CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def hf_from_gguf(tiny_gguf):
    """transformers' own GGUF loading of the same file: float32, eager attention."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name,
                                                 dtype=torch.float32, attn_implementation="eager").eval()
    return model, AutoTokenizer.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name)


def test_header_matches_the_gguf_package_reader(tiny_gguf):
    import gguf

    ours, ref = GGUFFile(tiny_gguf), gguf.GGUFReader(str(tiny_gguf))
    assert list(ours.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        info = ours.tensors[t.name]
        assert (info.shape, info.ggml_type, info.offset, info.nbytes) == \
            (tuple(int(d) for d in reversed(t.shape)), int(t.tensor_type), int(t.data_offset), int(t.n_bytes))
        assert np.array_equal(ours.read(info).reshape(-1), np.asarray(t.data).view(np.uint8).reshape(-1))
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        value = field.contents()
        if isinstance(ours.metadata[key], np.ndarray):
            np.testing.assert_array_equal(ours.metadata[key], value)
        else:
            assert ours.metadata[key] == pytest.approx(value) if isinstance(value, float) else \
                ours.metadata[key] == value, key
    assert ours.architecture == "gemma3"
    ours.close()


def test_long_string_arrays_are_kept_as_their_length(tmp_path):
    import gguf

    path = tmp_path / "vocab.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_token_list([f"t{i}" for i in range(5000)])
    writer.add_array("test.names", ["a", "bc"])
    writer.add_tensor("x.weight", np.arange(6, dtype=np.float32).reshape(2, 3))
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    f = GGUFFile(path)
    assert f.metadata["tokenizer.ggml.tokens"] == StringArray(5000) and len(f.metadata["tokenizer.ggml.tokens"]) == 5000
    assert f.metadata["test.names"] == ["a", "bc"]
    np.testing.assert_array_equal(f.read(f.tensors["x.weight"]).view(np.float32), [[0, 1, 2], [3, 4, 5]])
    whole = GGUFFile(path, string_arrays=("tokenizer.ggml.tokens",)).metadata  # asked for by key: read whole
    assert whole["tokenizer.ggml.tokens"] == [f"t{i}" for i in range(5000)]


GGUF_TOKENIZER_TEXTS = ["The capital of France is", "  two  spaces\tand\nlines ", "<bos>special<eos> text", "日本 🙂",
                        "", "<start_of_turn>user\nhi<end_of_turn>"]
BUILD_WITHOUT_TORCH = """
import json
from omnijax.app.gguf.file import GGUFFile
from omnijax.preprocess.tokenizer import GGUF_TOKENIZER_STRING_ARRAYS, cached_gguf_tokenizer
path, cache, texts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
tok = cached_gguf_tokenizer(path, "gemma3_text", GGUFFile(path).data_start, cache,
                            lambda: GGUFFile(path, string_arrays=GGUF_TOKENIZER_STRING_ARRAYS).metadata)
print(json.dumps({"class": type(tok).__name__, "backend": tok.backend_tokenizer.to_str(),
                  "special": tok.all_special_tokens, "template": tok.chat_template,
                  "ids": [tok(t, add_special_tokens=s)["input_ids"] for t in texts for s in (True, False)]}))
"""


def test_the_gguf_tokenizer_is_the_one_transformers_builds_and_needs_no_torch(tmp_path):
    """omnijax reads the vocabulary with its own GGUF reader (transformers' imports torch, which a user's install
    lacks) and builds the tokenizer with transformers' converter and class: the same as
    ``from_pretrained(folder, gguf_file=name)``, in a process where torch cannot be imported too."""
    import json

    from transformers import AutoTokenizer

    from fixtures.child_path import run_without_torch
    from omnijax.preprocess.tokenizer import GGUF_TOKENIZER_STRING_ARRAYS, load_gguf_tokenizer

    template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    path = write_tiny_gemma3_gguf(tmp_path / "chat.gguf", chat_template=template)
    ref = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    ours = load_gguf_tokenizer(GGUFFile(path, string_arrays=GGUF_TOKENIZER_STRING_ARRAYS).metadata, "gemma3_text",
                               str(path))
    assert type(ours) is type(ref) and ours.backend_tokenizer.to_str() == ref.backend_tokenizer.to_str()
    assert ours.get_vocab() == ref.get_vocab()
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "all_special_tokens", "chat_template",
                 "add_bos_token", "add_eos_token", "padding_side", "model_max_length"):
        assert getattr(ours, attr) == getattr(ref, attr), attr
    child = run_without_torch(BUILD_WITHOUT_TORCH, path, tmp_path / "cache", json.dumps(GGUF_TOKENIZER_TEXTS))
    assert child.returncode == 0, child.stderr[-3000:]
    assert "PyTorch was not found" not in child.stderr  # the notice does not apply to omnijax
    built = json.loads(child.stdout.strip().splitlines()[-1])
    assert built["class"] == type(ref).__name__ and built["backend"] == ref.backend_tokenizer.to_str()
    assert built["special"] == ref.all_special_tokens and built["template"] == template == ref.chat_template
    assert built["ids"] == [ref(t, add_special_tokens=s)["input_ids"] for t in GGUF_TOKENIZER_TEXTS
                            for s in (True, False)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dequantize_each_type_in_row_chunks_equals_gguf(tiny_gguf, dtype):
    import gguf
    from gguf.quants import dequantize

    from omnijax.app.checkpoint import numpy_dtype

    f = GGUFFile(tiny_gguf)
    types = {gguf.GGMLQuantizationType(i.ggml_type).name for i in f.tensors.values()}
    assert set(DEFAULT_TYPES.values()) | {"F32"} <= types  # Q4_K Q6_K Q8_0 Q4_0 Q5_0 F16 BF16 F32
    target = numpy_dtype(dtype)
    for info in f.tensors.values():
        whole = dequantize(f.read(info), gguf.GGMLQuantizationType(info.ggml_type)).reshape(info.shape)
        ours = dequantize_tensor(lambda part, i=info: f.read(i, part), info, target, chunk_bytes=1000)
        assert ours.dtype == target and ours.shape == info.shape
        np.testing.assert_array_equal(ours, whole.astype(np.float32).astype(target), err_msg=info.name)
        assert np.all(np.isfinite(whole)) and np.abs(whole).max() > 0, info.name


def test_hf_names_map_to_gguf_names():
    assert gguf_tensor_name("gemma3", 18, "model.embed_tokens.weight") == "token_embd.weight"
    assert gguf_tensor_name("gemma3", 18, "model.norm.weight") == "output_norm.weight"
    assert gguf_tensor_name("gemma3", 18, "model.layers.3.self_attn.q_proj.weight") == "blk.3.attn_q.weight"
    assert gguf_tensor_name("gemma3", 18, "model.layers.3.post_attention_layernorm.weight") == \
        "blk.3.post_attention_norm.weight"
    assert gguf_tensor_name("gemma3", 18, "model.layers.3.pre_feedforward_layernorm.weight") == "blk.3.ffn_norm.weight"
    assert gguf_tensor_name("gemma3", 18, "model.layers.3.mlp.down_proj.weight") == "blk.3.ffn_down.weight"
    assert gguf_tensor_name("gemma3", 18, "vision_tower.x.weight") is None


def test_unpermute_rotary_rows_undoes_llama_cpp_permute():
    def llama_cpp_permute(w, n_head):  # convert_hf_to_gguf.py LlamaModel.permute
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    w = np.random.default_rng(0).standard_normal((3 * 8, 5)).astype(np.float32)
    np.testing.assert_array_equal(unpermute_rotary_rows(llama_cpp_permute(w, 3), 3), w)
    assert not np.array_equal(llama_cpp_permute(w, 3), w)
    with pytest.raises(CheckpointError, match="rotary pairs"):
        unpermute_rotary_rows(w[:7], 3)


def _meta(**overrides) -> GGUFMetadata:
    base = {"general.architecture": "gemma3", "gemma3.embedding_length": 640, "gemma3.block_count": 12,
            "gemma3.feed_forward_length": 2048, "gemma3.attention.head_count": 4,
            "gemma3.attention.head_count_kv": 1, "gemma3.attention.key_length": 256,
            "gemma3.attention.sliding_window": 512, "gemma3.rope.freq_base": 1e6,
            "tokenizer.ggml.eos_token_id": 1, "tokenizer.ggml.eot_token_id": 106, "tokenizer.ggml.bos_token_id": 2}
    base.update(overrides)
    return GGUFMetadata({k: v for k, v in base.items() if v is not None}, {"token_embd.weight": (1000, 640)}, "m.gguf")


def test_gemma3_config_from_metadata_follows_llama_cpp():
    from omnijax.app.families.gemma3.spec import gguf_config

    cfg = gguf_config(_meta())
    assert cfg["layer_types"] == (["sliding_attention"] * 5 + ["full_attention"]) * 2
    assert cfg["rope_parameters"] == {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                      "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    assert (cfg["query_pre_attn_scalar"], cfg["head_dim"], cfg["vocab_size"]) == (256, 256, 1000)
    assert cfg["eos_token_id"] == [1, 106] and cfg["tie_word_embeddings"] and cfg["model_type"] == "gemma3_text"
    scaled = gguf_config(_meta(**{"gemma3.rope.scaling.type": "linear", "gemma3.rope.scaling.factor": 8.0,
                                  "gemma3.rope.freq_base_swa": 5e3, "gemma3.attention.sliding_window_pattern": 3}))
    assert scaled["rope_parameters"]["full_attention"] == {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}
    assert scaled["rope_parameters"]["sliding_attention"]["rope_theta"] == 5e3
    assert scaled["layer_types"][:3] == ["sliding_attention", "sliding_attention", "full_attention"]
    pattern = np.array([True, False] * 6)
    assert gguf_config(_meta(**{"gemma3.attention.sliding_window_pattern": pattern}))["layer_types"][:2] == \
        ["sliding_attention", "full_attention"]
    big = gguf_config(_meta(**{"gemma3.block_count": 62, "gemma3.embedding_length": 5376,
                               "gemma3.attention.head_count": 32, "gemma3.attention.key_length": 128}))
    assert big["query_pre_attn_scalar"] == 168  # the 27B model: hidden / heads, as llama.cpp scales it
    assert gguf_config(_meta(**{"gemma3.attention.scale": 0.125}))["query_pre_attn_scalar"] == 64.0  # stated
    with pytest.raises(CheckpointError, match="gemma3.block_count"):
        gguf_config(_meta(**{"gemma3.block_count": None}))
    with pytest.raises(CheckpointError, match="'yarn'"):
        gguf_config(_meta(**{"gemma3.rope.scaling.type": "yarn"}))


def test_tiny_gguf_config_equals_transformers(tiny_gguf, tiny_gguf_pipe, hf_from_gguf):
    from omnijax.app.families import family_for_config

    hf_config = hf_from_gguf[0].config.to_dict()
    assert family_for_config(hf_config).parse_config(hf_config).decoder == tiny_gguf_pipe.config.decoder
    assert tiny_gguf_pipe.family == "gemma3" and tiny_gguf_pipe.config.modalities == ()
    assert tiny_gguf_pipe.name == tiny_gguf.name


def test_tiny_gguf_tokenizer_equals_transformers(tiny_gguf_pipe, hf_from_gguf):
    _, tokenizer = hf_from_gguf
    for text in PROMPTS:
        ids = tiny_gguf_pipe.prepare(text).token_ids
        assert ids.tolist() == tokenizer(text)["input_ids"] and ids[0] == tokenizer.bos_token_id


def test_tiny_gguf_logits_and_greedy_tokens_equal_transformers(tiny_gguf_pipe, hf_from_gguf):
    model, _ = hf_from_gguf
    prompts = [tiny_gguf_pipe.prepare(text) for text in PROMPTS]
    assert len(prompts[1].token_ids) > 2 * model.config.sliding_window
    for prompt, ours in zip(prompts, tiny_gguf_pipe.prompt_logits(prompts)):
        with torch.no_grad():
            ref = model(torch.tensor(prompt.token_ids[None], dtype=torch.long)).logits[0].numpy()
        assert ours.shape == ref.shape
        assert np.abs(ours - ref).max() <= 1e-4 * max(1.0, float(np.abs(ref).max()))
    results = tiny_gguf_pipe.generate(PROMPTS, max_new_tokens=12)
    for prompt, result in zip(prompts, results):
        ids = torch.tensor(prompt.token_ids[None], dtype=torch.long)
        with torch.no_grad():
            ref = model.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1]:].tolist()
        assert result.token_ids == ref


def test_chat_template_comes_from_the_metadata(chat_gguf):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(chat_gguf.parent), gguf_file=chat_gguf.name)
    pipe = Pipeline.from_pretrained(chat_gguf)  # (nothing is generated: no compilation)
    messages = [{"role": "user", "content": "hello there"}]
    assert pipe.has_chat_template
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert "<start_of_turn>model\n" in expected
    assert pipe.prepare(messages).token_ids.tolist() == tokenizer(expected, add_special_tokens=False)["input_ids"]
    with pytest.raises(PromptError, match="text only"):
        pipe.prepare([{"role": "user", "content": [{"type": "image", "image": "x.png"},
                                                   {"type": "text", "text": "what?"}]}])


def test_without_a_chat_template_chat_messages_ask_for_raw_text(tiny_gguf_pipe):
    assert not tiny_gguf_pipe.has_chat_template
    with pytest.raises(PromptError, match="no chat template.*plain text.*--raw"):
        tiny_gguf_pipe.generate([{"role": "user", "content": "hi"}], max_new_tokens=2)
    with pytest.raises(PromptError, match="empty"):
        tiny_gguf_pipe.generate("", max_new_tokens=2)
    with pytest.raises(PromptError, match="must be a string"):
        tiny_gguf_pipe.prepare_raw(["not", "text"])


def test_raw_stream_equals_generate(tiny_gguf_pipe):
    full = tiny_gguf_pipe.generate(PROMPTS[0], max_new_tokens=6)
    stream = tiny_gguf_pipe.stream(PROMPTS[0], max_new_tokens=6)
    pieces = []
    while True:
        try:
            pieces.append(next(stream))
        except StopIteration as done:
            result = done.value
            break
    assert (result.token_ids, result.text) == (full.token_ids, full.text)
    assert full.prompt_tokens == len(tiny_gguf_pipe.prepare(PROMPTS[0]).token_ids)


def test_the_cli_on_a_folder_holding_one_gguf_file(tiny_gguf, tiny_gguf_pipe, capsys):
    from omnijax.app.cli import main

    expected = tiny_gguf_pipe.generate(PROMPTS[0], max_new_tokens=6)
    assert main(["generate", "--model", str(tiny_gguf.parent), "--raw", "--prompt", PROMPTS[0],
                 "--max-new-tokens", "6", "--no-stream"]) == 0
    assert capsys.readouterr().out == expected.text + "\n"
    assert main(["generate", "--model", str(tiny_gguf.parent), "--raw", "--prompt", "x", "--system", "s"]) == 2
    assert "--raw continues plain text and takes no --system" in capsys.readouterr().err


def test_folder_with_several_gguf_files(tiny_gguf, tmp_path):
    for name in ("a.gguf", "b.gguf", "mmproj-a.gguf"):
        shutil.copy(tiny_gguf, tmp_path / name)
    with pytest.raises(CheckpointError, match="several GGUF files.*a.gguf, b.gguf"):
        open_checkpoint(tmp_path)
    (tmp_path / "b.gguf").unlink()
    assert open_checkpoint(tmp_path).path.name == "a.gguf"  # the vision projector file is not a model


def test_unsupported_architecture_is_named(tmp_path):
    path = write_tiny_gemma3_gguf(tmp_path / "llama.gguf", architecture="llama")
    with pytest.raises(UnsupportedModelError, match="'llama'.*supported GGUF architectures: \\['gemma3'\\]"):
        Pipeline.from_pretrained(path)


def test_unsupported_tensor_type_is_named(tmp_path):
    path = write_tiny_gemma3_gguf(tmp_path / "ints.gguf", extra_tensors={"blk.0.extra.weight": np.zeros((4, 8), np.int32)})
    with pytest.raises(CheckpointError, match="unsupported ggml types: I32 \\(e.g. 'blk.0.extra.weight'\\)"):
        Pipeline.from_pretrained(path)


def test_a_tensor_the_model_does_not_use_is_reported(tmp_path):
    path = write_tiny_gemma3_gguf(tmp_path / "extra.gguf",
                                  extra_tensors={"blk.0.extra.weight": np.zeros((4, 8), np.float32)})
    with pytest.raises(CheckpointError, match="unexpected tensor.*blk.0.extra.weight"):
        Pipeline.from_pretrained(path)


def test_not_a_gguf_and_truncated_files(tiny_gguf, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(100))
    with pytest.raises(CheckpointError, match="not a GGUF file"):
        Pipeline.from_pretrained(bad)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match="truncated"):
        Pipeline.from_pretrained(cut)
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    with pytest.raises(CheckpointError, match="not a folder or a .gguf file"):
        Pipeline.from_pretrained(other)
    with pytest.raises(CheckpointError, match="no .gguf file"):
        Pipeline.from_pretrained(tmp_path / "empty" if (tmp_path / "empty").mkdir() is None else None)


def test_the_demo_continues_raw_text_for_a_model_without_a_chat_template(tiny_gguf_pipe):
    from omnijax.demo.web import build_demo, make_responder

    config = build_demo(tiny_gguf_pipe).get_config_file()
    header = next(c["props"]["value"] for c in config["components"] if c["props"].get("elem_id") == "model-info")
    assert "**inputs:** text" in header and "no chat template" in header
    expected = tiny_gguf_pipe.generate(PROMPTS[0], max_new_tokens=6)
    history = [{"role": "user", "content": "an earlier turn"}, {"role": "assistant", "content": "its answer"}]
    outputs = list(make_responder(tiny_gguf_pipe)({"text": PROMPTS[0], "files": []}, history, 6, 0.0, 1.0, 0, 0))
    assert outputs[-1][0]["content"][0]["text"] == expected.text
    empty = list(make_responder(tiny_gguf_pipe)({"text": "  ", "files": []}, [], 6, 0.0, 1.0, 0, 0))
    assert "empty" in empty[-1][0]["content"]


def test_tensors_an_architecture_ignores_are_left_out(tmp_path):
    import dataclasses

    from omnijax.app.families.gemma3.spec import GGUF
    from omnijax.app.gguf.tensors import GGUFTensors

    path = write_tiny_gemma3_gguf(tmp_path / "rope.gguf", extra_tensors={"rope_freqs.weight": np.ones(64, np.float32)})
    file = GGUFFile(path)
    config = {"num_hidden_layers": 6}
    wanted = ["model.norm.weight", "model.layers.0.self_attn.q_norm.weight", "model.no_such.weight"]
    plain = GGUFTensors(file, GGUF, config, wanted, np.float32)
    assert {"model.norm.weight", "model.layers.0.self_attn.q_norm.weight", "rope_freqs.weight"} <= plain.keys()
    assert "model.no_such.weight" not in plain.keys() and "output_norm.weight" not in plain.keys()
    ignoring = GGUFTensors(file, dataclasses.replace(GGUF, ignored=(r"rope_freqs\.weight",)), config, wanted,
                           np.float32)
    assert "rope_freqs.weight" not in ignoring.keys()
    stored = dequantize_tensor(lambda part: file.read(file.tensors["output_norm.weight"], part),
                               file.tensors["output_norm.weight"], np.float32)
    np.testing.assert_array_equal(plain.read("model.norm.weight"), stored - np.float32(1))  # 1 + w stored
    with pytest.raises(CheckpointError, match="missing"):
        plain.read("model.no_such.weight")
    file.close()
