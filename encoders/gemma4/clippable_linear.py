"""Gemma 4's clippable linear layer (``Gemma4ClippableLinear``), the projections of both the vision and the audio
towers.

y = clamp(clamp(x, input_min, input_max) @ W.T, output_min, output_max), no bias (``torch.clamp``: max with the low
bound first, then min with the high one). The four bounds are scalar tensors of the checkpoint (``{key}.input_min``
...), present when the tower's config sets ``use_clipped_linears``; without it the layer is a plain linear
(``{key}.linear.weight`` only).

Parameter tree (paths relative to the module)::

    ("kernel",)                                          [out, in]   <- {key}.linear.weight
    ("input_min",) ("input_max",) ("output_min",) ("output_max",)   []   <- {key}.input_min ... (clipped only)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from omnijax.common.linear import matmul_oi, param
from omnijax.common.weights import ParamPath, TensorSpec, linear, plain

CLIP_BOUNDS = ("input_min", "input_max", "output_min", "output_max")


def _clamp(x: jax.Array, low: jax.Array, high: jax.Array) -> jax.Array:
    """torch.clamp(x, low, high): max with low first, then min with high."""
    return jnp.minimum(jnp.maximum(x, low.astype(x.dtype)), high.astype(x.dtype))


class ClippableLinear(nnx.Module):
    """x [..., in] -> [..., out]; kernel [out, in] (torch's layout) with logical axes ``axes`` given as (in, out),
    as for ``common.linear.Linear``.

    ``clipped``: whether the four scalar bounds exist (they start at -inf / +inf and are loaded from the
    checkpoint)."""

    def __init__(self, in_features: int, out_features: int, *, clipped: bool,
                 axes: tuple[str | None, str | None], rngs: nnx.Rngs):
        self.kernel = param(rngs, (out_features, in_features), (axes[1], axes[0]))
        self.clipped = clipped
        if clipped:
            self.input_min = nnx.Param(jnp.asarray(-jnp.inf, jnp.float32), axes=())
            self.input_max = nnx.Param(jnp.asarray(jnp.inf, jnp.float32), axes=())
            self.output_min = nnx.Param(jnp.asarray(-jnp.inf, jnp.float32), axes=())
            self.output_max = nnx.Param(jnp.asarray(jnp.inf, jnp.float32), axes=())

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.clipped:
            x = _clamp(x, self.input_min[...], self.input_max[...])
        y = matmul_oi(x, self.kernel[...])
        if self.clipped:
            y = _clamp(y, self.output_min[...], self.output_max[...])
        return y


def clippable_linear_map(path: ParamPath, key: str, clipped: bool) -> dict[ParamPath, TensorSpec]:
    """A ``ClippableLinear`` at ``path`` <- ``{key}.linear.weight`` (and ``{key}.input_min`` ... when clipped)."""
    m: dict[ParamPath, TensorSpec] = {path + ("kernel",): linear(f"{key}.linear")}
    if clipped:
        m.update({path + (name,): plain(f"{key}.{name}") for name in CLIP_BOUNDS})
    return m
