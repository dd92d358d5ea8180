"""Gemma 4 vision tower and vision embedder, matching Hugging Face ``Gemma4VisionModel`` + ``embed_vision``
(``Gemma4Model.get_image_features``).

Encoder contract (what the integrator calls):

* inputs: ``{"pixel_values": float32 [B, L, 3 p**2], "position_ids": int32 [B, L, 2], "num_soft_tokens": int32
  [B]}``, the B images of a batch padded to one patch budget (L = max_patches) and B a power of two, batched on the
  host by preprocess/gemma4/image_batch.py.
* :class:`Gemma4VisionEncoder` ``(inputs) -> (features [B * max_soft_tokens, text_hidden], valid [B *
  max_soft_tokens] bool, ())``: rows image-major, image i's soft tokens in rows ``i * max_soft_tokens + j`` for
  ``j < num_soft_tokens[i]`` (row-major over its pooled grid); ``valid`` is False (and the row zero) for the rest.
  The j-th valid row is what the j-th ``<|image|>`` placeholder of the prompt receives. The result does not depend
  on the patch budget (padding patches are masked out and pool into nothing).

Per image (the reference's steps):

1. Patch embedding: ``input_proj(2 (x - 0.5))`` (no bias) plus the learned position tables,
   ``table[0][x] + table[1][y]`` (zero for padding patches).
2. Encoder layers (bidirectional attention over the image's own patches; padding keys are masked): sandwich
   RMSNorms (``x + post_attention_norm(attn(input_norm(x)))``, then the same around the MLP), q / k RMSNorms with
   weights and a weightless v RMSNorm over head_dim, 2-D RoPE (theta ``rope_parameters.rope_theta``, 100): the first
   half of every head rotated by the patch's x, the second half by its y (each half by ``rotate_half`` with
   head_dim / 4 frequencies; encoders/rope_2d.py, two sections), attention scale 1 (encoders/attention.py), GQA
   when ``num_key_value_heads < num_attention_heads``;
   GeGLU MLP ``down(gelu_tanh(gate(x)) * up(x))``. Every projection is a :class:`ClippableLinear`.
3. Pooling by position: padding patches zeroed, each k x k block of patches averaged into one soft token (pooled
   grid row-major), then multiplied by sqrt(hidden_size) in float32.
4. With ``standardize``: ``(x - std_bias) * std_scale`` in float32.
5. The vision embedder (``embed_vision``): weightless RMSNorm, projection to the text hidden size.

Parameter tree (paths in the NNX state) and logical axes (Linear axes given as (in, out); kernels stored
[out, in])::

    ("patch_embed", "kernel")                  [D, 3 p p]   (None, "vision_embed")
    ("pos_embed",)                             [2, position_embedding_size, D]
    ("layers", i, "input_norm" | "post_attn_norm" | "pre_ff_norm" | "post_ff_norm", "weight")   [D]
    ("layers", i, "attn", "q_proj" | "k_proj" | "v_proj", "kernel")   ("vision_embed", "vision_heads")
    ("layers", i, "attn", "o_proj", "kernel")                          ("vision_heads", "vision_embed")
    ("layers", i, "attn", "q_norm" | "k_norm", "weight")               [head_dim]
    ("layers", i, "mlp", "gate_proj" | "up_proj", "kernel")            ("vision_embed", "vision_mlp")
    ("layers", i, "mlp", "down_proj", "kernel")                        ("vision_mlp", "vision_embed")
    (..._proj, "input_min" | "input_max" | "output_min" | "output_max")   []   with use_clipped_linears
    ("std_bias",), ("std_scale",)              [D]   with standardize
    ("embedder", "projection", "kernel")       [text_hidden, D]   ("vision_embed", "embed")
"""

from __future__ import annotations

import dataclasses
import jax
import jax.numpy as jnp
from flax import nnx

from omnijax.common.activations import activation
from omnijax.common.config_values import config_getter, uniform_int
from omnijax.common.errors import CheckpointError
from omnijax.common.linear import Linear, param
from omnijax.common.norms import RMSNorm, rms_norm
from omnijax.common.weights import ParamPath, TensorSpec, linear, plain
from omnijax.encoders.attention import attention
from omnijax.encoders.gemma4.clippable_linear import ClippableLinear, clippable_linear_map
from omnijax.encoders.gemma4.embedder import MultimodalEmbedder, multimodal_embedder_map
from omnijax.encoders.rope_2d import apply_rope_2d, rope_2d_angles, rope_2d_cos_sin

# Queries are attended in blocks of this many patches when an image has more, so that the scores of one layer take
# batch x heads x block x max_patches values instead of batch x heads x max_patches**2.
ATTENTION_QUERY_BLOCK = 1024
# The 2-D RoPE turns each half of a head by itself: the first half by x, the second by y (encoders/rope_2d.py).
ROPE_SECTIONS = 2


@dataclasses.dataclass(frozen=True)
class Gemma4VisionConfig:
    """The vision tower's settings (HF ``Gemma4VisionConfig``; defaults are its defaults) plus the text hidden size
    the embedder projects to."""

    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 16
    num_attention_heads: int = 12
    num_key_value_heads: int = 12
    head_dim: int = 64
    hidden_activation: str = "gelu_pytorch_tanh"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 100.0
    pooling_kernel_size: int = 3
    patch_size: int = 16
    position_embedding_size: int = 10 * 1024
    use_clipped_linears: bool = False
    standardize: bool = False
    text_hidden_size: int = 2304

    def __post_init__(self):
        for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "head_dim", "pooling_kernel_size", "patch_size", "position_embedding_size",
                    "text_hidden_size"):
            value = getattr(self, key)
            if isinstance(value, bool) or int(value) != value or int(value) <= 0:
                raise ValueError(f"vision config: {key} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"vision config: num_attention_heads {self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads {self.num_key_value_heads}")
        if self.head_dim % 4:
            raise ValueError(f"vision config: head_dim {self.head_dim} must be a multiple of 4 for the 2-D rotary "
                             f"embedding (a quarter of the head per axis and rotation half)")
        if not self.rope_theta > 0:
            raise ValueError(f"vision config: rope_theta must be positive, got {self.rope_theta}")
        activation(self.hidden_activation)

    @classmethod
    def from_hf(cls, vision: dict, text_hidden_size: int) -> "Gemma4VisionConfig":
        """From a HF ``vision_config`` dict (missing keys take HF defaults) and the text config's hidden size."""
        if not isinstance(vision, dict):
            raise CheckpointError(f"vision_config must be a JSON object, got {type(vision).__name__}")
        get = config_getter(vision, cls())
        rope = vision.get("rope_parameters") or {}
        try:
            for key in ("use_clipped_linears", "standardize"):
                if not isinstance(get(key), bool):
                    raise ValueError(f"{key} must be true or false, got {get(key)!r}")
            return cls(
                hidden_size=int(get("hidden_size")),
                intermediate_size=int(get("intermediate_size")),
                num_hidden_layers=int(get("num_hidden_layers")),
                num_attention_heads=int(get("num_attention_heads")),
                num_key_value_heads=int(get("num_key_value_heads")),
                head_dim=int(get("head_dim")),
                hidden_activation=str(get("hidden_activation")),
                rms_norm_eps=float(get("rms_norm_eps")),
                rope_theta=float(rope.get("rope_theta", cls.rope_theta)),
                pooling_kernel_size=int(get("pooling_kernel_size")),
                patch_size=uniform_int(get("patch_size"), "patch_size"),
                position_embedding_size=int(get("position_embedding_size")),
                use_clipped_linears=bool(get("use_clipped_linears")),
                standardize=bool(get("standardize")),
                text_hidden_size=int(text_hidden_size),
            )
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"vision_config: {exc}") from exc

    @classmethod
    def from_model_config(cls, config: dict) -> "Gemma4VisionConfig":
        """From a whole ``Gemma4Config`` dict (``vision_config`` and ``text_config.hidden_size``)."""
        vision = config.get("vision_config") if isinstance(config, dict) else None
        if vision is None:
            raise CheckpointError("the config has no vision_config: this checkpoint has no vision tower")
        text = config.get("text_config") or {}
        return cls.from_hf(vision, text.get("hidden_size", cls.text_hidden_size))

    @property
    def patch_dim(self) -> int:
        return 3 * self.patch_size ** 2


# ---------------------------------------------------------------------------------------------------------------
# Modules.


class Gemma4VisionAttention(nnx.Module):
    def __init__(self, cfg: Gemma4VisionConfig, *, rngs: nnx.Rngs):
        d, hd, clip = cfg.hidden_size, cfg.head_dim, cfg.use_clipped_linears
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.eps = cfg.rms_norm_eps
        axes_in, axes_out = ("vision_embed", "vision_heads"), ("vision_heads", "vision_embed")
        self.q_proj = ClippableLinear(d, self.num_heads * hd, clipped=clip, axes=axes_in, rngs=rngs)
        self.k_proj = ClippableLinear(d, self.num_kv_heads * hd, clipped=clip, axes=axes_in, rngs=rngs)
        self.v_proj = ClippableLinear(d, self.num_kv_heads * hd, clipped=clip, axes=axes_in, rngs=rngs)
        self.o_proj = ClippableLinear(self.num_heads * hd, d, clipped=clip, axes=axes_out, rngs=rngs)
        self.q_norm = RMSNorm(hd, eps=cfg.rms_norm_eps, axis_name="head_dim")
        self.k_norm = RMSNorm(hd, eps=cfg.rms_norm_eps, axis_name="head_dim")

    def __call__(self, x_BLD: jax.Array, cos_BLH: jax.Array, sin_BLH: jax.Array, key_valid_BL: jax.Array
                 ) -> jax.Array:
        b, p, _ = x_BLD.shape
        q = self.q_norm(self.q_proj(x_BLD).reshape(b, p, self.num_heads, self.head_dim))
        k = self.k_norm(self.k_proj(x_BLD).reshape(b, p, self.num_kv_heads, self.head_dim))
        v = rms_norm(self.v_proj(x_BLD).reshape(b, p, self.num_kv_heads, self.head_dim), None, eps=self.eps,
                     plus_one=False)
        q, k = (apply_rope_2d(x, cos_BLH, sin_BLH, sections=ROPE_SECTIONS) for x in (q, k))
        out = attention(q, k, v, key_valid_BL, query_block=ATTENTION_QUERY_BLOCK)
        return self.o_proj(out.reshape(b, p, self.num_heads * self.head_dim))


class Gemma4VisionMLP(nnx.Module):
    def __init__(self, cfg: Gemma4VisionConfig, *, rngs: nnx.Rngs):
        d, i, clip = cfg.hidden_size, cfg.intermediate_size, cfg.use_clipped_linears
        self.act = cfg.hidden_activation
        self.gate_proj = ClippableLinear(d, i, clipped=clip, axes=("vision_embed", "vision_mlp"), rngs=rngs)
        self.up_proj = ClippableLinear(d, i, clipped=clip, axes=("vision_embed", "vision_mlp"), rngs=rngs)
        self.down_proj = ClippableLinear(i, d, clipped=clip, axes=("vision_mlp", "vision_embed"), rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(activation(self.act)(self.gate_proj(x)) * self.up_proj(x))


class Gemma4VisionLayer(nnx.Module):
    """x + post_attn_norm(attn(input_norm(x))), then x + post_ff_norm(mlp(pre_ff_norm(x))); [B, L, D]."""

    def __init__(self, cfg: Gemma4VisionConfig, *, rngs: nnx.Rngs):
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_norm = RMSNorm(d, eps=eps, axis_name="vision_embed")
        self.attn = Gemma4VisionAttention(cfg, rngs=rngs)
        self.post_attn_norm = RMSNorm(d, eps=eps, axis_name="vision_embed")
        self.pre_ff_norm = RMSNorm(d, eps=eps, axis_name="vision_embed")
        self.mlp = Gemma4VisionMLP(cfg, rngs=rngs)
        self.post_ff_norm = RMSNorm(d, eps=eps, axis_name="vision_embed")

    def __call__(self, x_BLD: jax.Array, cos_BLH: jax.Array, sin_BLH: jax.Array, key_valid_BL: jax.Array
                 ) -> jax.Array:
        x = x_BLD + self.post_attn_norm(self.attn(self.input_norm(x_BLD), cos_BLH, sin_BLH, key_valid_BL))
        return x + self.post_ff_norm(self.mlp(self.pre_ff_norm(x)))


def pool_by_position(x_BLD: jax.Array, positions_BL2: jax.Array, padding_BL: jax.Array, k: int,
                     output_length: int) -> tuple[jax.Array, jax.Array]:
    """Average every k x k block of the L patches into one soft token: (pooled float32 [B, output_length, D], valid
    [B, output_length]).

    A patch at (x, y) of an image w patches wide goes to soft token ``floor(x/k) + (w/k) * floor(y/k)`` (the
    pooled grid row-major; w is the image's largest x + 1). Padding patches contribute nothing; a soft token is
    valid when some patch of the image falls into it."""
    b, p, d = x_BLD.shape
    pos = jnp.maximum(positions_BL2, 0)
    width = jnp.max(pos[..., 0], axis=-1, keepdims=True) + 1  # [B, 1]
    kernel = pos // k
    token = kernel[..., 0] + (width // k) * kernel[..., 1]  # [B, L]
    token = jnp.where(padding_BL | (token >= output_length), output_length, token)  # out of range: dropped
    segment = (jnp.arange(b, dtype=token.dtype)[:, None] * (output_length + 1) + token).reshape(-1)
    num_segments = b * (output_length + 1)
    xf = jnp.where(padding_BL[..., None], 0.0, x_BLD.astype(jnp.float32)).reshape(b * p, d)
    pooled = jax.ops.segment_sum(xf, segment, num_segments=num_segments) * (1.0 / (k * k))
    counts = jax.ops.segment_sum(jnp.ones((b * p,), jnp.int32), segment, num_segments=num_segments)
    pooled = pooled.reshape(b, output_length + 1, d)[:, :output_length]
    valid = counts.reshape(b, output_length + 1)[:, :output_length] > 0
    return pooled, valid


class Gemma4VisionEncoder(nnx.Module):
    """The Gemma 4 vision tower plus the vision embedder; see the module docstring for the contract."""

    def __init__(self, cfg: Gemma4VisionConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d = cfg.hidden_size
        self.patch_embed = Linear(cfg.patch_dim, d, axes=(None, "vision_embed"), rngs=rngs)
        self.pos_embed = param(rngs, (2, cfg.position_embedding_size, d), (None, None, "vision_embed"))
        self.layers = nnx.List([Gemma4VisionLayer(cfg, rngs=rngs) for _ in range(cfg.num_hidden_layers)])
        if cfg.standardize:
            self.std_bias = nnx.Param(jnp.zeros((d,)), axes=("vision_embed",))
            self.std_scale = nnx.Param(jnp.ones((d,)), axes=("vision_embed",))
        self.embedder = MultimodalEmbedder(d, cfg.text_hidden_size, eps=cfg.rms_norm_eps, axis_in="vision_embed",
                                           rngs=rngs)

    def __call__(self, inputs: dict) -> tuple[jax.Array, jax.Array, tuple]:
        """inputs: see the module docstring (``num_soft_tokens`` is not needed: validity follows from the positions).
        Returns (features [B * output_length, text_hidden] in the weights' dtype, valid [B * output_length] bool,
        no extra feature maps), output_length = max_patches / k**2."""
        cfg = self.cfg
        pixel_values, positions = inputs["pixel_values"], inputs["position_ids"]
        if pixel_values.ndim != 3 or pixel_values.shape[2] != cfg.patch_dim:
            raise ValueError(f"expected pixel_values [images, patches, {cfg.patch_dim}], got {pixel_values.shape}")
        b, p, _ = pixel_values.shape
        if positions.shape != (b, p, 2):
            raise ValueError(f"expected position_ids [{b}, {p}, 2], got {positions.shape}")
        k = cfg.pooling_kernel_size
        if p % (k * k):
            raise ValueError(f"{p} patches per image is not a multiple of pooling_kernel_size**2 = {k * k}")
        output_length = p // (k * k)
        if output_length * k > cfg.position_embedding_size:
            raise ValueError(f"{output_length} soft tokens per image allow images {output_length * k} patches long, "
                             f"beyond the {cfg.position_embedding_size} learned positions")
        dtype = self.patch_embed.kernel[...].dtype
        positions = positions.astype(jnp.int32)
        padding = jnp.all(positions == -1, axis=-1)  # [B, L]

        x = self.patch_embed((2.0 * (pixel_values.astype(jnp.float32) - 0.5)).astype(dtype))
        table = self.pos_embed[...]
        clamped = jnp.maximum(positions, 0)
        pos = table[0][clamped[..., 0]] + table[1][clamped[..., 1]]
        x = x + jnp.where(padding[..., None], 0.0, pos).astype(x.dtype)

        cos, sin = rope_2d_cos_sin(rope_2d_angles(positions, cfg.head_dim, cfg.rope_theta), sections=ROPE_SECTIONS)
        key_valid = ~padding
        for layer in self.layers:
            x = layer(x, cos, sin, key_valid)

        pooled, valid = pool_by_position(x, positions, padding, k, output_length)
        pooled = pooled * jnp.float32(cfg.hidden_size ** 0.5)
        if cfg.standardize:
            pooled = (pooled - self.std_bias[...].astype(jnp.float32)) * self.std_scale[...].astype(jnp.float32)
        features = self.embedder(pooled.astype(dtype))
        features = jnp.where(valid[..., None], features, 0).astype(dtype)
        return features.reshape(b * output_length, -1), valid.reshape(b * output_length), ()


def gemma4_vision_weight_map(cfg: Gemma4VisionConfig, key_prefix: str = "model.") -> dict[ParamPath, TensorSpec]:
    """Every parameter of ``Gemma4VisionEncoder`` -> its checkpoint tensor: the tower's under
    ``{key_prefix}vision_tower.``, the embedder's under ``{key_prefix}embed_vision.`` (the published layout has
    ``key_prefix`` ``model.``)."""
    p = f"{key_prefix}vision_tower."
    clip = cfg.use_clipped_linears
    m: dict[ParamPath, TensorSpec] = {
        ("patch_embed", "kernel"): linear(f"{p}patch_embedder.input_proj"),
        ("pos_embed",): plain(f"{p}patch_embedder.position_embedding_table"),
    }
    norms = {"input_norm": "input_layernorm", "post_attn_norm": "post_attention_layernorm",
             "pre_ff_norm": "pre_feedforward_layernorm", "post_ff_norm": "post_feedforward_layernorm"}
    for i in range(cfg.num_hidden_layers):
        lp = f"{p}encoder.layers.{i}."
        for ours, theirs in norms.items():
            m[("layers", i, ours, "weight")] = plain(f"{lp}{theirs}.weight")
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            m.update(clippable_linear_map(("layers", i, "attn", proj), f"{lp}self_attn.{proj}", clip))
        for norm in ("q_norm", "k_norm"):
            m[("layers", i, "attn", norm, "weight")] = plain(f"{lp}self_attn.{norm}.weight")
        for proj in ("gate_proj", "up_proj", "down_proj"):
            m.update(clippable_linear_map(("layers", i, "mlp", proj), f"{lp}mlp.{proj}", clip))
    if cfg.standardize:
        m[("std_bias",)] = plain(f"{p}std_bias")
        m[("std_scale",)] = plain(f"{p}std_scale")
    m.update(multimodal_embedder_map(("embedder",), f"{key_prefix}embed_vision"))
    return m
