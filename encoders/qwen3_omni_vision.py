"""Qwen3-Omni vision tower with deepstack features, matching Hugging Face ``Qwen3OmniMoeVisionEncoder``.

Input: pixel patches [total_patches, C*T*p*p] exactly as the Qwen3-Omni image processor emits them (each image's
patches in 2x2 spatial-merge-block order, each patch flattened in (channel, frame, row, column) order) and the
per-image grids ``grid_thw`` as a static tuple of (t, h, w) in patches. Output: the merged image embeddings
[total_patches / merge**2, out_hidden] and one [total_patches / merge**2, out_hidden] array per deepstack layer.

Everything that depends on the grids (learned-position interpolation taps, 2-D RoPE positions, attention segments)
is computed with numpy at trace time, so a jitted call specialises on the grids and keeps static shapes.

Attention is restricted to each frame of each image (``cu_seqlens`` in the reference: t segments of h*w patches per
grid entry), computed as dense attention over groups of equal-length segments (``segment_attention``).

Parameter tree (paths in the NNX state) and logical axes::

    ("patch_embed", "kernel")              [D, C*T*p*p]  ("vision_embed", None)   conv3d weight [D, C, T, p, p]
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
import numpy as np
from flax import nnx

from common.weights import ParamPath, TensorSpec, plain
from common.linear import Linear, param
from common.activations import activation
from common.norms import LayerNorm
from common.config_values import config_getter, uniform_int
from encoders.blocks import (FeedForward, PreLNBlock, biased_linear_map, feed_forward_map, layer_norm_map,
                             pre_ln_block_norms_map)

Grid = tuple[tuple[int, int, int], ...]

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
# Static (numpy, trace-time) helpers: everything that depends only on the grids.


def check_grid(grid_thw, merge: int) -> Grid:
    """``grid_thw`` as a tuple of (t, h, w) Python ints; h and w must be multiples of the merge size."""
    try:
        grid = tuple((int(t), int(h), int(w)) for t, h, w in grid_thw)
    except (TypeError, ValueError):
        raise ValueError(f"grid_thw must be a sequence of (t, h, w) triples, got {grid_thw!r}") from None
    if not grid:
        raise ValueError("grid_thw is empty: at least one image is needed")
    for t, h, w in grid:
        if t < 1 or h < 1 or w < 1:
            raise ValueError(f"grid {(t, h, w)} has a non-positive size")
        if h % merge or w % merge:
            raise ValueError(f"grid {(t, h, w)}: h and w must be multiples of spatial_merge_size {merge}")
    return grid


def vision_patch_count(grid_thw: Grid) -> int:
    return sum(t * h * w for t, h, w in grid_thw)


def vision_token_count(grid_thw: Grid, merge: int) -> int:
    """Merged tokens for all grids: sum(t*h*w) / merge**2."""
    return vision_patch_count(grid_thw) // (merge * merge)


def vision_segments(grid_thw: Grid) -> tuple[int, ...]:
    """Attention segment lengths: each of the t frames of each grid entry is one segment of h*w patches."""
    return tuple(h * w for t, h, w in grid_thw for _ in range(t))


def _merge_block_rows_cols(h: int, w: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of each of one frame's h*w patches, in spatial-merge-block order."""
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    shape = (h // merge, merge, w // merge, merge)
    return (rows.reshape(shape).transpose(0, 2, 1, 3).reshape(-1),
            cols.reshape(shape).transpose(0, 2, 1, 3).reshape(-1))


def vision_rope_positions(grid_thw: Grid, merge: int) -> np.ndarray:
    """[total_patches, 2] int32 (row, col) of every patch, frames repeating the same positions."""
    out = []
    for t, h, w in grid_thw:
        rows, cols = _merge_block_rows_cols(h, w, merge)
        out.append(np.tile(np.stack([rows, cols], axis=-1), (t, 1)))
    return np.concatenate(out, axis=0).astype(np.int32)


def _axis_taps(index: np.ndarray, size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Bilinear (align_corners=True) taps [n, 2] into a ``side``-long axis and their float32 weights [n, 2], with
    the reference's float32 operation order (``index * (side-1) / max(size-1, 1)``, border clamping)."""
    index = index.astype(np.float32)
    src = index * np.float32(side - 1) / np.float32(max(size - 1, 1))
    floor = np.floor(src)
    offsets = np.arange(2)
    taps = np.clip(floor.astype(np.int64)[:, None] + offsets, 0, side - 1)
    distance = np.abs(src[:, None] - floor[:, None] - offsets.astype(np.float32))
    weights = np.maximum(np.float32(1) - distance, np.float32(0)).astype(np.float32)
    return taps, weights


def vision_pos_interpolation(grid_thw: Grid, side: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices [total_patches, 4] int32 into the flattened (side x side) learned position table and float32 weights
    [total_patches, 4] that resample it bilinearly (align_corners=True) to each grid, in merge-block order."""
    indices, weights = [], []
    for t, h, w in grid_thw:
        rows, cols = _merge_block_rows_cols(h, w, merge)
        h_taps, h_w = _axis_taps(rows, h, side)
        w_taps, w_w = _axis_taps(cols, w, side)
        idx = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4)
        wts = (h_w[:, :, None] * w_w[:, None, :]).reshape(-1, 4)
        indices.append(np.tile(idx, (t, 1)))
        weights.append(np.tile(wts, (t, 1)))
    return np.concatenate(indices).astype(np.int32), np.concatenate(weights).astype(np.float32)


# ---------------------------------------------------------------------------------------------------------------
# Attention over packed segments.


def _segment_groups(seqlens: tuple[int, ...]) -> tuple[np.ndarray | None, list[tuple[int, int]]]:
    """Order the packed segments so equal lengths are adjacent.

    Returns (perm or None when the order is unchanged, [(segment length, number of segments)] per group in the new
    order). ``x[perm]`` puts each group's segments contiguously."""
    starts = np.concatenate([[0], np.cumsum(seqlens)[:-1]]).astype(np.int64)
    order: dict[int, list[int]] = {}
    for i, n in enumerate(seqlens):
        order.setdefault(n, []).append(i)
    perm = np.concatenate([np.arange(starts[i], starts[i] + n) for n, idx in order.items() for i in idx])
    groups = [(n, len(idx)) for n, idx in order.items()]
    identity = np.array_equal(perm, np.arange(len(perm)))
    return (None if identity else perm.astype(np.int32)), groups


def segment_attention(q_SHD: jax.Array, k_SHD: jax.Array, v_SHD: jax.Array, seqlens: tuple[int, ...],
                      scale: float) -> jax.Array:
    """Bidirectional attention where each token attends only within its own segment.

    q, k, v: [S, heads, head_dim], the segments packed back to back with lengths ``seqlens`` (static, sum = S).
    Returns [S, heads, head_dim]. Equal-length segments are batched into one dense attention each, so memory is
    sum over groups of (segments x heads x L x L), never S x S. Softmax in float32, as the reference's eager path.
    """
    s = q_SHD.shape[0]
    if sum(seqlens) != s or any(n <= 0 for n in seqlens):
        raise ValueError(f"segment lengths {seqlens} do not partition {s} tokens")
    perm, groups = _segment_groups(tuple(seqlens))
    if perm is not None:
        q_SHD, k_SHD, v_SHD = q_SHD[perm], k_SHD[perm], v_SHD[perm]
    h, d = q_SHD.shape[1:]
    outs, start = [], 0
    for n, count in groups:
        take = lambda x: x[start:start + n * count].reshape(count, n, h, d)  # noqa: E731
        q, k, v = take(q_SHD), take(k_SHD), take(v_SHD)
        scores = jnp.einsum("gqhd,gkhd->ghqk", q, k) * scale
        probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(v.dtype)
        outs.append(jnp.einsum("ghqk,gkhd->gqhd", probs, v).reshape(n * count, h, d))
        start += n * count
    out = outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=0)
    if perm is not None:
        out = out[np.argsort(perm).astype(np.int32)]
    return out


# ---------------------------------------------------------------------------------------------------------------
# Modules.


def rotate_half(x: jax.Array) -> jax.Array:
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def vision_rope_cos_sin(positions_P2: np.ndarray, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos, sin [P, head_dim] float32 of the axial 2-D RoPE: head_dim/4 frequencies for rows, then the same for
    columns, that half repeated twice (``Qwen3OmniMoeVisionRotaryEmbedding``)."""
    spatial = head_dim // 2
    inv_freq = 1.0 / (theta ** (jnp.arange(0, spatial, 2, dtype=jnp.float32) / spatial))
    freqs = jnp.asarray(positions_P2, jnp.float32)[..., None] * inv_freq  # [P, 2, head_dim/4]
    freqs = freqs.reshape(freqs.shape[0], -1)  # rows' frequencies, then columns'
    freqs = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(freqs), jnp.sin(freqs)


def apply_vision_rope(x_SHK: jax.Array, cos_SK: jax.Array, sin_SK: jax.Array) -> jax.Array:
    """x * cos + rotate_half(x) * sin in float32, cast back to x's dtype; x [S, heads, head_dim]."""
    xf = x_SHK.astype(jnp.float32)
    return (xf * cos_SK[:, None, :] + rotate_half(xf) * sin_SK[:, None, :]).astype(x_SHK.dtype)


class QKVLinear(nnx.Module):
    """Fused q/k/v projection: kernel [D, 3, D] (torch's [3D, D] weight transposed), bias [3, D]."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs):
        self.kernel = param(rngs, (dim, 3, dim), ("vision_embed", None, "vision_heads"))
        self.bias = nnx.Param(jnp.zeros((3, dim)), axes=(None, "vision_heads"))

    def __call__(self, x_SD: jax.Array) -> jax.Array:
        """[S, D] -> [S, 3, D] (q, k, v)."""
        y = jnp.einsum("sd,dtf->stf", x_SD, self.kernel[...].astype(x_SD.dtype))
        return y + self.bias[...].astype(y.dtype)


class QwenVisionAttention(nnx.Module):
    def __init__(self, cfg: QwenVisionConfig, *, rngs: nnx.Rngs):
        d = cfg.hidden_size
        self.num_heads = cfg.num_heads
        self.head_dim = cfg.head_dim
        self.qkv = QKVLinear(d, rngs=rngs)
        self.proj = Linear(d, d, axes=("vision_heads", "vision_embed"), use_bias=True, rngs=rngs)

    def __call__(self, x_SD: jax.Array, cos_SK: jax.Array, sin_SK: jax.Array, seqlens: tuple[int, ...]):
        s = x_SD.shape[0]
        qkv = self.qkv(x_SD).reshape(s, 3, self.num_heads, self.head_dim)
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
        q, k = apply_vision_rope(q, cos_SK, sin_SK), apply_vision_rope(k, cos_SK, sin_SK)
        out = segment_attention(q, k, v, seqlens, self.head_dim ** -0.5)
        return self.proj(out.reshape(s, self.num_heads * self.head_dim))


def qwen_vision_block(cfg: QwenVisionConfig, *, rngs: nnx.Rngs) -> PreLNBlock:
    """Pre-LN block: x + attn(norm1(x), cos, sin, seqlens), then x + mlp(norm2(x)); [S, D] -> [S, D]."""
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

    def __call__(self, x_PD: jax.Array) -> jax.Array:
        """[P, D] patches in merge-block order -> [P / merge**2, out_hidden]."""
        if self.postshuffle_norm:
            x = self.ln_q(x_PD.reshape(-1, self.merged))
        else:
            x = self.ln_q(x_PD).reshape(-1, self.merged)
        return self.mlp(x)


class QwenVisionTower(nnx.Module):
    """Patch embedding + interpolated learned positions, 2-D RoPE blocks with per-frame attention, final merger and
    deepstack mergers."""

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

    def __call__(self, patches: jax.Array, grid_thw) -> tuple[jax.Array, list[jax.Array]]:
        """patches [total_patches, C*T*p*p], grid_thw static ((t, h, w), ...) ->
        (embeds [tokens, out_hidden], [deepstack features [tokens, out_hidden] per deepstack layer])."""
        cfg = self.cfg
        grid = check_grid(grid_thw, cfg.spatial_merge_size)
        n_patches = vision_patch_count(grid)
        if patches.ndim != 2 or patches.shape != (n_patches, cfg.patch_dim):
            raise ValueError(f"expected patches [{n_patches}, {cfg.patch_dim}] for grids {grid}, got "
                             f"{tuple(patches.shape)}")
        dtype = self.patch_embed.kernel[...].dtype
        x = self.patch_embed(patches.astype(dtype))

        idx, wts = vision_pos_interpolation(grid, cfg.num_grid_per_side, cfg.spatial_merge_size)
        table = self.pos_embed[...].astype(jnp.float32)
        pos = jnp.sum(table[idx] * wts[:, :, None], axis=1)
        x = x + pos.astype(x.dtype)

        cos, sin = vision_rope_cos_sin(vision_rope_positions(grid, cfg.spatial_merge_size), cfg.head_dim,
                                       cfg.rope_theta)
        seqlens = vision_segments(grid)
        deepstack = []
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, seqlens)
            if i in cfg.deepstack_visual_indexes:
                deepstack.append(self.deepstack_mergers[cfg.deepstack_visual_indexes.index(i)](x))
        return self.merger(x), deepstack


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

