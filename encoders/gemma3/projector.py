"""Gemma 3 multimodal projector: SigLIP patch features -> soft tokens in the text model's width.

Matches HF ``Gemma3MultiModalProjector``: the [B, L, D] patch features are laid out on the square patch grid,
average-pooled with a (patches_per_side // tokens_per_side) window and stride, flattened row-major over the pooled
grid, RMS-normalised with (1 + w) scaling and multiplied by ``mm_input_projection_weight`` [vision_D, text_D].

Parameter tree::

    ("mm_input_projection_weight",)   [vision_D, text_D]   used as x @ W (stored untransposed on disk)
    ("mm_soft_emb_norm", "weight")    [vision_D]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from omnijax.common.weights import ParamPath, TensorSpec, plain
from omnijax.common.linear import param
from omnijax.common.norms import RMSNorm


class Gemma3Projector(nnx.Module):
    def __init__(self, vision_hidden: int, text_hidden: int, patches_per_side: int, tokens_per_side: int,
                 eps: float = 1e-6, *, rngs: nnx.Rngs):
        if tokens_per_side <= 0 or patches_per_side % tokens_per_side:
            raise ValueError(f"patches_per_side {patches_per_side} is not a multiple of tokens_per_side "
                             f"{tokens_per_side}")
        self.patches_per_side = patches_per_side
        self.tokens_per_side = tokens_per_side
        self.kernel_size = patches_per_side // tokens_per_side
        self.mm_soft_emb_norm = RMSNorm(vision_hidden, eps=eps, plus_one=True, axis_name="vision_embed")
        self.mm_input_projection_weight = param(rngs, (vision_hidden, text_hidden), ("vision_embed", "embed"))

    @property
    def mm_tokens(self) -> int:
        return self.tokens_per_side ** 2

    def __call__(self, x_BLD: jax.Array) -> jax.Array:
        """Patch features [B, L, D] (L = patches_per_side**2) -> soft tokens [B, tokens_per_side**2, text_D]."""
        n, p, d = x_BLD.shape
        s, t, k = self.patches_per_side, self.tokens_per_side, self.kernel_size
        if p != s * s:
            raise ValueError(f"expected {s * s} patches, got {p}")
        # patch index = row * s + col; row = ti * k + ki, col = tj * k + kj. Pool over (ki, kj) and keep the
        # pooled grid row-major (ti, tj), as torch's AvgPool2d(k, k) + flatten(2) does.
        grid = x_BLD.reshape(n, t, k, t, k, d)
        pooled = jnp.mean(grid.astype(jnp.float32), axis=(2, 4)).astype(x_BLD.dtype).reshape(n, t * t, d)
        normed = self.mm_soft_emb_norm(pooled)
        w = self.mm_input_projection_weight[...]
        return jnp.matmul(normed, w.astype(normed.dtype)).astype(x_BLD.dtype)


def gemma3_projector_weight_map(key_prefix: str = "multi_modal_projector.") -> dict[ParamPath, TensorSpec]:
    return {
        ("mm_input_projection_weight",): plain(f"{key_prefix}mm_input_projection_weight"),
        ("mm_soft_emb_norm", "weight"): plain(f"{key_prefix}mm_soft_emb_norm.weight"),
    }
