"""The converted-weights cache (app/weight_cache.py) on tiny checkpoints: a second load reads the entry the first
wrote and gives the same weights; a damaged entry is detected, removed and built again; a changed source file or
another setting misses; the bound holds; the entry is a safetensors file. And the cached GGUF tokenizer read back
directly gives what the tokenizer built from the file gives. Correctness only: nothing here is timed."""

from __future__ import annotations

import os
import pathlib

import jax
import numpy as np
import pytest

import omnijax.app.pipeline_loading as pipeline_loading
from omnijax.app import weight_cache
from omnijax.app.pipeline import Pipeline
from omnijax.common.quantized import QuantizedArray
from fixtures.tiny_gguf import write_tiny_gemma3_gguf

PROMPT = "the quick brown fox"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_tiny_gemma3_gguf(tmp_path_factory.mktemp("cache_gguf") / "tiny.gguf", seed=3)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "weights"
    monkeypatch.setenv("OMNIJAX_WEIGHT_CACHE_DIR", str(folder))
    monkeypatch.delenv("OMNIJAX_WEIGHT_CACHE", raising=False)
    monkeypatch.delenv("OMNIJAX_WEIGHT_CACHE_GB", raising=False)
    return folder


@pytest.fixture
def conversions(monkeypatch):
    """How many times ``load_params`` (the conversion a cache hit skips) ran."""
    calls = []
    real = pipeline_loading.load_params
    monkeypatch.setattr(pipeline_loading, "load_params", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def flat(pipe) -> dict:
    """{path: (static description, host array)} of every parameter leaf (a QuantizedArray's parts and its bits,
    axis and group)."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(
            pipe.engine.params, is_leaf=lambda x: isinstance(x, QuantizedArray))[0]:
        name = jax.tree_util.keystr(path)
        if isinstance(leaf, QuantizedArray):
            for part in ("values", "scales", "offsets"):
                value = getattr(leaf, part)
                if value is not None:
                    out[f"{name}.{part}"] = ((leaf.bits, leaf.axis, leaf.group), np.asarray(value))
        else:
            out[name] = (None, np.asarray(leaf))
    return out


def assert_same(a: dict, b: dict) -> None:
    assert list(a) == list(b) and a
    for name in a:
        (sa, xa), (sb, xb) = a[name], b[name]
        assert sa == sb and xa.dtype == xb.dtype and xa.shape == xb.shape, name
        assert np.array_equal(xa.view(np.uint8), xb.view(np.uint8)), name


def entries(folder: pathlib.Path) -> list[pathlib.Path]:
    return sorted(folder.glob("*.safetensors"))


@pytest.mark.parametrize("dtype, quantize", [("float32", None), ("bfloat16", None), ("float32", "int8"),
                                             ("float32", "int4")])
def test_a_second_load_reads_the_cache_and_gives_identical_weights(tiny_gguf, cache_dir, conversions, dtype,
                                                                   quantize):
    first = Pipeline.from_pretrained(tiny_gguf, dtype=dtype, quantize=quantize)
    assert len(conversions) == 1 and len(entries(cache_dir)) == 1
    second = Pipeline.from_pretrained(tiny_gguf, dtype=dtype, quantize=quantize)
    assert len(conversions) == 1  # read from the entry: no conversion
    assert_same(flat(first), flat(second))  # bit for bit: the same answers


def test_the_entry_is_a_safetensors_file(tiny_gguf, cache_dir):
    from safetensors import safe_open

    pipe = Pipeline.from_pretrained(tiny_gguf, quantize="int4")
    [entry] = entries(cache_dir)
    ours = flat(pipe)
    with safe_open(str(entry), framework="numpy") as f:
        names = list(f.keys())
        assert f.metadata()["setting"]
        embedding = f.get_tensor("decoder/embedder/embedding#values")
    assert any(n.endswith("#offsets") for n in names)
    assert np.array_equal(embedding, ours["['decoder']['embedder']['embedding'].values"][1])


def damage_data(entry: pathlib.Path) -> None:
    """Flip one byte in the middle of the last tensor's data (the header stays valid)."""
    size = entry.stat().st_size
    with open(entry, "r+b") as f:
        f.seek(size - 17)
        byte = f.read(1)
        f.seek(size - 17)
        f.write(bytes([byte[0] ^ 0x5A]))


def truncate(entry: pathlib.Path) -> None:
    os.truncate(entry, entry.stat().st_size - 100)


def garbage_header(entry: pathlib.Path) -> None:
    with open(entry, "r+b") as f:
        f.seek(8)
        f.write(b"{not json")


def huge_header(entry: pathlib.Path) -> None:
    with open(entry, "r+b") as f:
        f.write((1 << 62).to_bytes(8, "little"))


def hostile_metadata(entry: pathlib.Path) -> None:
    """Valid JSON of the wrong kind: every parameter's record a list."""
    import json

    with open(entry, "r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        meta = header["__metadata__"]
        meta["params"] = json.dumps({name: [] for name in json.loads(meta["params"])})
        text = json.dumps(header).encode()
        assert len(text) <= n
        f.seek(8)
        f.write(text + b" " * (n - len(text)))


@pytest.mark.parametrize("damage", [damage_data, truncate, garbage_header, huge_header, hostile_metadata])
def test_a_damaged_entry_is_detected_and_built_again(tiny_gguf, cache_dir, conversions, damage, caplog):
    first = Pipeline.from_pretrained(tiny_gguf, quantize="int8")
    [entry] = entries(cache_dir)
    damage(entry)
    with caplog.at_level("WARNING", logger="omnijax.app.weight_cache"):
        again = Pipeline.from_pretrained(tiny_gguf, quantize="int8")
    assert len(conversions) == 2  # not used: converted again
    assert "not usable" in caplog.text
    assert_same(flat(first), flat(again))
    Pipeline.from_pretrained(tiny_gguf, quantize="int8")
    assert len(conversions) == 2  # the rebuilt entry is good


def test_an_entry_of_another_setting_under_the_key_is_not_used(tiny_gguf, cache_dir, conversions):
    """An entry renamed to the key of another setting (int4 parts where int8 is expected) is refused."""
    Pipeline.from_pretrained(tiny_gguf, quantize="int4")
    [int4] = entries(cache_dir)
    int8 = Pipeline.from_pretrained(tiny_gguf, quantize="int8")
    int8_entry = next(e for e in entries(cache_dir) if e != int4)
    os.replace(int4, int8_entry)
    again = Pipeline.from_pretrained(tiny_gguf, quantize="int8")
    assert len(conversions) == 3
    assert_same(flat(int8), flat(again))


def test_a_changed_source_file_misses(tmp_path, cache_dir, conversions):
    path = write_tiny_gemma3_gguf(tmp_path / "model.gguf", seed=1)
    first = Pipeline.from_pretrained(path, quantize="int8")
    write_tiny_gemma3_gguf(path, seed=2)  # other weights in the same file
    second = Pipeline.from_pretrained(path, quantize="int8")
    assert len(conversions) == 2 and len(entries(cache_dir)) == 2
    a, b = flat(first), flat(second)
    assert any(not np.array_equal(a[n][1], b[n][1]) for n in a)
    again = Pipeline.from_pretrained(path, quantize="int8")
    assert len(conversions) == 2
    assert_same(b, flat(again))


def test_a_quantized_safetensors_folder_is_cached_and_a_float_one_is_not(tiny_gemma3_dir, cache_dir, conversions):
    Pipeline.from_pretrained(tiny_gemma3_dir)
    assert entries(cache_dir) == []  # read as stored: nothing to keep
    first = Pipeline.from_pretrained(tiny_gemma3_dir, quantize="int8")
    second = Pipeline.from_pretrained(tiny_gemma3_dir, quantize="int8")
    assert len(conversions) == 2 and len(entries(cache_dir)) == 1
    assert_same(flat(first), flat(second))


def test_the_cache_can_be_turned_off_and_is_bounded(tiny_gguf, cache_dir, conversions, monkeypatch):
    monkeypatch.setenv("OMNIJAX_WEIGHT_CACHE", "0")
    Pipeline.from_pretrained(tiny_gguf, quantize="int8")
    assert not cache_dir.exists() or entries(cache_dir) == []
    monkeypatch.setenv("OMNIJAX_WEIGHT_CACHE", "1")
    monkeypatch.setenv("OMNIJAX_WEIGHT_CACHE_GB", str(1 / 2**30))  # one byte: no entry fits
    Pipeline.from_pretrained(tiny_gguf, quantize="int8")
    assert entries(cache_dir) == [] and list(cache_dir.glob(".building-*")) == []
    assert len(conversions) == 2


def test_prune_removes_the_least_recently_used_entries(tmp_path):
    for i, name in enumerate(["old", "middle", "new"]):
        file = tmp_path / f"{name}.safetensors"
        file.write_bytes(b"x" * 1000)
        os.utime(file, (1000 + i, 1000 + i))
    stale = tmp_path / ".building-dead.safetensors"
    stale.write_bytes(b"x")
    os.utime(stale, (1, 1))
    weight_cache.prune(tmp_path, 2000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["middle.safetensors", "new.safetensors"]
    weight_cache.prune(tmp_path, 0, keep=tmp_path / "middle.safetensors")
    assert [p.name for p in tmp_path.iterdir()] == ["middle.safetensors"]


def test_the_content_hash_is_remembered_until_the_file_changes(tmp_path, monkeypatch):
    file = tmp_path / "a.bin"
    file.write_bytes(b"one")
    memo = tmp_path / "memo"
    first = weight_cache.file_digest(file, memo)
    hashed = []
    real = weight_cache.hashlib.sha256
    monkeypatch.setattr(weight_cache.hashlib, "sha256", lambda *a: hashed.append(a) or real(*a))
    assert weight_cache.file_digest(file, memo) == first
    assert [a for a in hashed if not a] == []  # no content hashed (the memo's name is a hash of the path)
    file.write_bytes(b"two")
    assert weight_cache.file_digest(file, memo) != first


def test_the_cached_gguf_tokenizer_reads_back_as_built(tmp_path):
    from omnijax.app.gguf.file import GGUFFile
    from omnijax.preprocess.tokenizer import (GGUF_TOKENIZER_STRING_ARRAYS, byte_fallback_ids, cached_gguf_tokenizer,
                                              special_tokens)

    template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    path = write_tiny_gemma3_gguf(tmp_path / "chat.gguf", chat_template=template)
    start = GGUFFile(path).data_start
    reads = []

    def metadata():
        reads.append(1)
        return GGUFFile(path, string_arrays=GGUF_TOKENIZER_STRING_ARRAYS).metadata

    built = cached_gguf_tokenizer(path, "gemma3_text", start, tmp_path / "tok", metadata)
    read = cached_gguf_tokenizer(path, "gemma3_text", start, tmp_path / "tok", metadata)
    assert len(reads) == 1  # the vocabulary is read only to build
    assert type(read) is not type(built)  # the second is read back from the cache folder
    for text in [PROMPT, "  two  spaces\tand\nlines ", "<bos>special<eos> text", "日本 🙂", ""]:
        for specials in (True, False):
            ids = built(text, add_special_tokens=specials)["input_ids"]
            assert read(text, add_special_tokens=specials)["input_ids"] == ids
            assert read.decode(ids) == built.decode(ids)
            assert read.decode(ids, skip_special_tokens=True) == built.decode(ids, skip_special_tokens=True)
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "all_special_ids", "chat_template"):
        assert getattr(read, attr) == getattr(built, attr), attr
    assert len(read) == len(built) and read.get_vocab() == built.get_vocab()
    assert special_tokens(read) == special_tokens(built) and byte_fallback_ids(read) == byte_fallback_ids(built)
    messages = [{"role": "user", "content": "hi"}]
    assert read.apply_chat_template(messages, tokenize=False) == built.apply_chat_template(messages, tokenize=False)


def test_safetensors_tensors_are_read_as_safetensors_reads_them(tmp_path):
    """TensorIndex reads tensors with plain file reads into aligned buffers; what it reads equals safetensors' own
    reading for every dtype, and a dtype that reader does not know (bool) still comes through safetensors."""
    import ml_dtypes
    from safetensors import safe_open
    from safetensors.numpy import save_file

    from omnijax.app.checkpoint import TensorIndex

    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((3, 5)).astype(np.float32), "b": rng.standard_normal(7).astype(np.float16),
               "c": rng.standard_normal((2, 64)).astype(ml_dtypes.bfloat16), "d": np.arange(5, dtype=np.int64),
               "e": np.array([True, False, True]), "f": np.array(2.5, np.float32), "g": np.zeros((0, 4), np.float32)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    index = TensorIndex(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), framework="numpy") as f:
        for key in tensors:
            ours, ref = index.read(key), f.get_tensor(key)
            assert ours.dtype == ref.dtype and ours.shape == ref.shape and np.array_equal(ours, ref), key
            if key in "abcd":
                assert ours.ctypes.data % weight_cache.ALIGN == 0, key
    index.close()
