"""Dense layers whose parameters carry logical axis names.

Every parameter in omnijax is an ``nnx.Param`` with an ``axes`` metadata tuple of logical axis names (one per
dimension, ``None`` for a replicated dimension). ``app.mesh`` maps those names to mesh axes. Modules are built under
``nnx.eval_shape`` and their values come from a checkpoint, so initialisers only need the right shape.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


def param(rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str | None, ...], dtype=jnp.float32,
          scale: float = 0.02) -> nnx.Param:
    """A randomly initialised parameter tagged with logical ``axes`` (len(axes) == len(shape))."""
    if len(axes) != len(shape):
        raise ValueError(f"axes {axes} do not match shape {shape}")
    return nnx.Param(scale * jax.random.normal(rngs.params(), shape, dtype), axes=tuple(axes))


class Linear(nnx.Module):
    """y = x @ kernel (+ bias). ``kernel`` is [in, out] (the transpose of torch's nn.Linear weight)."""

    def __init__(self, in_features: int, out_features: int, *, axes: tuple[str | None, str | None],
                 use_bias: bool = False, rngs: nnx.Rngs):
        self.kernel = param(rngs, (in_features, out_features), axes)
        self.bias = nnx.Param(jnp.zeros((out_features,)), axes=(axes[1],)) if use_bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.kernel[...]
        y = jnp.matmul(x, kernel.astype(x.dtype))
        if self.bias is not None:
            y = y + self.bias[...].astype(y.dtype)
        return y
