"""Gemma 4's multimodal embedder (``Gemma4MultimodalEmbedder``): encoder features -> the text hidden size.

y = RMSNorm_without_scale(x) @ W.T: the norm (eps = the encoder config's ``rms_norm_eps``) is computed in float32
and has no weight; the projection has no bias. The checkpoint holds it as ``model.embed_vision.*`` (vision) and
``model.embed_audio.*`` (audio).

Parameter tree (paths relative to the module)::

    ("projection", "kernel")   [text_hidden, in_dim]   <- {key}.embedding_projection.weight
"""

from __future__ import annotations

import jax
from flax import nnx

from omnijax.common.linear import Linear
from omnijax.common.norms import rms_norm
from omnijax.common.weights import ParamPath, TensorSpec, linear


class MultimodalEmbedder(nnx.Module):
    """x [..., in_dim] -> [..., text_hidden]. ``axis_in`` names the encoder's feature axis for sharding."""

    def __init__(self, in_dim: int, text_hidden: int, *, eps: float, axis_in: str | None, rngs: nnx.Rngs):
        self.eps = float(eps)
        self.projection = Linear(in_dim, text_hidden, axes=(axis_in, "embed"), rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.projection(rms_norm(x, None, eps=self.eps, plus_one=False))


def multimodal_embedder_map(path: ParamPath, key: str) -> dict[ParamPath, TensorSpec]:
    """A ``MultimodalEmbedder`` at ``path`` <- ``{key}.embedding_projection.weight`` (``key`` e.g.
    ``model.embed_vision``)."""
    return {path + ("projection", "kernel"): linear(f"{key}.embedding_projection")}
