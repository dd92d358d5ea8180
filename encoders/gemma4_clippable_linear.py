"""Gemma 4's clippable linear (``Gemma4ClippableLinear``): a bias-free linear whose input and output are clamped to
bounds stored in the checkpoint (scalars; +-inf when unused) when the config sets ``use_clipped_linears``.

Parameter tree: ``kernel`` [out, in] (torch layout), and with clipping the scalars ``input_min``, ``input_max``,
``output_min``, ``output_max`` (shape ()). Checkpoint keys: ``{key}.linear.weight`` and ``{key}.input_min`` ...
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from common.linear import matmul_oi, param
from common.weights import ParamPath, TensorSpec, linear, plain

CLIP_BOUNDS = ("input_min", "input_max", "output_min", "output_max")


class ClippableLinear(nnx.Module):
    """y = clip(clip(x, input_min, input_max) @ kernel.T, output_min, output_max); x [..., in] -> [..., out].

    ``axes`` names the (in, out) dimensions, as for ``common.linear.Linear``."""

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
            x = jnp.clip(x, self.input_min[...].astype(x.dtype), self.input_max[...].astype(x.dtype))
        y = matmul_oi(x, self.kernel[...])
        if self.clipped:
            y = jnp.clip(y, self.output_min[...].astype(y.dtype), self.output_max[...].astype(y.dtype))
        return y


def clippable_linear_map(path: ParamPath, key: str, clipped: bool) -> dict[ParamPath, TensorSpec]:
    """A ``ClippableLinear`` at ``path`` <- ``{key}.linear.weight`` (and ``{key}.input_min`` ... with clipping)."""
    m = {path + ("kernel",): linear(f"{key}.linear")}
    if clipped:
        m.update({path + (name,): plain(f"{key}.{name}") for name in CLIP_BOUNDS})
    return m
