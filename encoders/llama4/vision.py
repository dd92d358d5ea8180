"""Llama 4 image encoder: the vision tower (``Llama4VisionModel``) and the multimodal projector of Hugging Face
``Llama4ForConditionalGeneration``.

Per tile [3, S, S] (S = image_size, the processor's tile size):

1. Unfold into (S/p)**2 patches, each flattened in (channel, row, column) order, and a linear embedding (no bias).
2. The class embedding is appended LAST, the learned positional embedding [(S/p)**2 + 1, D] added, then
   ``layernorm_pre``.
3. Encoder layers: x + attn(LN(x)), x + mlp(LN(x)). Attention is bidirectional over the tile's tokens with
   biased q/k/v/o projections and a 2-D rotary embedding applied as a complex multiply on interleaved pairs
   (2j, 2j+1): the first head_dim/4 pairs rotate by (column + 1) * f_j, the next head_dim/4 by (row + 1) * f_j,
   f_j = theta**(-4j / head_dim); the class token is not rotated. MLP: fc1, exact GELU, fc2, with biases.
4. ``layernorm_post``, class token dropped, pixel shuffle (ratio r: (S/p)**2 tokens of D -> (r S/p)**2 tokens of
   D / r**2, the reference's reshape/permute order), adapter MLP fc1 -> GELU -> fc2 -> GELU (no biases).
5. The projector ``multi_modal_projector.linear_1`` (no bias) maps to the text hidden size.

Every LayerNorm uses eps 1e-5 (``nn.LayerNorm``'s default; the reference ignores the config's ``norm_eps``), and
every GELU is the exact (erf) one (the reference ignores ``hidden_act``).

Encoder contract (:class:`Llama4ImageEncoder`): the host batches the tiles of all images of a prompt (each image's
tiles row-major, then its global tile; images in prompt order), padding the tile count to a power of two
(preprocess/llama4/image_batch.py); ``__call__`` returns features [padded_tiles * tokens_per_tile,
text_hidden] and ``valid`` [same rows] bool. The j-th valid row is what the j-th ``<|patch|>`` placeholder of the
prompt receives (transformers ``masked_scatter``s the flattened projected features into the ``<|patch|>``
positions in order, and the processor writes each image's tiles in that same order, global tile last).

Parameter tree (paths in the NNX state) and logical axes; Linear kernels are [out, in] (axes given as (in, out))::

    ("tower", "patch_embed", "kernel")             [D, C*p*p]       (None, "vision_embed")
    ("tower", "class_embedding",)                  [D]              ("vision_embed",)
    ("tower", "pos_embed",)                        [patches + 1, D] (None, "vision_embed")
    ("tower", "layernorm_pre" | "layernorm_post", "weight" | "bias")
    ("tower", "layers", i, "norm1" | "norm2", "weight" | "bias")       <- input_layernorm | post_attention_layernorm
    ("tower", "layers", i, "attn", "q_proj" | "k_proj" | "v_proj" | "out_proj", "kernel" | "bias")  <- o_proj
    ("tower", "layers", i, "mlp", "fc1" | "fc2", "kernel" | "bias")
    ("tower", "adapter", "fc1", "kernel")          [proj_in, D / r**2]   ("vision_merge", "vision_mlp")
    ("tower", "adapter", "fc2", "kernel")          [proj_out, proj_out]  ("vision_mlp", "vision_out")
    ("projector", "kernel")                        [text_hidden, vision_output_dim]  ("vision_out", "embed")
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from omnijax.common.config_values import as_float, as_int, uniform_int
from omnijax.common.errors import CheckpointError
from omnijax.common.linear import Linear, param
from omnijax.common.norms import LayerNorm
from omnijax.common.weights import ParamPath, TensorSpec, linear, plain, prefixed
from omnijax.encoders.attention import attention
from omnijax.encoders.blocks import (FeedForward, MultiHeadProjections, PreLNBlock, biased_linear_map, feed_forward_map,
                                     layer_norm_map, pre_ln_block_norms_map)
from omnijax.encoders.gemma3.siglip import unfold_patches
from omnijax.encoders.rope_2d import apply_rope_2d, rope_2d_angles, rope_2d_cos_sin

LAYER_NORM_EPS = 1e-5
# Bounds on the config: depth and widths far beyond any published checkpoint are refused as broken configs.
_MAX_LAYERS = 256
_MAX_WIDTH = 1 << 16


@dataclasses.dataclass(frozen=True)
class Llama4VisionConfig:
    """The vision tower, adapter and projector settings (HF ``Llama4VisionConfig`` names and defaults), plus the
    text hidden size the projector maps to."""

    hidden_size: int = 768
    intermediate_size: int = 5632
    num_hidden_layers: int = 34
    num_attention_heads: int = 16
    num_channels: int = 3
    image_size: int = 448
    patch_size: int = 14
    pixel_shuffle_ratio: float = 0.5
    projector_input_dim: int = 4096
    projector_output_dim: int = 4096
    vision_output_dim: int = 7680
    rope_theta: float = 10000.0
    text_hidden_size: int = 5120

    @classmethod
    def from_hf(cls, vision: dict[str, Any], text_hidden_size: int, source: str = "vision_config"
                ) -> "Llama4VisionConfig":
        """From the ``vision_config`` dict of config.json and the text model's ``hidden_size``. Missing keys take
        the HF defaults; ``rope_theta`` is read from ``rope_parameters`` (transformers 5) or the top level (older
        exports). Raises ``CheckpointError`` naming ``source`` for a wrong type or an inconsistent set of sizes."""
        if not isinstance(vision, dict):
            raise CheckpointError(f"{source}: expected a JSON object, got {type(vision).__name__}")
        defaults = cls()

        def get(name):
            return vision[name] if vision.get(name) is not None else getattr(defaults, name)

        try:
            rope = vision.get("rope_parameters") or {}
            theta = rope.get("rope_theta", vision.get("rope_theta"))
            ints = {name: as_int(get(name), name) for name in (
                "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_channels",
                "projector_input_dim", "projector_output_dim", "vision_output_dim")}
            cfg = cls(
                **ints,
                image_size=uniform_int(get("image_size"), "image_size"),
                patch_size=uniform_int(get("patch_size"), "patch_size"),
                pixel_shuffle_ratio=as_float(get("pixel_shuffle_ratio"), "pixel_shuffle_ratio"),
                rope_theta=as_float(defaults.rope_theta if theta is None else theta, "rope_theta"),
                text_hidden_size=as_int(text_hidden_size, "text_config.hidden_size"),
            )
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{source}: {exc}") from exc
        cfg.validate(source)
        return cfg

    @classmethod
    def from_model_config(cls, config: dict[str, Any]) -> "Llama4VisionConfig":
        """From a whole ``Llama4ForConditionalGeneration`` config.json dict (``vision_config`` + ``text_config``)."""
        vision, text = config.get("vision_config"), config.get("text_config")
        if not isinstance(vision, dict) or not isinstance(text, dict) or "hidden_size" not in text:
            raise CheckpointError("config.json: a Llama 4 image model needs 'vision_config' and 'text_config' "
                                  "(with 'hidden_size')")
        return cls.from_hf(vision, text["hidden_size"])

    def validate(self, source: str = "vision_config") -> None:
        """Raises ``CheckpointError`` when the sizes do not fit together the way the reference needs them to."""
        problems = []
        for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_channels", "image_size",
                     "patch_size", "projector_input_dim", "projector_output_dim", "vision_output_dim",
                     "text_hidden_size"):
            if not 1 <= getattr(self, name) <= _MAX_WIDTH:
                problems.append(f"{name} {getattr(self, name)} is not in [1, {_MAX_WIDTH}]")
        if not 1 <= self.num_hidden_layers <= _MAX_LAYERS:
            problems.append(f"num_hidden_layers {self.num_hidden_layers} is not in [1, {_MAX_LAYERS}]")
        if not 0.0 < self.pixel_shuffle_ratio <= 1.0:
            problems.append(f"pixel_shuffle_ratio {self.pixel_shuffle_ratio} is not in (0, 1]")
        if not self.rope_theta > 0:
            problems.append(f"rope theta {self.rope_theta} is not positive")
        if problems:
            raise CheckpointError(f"{source}: " + "; ".join(problems))
        r = self.pixel_shuffle_ratio
        side = self.patches_per_side
        if self.image_size % self.patch_size:
            problems.append(f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
        if self.hidden_size % self.num_attention_heads or (self.hidden_size // self.num_attention_heads) % 4:
            problems.append(f"hidden_size {self.hidden_size} / num_attention_heads {self.num_attention_heads} must "
                            "be a whole head size divisible by 4 (2-D rotary embedding)")
        if side * r != int(side * r) or self.hidden_size / r != int(self.hidden_size / r) \
                or self.hidden_size / r ** 2 != int(self.hidden_size / r ** 2):
            problems.append(f"pixel_shuffle_ratio {r} does not divide a {side}x{side} patch grid of "
                            f"{self.hidden_size} features evenly")
        elif self.intermediate_size != int(self.hidden_size / r ** 2):
            problems.append(f"intermediate_size {self.intermediate_size} must equal hidden_size / "
                            f"pixel_shuffle_ratio**2 = {int(self.hidden_size / r ** 2)} (the adapter's input width)")
        if self.projector_input_dim != self.projector_output_dim:
            problems.append(f"projector_input_dim {self.projector_input_dim} must equal projector_output_dim "
                            f"{self.projector_output_dim} (the adapter's second layer takes the first one's output)")
        if self.vision_output_dim != self.projector_output_dim:
            problems.append(f"vision_output_dim {self.vision_output_dim} must equal projector_output_dim "
                            f"{self.projector_output_dim} (the projector takes the adapter's output)")
        if problems:
            raise CheckpointError(f"{source}: " + "; ".join(problems))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.patches_per_side ** 2

    @property
    def shuffled_dim(self) -> int:
        """Feature width after the pixel shuffle: hidden_size / ratio**2."""
        return int(self.hidden_size / self.pixel_shuffle_ratio ** 2)

    @property
    def tokens_per_tile(self) -> int:
        """Output tokens of one tile: (ratio * patches_per_side)**2."""
        return int(self.patches_per_side * self.pixel_shuffle_ratio) ** 2


# ---------------------------------------------------------------------------------------------------------------
# Pure helpers.


def vision_rope_positions(cfg: Llama4VisionConfig) -> np.ndarray:
    """int32 [num_patches + 1, 2]: (x + 1, y + 1) of each patch, patch i at column x = i % side and row
    y = i // side (``Llama4VisionRotaryEmbedding``); (0, 0) for the class token (last), which is not rotated."""
    side = cfg.patches_per_side
    idx = np.arange(side * side)
    patches = np.stack([idx % side + 1, idx // side + 1], axis=-1)
    return np.concatenate([patches, np.zeros((1, 2), patches.dtype)], axis=0).astype(np.int32)


def vision_rope_angles(cfg: Llama4VisionConfig) -> np.ndarray:
    """float32 [num_patches + 1, head_dim / 2]: the rotation angle of each (2j, 2j+1) pair of each token, a table
    of constants built on the host: pairs 0 .. head_dim/4 - 1 turn by (x + 1) * f_j, the next head_dim/4 by
    (y + 1) * f_j, with f_j = 1 / theta**(2j / (head_dim / 2)) in float32 (encoders/rope_2d.py). The class token
    (last) gets angle 0."""
    return rope_2d_angles(vision_rope_positions(cfg), cfg.head_dim, cfg.rope_theta, xp=np)


def pixel_shuffle(x_BLD: jax.Array, ratio: float) -> jax.Array:
    """[B, side*side, D] -> [B, (ratio*side)**2, D / ratio**2] in the reference's reshape / permute order."""
    t, n, c = x_BLD.shape
    side = math.isqrt(n)
    if side * side != n:
        raise ValueError(f"pixel shuffle needs a square number of tokens, got {n}")
    x = x_BLD.reshape(t, side, side, c)
    x = x.reshape(t, side, int(side * ratio), int(c / ratio))
    x = jnp.transpose(x, (0, 2, 1, 3))
    x = x.reshape(t, int(side * ratio), int(side * ratio), int(c / ratio ** 2))
    x = jnp.transpose(x, (0, 2, 1, 3))
    return x.reshape(t, -1, x.shape[-1])


# ---------------------------------------------------------------------------------------------------------------
# Modules.


class Llama4VisionAttention(MultiHeadProjections):
    """Bidirectional attention over one tile's tokens, 2-D rotary embedding on q and k, scale head_dim**-0.5."""

    def __init__(self, cfg: Llama4VisionConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg.hidden_size, cfg.num_attention_heads, "vision_embed", "vision_heads", rngs=rngs)

    def __call__(self, x_BLD: jax.Array, cos_LJ: jax.Array, sin_LJ: jax.Array) -> jax.Array:
        def core(q, k, v):
            q, k = (apply_rope_2d(x, cos_LJ, sin_LJ, interleaved=True, float32=True) for x in (q, k))
            return attention(q, k, v, scale=self.head_dim ** -0.5)

        return super().__call__(x_BLD, core)


class Llama4VisionAdapter(nnx.Module):
    """gelu(fc2(gelu(fc1(x)))), no biases: [..., hidden / ratio**2] -> [..., projector_output_dim]."""

    def __init__(self, cfg: Llama4VisionConfig, *, rngs: nnx.Rngs):
        self.fc1 = Linear(cfg.shuffled_dim, cfg.projector_input_dim, axes=("vision_merge", "vision_mlp"), rngs=rngs)
        self.fc2 = Linear(cfg.projector_output_dim, cfg.projector_output_dim, axes=("vision_mlp", "vision_out"),
                          rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        gelu = lambda y: jax.nn.gelu(y, approximate=False)  # noqa: E731
        return gelu(self.fc2(gelu(self.fc1(x))))


class Llama4VisionTower(nnx.Module):
    """Tiles [B, 3, image_size, image_size] -> adapter features [B, tokens_per_tile, projector_output_dim]."""

    def __init__(self, cfg: Llama4VisionConfig, *, rngs: nnx.Rngs):
        cfg.validate()
        self.cfg = cfg
        d = cfg.hidden_size
        self.patch_embed = Linear(cfg.num_channels * cfg.patch_size ** 2, d, axes=(None, "vision_embed"), rngs=rngs)
        self.class_embedding = param(rngs, (d,), ("vision_embed",))
        self.pos_embed = param(rngs, (cfg.num_patches + 1, d), (None, "vision_embed"))
        self.layernorm_pre = LayerNorm(d, eps=LAYER_NORM_EPS, axis_name="vision_embed")
        self.layers = nnx.List([
            PreLNBlock(d, LAYER_NORM_EPS, "vision_embed", Llama4VisionAttention(cfg, rngs=rngs),
                       FeedForward(d, cfg.intermediate_size, "gelu", "vision_embed", "vision_mlp", rngs=rngs))
            for _ in range(cfg.num_hidden_layers)])
        self.layernorm_post = LayerNorm(d, eps=LAYER_NORM_EPS, axis_name="vision_embed")
        self.adapter = Llama4VisionAdapter(cfg, rngs=rngs)

    def __call__(self, pixels_BCYX: jax.Array) -> jax.Array:
        cfg = self.cfg
        expected = (cfg.num_channels, cfg.image_size, cfg.image_size)
        if pixels_BCYX.ndim != 4 or pixels_BCYX.shape[1:] != expected:
            raise ValueError(f"expected tiles [tiles, {', '.join(map(str, expected))}], got {pixels_BCYX.shape}")
        dtype = self.patch_embed.kernel[...].dtype
        x = self.patch_embed(unfold_patches(pixels_BCYX.astype(dtype), cfg.patch_size))
        cls = jnp.broadcast_to(self.class_embedding[...].astype(x.dtype), (x.shape[0], 1, x.shape[2]))
        x = jnp.concatenate([x, cls], axis=1)
        x = self.layernorm_pre(x + self.pos_embed[...].astype(x.dtype)[None])
        cos, sin = rope_2d_cos_sin(vision_rope_angles(cfg), interleaved=True)
        for layer in self.layers:
            x = layer(x, cos, sin)
        x = self.layernorm_post(x)[:, :-1]
        return self.adapter(pixel_shuffle(x, cfg.pixel_shuffle_ratio))


class Llama4ImageEncoder(nnx.Module):
    """The vision tower and the projector: collated tiles -> (features [rows, text_hidden], valid [rows])."""

    def __init__(self, cfg: Llama4VisionConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.tower = Llama4VisionTower(cfg, rngs=rngs)
        self.projector = Linear(cfg.vision_output_dim, cfg.text_hidden_size, axes=("vision_out", "embed"), rngs=rngs)

    def __call__(self, inputs: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        """``inputs`` (preprocess/llama4/image_batch.py) -> (features [bucket * tokens_per_tile, text_hidden], valid
        [same] bool).

        Rows come tile after tile, each tile's tokens in the pixel-shuffle order; ``valid`` is False on the rows of
        padding tiles (index >= num_tiles)."""
        feats = self.projector(self.tower(inputs["pixel_values"]))
        tiles, tokens, width = feats.shape
        valid = jnp.arange(tiles) < jnp.asarray(inputs["num_tiles"], jnp.int32)
        return feats.reshape(tiles * tokens, width), jnp.repeat(valid, tokens)


# ---------------------------------------------------------------------------------------------------------------
# Weight maps (checkpoint keys as transformers 5 save_pretrained writes them).


def llama4_vision_weight_map(cfg: Llama4VisionConfig, key_prefix: str = "vision_model."
                             ) -> dict[ParamPath, TensorSpec]:
    """Every parameter of ``Llama4VisionTower`` -> its checkpoint tensor."""
    p = key_prefix
    m: dict[ParamPath, TensorSpec] = {
        ("patch_embed", "kernel"): linear(f"{p}patch_embedding.linear"),
        ("class_embedding",): plain(f"{p}class_embedding"),
        ("pos_embed",): plain(f"{p}positional_embedding_vlm"),
        **layer_norm_map(("layernorm_pre",), f"{p}layernorm_pre"),
        **layer_norm_map(("layernorm_post",), f"{p}layernorm_post"),
        ("adapter", "fc1", "kernel"): linear(f"{p}vision_adapter.mlp.fc1"),
        ("adapter", "fc2", "kernel"): linear(f"{p}vision_adapter.mlp.fc2"),
    }
    for i in range(cfg.num_hidden_layers):
        lp = f"{p}model.layers.{i}."
        m.update(pre_ln_block_norms_map(("layers", i), f"{lp}input_layernorm", f"{lp}post_attention_layernorm"))
        for ours, theirs in (("q_proj", "q_proj"), ("k_proj", "k_proj"), ("v_proj", "v_proj"), ("out_proj", "o_proj")):
            m.update(biased_linear_map(("layers", i, "attn", ours), f"{lp}self_attn.{theirs}"))
        m.update(feed_forward_map(("layers", i, "mlp"), f"{lp}mlp.fc1", f"{lp}mlp.fc2"))
    return m


def llama4_projector_weight_map(cfg: Llama4VisionConfig, key_prefix: str = "multi_modal_projector."
                                ) -> dict[ParamPath, TensorSpec]:
    """The projector's kernel <- ``{prefix}linear_1.weight`` [text_hidden, vision_output_dim]."""
    del cfg  # one tensor whatever the sizes
    return {("kernel",): linear(f"{key_prefix}linear_1")}


def llama4_image_encoder_weight_map(cfg: Llama4VisionConfig, vision_prefix: str = "vision_model.",
                                    projector_prefix: str = "multi_modal_projector."
                                    ) -> dict[ParamPath, TensorSpec]:
    """Every parameter of :class:`Llama4ImageEncoder` (paths under "tower" and "projector")."""
    return {**prefixed(llama4_vision_weight_map(cfg, vision_prefix), ("tower",)),
            **prefixed(llama4_projector_weight_map(cfg, projector_prefix), ("projector",))}
