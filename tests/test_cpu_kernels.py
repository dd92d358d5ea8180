"""The native CPU kernels (common/kernels/): the narrow-weight product against its pure-JAX reference and a float64
product for every stored format, 1..17 rows, sizes that are not multiples of the vector width, each instruction-set
path (AVX2 forced on an AVX-512 machine, and plain C++), batched, vmapped and sharded over 4 simulated devices; which
products take the kernel; the library's build; and the pure-JAX path with one warning where the library is
missing."""

from __future__ import annotations

import pathlib
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from omnijax.common.cpu import cpu_flags
from omnijax.common.errors import SettingError
from omnijax.common.matmul_policy import DECODE_ROWS, matmul_oi
from omnijax.common.quantized import QuantizedArray, dequantize_numpy, quantize
from omnijax.common.kernels import native_library
from omnijax.common.kernels.narrow_matmul import kernel_format, narrow_matmul, native, reference
from fixtures.four_devices import run_on_four_devices

ROOT = pathlib.Path(__file__).resolve().parents[1]
FORMATS = ("int8", "int4", "bf16")
# out not a multiple of the 4-row output blocks or of any vector width; in (int8, bf16) leaves a tail of 3 after
# 16- and 8-wide vectors; int4's in is whole groups of 32
SIZES = {"int8": (37, 83), "int4": (37, 96), "bf16": (37, 83)}
ISAS = ("auto", "avx2", "scalar")


def _weight(fmt: str, w: np.ndarray):
    """(the stored weight, its float64 values) for ``w`` [out..., in] stored as ``fmt`` along the last axis."""
    if fmt == "bf16":
        stored = jnp.asarray(w, jnp.bfloat16)
        return stored, np.asarray(stored.astype(jnp.float32), np.float64)
    parts = quantize(w, fmt, -1)
    stored = QuantizedArray(jnp.asarray(parts["values"]), jnp.asarray(parts["scales"]),
                            jnp.asarray(parts["offsets"]) if "offsets" in parts else None,
                            bits=8 if fmt == "int8" else 4, axis=w.ndim - 1, group=32 if fmt == "int4" else 0)
    return stored, dequantize_numpy(parts, fmt, w.ndim - 1).astype(np.float64)


def _close(got, want_f64):
    """Equal up to float32 sums in another order: within 1e-5 of the largest output."""
    got = np.asarray(got)
    assert got.dtype == np.float32 and got.shape == want_f64.shape
    np.testing.assert_allclose(got, want_f64, rtol=0, atol=1e-5 * np.abs(want_f64).max())


def _has_kernel(fn, *args) -> bool:
    return "omnijax_matmul_" in jax.jit(fn).lower(*args).as_text()


@pytest.fixture(scope="module")
def library():
    lib = native_library.library()
    assert lib is not None, "the CPU kernels were not built (pip install -e . builds them)"
    return lib


def test_the_library_is_built_and_takes_the_cpus_best_instruction_set(library):
    flags = cpu_flags()
    if {"avx512f", "avx512bw", "avx512vl", "fma", "f16c"} <= flags:
        best = "avx512"
    elif {"avx2", "fma", "f16c"} <= flags:
        best = "avx2"
    else:
        best = "scalar"
    assert native_library.best_isa() == best
    assert native_library.chosen_isa("avx512") == best and native_library.chosen_isa("scalar") == "scalar"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_kernel_equals_the_reference_for_1_to_17_rows(library, fmt, isa):
    rng = np.random.default_rng(FORMATS.index(fmt))
    out, n_in = SIZES[fmt]
    w, w64 = _weight(fmt, rng.standard_normal((out, n_in)).astype(np.float32))
    x = rng.standard_normal((DECODE_ROWS + 1, n_in)).astype(np.float32)
    row_counts = range(1, DECODE_ROWS + 2)
    both = jax.jit(lambda x, w: [(native(x[:r], w, isa), reference(x[:r], w)) for r in row_counts])
    for r, (got, ref) in zip(row_counts, both(jnp.asarray(x), w)):
        want = x[:r].astype(np.float64) @ w64.T
        _close(got, want)
        _close(ref, want)


@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_products_take_the_kernel_and_larger_ones_xla(library, fmt):
    rng = np.random.default_rng(10)
    out, n_in = SIZES[fmt]
    w, w64 = _weight(fmt, rng.standard_normal((out, n_in)).astype(np.float32))
    for rows in (1, DECODE_ROWS, DECODE_ROWS + 1):
        x = jnp.asarray(rng.standard_normal((1, rows, n_in)).astype(np.float32))
        assert _has_kernel(matmul_oi, x, w) == (rows <= DECODE_ROWS)
        if rows <= DECODE_ROWS:
            _close(jax.jit(matmul_oi)(x, w), np.asarray(x, np.float64) @ w64.T)
    f32 = jnp.asarray(rng.standard_normal((out, n_in)).astype(np.float32))
    assert not _has_kernel(matmul_oi, jnp.ones((1, n_in)), f32)  # float32 weights keep XLA's own product


@pytest.mark.parametrize("fmt", FORMATS)
def test_leading_axes_of_x_and_the_weight_flatten_to_rows_and_outputs(library, fmt):
    rng = np.random.default_rng(11)
    w, w64 = _weight(fmt, rng.standard_normal((5, 7, 64)).astype(np.float32))
    x = rng.standard_normal((2, 3, 64)).astype(np.float32)
    got = jax.jit(matmul_oi)(jnp.asarray(x), w)
    assert got.shape == (2, 3, 5, 7)
    _close(got, np.einsum("abi,cdi->abcd", x.astype(np.float64), w64))


def test_the_kernel_runs_under_vmap(library):
    rng = np.random.default_rng(12)
    w, w64 = _weight("int4", rng.standard_normal((40, 64)).astype(np.float32))
    x = rng.standard_normal((3, 2, 64)).astype(np.float32)
    got = jax.jit(jax.vmap(lambda x_RI: native(x_RI, w)))(jnp.asarray(x))
    _close(got, np.einsum("bri,oi->bro", x.astype(np.float64), w64))


def test_forcing_avx2_runs_other_code_than_avx512(library, monkeypatch):
    """On an AVX-512 machine the AVX2 path (16 lanes of sums against 8) rounds some sums differently, so the two
    results are not bit-equal; OMNIJAX_CPU_ISA=avx2 gives the AVX2 path's bits exactly."""
    if native_library.best_isa() != "avx512":
        pytest.skip("this CPU has no AVX-512: auto is the AVX2 path")
    rng = np.random.default_rng(13)
    w, _ = _weight("int8", rng.standard_normal((256, 640)).astype(np.float32))
    x = jnp.asarray(rng.standard_normal((1, 640)).astype(np.float32))
    avx512 = np.asarray(jax.jit(lambda x, w: native(x, w, "avx512"))(x, w))
    avx2 = np.asarray(jax.jit(lambda x, w: native(x, w, "avx2"))(x, w))
    assert not np.array_equal(avx512, avx2)
    monkeypatch.setenv(native_library.ISA_ENV, "avx2")
    forced = np.asarray(jax.jit(lambda x, w: native(x, w))(x, w))  # a new function: traced with the setting
    assert np.array_equal(forced, avx2)
    assert native_library.chosen_isa() == "avx2" and native_library.chosen_isa("auto") == "avx512"


def test_unknown_instruction_sets_and_shapes_are_refused(library):
    with pytest.raises(SettingError, match="OMNIJAX_CPU_ISA='sse2': use one of auto, avx512, avx2, scalar"):
        native_library.isa_setting({"OMNIJAX_CPU_ISA": "sse2"})
    assert native_library.isa_setting({}) == "auto"
    w, _ = _weight("int8", np.ones((4, 32), np.float32))
    with pytest.raises(ValueError, match="isa='neon'"):
        native(jnp.ones((1, 32)), w, "neon")
    with pytest.raises(ValueError, match=r"x \[..., 31\] does not fit a weight of shape \(4, 32\)"):
        native(jnp.ones((1, 31)), w)
    columns = QuantizedArray(w.values, jnp.ones((1, 32), jnp.float32), bits=8, axis=0)
    assert kernel_format(columns) is None  # quantized along the other axis: the reference takes it
    assert kernel_format(jnp.ones((4, 32), jnp.float16)) is None


def test_sharded_weights_on_four_devices_give_the_one_device_answer(library):
    """A child with 4 simulated devices: int8 / int4 / bfloat16 weights split along their output rows and along the
    contracted axis, in a jitted decode-sized product: the kernel runs and the answer equals the float64 one."""
    four = run_on_four_devices(SHARD_SCRIPT)
    assert four["devices"] == 4
    for fmt in FORMATS:
        for split in ("out", "in"):
            got, want = np.asarray(four[f"{fmt}-{split}"], np.float32), np.asarray(four[f"{fmt}-want"])
            _close(got, want)
            assert four[f"{fmt}-{split}-kernel"], (fmt, split)


SHARD_SCRIPT = r"""
import json
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from omnijax.common.matmul_policy import matmul_oi
from omnijax.common.quantized import QuantizedArray, dequantize_numpy, quantize

mesh = jax.make_mesh((4,), ("model",))
rng = np.random.default_rng(14)
w = rng.standard_normal((64, 128)).astype(np.float32)
x = jnp.asarray(rng.standard_normal((1, 3, 128)).astype(np.float32))
out = {"devices": len(jax.devices())}
for fmt in ("int8", "int4", "bf16"):
    if fmt == "bf16":
        bf16 = jnp.asarray(w, jnp.bfloat16)
        parts, w64 = {"values": np.asarray(bf16)}, np.asarray(bf16.astype(jnp.float32), np.float64)
    else:
        parts = quantize(w, fmt, -1)
        w64 = dequantize_numpy(parts, fmt, 1).astype(np.float64)
    out[f"{fmt}-want"] = (np.asarray(x, np.float64) @ w64.T).tolist()
    for split, spec in (("out", P("model", None)), ("in", P(None, "model"))):
        put = lambda a: jax.device_put(jnp.asarray(a), NamedSharding(mesh, spec))
        if fmt == "bf16":
            stored = put(parts["values"])
        else:
            stored = QuantizedArray(put(parts["values"]), put(parts["scales"]) if parts["scales"].shape[1] > 1
                                    else jax.device_put(jnp.asarray(parts["scales"]), NamedSharding(mesh, P())),
                                    put(parts["offsets"]) if "offsets" in parts else None,
                                    bits=8 if fmt == "int8" else 4, axis=1, group=32 if fmt == "int4" else 0)
        f = jax.jit(matmul_oi)
        out[f"{fmt}-{split}"] = np.asarray(f(x, stored)).tolist()
        out[f"{fmt}-{split}-kernel"] = "omnijax_matmul_" in f.lower(x, stored).as_text()
print("RESULT" + json.dumps(out))
"""


def test_a_missing_library_warns_once_and_products_take_the_reference(library, monkeypatch, tmp_path):
    assert native_library.library_path(tmp_path) is None
    monkeypatch.setattr(native_library, "library_path", lambda: tmp_path / "_cpu_kernels.so")
    rng = np.random.default_rng(15)
    w, w64 = _weight("int4", rng.standard_normal((24, 64)).astype(np.float32))
    x = jnp.asarray(rng.standard_normal((1, 64)).astype(np.float32))
    with pytest.warns(native_library.CpuKernelsMissing, match="CPU kernels are missing .*_cpu_kernels.so"):
        assert native_library.library() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        assert not _has_kernel(matmul_oi, x, w)
        got = jax.jit(narrow_matmul)(x, w)
    _close(got, np.asarray(x, np.float64) @ w64.T)
    np.testing.assert_array_equal(got, jax.jit(reference)(x, w))


def test_the_ffi_headers_are_the_locked_jaxlibs():
    """common/kernels/cpu/third_party holds jaxlib's FFI headers unchanged, from the version its README names; when that
    jaxlib is installed, they are byte-equal to its own."""
    import jaxlib

    third_party = ROOT / "common" / "kernels" / "cpu" / "third_party"
    version = re.search(r"jaxlib (\d+\.\d+\.\d+)", (third_party / "README.md").read_text()).group(1)
    lock = (ROOT / "requirements-lock.txt").read_text()
    assert f"\njaxlib=={version}\n" in lock
    if jaxlib.__version__ != version:
        pytest.skip(f"jaxlib {jaxlib.__version__} is installed, the headers are {version}'s")
    installed = pathlib.Path(jax.ffi.include_dir()) / "xla" / "ffi" / "api"
    for name in ("c_api.h", "api.h", "ffi.h"):
        assert (third_party / "xla" / "ffi" / "api" / name).read_bytes() == (installed / name).read_bytes(), name
