"""x [..., in] times a weight stored narrow as [out..., in] (torch's layout, contracting the last axes) -> float32
[..., out...]: on CPU by the native kernels of common/kernels/cpu/narrow_matmul.cc, elsewhere (and wherever the
kernels cannot take the weight) by ``reference``, the pure-JAX product every test compares them with.

The weights the kernels read as stored bytes, widening them in registers (float32 sums, so exact against the
dequantized weight up to the order of the sums):

- a ``QuantizedArray`` with 8 bits along its last axis: int8 values [out..., in], float32 scales [out..., 1];
- one with 4 bits in groups of 32 along its last axis: uint8 values [out..., in / 2], float16 scales and offsets
  [out..., in / 32] (common/quantized.py has the layout);
- a bfloat16 array [out..., in].

The weight's output rows are split across XLA's intra-op threads. Each call reads the whole weight once for all
rows of x, so it suits few rows (decode steps: common/matmul_policy.py sends it at most DECODE_ROWS).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from omnijax.common.quantized import INT4_GROUP, is_quantized
from omnijax.common.kernels import native_library


def _contract_last(x, w_OI):
    return (((x.ndim - 1,), (len(w_OI.shape) - 1,)), ((), ()))


def reference(x_XI: jax.Array, w_OI) -> jax.Array:
    """The product in plain JAX ops, in x's dtype: an int8 weight's values times x, then its per-channel scales;
    any other weight widened to x's dtype next to the product."""
    dims = _contract_last(x_XI, w_OI)
    if is_quantized(w_OI) and w_OI.bits == 8:
        y = jax.lax.dot_general(x_XI, w_OI.values.astype(x_XI.dtype), dims)
        return y * w_OI.scales.reshape(w_OI.shape[:-1]).astype(y.dtype)
    w = w_OI.dequantize(x_XI.dtype) if is_quantized(w_OI) else w_OI.astype(x_XI.dtype)
    return jax.lax.dot_general(x_XI, w, dims)


def kernel_format(w_OI) -> str | None:
    """int8, int4 or bf16: the kernel that reads ``w_OI`` as stored; None where none does (the reference does)."""
    if len(w_OI.shape) < 2:
        return None
    if is_quantized(w_OI):
        if w_OI.axis != w_OI.ndim - 1:
            return None
        if w_OI.bits == 8 and w_OI.values.dtype == jnp.int8 and w_OI.scales.dtype == jnp.float32:
            return "int8"
        if (w_OI.bits == 4 and w_OI.group == INT4_GROUP and w_OI.values.dtype == jnp.uint8
                and w_OI.scales.dtype == jnp.float16 and w_OI.offsets.dtype == jnp.float16):
            return "int4"
        return None
    return "bf16" if jnp.dtype(w_OI.dtype) == jnp.bfloat16 else None


def native(x_XI: jax.Array, w_OI, isa: str | None = None) -> jax.Array:
    """The product by the CPU kernel (float32, in x's dtype), which must be loaded (``native_library.library()``)
    and take the weight (``kernel_format``). ``isa``: the instruction set to ask for (auto, avx512, avx2, scalar;
    default ``OMNIJAX_CPU_ISA``)."""
    fmt = kernel_format(w_OI)
    if fmt is None:
        raise ValueError(f"no CPU kernel reads a weight of shape {w_OI.shape} stored as {_stored(w_OI)}")
    if native_library.library() is None:
        raise RuntimeError("omnijax's CPU kernels are missing (see the CpuKernelsMissing warning)")
    isa = native_library.isa_setting() if isa is None else isa
    if isa not in native_library.ISAS:
        raise ValueError(f"isa={isa!r}: use one of {', '.join(native_library.ISAS)}")
    out_dims = tuple(w_OI.shape[:-1])
    n_in = w_OI.shape[-1]
    if x_XI.shape[-1] != n_in:
        raise ValueError(f"x [..., {x_XI.shape[-1]}] does not fit a weight of shape {w_OI.shape}")
    rows = math.prod(x_XI.shape[:-1])
    x_RI = x_XI.reshape(rows, n_in).astype(jnp.float32)
    flat = lambda a: a.reshape(math.prod(out_dims), a.shape[-1])
    if fmt == "bf16":
        parts = (flat(w_OI),)
    else:
        parts = tuple(flat(a) for a in (w_OI.values, w_OI.scales, w_OI.offsets) if a is not None)
    call = jax.ffi.ffi_call(f"omnijax_matmul_{fmt}", jax.ShapeDtypeStruct((rows, math.prod(out_dims)), jnp.float32),
                            vmap_method="sequential")
    y_RO = call(x_RI, *parts, isa=isa)
    return y_RO.reshape(*x_XI.shape[:-1], *out_dims).astype(x_XI.dtype)


def narrow_matmul(x_XI: jax.Array, w_OI) -> jax.Array:
    """x [..., in] times the narrow weight [out..., in] -> [..., out...] in x's dtype: the CPU kernel where the
    default backend is the CPU, the kernels are built and one reads this weight; else ``reference``."""
    rows = math.prod(x_XI.shape[:-1])
    if (rows and jax.default_backend() == "cpu" and kernel_format(w_OI) is not None
            and native_library.library() is not None):
        return native(x_XI, w_OI)
    return reference(x_XI, w_OI)


def _stored(w) -> str:
    if is_quantized(w):
        return f"{w.bits}-bit values along axis {w.axis} (group {w.group}, {w.values.dtype} / {w.scales.dtype})"
    return str(jnp.dtype(w.dtype))
