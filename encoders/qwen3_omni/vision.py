"""Qwen3-Omni vision tower with deepstack features, matching Hugging Face ``Qwen3OmniMoeVisionEncoder``.

Input layout (``QwenVisionTower.encode``): frame blocks. Attention is restricted to each frame of each image
(``cu_seqlens`` in the reference: t segments of h*w patches per grid entry), so every frame of the batch gets its
own block of a [frames, frame_patches] array: its patches first, in the processor's 2x2 spatial-merge-block order
(each patch flattened in (channel, frame, row, column) order), then padding. Everything that depends on the grids
is data laid out the same way (preprocess/qwen3_omni/image_batch.py): learned-position interpolation taps and
weights, 2-D RoPE positions, a valid mask. Attention runs per block over its valid patches, so a program compiled
for one (frames, frame_patches) bucket serves every grid that fits it.

Output: merged tokens [frames * frame_patches / merge**2, out_hidden] and one such array per deepstack layer, row
r of block f being the r-th merged token of frame f (rows past a frame's tokens are padding).

Parameter tree (paths in the NNX state) and logical axes::

    ("patch_embed", "kernel")              [D, F]  ("vision_embed", None)   conv3d weight [D, C, t, p, p], F = C*t*p*p
    ("patch_embed", "bias")                [D]
    ("pos_embed",)                         [num_position_embeddings, D]  (None, "vision_embed")
    ("blocks", i, "norm1" | "norm2", "weight" | "bias")        [D]  ("vision_embed",)
    ("blocks", i, "attn", "qkv", "kernel") [D, 3, D]  ("vision_embed", None, "vision_heads")  torch [3D, D]
    ("blocks", i, "attn", "qkv", "bias")   [3, D]     (None, "vision_heads")
    ("blocks", i, "attn", "proj", "kernel" | "bias")           ("vision_heads", "vision_embed")
    ("blocks", i, "mlp", "fc1" | "fc2", "kernel" | "bias")   "vision_embed" <-> "vision_mlp"  <- linear_fc1 | 2
    ("merger", "ln_q", "weight" | "bias")  [D]
    ("merger" | ("deepstack_mergers", j), "mlp", "fc1", ...)  [4D, 4D]  ("vision_merge", "vision_mlp")  <- mlp.0
    ("merger" | ("deepstack_mergers", j), "mlp", "fc2", ...)  [out_hidden, 4D]  ("vision_mlp", "embed")  <- mlp.2
    ("deepstack_mergers", j, "ln_q", "weight" | "bias")  [4D]  ("vision_merge",)

Linear kernels are stored [out, in] (torch's layout); their axes above are given in (in, out) order.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from omnijax.common.weights import ParamPath, TensorSpec, plain
from omnijax.common.linear import Linear, param
from omnijax.common.activations import activation
from omnijax.common.norms import LayerNorm
from omnijax.common.config_values import config_getter, uniform_int
from omnijax.encoders.attention import attention
from omnijax.encoders.blocks import (FeedForward, PreLNBlock, biased_linear_map, feed_forward_map, layer_norm_map,
                                     pre_ln_block_norms_map)
from omnijax.encoders.rope_2d import apply_rope_2d, rope_2d_angles, rope_2d_cos_sin


@dataclasses.dataclass(frozen=True)
class QwenVisionConfig:
    depth: int = 27
    hidden_size: int = 1152
    hidden_act: str = "gelu_pytorch_tanh"
    intermediate_size: int = 4304
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 16
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    out_hidden_size: int = 3584
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: tuple[int, ...] = (8, 16, 24)
    rope_theta: float = 10000.0
    layer_norm_eps: float = 1e-6  # fixed in the reference (every vision LayerNorm uses eps=1e-6)

    @classmethod
    def from_hf(cls, d: dict) -> "QwenVisionConfig":
        """From the thinker config's ``vision_config`` dict; missing keys take HF defaults."""
        defaults = cls()
        get = config_getter(d, defaults)
        rope = d.get("rope_parameters") or {}
        cfg = cls(
            depth=int(get("depth", "num_hidden_layers")),
            hidden_size=int(get("hidden_size")),
            hidden_act=str(get("hidden_act")),
            intermediate_size=int(get("intermediate_size")),
            num_heads=int(get("num_heads", "num_attention_heads")),
            in_channels=int(get("in_channels", "in_chans")),
            patch_size=uniform_int(get("patch_size"), "patch_size"),
            spatial_merge_size=int(get("spatial_merge_size")),
            temporal_patch_size=uniform_int(get("temporal_patch_size"), "temporal_patch_size"),
            out_hidden_size=int(get("out_hidden_size")),
            num_position_embeddings=int(get("num_position_embeddings")),
            deepstack_visual_indexes=tuple(int(i) for i in get("deepstack_visual_indexes")),
            rope_theta=float(rope.get("rope_theta", d.get("rope_theta", defaults.rope_theta))),
        )
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"vision hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.head_dim % 4:
            raise ValueError(f"vision head_dim {self.head_dim} must be a multiple of 4 for the 2-D rotary embedding")
        bad = [i for i in self.deepstack_visual_indexes if not 0 <= i < self.depth]
        if bad:
            raise ValueError(f"deepstack_visual_indexes {bad} are outside the {self.depth} vision blocks")
        activation(self.hidden_act)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Length of one flattened input patch: C * T * p * p."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size ** 2

    @property
    def num_grid_per_side(self) -> int:
        return int(self.num_position_embeddings ** 0.5)


# ---------------------------------------------------------------------------------------------------------------
# Modules.


class QKVLinear(nnx.Module):
    """Fused q/k/v projection: kernel [D, 3, D] (torch's [3D, D] weight transposed), bias [3, D]."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs):
        self.kernel = param(rngs, (dim, 3, dim), ("vision_embed", None, "vision_heads"))
        self.bias = nnx.Param(jnp.zeros((3, dim)), axes=(None, "vision_heads"))

    def __call__(self, x_BLD: jax.Array) -> jax.Array:
        """[..., D] -> [..., 3, D] (q, k, v)."""
        y = jnp.einsum("...d,dtf->...tf", x_BLD, self.kernel[...].astype(x_BLD.dtype))
        return y + self.bias[...].astype(y.dtype)


class QwenVisionAttention(nnx.Module):
    def __init__(self, cfg: QwenVisionConfig, *, rngs: nnx.Rngs):
        d = cfg.hidden_size
        self.num_heads = cfg.num_heads
        self.head_dim = cfg.head_dim
        self.qkv = QKVLinear(d, rngs=rngs)
        self.proj = Linear(d, d, axes=("vision_heads", "vision_embed"), use_bias=True, rngs=rngs)

    def __call__(self, x_BLD: jax.Array, cos_BLH: jax.Array, sin_BLH: jax.Array, valid_BL: jax.Array):
        """Attention within each frame block over its valid patches; x [B, L, D] (B frame blocks) -> [B, L, D]."""
        f, l = x_BLD.shape[:2]
        qkv = self.qkv(x_BLD).reshape(f, l, 3, self.num_heads, self.head_dim)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        q, k = (apply_rope_2d(x, cos_BLH, sin_BLH, float32=True) for x in (q, k))
        out = attention(q, k, v, valid_BL, scale=self.head_dim ** -0.5)
        return self.proj(out.reshape(f, l, self.num_heads * self.head_dim))


def qwen_vision_block(cfg: QwenVisionConfig, *, rngs: nnx.Rngs) -> PreLNBlock:
    """Pre-LN block: x + attn(norm1(x), cos, sin, valid), then x + mlp(norm2(x)); [B, L, D] -> [B, L, D]."""
    d = cfg.hidden_size
    return PreLNBlock(d, cfg.layer_norm_eps, "vision_embed", QwenVisionAttention(cfg, rngs=rngs),
                      FeedForward(d, cfg.intermediate_size, cfg.hidden_act, "vision_embed", "vision_mlp", rngs=rngs))


class QwenPatchMerger(nnx.Module):
    """merge x merge neighbouring patches -> one token: LayerNorm, group 4 consecutive patches, Linear, GELU (erf),
    Linear. ``postshuffle_norm`` (deepstack mergers) normalises over the grouped 4*D features instead of per patch."""

    def __init__(self, cfg: QwenVisionConfig, postshuffle_norm: bool, *, rngs: nnx.Rngs):
        self.merged = cfg.hidden_size * cfg.merge_unit
        self.postshuffle_norm = postshuffle_norm
        self.ln_q = LayerNorm(self.merged if postshuffle_norm else cfg.hidden_size, eps=cfg.layer_norm_eps,
                              axis_name="vision_merge" if postshuffle_norm else "vision_embed")
        self.mlp = FeedForward(self.merged, self.merged, "gelu", "vision_merge", "vision_mlp", rngs=rngs,
                               out_dim=cfg.out_hidden_size, axes_out="embed")

    def __call__(self, x_RD: jax.Array) -> jax.Array:
        """[R, D] patches in merge-block order -> [R / merge**2, out_hidden]."""
        if self.postshuffle_norm:
            x = self.ln_q(x_RD.reshape(-1, self.merged))
        else:
            x = self.ln_q(x_RD).reshape(-1, self.merged)
        return self.mlp(x)


class QwenVisionTower(nnx.Module):
    """Patch embedding + interpolated learned positions, 2-D RoPE blocks with per-frame attention, final merger and
    deepstack mergers. ``encode`` takes frame blocks."""

    def __init__(self, cfg: QwenVisionConfig, *, rngs: nnx.Rngs):
        cfg.validate()
        self.cfg = cfg
        d = cfg.hidden_size
        self.patch_embed = Linear(cfg.patch_dim, d, axes=(None, "vision_embed"), use_bias=True, rngs=rngs)
        self.pos_embed = param(rngs, (cfg.num_position_embeddings, d), (None, "vision_embed"))
        self.blocks = nnx.List([qwen_vision_block(cfg, rngs=rngs) for _ in range(cfg.depth)])
        self.merger = QwenPatchMerger(cfg, postshuffle_norm=False, rngs=rngs)
        self.deepstack_mergers = nnx.List([QwenPatchMerger(cfg, postshuffle_norm=True, rngs=rngs)
                                           for _ in cfg.deepstack_visual_indexes])

    def encode(self, patches_BLF: jax.Array, pos_index_BL4: jax.Array, pos_weight_BL4: jax.Array,
               rope_pos_BL2: jax.Array, valid_BL: jax.Array) -> tuple[jax.Array, list[jax.Array]]:
        """B frame blocks (preprocess/qwen3_omni/image_batch.py) -> (merged tokens [B*L/merge**2, out_hidden],
        [deepstack features of the same shape per deepstack layer]). patches [B, L, F]; L a multiple of merge**2."""
        cfg = self.cfg
        f, l = valid_BL.shape
        if patches_BLF.shape != (f, l, cfg.patch_dim) or l % cfg.merge_unit:
            raise ValueError(f"expected patch blocks [{f}, {l}, {cfg.patch_dim}] with {l} a multiple of "
                             f"{cfg.merge_unit}, got {tuple(patches_BLF.shape)}")
        dtype = self.patch_embed.kernel[...].dtype
        x = self.patch_embed(patches_BLF.astype(dtype))
        table = self.pos_embed[...].astype(jnp.float32)
        pos = jnp.sum(table[pos_index_BL4] * pos_weight_BL4[..., None].astype(jnp.float32), axis=-2)
        x = x + pos.astype(x.dtype)
        cos, sin = rope_2d_cos_sin(rope_2d_angles(rope_pos_BL2, cfg.head_dim, cfg.rope_theta))
        deepstack = []
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, valid_BL)
            if i in cfg.deepstack_visual_indexes:
                merger = self.deepstack_mergers[cfg.deepstack_visual_indexes.index(i)]
                deepstack.append(merger(x.reshape(f * l, -1)))
        return self.merger(x.reshape(f * l, -1)), deepstack


def qwen_vision_weight_map(cfg: QwenVisionConfig, key_prefix: str = "thinker.visual.") -> dict[ParamPath, TensorSpec]:
    """Every parameter of ``QwenVisionTower`` -> its checkpoint tensor. ``key_prefix``: ``thinker.visual.`` in a
    full Qwen3-Omni checkpoint, ``visual.`` in a thinker-only one."""
    p = key_prefix
    d = cfg.hidden_size
    m: dict[ParamPath, TensorSpec] = {
        ("patch_embed", "kernel"): TensorSpec(f"{p}patch_embed.proj.weight",
                                              reshape=(d, cfg.patch_dim)),
        ("patch_embed", "bias"): plain(f"{p}patch_embed.proj.bias"),
        ("pos_embed",): plain(f"{p}pos_embed.weight"),
    }
    for i in range(cfg.depth):
        bp = f"{p}blocks.{i}."
        m.update(pre_ln_block_norms_map(("blocks", i), f"{bp}norm1", f"{bp}norm2"))
        m[("blocks", i, "attn", "qkv", "kernel")] = TensorSpec(f"{bp}attn.qkv.weight", transpose=(1, 0),
                                                               reshape=(d, 3, d))
        m[("blocks", i, "attn", "qkv", "bias")] = TensorSpec(f"{bp}attn.qkv.bias", reshape=(3, d))
        m.update(biased_linear_map(("blocks", i, "attn", "proj"), f"{bp}attn.proj"))
        m.update(feed_forward_map(("blocks", i, "mlp"), f"{bp}mlp.linear_fc1", f"{bp}mlp.linear_fc2"))

    def merger(path: ParamPath, kp: str) -> None:
        m.update(layer_norm_map(path + ("ln_q",), f"{kp}ln_q"))
        m.update(feed_forward_map(path + ("mlp",), f"{kp}mlp.0", f"{kp}mlp.2"))

    merger(("merger",), f"{p}merger.")
    for j in range(len(cfg.deepstack_visual_indexes)):
        merger(("deepstack_mergers", j), f"{p}merger_list.{j}.")
    return m

