"""SigLIP vision tower (the image encoder of Gemma 3), matching Hugging Face ``SiglipVisionModel``.

Output: post-layernorm hidden states [N, num_patches, D] (``last_hidden_state``). The attention-pooling head is not
built: Gemma 3 never uses its output, so its checkpoint tensors are reported by ``siglip_unused_keys``.

Parameter tree (paths in the NNX state)::

    ("patch_embed", "kernel")    [D, C*p*p]   conv weight [D, C, p, p] -> reshape
    ("patch_embed", "bias")      [D]
    ("pos_embed",)               [num_patches, D]
    ("layers", i, "norm1" | "norm2", "weight" | "bias")                                 <- layer_norm1 | layer_norm2
    ("layers", i, "attn", "q_proj" | "k_proj" | "v_proj" | "out_proj", "kernel" | "bias")   <- self_attn.*
    ("layers", i, "mlp", "fc1" | "fc2", "kernel" | "bias")
    ("post_layernorm", "weight" | "bias")

Patches are unfolded in (channel, row-in-patch, column-in-patch) order, which is the row-major flattening of the
torch conv weight's [C, p, p] trailing axes, and patches are ordered row-major over the grid (torch's
``flatten(2).transpose(1, 2)``).
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
from flax import nnx

from omnijax.common.weights import ParamPath, TensorSpec, plain
from omnijax.common.linear import Linear, param
from omnijax.common.norms import LayerNorm
from omnijax.common.config_values import uniform_int
from omnijax.encoders.attention import attention
from omnijax.encoders.blocks import (FeedForward, MultiHeadProjections, PreLNBlock, feed_forward_map, layer_norm_map,
                                     multi_head_projections_map, pre_ln_block_norms_map)


@dataclasses.dataclass(frozen=True)
class SiglipVisionConfig:
    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    num_channels: int = 3
    image_size: int = 224
    patch_size: int = 16
    layer_norm_eps: float = 1e-6
    hidden_act: str = "gelu_pytorch_tanh"

    @classmethod
    def from_hf(cls, d: dict) -> "SiglipVisionConfig":
        """From a HF ``vision_config`` dict; missing keys take HF ``SiglipVisionConfig`` defaults."""
        defaults = cls()
        get = lambda name: d.get(name, getattr(defaults, name))  # noqa: E731
        return cls(
            hidden_size=int(get("hidden_size")),
            intermediate_size=int(get("intermediate_size")),
            num_hidden_layers=int(get("num_hidden_layers")),
            num_attention_heads=int(get("num_attention_heads")),
            num_channels=int(get("num_channels")),
            image_size=uniform_int(get("image_size"), "image_size"),
            patch_size=uniform_int(get("patch_size"), "patch_size"),
            layer_norm_eps=float(get("layer_norm_eps")),
            hidden_act=str(get("hidden_act")),
        )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.patches_per_side ** 2


class SiglipAttention(MultiHeadProjections):
    """Bidirectional multi-head self-attention with biases; scores scaled by head_dim**-0.5, softmax in float32."""

    def __init__(self, cfg: SiglipVisionConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg.hidden_size, cfg.num_attention_heads, "vision_embed", "vision_heads", rngs=rngs)

    def __call__(self, x_BLD: jax.Array) -> jax.Array:
        return super().__call__(x_BLD, lambda q, k, v: attention(q, k, v, scale=self.head_dim ** -0.5))


def siglip_encoder_layer(cfg: SiglipVisionConfig, *, rngs: nnx.Rngs) -> PreLNBlock:
    """Pre-LN transformer block: x + attn(norm1(x)), then x + mlp(norm2(x)); [B, L, D] -> [B, L, D]."""
    d = cfg.hidden_size
    return PreLNBlock(d, cfg.layer_norm_eps, "vision_embed", SiglipAttention(cfg, rngs=rngs),
                      FeedForward(d, cfg.intermediate_size, cfg.hidden_act, "vision_embed", "vision_mlp", rngs=rngs))


def unfold_patches(pixels_BCYX: jax.Array, patch_size: int) -> jax.Array:
    """[B, C, Y, X] -> [B, (Y/p)*(X/p), C*p*p]: row-major patch order, (channel, row, column) within a patch."""
    n, c, h, w = pixels_BCYX.shape
    p = patch_size
    if h % p or w % p:
        raise ValueError(f"image size {(h, w)} is not a multiple of the patch size {p}")
    x = pixels_BCYX.reshape(n, c, h // p, p, w // p, p)
    x = jnp.transpose(x, (0, 2, 4, 1, 3, 5))  # [B, Y/p, X/p, C, p, p]
    return x.reshape(n, (h // p) * (w // p), c * p * p)


class SiglipVisionTower(nnx.Module):
    """SigLIP vision encoder: patch embedding + learned positions, pre-LN encoder layers, post layernorm."""

    def __init__(self, cfg: SiglipVisionConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d = cfg.hidden_size
        self.patch_embed = Linear(cfg.num_channels * cfg.patch_size ** 2, d, axes=(None, "vision_embed"),
                                  use_bias=True, rngs=rngs)
        self.pos_embed = param(rngs, (cfg.num_patches, d), (None, "vision_embed"))
        self.layers = nnx.List([siglip_encoder_layer(cfg, rngs=rngs) for _ in range(cfg.num_hidden_layers)])
        self.post_layernorm = LayerNorm(d, eps=cfg.layer_norm_eps, axis_name="vision_embed")

    def __call__(self, pixels_BCYX: jax.Array) -> jax.Array:
        cfg = self.cfg
        if pixels_BCYX.shape[1:] != (cfg.num_channels, cfg.image_size, cfg.image_size):
            raise ValueError(f"expected pixels [images, {cfg.num_channels}, {cfg.image_size}, {cfg.image_size}], "
                             f"got {pixels_BCYX.shape}")
        dtype = self.patch_embed.kernel[...].dtype
        x = self.patch_embed(unfold_patches(pixels_BCYX.astype(dtype), cfg.patch_size))
        x = x + self.pos_embed[...].astype(x.dtype)[None]
        for layer in self.layers:
            x = layer(x)
        return self.post_layernorm(x)


def siglip_weight_map(cfg: SiglipVisionConfig, key_prefix: str = "vision_tower.") -> dict[ParamPath, TensorSpec]:
    """Every parameter of ``SiglipVisionTower`` -> its checkpoint tensor (keys as HF 5.x writes them)."""
    p = key_prefix
    c, ps, d = cfg.num_channels, cfg.patch_size, cfg.hidden_size
    m: dict[ParamPath, TensorSpec] = {
        ("patch_embed", "kernel"): TensorSpec(f"{p}embeddings.patch_embedding.weight",
                                              reshape=(d, c * ps * ps)),
        ("patch_embed", "bias"): plain(f"{p}embeddings.patch_embedding.bias"),
        ("pos_embed",): plain(f"{p}embeddings.position_embedding.weight"),
        **layer_norm_map(("post_layernorm",), f"{p}post_layernorm"),
    }
    for i in range(cfg.num_hidden_layers):
        lp = f"{p}encoder.layers.{i}."
        m.update(pre_ln_block_norms_map(("layers", i), f"{lp}layer_norm1", f"{lp}layer_norm2"))
        m.update(multi_head_projections_map(("layers", i, "attn"), f"{lp}self_attn"))
        m.update(feed_forward_map(("layers", i, "mlp"), f"{lp}mlp.fc1", f"{lp}mlp.fc2"))
    return m


_HEAD_SUFFIXES = (
    "head.probe",
    "head.attention.in_proj_weight",
    "head.attention.in_proj_bias",
    "head.attention.out_proj.weight",
    "head.attention.out_proj.bias",
    "head.layernorm.weight",
    "head.layernorm.bias",
    "head.mlp.fc1.weight",
    "head.mlp.fc1.bias",
    "head.mlp.fc2.weight",
    "head.mlp.fc2.bias",
)


def siglip_unused_keys(cfg: SiglipVisionConfig, hf_config_dict: dict, key_prefix: str = "vision_tower.") -> list[str]:
    """Checkpoint keys of the vision tower that are on disk but not used (the attention-pooling head's tensors,
    present when ``vision_use_head`` is true, the HF default). ``hf_config_dict`` is the vision_config dict or the
    whole model config dict holding it under ``"vision_config"``."""
    del cfg  # the head's tensor names do not depend on sizes
    vision = hf_config_dict.get("vision_config", hf_config_dict) if hf_config_dict else {}
    if not vision.get("vision_use_head", True):
        return []
    return [key_prefix + s for s in _HEAD_SUFFIXES]


def siglip_unused_key_pattern(key_prefix: str = "vision_tower.") -> re.Pattern:
    """A regex matching every vision-tower head key (``{prefix}head.*``), whatever the config says."""
    return re.compile(re.escape(key_prefix) + r"head\..*")
