"""Quantized weights: the int8 / int4 layouts, their products, loading a tiny Gemma 3 with them (one device and four
simulated ones), GGUF tensors converted a group of rows at a time, the cached GGUF tokenizer, and the errors that
name the valid settings."""

from __future__ import annotations

import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from omnijax.common.errors import SettingError
from omnijax.common.matmul_policy import fast_bf16_products, matmul_oi
from omnijax.common.quantized import (QuantizedArray, check_quantize, dequantize_numpy, quantize, quantize_int4,
                                      quantize_int8)
from fixtures.four_devices import run_on_four_devices
from fixtures.step_shapes import few_step_shapes

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _device(parts, mode, axis):
    return QuantizedArray(jnp.asarray(parts["values"]), jnp.asarray(parts["scales"]),
                          None if "offsets" not in parts else jnp.asarray(parts["offsets"]),
                          bits=8 if mode == "int8" else 4, axis=axis, group=32 if mode == "int4" else 0)


@pytest.mark.parametrize("axis", [-1, 1])
def test_int8_is_within_half_a_step_per_output_channel(axis):
    w = np.random.default_rng(0).standard_normal((3, 64, 96)).astype(np.float32)
    values, scales = quantize_int8(w, axis % 3)
    assert values.dtype == np.int8 and scales.shape[axis] == 1 and np.abs(values).max() == 127
    back = values.astype(np.float32) * scales
    assert np.all(np.abs(back - w) <= scales / 2 + 1e-7)


@pytest.mark.parametrize("axis", [-1, 1])
def test_int4_packs_two_per_byte_and_is_within_half_a_step_per_group(axis):
    w = np.random.default_rng(1).standard_normal((3, 64, 96)).astype(np.float32)
    a = axis % 3
    values, scales, offsets = quantize_int4(w, a)
    assert values.dtype == np.uint8 and values.shape[a] == w.shape[a] // 2 and scales.shape[a] == w.shape[a] // 32
    back = dequantize_numpy({"values": values, "scales": scales, "offsets": offsets}, "int4", a)
    step = np.repeat(scales.astype(np.float32), 32, axis=a)
    assert back.shape == w.shape
    assert np.all(np.abs(back - w) <= step / 2 + 1e-3 * np.abs(w).max())
    # a group that holds 16 evenly spaced levels (a GGUF 4-bit block) comes back exactly
    levels = (np.arange(32) % 16).astype(np.float32) * 0.25 - 1.0
    exact = quantize(levels[None], "int4", -1)
    assert np.array_equal(dequantize_numpy(exact, "int4", 1)[0], levels)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_device_dequantize_reshape_and_index_match_numpy(mode):
    w = np.random.default_rng(2).standard_normal((4, 6, 64)).astype(np.float32)
    parts = quantize(w, mode, -1)
    q = _device(parts, mode, 2)
    ref = dequantize_numpy(parts, mode, 2)
    assert q.shape == w.shape and q[...] is q
    np.testing.assert_allclose(np.asarray(q.dequantize()), ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(q.reshape(-1, 64).dequantize()), ref.reshape(24, 64), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(q[jnp.array([3, 1])].dequantize()), ref[[3, 1]], rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="only the axes before"):
        q.reshape(4, 6 * 64)


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("rows", [1, 40])
def test_products_with_quantized_weights_equal_products_with_their_values(mode, rows):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((48, 64)).astype(np.float32)
    x = rng.standard_normal((rows, 64)).astype(np.float32)
    parts = quantize(w, mode, -1)
    y = np.asarray(jax.jit(matmul_oi)(jnp.asarray(x), _device(parts, mode, 1)))
    ref = x @ dequantize_numpy(parts, mode, 1).T
    tol = 2e-2 if rows > 16 and fast_bf16_products() else 1e-5  # bf16 products where the platform has them
    np.testing.assert_allclose(y, ref, rtol=tol, atol=tol * np.abs(ref).max())


def test_float32_products_are_unchanged():
    rng = np.random.default_rng(4)
    w, x = rng.standard_normal((48, 64)).astype(np.float32), rng.standard_normal((2, 5, 64)).astype(np.float32)
    got = np.asarray(matmul_oi(jnp.asarray(x), jnp.asarray(w)))
    want = np.asarray(jax.lax.dot_general(jnp.asarray(x), jnp.asarray(w), (((2,), (1,)), ((), ()))))
    assert np.array_equal(got, want)


def test_fast_bf16_products_follow_the_platform_and_cpu_flags():
    assert fast_bf16_products("gpu", environ={}) and fast_bf16_products("tpu", environ={})
    assert fast_bf16_products("cpu", frozenset({"avx2", "avx512_bf16"}), environ={})
    assert fast_bf16_products("cpu", frozenset({"amx_bf16"}), environ={})
    assert not fast_bf16_products("cpu", frozenset({"avx2", "avx512f"}), environ={})
    forced = {"OMNIJAX_NARROW_PRODUCTS": "float32"}
    assert not fast_bf16_products("gpu", environ=forced)
    assert not fast_bf16_products("cpu", frozenset({"avx512_bf16"}), environ=forced)
    assert fast_bf16_products("cpu", frozenset({"avx2"}), environ={"OMNIJAX_NARROW_PRODUCTS": "bfloat16"})
    with pytest.raises(ValueError, match="OMNIJAX_NARROW_PRODUCTS"):
        fast_bf16_products("cpu", environ={"OMNIJAX_NARROW_PRODUCTS": "int8"})


def test_unknown_settings_name_the_valid_ones(tiny_gemma3_dir):
    from omnijax.app.pipeline import Pipeline

    with pytest.raises(SettingError, match="int8, int4"):
        check_quantize("int3")
    with pytest.raises(SettingError, match="int8, int4"):
        Pipeline.from_pretrained(tiny_gemma3_dir, quantize="q4")
    with pytest.raises(SettingError, match="bfloat16, float16, float32"):
        Pipeline.from_pretrained(tiny_gemma3_dir, dtype="float64")
    assert issubclass(SettingError, ValueError)


@pytest.fixture(scope="module")
def quantized_pipes(tiny_gemma3_dir, gemma3_pipeline):
    from omnijax.app.pipeline import Pipeline

    return {mode: few_step_shapes(Pipeline.from_pretrained(tiny_gemma3_dir, quantize=mode))
            for mode in ("int8", "int4")}


def test_the_decoder_matrices_are_stored_quantized_and_the_rest_is_not(quantized_pipes, gemma3_pipeline):
    params = quantized_pipes["int4"].engine.params
    dec = params["decoder"]
    assert isinstance(dec["embedder"]["embedding"], QuantizedArray) and dec["embedder"]["embedding"].bits == 8
    assert dec["layers"][0]["mlp"]["gate_up_proj"].bits == 4
    layer = dec["layers"][0]
    for leaf in (layer["attn"]["qkv"], layer["attn"]["o_proj"]["kernel"], layer["mlp"]["gate_up_proj"],
                 layer["mlp"]["down_proj"]["kernel"]):
        assert isinstance(leaf, QuantizedArray)
    assert not isinstance(layer["attn_norm_in"]["weight"], QuantizedArray)
    encoder_leaves = jax.tree.leaves(params["encoders"], is_leaf=lambda x: isinstance(x, QuantizedArray))
    assert encoder_leaves and not any(isinstance(x, QuantizedArray) for x in encoder_leaves)
    size = lambda p: sum(x.nbytes for x in jax.tree.leaves(p["decoder"]))
    f32 = size(gemma3_pipeline.engine.params)
    assert size(quantized_pipes["int8"].engine.params) < 0.3 * f32
    assert size(params) < 0.2 * f32


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantized_logits_stay_close_to_float32(quantized_pipes, gemma3_pipeline, mode):
    prompt = gemma3_pipeline.prepare([{"role": "user", "content": "Tell me a story about a fox and a crow."}])
    ref = gemma3_pipeline.prompt_logits(prompt)[-1]
    got = quantized_pipes[mode].prompt_logits(prompt)[-1]
    # random tiny weights: int8 stays within a few percent of the largest logit; int4 (16 levels per group of 32
    # Gaussian values, ~8% noise per weight) moves them more, but they must still follow float32's
    err = np.abs(got - ref).max() / np.abs(ref).max()
    corr = np.corrcoef(got, ref)[0, 1]
    print(f"{mode}: max error {err:.3f} of the largest logit, correlation {corr:.4f}")
    if mode == "int8":
        assert err < 0.05 and corr > 0.999, (err, corr)
    else:
        assert corr > 0.9, (err, corr)
    result = quantized_pipes[mode].generate([{"role": "user", "content": "Hello"}], max_new_tokens=4)
    assert len(result.token_ids) >= 1


def test_the_serving_programs_read_the_products_setting_when_called(quantized_pipes, monkeypatch):
    """One pipeline scores a text with its prompt's int8 products in float32, then bfloat16, then float32 again:
    the setting is read at each call (another setting, another program), not fixed when a program first traced."""
    pipe = quantized_pipes["int8"]
    text = "The quick brown fox jumps over the lazy dog near the river bank. " * 3
    runs = []
    for products in ("float32", "bfloat16", "float32"):
        monkeypatch.setenv("OMNIJAX_NARROW_PRODUCTS", products)
        runs.append(pipe.score(text))
    assert len(runs[0]) > 16  # products of more than DECODE_ROWS rows: the setting applies
    np.testing.assert_array_equal(runs[0], runs[2])
    assert not np.array_equal(runs[0], runs[1])
    np.testing.assert_allclose(runs[1], runs[0], rtol=0, atol=0.1)


SHARD_SCRIPT = r"""
import json, sys
import jax, numpy as np
from omnijax.app.pipeline import Pipeline
from omnijax.common.sharding import make_mesh
from fixtures.step_shapes import few_step_shapes
assert len(jax.devices()) == 4, jax.devices()
pipe = few_step_shapes(Pipeline.from_pretrained(sys.argv[1], mesh=make_mesh(4), quantize="int4"))
w = pipe.engine.params["decoder"]["layers"][0]["mlp"]["gate_up_proj"]
logits = pipe.prompt_logits([PROMPT])[0][-1:]
out = {"tokens": pipe.generate([PROMPT], max_new_tokens=8)[0].token_ids, "logits": logits.tolist(),
       "specs": [str(x.sharding.spec) for x in (w.values, w.scales, w.offsets)],
       "shards": len(w.values.addressable_shards)}
print("RESULT" + json.dumps(out))
"""
SHARD_PROMPT = "Tell me a story about a fox."


@pytest.mark.multidevice
def test_quantized_weights_shard_like_their_float_weights(tiny_gemma3_dir, quantized_pipes, monkeypatch):
    """int4 weights on a model axis of 4 (a child process) give the one-device int4 pipeline's answer. Both run
    their prompt's products in float32 (``OMNIJAX_NARROW_PRODUCTS``; the child inherits it): where bfloat16 products
    are the default (avx512_bf16, AMX), activations that differ in their last float32 bits (the products split over
    4 devices sum in another order) round to bfloat16 values one bfloat16 step apart, and the logits differ by up
    to 3e-3 (seen on a Xeon with AMX); the comparison is of the sharding, not of that rounding."""
    monkeypatch.setenv("OMNIJAX_NARROW_PRODUCTS", "float32")
    four = run_on_four_devices(SHARD_SCRIPT.replace("PROMPT", repr(SHARD_PROMPT)), tiny_gemma3_dir)
    one = quantized_pipes["int4"]
    assert four["tokens"] == one.generate([SHARD_PROMPT], max_new_tokens=8)[0].token_ids
    np.testing.assert_allclose(four["logits"], one.prompt_logits([SHARD_PROMPT])[0][-1:], rtol=1e-4, atol=1e-4)
    # gate_up_proj [mlp, 2, embed]: values, scales and offsets are all split along "mlp" over the model axis
    assert four["shards"] == 4
    assert all(spec.replace("PartitionSpec", "P").startswith("P('model'") for spec in four["specs"]), four["specs"]


@pytest.mark.parametrize("scale", [b"\x00\x7e", b"\x00\x7c"], ids=["nan", "inf"])
def test_a_broken_block_scale_is_refused_whatever_the_weights_become(tmp_path, scale):
    """A GGUF whose Q8_0 block scale is NaN or infinite: loading it as float32, int8 or int4 raises CheckpointError
    naming the tensor (the quantized paths read the stored blocks directly and checked nothing)."""
    import gguf
    from fixtures.tiny_gguf import write_tiny_gemma3_gguf

    from omnijax.app.pipeline import Pipeline
    from omnijax.common.errors import CheckpointError

    path = write_tiny_gemma3_gguf(tmp_path / "tiny.gguf")
    info = next(t for t in gguf.GGUFReader(path).tensors if t.name == "token_embd.weight")
    assert info.tensor_type == gguf.GGMLQuantizationType.Q8_0  # blocks of a float16 scale and 32 int8 values
    with open(path, "r+b") as f:
        f.seek(info.data_offset + 34 * 3)  # the fourth block's scale
        f.write(scale)
    for mode in (None, "int8", "int4"):
        with pytest.raises(CheckpointError, match="'model.embed_tokens.weight' holds NaN or infinite values"):
            Pipeline.from_pretrained(path, quantize=mode)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_gguf_tensors_convert_a_group_of_rows_at_a_time(tmp_path, mode):
    from fixtures.tiny_gguf import write_tiny_gemma3_gguf

    from omnijax.app.checkpoint_source import open_checkpoint
    from omnijax.app.families import family_for_config

    path = write_tiny_gemma3_gguf(tmp_path / "tiny.gguf")
    ckpt = open_checkpoint(path, tokenizer_cache=tmp_path / "tokenizers")
    spec = family_for_config(ckpt.hf_config)
    cfg = spec.parse_config(ckpt.hf_config)
    tensors = ckpt.open_tensors(spec, spec.weight_map(cfg), "float32")
    key = "model.embed_tokens.weight"  # Q8_0 in the tiny file
    whole = tensors.read(key)
    parts = tensors.read_quantized(key, mode, 1, whole.shape, chunk_bytes=1024)  # many row groups
    assert parts is not None and whole.shape[0] * whole.shape[1] > 4 * 1024
    expected = quantize(whole, mode, -1)
    assert sorted(parts) == sorted(expected)
    for name in parts:
        assert np.array_equal(parts[name], expected[name]), name
    tensors.close()


def test_the_gguf_tokenizer_is_built_once_and_read_back_the_same(tmp_path):
    from fixtures.tiny_gguf import write_tiny_gemma3_gguf

    from omnijax.app.checkpoint_source import open_checkpoint

    path = write_tiny_gemma3_gguf(tmp_path / "tiny.gguf")
    cache = tmp_path / "tokenizers"
    first = open_checkpoint(path, tokenizer_cache=cache).processor_kwargs["tokenizer"]
    entries = list(cache.iterdir())
    assert len(entries) == 1 and (entries[0] / "tokenizer.json").is_file()
    assert not list(entries[0].glob("*.pkl")) and json.loads((entries[0] / "tokenizer.json").read_text())["model"]
    second = open_checkpoint(path, tokenizer_cache=cache).processor_kwargs["tokenizer"]
    text = "Hello world, the fox jumps over the lazy dog 12345."
    assert first(text)["input_ids"] == second(text)["input_ids"]
    assert first.decode(first(text)["input_ids"]) == second.decode(second(text)["input_ids"])
    assert second.chat_template == first.chat_template
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # a changed file: a new entry
    open_checkpoint(path, tokenizer_cache=cache)
    assert len(list(cache.iterdir())) == 2
