"""The Gemma 4 audio encoder: conformer tower (``Gemma4AudioModel``) and the embedder into the text width
(``Gemma4MultimodalEmbedder`` of ``embed_audio``), with their weight maps.

``Gemma4AudioEncoder`` is what the model runs: the host batches clips (preprocess/gemma4/audio_batch.py) into
``{"features": [B, L, M], "num_frames": [B]}`` (B clips of L frames of M mel bins) and the module maps that to
``(features [B * L/4, text_hidden], valid [B * L/4] bool, ())``; clip c's tokens are rows c*L/4 .. c*L/4 +
tokens_c - 1, so the j-th valid row is the j-th ``<|audio|>`` placeholder's. Lengths are data: every clip count
and length inside one (clip bucket, frame bucket) pair runs the same compiled program, and the valid rows do not
depend on the padding.

Tower: frames valid iff index < num_frames -> ``Subsampling`` (two stride-2 convs, validity ``[::2][::2]``) ->
``num_hidden_layers`` x ``ConformerLayer`` (keys limited to valid tokens) -> ``output_proj`` (with bias).
Embedder (``encoders.gemma4.embedder``, shared with the vision tower): weightless RMSNorm (eps
``rms_norm_eps``) -> ``embedding_projection`` (no bias).

Parameter tree of ``Gemma4AudioEncoder`` <- checkpoint keys (``model.audio_tower.`` / ``model.embed_audio.``)::

    ("tower", "subsample", ...)                 <- subsample_conv_projection.*   (see gemma4_audio_conformer)
    ("tower", "layers", i, ...)                 <- layers.{i}.*
    ("tower", "output_proj", "kernel" | "bias") <- output_proj.weight | .bias   [output_proj_dims, hidden]
    ("embedder", "projection", "kernel")        <- embedding_projection.weight  [text_hidden, output_proj_dims]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from omnijax.common.linear import Linear
from omnijax.common.weights import ParamPath, TensorSpec, linear, plain, prefixed
from omnijax.encoders.gemma4.audio_attention import relative_position_embeddings
from omnijax.encoders.gemma4.audio_conformer import ConformerLayer, Subsampling, conformer_layer_map, subsampling_map
from omnijax.encoders.gemma4.audio_config import Gemma4AudioEncoderConfig
from omnijax.encoders.gemma4.embedder import MultimodalEmbedder, multimodal_embedder_map


class Gemma4AudioTower(nnx.Module):
    """features [B, L, M], frame validity [B, L] bool -> (hidden [B, L'', output_proj_dims], validity [B, L''])
    with L'' = ceil(ceil(L / 2) / 2). Rows where validity is False are padding (their values are unspecified)."""

    def __init__(self, cfg: Gemma4AudioEncoderConfig, *, rngs: nnx.Rngs):
        cfg.validate()
        self.cfg = cfg
        self.subsample = Subsampling(cfg, rngs=rngs)
        self.layers = nnx.List([ConformerLayer(cfg, rngs=rngs) for _ in range(cfg.num_hidden_layers)])
        self.output_proj = Linear(cfg.hidden_size, cfg.output_proj_dims, axes=("audio_embed", None), use_bias=True,
                                  rngs=rngs)

    def __call__(self, features_BLM: jax.Array, valid_BL: jax.Array) -> tuple[jax.Array, jax.Array]:
        x, valid = self.subsample(features_BLM, valid_BL)
        rel_pos = jnp.asarray(relative_position_embeddings(self.cfg), x.dtype)
        for layer in self.layers:
            x = layer(x, valid, rel_pos)
        return self.output_proj(x), valid


class Gemma4AudioEncoder(nnx.Module):
    """Batched clips (preprocess/gemma4/audio_batch.py) -> (features [B * L/4, text_hidden], valid [B * L/4] bool,
    no extra feature maps)."""

    def __init__(self, cfg: Gemma4AudioEncoderConfig, *, rngs: nnx.Rngs):
        self.tower = Gemma4AudioTower(cfg, rngs=rngs)
        self.embedder = MultimodalEmbedder(cfg.output_proj_dims, cfg.text_hidden_size, eps=cfg.rms_norm_eps,
                                           axis_in=None, rngs=rngs)

    def __call__(self, inputs: dict) -> tuple[jax.Array, jax.Array, tuple]:
        features_BLM, num_frames_B = inputs["features"], inputs["num_frames"]
        b, t, _ = features_BLM.shape
        valid_BL = jnp.arange(t, dtype=jnp.int32)[None, :] < num_frames_B.astype(jnp.int32)[:, None]
        hidden, valid = self.tower(features_BLM, valid_BL)
        embeds = self.embedder(hidden)
        return embeds.reshape(b * embeds.shape[1], embeds.shape[2]), valid.reshape(-1), ()


# ---------------------------------------------------------------------------------------------------------------
# Weight maps


def gemma4_audio_tower_weight_map(cfg: Gemma4AudioEncoderConfig,
                                  key_prefix: str = "model.audio_tower.") -> dict[ParamPath, TensorSpec]:
    """Every parameter of ``Gemma4AudioTower`` -> its checkpoint tensor under ``key_prefix``."""
    p = key_prefix
    m = subsampling_map(("subsample",), f"{p}subsample_conv_projection")
    for i in range(cfg.num_hidden_layers):
        m.update(conformer_layer_map(("layers", i), f"{p}layers.{i}", cfg))
    m[("output_proj", "kernel")] = linear(f"{p}output_proj")
    m[("output_proj", "bias")] = plain(f"{p}output_proj.bias")
    return m


def gemma4_audio_embedder_weight_map(cfg: Gemma4AudioEncoderConfig,
                                     key_prefix: str = "model.embed_audio.") -> dict[ParamPath, TensorSpec]:
    """Every parameter of the audio embedder (a ``MultimodalEmbedder``) -> its checkpoint tensor under
    ``key_prefix``."""
    return multimodal_embedder_map((), key_prefix.rstrip("."))


def gemma4_audio_weight_map(cfg: Gemma4AudioEncoderConfig, key_prefix: str = "model.") -> dict[ParamPath, TensorSpec]:
    """Every parameter of ``Gemma4AudioEncoder`` -> ``{key_prefix}audio_tower.*`` / ``{key_prefix}embed_audio.*``."""
    return {**prefixed(gemma4_audio_tower_weight_map(cfg, f"{key_prefix}audio_tower."), ("tower",)),
            **prefixed(gemma4_audio_embedder_weight_map(cfg, f"{key_prefix}embed_audio."), ("embedder",))}
