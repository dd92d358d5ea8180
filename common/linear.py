"""Dense layers whose parameters carry logical axis names.

Every parameter in omnijax is an ``nnx.Param`` with an ``axes`` metadata tuple of logical axis names (one per
dimension, ``None`` for a replicated dimension). common/sharding.py maps those names to mesh axes. Modules are built
under ``nnx.eval_shape`` and their values come from a checkpoint, so initialisers only need the right shape.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from omnijax.common.matmul_policy import matmul_oi

__all__ = ["Linear", "matmul_oi", "param"]


def param(rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str | None, ...], dtype=jnp.float32,
          scale: float = 0.02, quant_axis: int | None = None, int4: bool = True) -> nnx.Param:
    """A randomly initialised parameter tagged with logical ``axes`` (len(axes) == len(shape)).

    quant_axis: for a weight matrix that may be stored quantized (common/quantized.py), the axis its products
    contract (its values are grouped along it); the loader quantizes only parameters that name one. int4=False:
    a weight that stays int8 when int4 is asked (the embedding / output matrix, as llama.cpp's Q4_K_M files keep
    it at 8 bits: 4 bits there cost far more quality than anywhere else)."""
    if len(axes) != len(shape):
        raise ValueError(f"axes {axes} do not match shape {shape}")
    extra = {} if quant_axis is None else {"quant_axis": quant_axis % len(shape), "quant_int4": bool(int4)}
    return nnx.Param(scale * jax.random.normal(rngs.params(), shape, dtype), axes=tuple(axes), **extra)


class Linear(nnx.Module):
    """y = x @ kernel.T (+ bias). ``kernel`` is [out, in], as torch's nn.Linear stores its weight (or a
    QuantizedArray of it; common/matmul_policy.py computes the product).

    ``axes`` names the (in, out) dimensions; the kernel's own axes are therefore (out, in)."""

    def __init__(self, in_features: int, out_features: int, *, axes: tuple[str | None, str | None],
                 use_bias: bool = False, rngs: nnx.Rngs):
        self.kernel = param(rngs, (out_features, in_features), (axes[1], axes[0]), quant_axis=-1)
        self.bias = nnx.Param(jnp.zeros((out_features,)), axes=(axes[1],)) if use_bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        y = matmul_oi(x, self.kernel[...])
        if self.bias is not None:
            y = y + self.bias[...].astype(y.dtype)
        return y
