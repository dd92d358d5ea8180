"""How a product with a weight is computed, chosen per shape in one place.

A weight is stored in one of: float32, bfloat16 (or float16), or a ``QuantizedArray`` (int8 / int4 with scales,
common/quantized.py). Activations are float32 wherever narrow products are slow (CPUs without bf16 dot
instructions) and keep the weights' dtype elsewhere (``activation_dtype``). A product then goes one of two ways:

- few rows (a decode step: at most ``DECODE_ROWS`` rows): on CPU a native kernel reads an int8, int4 or bfloat16
  weight as its stored bytes and widens them in registers (common/kernels/narrow_matmul.py: XLA would first write a
  widened copy of the weight to memory, and decode is bandwidth bound); elsewhere, or where the kernels are not
  built, the weight is widened to the activations' dtype next to the product, and an int8 weight's per-channel
  scales multiply the product's output instead of every weight (the kernel's pure-JAX reference);
- many rows (a prompt, a batch): where the platform multiplies bfloat16 fast (every GPU and TPU, CPUs with
  avx512_bf16 or AMX: ``fast_bf16_products``), a narrow weight and the activations meet as bfloat16 with float32
  accumulation; elsewhere as float32. ``OMNIJAX_NARROW_PRODUCTS`` (float32 / bfloat16) forces one way on every
  platform, e.g. to get the same numbers on every CPU. The engine's programs read it when they are called
  (``products_setting``, a static argument: another setting is another program) and trace under it
  (``narrow_products``); other code reads it when it is traced.

Float32 weights with float32 activations take exactly the product they always took (the parity tests' numbers).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os

import jax
import jax.numpy as jnp

from omnijax.common.cpu import cpu_flags
from omnijax.common.kernels.narrow_matmul import narrow_matmul
from omnijax.common.kernels.narrow_matmul import reference as narrow_reference
from omnijax.common.quantized import QuantizedArray, is_quantized

DECODE_ROWS = 16  # products with at most this many rows: the CPU kernel, elsewhere the weight widened next to them
_FAST_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
NARROW_PRODUCTS_ENV = "OMNIJAX_NARROW_PRODUCTS"
_FORCED = {"float32": False, "bfloat16": True}


_TRACING_PRODUCTS: contextvars.ContextVar[str | None] = contextvars.ContextVar("narrow_products", default=None)


@contextlib.contextmanager
def narrow_products(kind: str | None):
    """A block whose traced products of narrow weights with many rows run as ``kind`` ("float32" / "bfloat16";
    None: as ``fast_bf16_products`` finds)."""
    token = _TRACING_PRODUCTS.set(kind)
    try:
        yield
    finally:
        _TRACING_PRODUCTS.reset(token)


def products_setting(environ=os.environ) -> str:
    """"bfloat16" or "float32": how products of narrow weights with many rows run now (``fast_bf16_products``)."""
    return "bfloat16" if fast_bf16_products(environ=environ) else "float32"


def fast_bf16_products(platform: str | None = None, flags: frozenset[str] | None = None,
                       environ=os.environ) -> bool:
    """Whether products of narrow weights with many rows run as bfloat16 x bfloat16 (float32 accumulation): what
    the enclosing ``narrow_products`` block says, else what ``OMNIJAX_NARROW_PRODUCTS`` forces (float32 /
    bfloat16), else where they beat float32 ones on ``platform`` (default: JAX's default backend): every GPU and
    TPU, and CPUs with avx512_bf16 or AMX."""
    tracing = _TRACING_PRODUCTS.get()
    if tracing is not None:
        return _FORCED[tracing]
    forced = environ.get(NARROW_PRODUCTS_ENV, "") or "auto"
    if forced != "auto":
        if forced not in _FORCED:
            raise ValueError(f"{NARROW_PRODUCTS_ENV}={forced!r}: use auto, float32 or bfloat16")
        return _FORCED[forced]
    platform = platform or jax.default_backend()
    if platform != "cpu":
        return True
    flags = cpu_flags() if flags is None else flags
    return any(f in flags for f in _FAST_BF16_CPU_FLAGS)


def activation_dtype(weight_dtype, platform: str | None = None):
    """The dtype activations flow in for weights stored as ``weight_dtype``: float32 on a CPU (its narrow products
    are slow; narrow weights are widened next to their products), the weights' own float dtype elsewhere."""
    if weight_dtype is None or not jnp.issubdtype(weight_dtype, jnp.floating):
        return jnp.float32
    platform = platform or jax.default_backend()
    return jnp.dtype(jnp.float32) if platform == "cpu" else jnp.dtype(weight_dtype)


def weight_dtype(w) -> jnp.dtype:
    """The float dtype of a stored weight (float32 for a QuantizedArray)."""
    return jnp.dtype(w.dtype)


def widened(w, dtype) -> jax.Array:
    """The weight ``w`` (an array or a QuantizedArray) as a ``dtype`` array (elementwise, fusable)."""
    if is_quantized(w):
        return w.dequantize(dtype)
    return w.astype(dtype)


def _narrow(w) -> bool:
    return is_quantized(w) or jnp.dtype(w.dtype).itemsize < 4


def matmul_oi(x_XI: jax.Array, w_OI) -> jax.Array:
    """x [..., in] times a weight stored [out..., in] (torch's layout) -> [..., out...] in x's dtype, contracting
    the last axes (a direct dot_general: on XLA's CPU backend this layout streams the weight faster than
    [in, out] for decode-sized batches, with no transpose op).

    w_OI: an array or a ``QuantizedArray`` quantized along its last axis."""
    rows = math.prod(x_XI.shape[:-1])
    out_dims = tuple(w_OI.shape[:-1])
    dims = (((x_XI.ndim - 1,), (len(out_dims),)), ((), ()))
    if not _narrow(w_OI):  # float32 weights: the product they always took
        return jax.lax.dot_general(x_XI, w_OI.astype(x_XI.dtype), dims)
    if rows > DECODE_ROWS and fast_bf16_products():
        y = jax.lax.dot_general(x_XI.astype(jnp.bfloat16), widened(w_OI, jnp.bfloat16), dims,
                                preferred_element_type=jnp.float32)
        return y.astype(x_XI.dtype)
    if rows <= DECODE_ROWS:  # on CPU the native kernel reads the narrow bytes; elsewhere its reference below
        return narrow_matmul(x_XI, w_OI)
    return narrow_reference(x_XI, w_OI)


def logits_matmul(h_BLD: jax.Array, w_VD) -> jax.Array:
    """Logits [B, L, V] in float32 from the output matrix [V, D] (an array or a QuantizedArray)."""
    if not _narrow(w_VD):
        return jnp.einsum("bld,vd->blv", h_BLD, w_VD.astype(h_BLD.dtype), preferred_element_type=jnp.float32)
    return matmul_oi(h_BLD.astype(jnp.float32) if h_BLD.dtype != jnp.float32 else h_BLD, w_VD).astype(jnp.float32)


def table_rows(table_VD, ids, dtype) -> jax.Array:
    """Rows ``ids`` of an embedding table [V, D] (an array or a QuantizedArray quantized along D) as ``dtype``."""
    if is_quantized(table_VD):
        return table_VD[ids].dequantize(dtype)
    return jnp.take(table_VD, ids, axis=0)


def expert_weights(w, dtype):
    """Expert weights [E, ...] as ``dtype`` for the mixture-of-experts products (a QuantizedArray stays one: the
    experts' code gathers the selected experts first, then widens them)."""
    return w if is_quantized(w) else w.astype(dtype)


__all__ = ["DECODE_ROWS", "QuantizedArray", "activation_dtype", "cpu_flags", "expert_weights", "fast_bf16_products",
           "logits_matmul", "matmul_oi", "narrow_products", "products_setting", "table_rows", "weight_dtype",
           "widened"]
