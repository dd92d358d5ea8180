"""Qwen3-Omni audio tower, matching Hugging Face ``Qwen3OmniMoeAudioEncoder``.

The reference, for log-mel features of a batch of clips (``lengths`` frames each):
  1. cuts each clip into chunks of 2 * n_window frames (the last one shorter) and zero-pads every chunk to the
     longest chunk of the whole batch (the padded length changes the convolution outputs near a short chunk's end);
  2. three Conv2d(3x3, stride 2, padding 1) + GELU (erf) over (mel, time), then ``conv_out`` over (channel, mel);
  3. adds sinusoidal positions restarting at 0 in every chunk; each chunk keeps its first
     ``audio_tokens_from_frames(chunk_frames)`` positions (preprocess/qwen3_omni/mrope.py);
  4. runs pre-LN encoder layers whose attention is restricted to windows of
     ``max_chunk_tokens * (n_window_infer // (2 * n_window))`` tokens within each clip (the last window of a clip
     shorter), the reference's ``cu_seqlens``;
  5. ln_post -> proj1 -> activation -> proj2.

A window always covers whole chunks of one clip, at most n_window_infer // (2 * n_window) of them.
``QwenAudioTower.encode`` takes window blocks: [windows, chunks_per_window, n_mels, 2 * n_window] frames, each chunk
zero-padded to the full chunk length, plus the frames of every chunk and the batch's longest chunk as data (laid out
on the host by preprocess/qwen3_omni/audio_batch.py). The convolutions' outputs past the batch's longest
chunk are zeroed, which is exactly the reference's padding to that length, and attention runs per window block over
its valid tokens; a program compiled for one (windows, chunks_per_window) bucket serves every set of lengths that
fits it.

Parameter tree (paths in the NNX state) and logical axes::

    ("conv2d1" | "conv2d2" | "conv2d3", "kernel")   [O, I, 3, 3] torch OIHW layout  ("audio_conv", None, None, None)
    ("conv2d1" | "conv2d2" | "conv2d3", "bias")     [O]  ("audio_conv",)
    ("conv_out", "kernel")                          [d_model, C * mel_after_convs]  ("audio_embed", None), no bias
    ("layers", i, "norm1" | "norm2", "weight" | "bias")   [d_model]  ("audio_embed",)
                                                    <- self_attn_layer_norm | final_layer_norm
    ("layers", i, "attn", "q_proj" | "k_proj" | "v_proj", "kernel" | "bias")   ("audio_embed", "audio_heads")
    ("layers", i, "attn", "out_proj", "kernel" | "bias")                       ("audio_heads", "audio_embed")
                                                    <- self_attn.*
    ("layers", i, "mlp", "fc1" | "fc2", "kernel" | "bias")    "audio_embed" <-> "audio_mlp"  <- fc1 | fc2
    ("ln_post", "weight" | "bias")
    ("proj", "fc1", "kernel" | "bias")              [d_model, d_model]  ("audio_embed", "audio_mlp")  <- proj1
    ("proj", "fc2", "kernel" | "bias")              [output_dim, d_model]  ("audio_mlp", "embed")  <- proj2

Linear kernels are stored [out, in] (torch's layout); their axes above are given in (in, out) order.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from omnijax.common.weights import ParamPath, TensorSpec, linear, plain
from omnijax.common.linear import Linear, param
from omnijax.common.activations import activation
from omnijax.common.norms import LayerNorm
from omnijax.common.config_values import config_getter
from omnijax.encoders.attention import attention
from omnijax.encoders.blocks import (FeedForward, MultiHeadProjections, PreLNBlock, feed_forward_map, layer_norm_map,
                                     multi_head_projections_map, pre_ln_block_norms_map)
from omnijax.preprocess.qwen3_omni.mrope import audio_tokens_from_frames


@dataclasses.dataclass(frozen=True)
class QwenAudioConfig:
    num_mel_bins: int = 128
    encoder_layers: int = 32
    encoder_attention_heads: int = 20
    encoder_ffn_dim: int = 5120
    d_model: int = 1280
    activation_function: str = "gelu"
    max_source_positions: int = 1500
    n_window: int = 50
    output_dim: int = 3584
    n_window_infer: int = 800
    downsample_hidden_size: int = 480
    layer_norm_eps: float = 1e-5  # torch nn.LayerNorm default, used by every LayerNorm of the reference

    @classmethod
    def from_hf(cls, d: dict) -> "QwenAudioConfig":
        """From the thinker config's ``audio_config`` dict; missing keys take HF defaults."""
        get = config_getter(d, cls())
        cfg = cls(
            num_mel_bins=int(get("num_mel_bins")),
            encoder_layers=int(get("encoder_layers", "num_hidden_layers")),
            encoder_attention_heads=int(get("encoder_attention_heads", "num_attention_heads")),
            encoder_ffn_dim=int(get("encoder_ffn_dim", "intermediate_size")),
            d_model=int(get("d_model", "hidden_size")),
            activation_function=str(get("activation_function")),
            max_source_positions=int(get("max_source_positions")),
            n_window=int(get("n_window")),
            output_dim=int(get("output_dim")),
            n_window_infer=int(get("n_window_infer")),
            downsample_hidden_size=int(get("downsample_hidden_size")),
        )
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.d_model % self.encoder_attention_heads:
            raise ValueError(f"audio d_model {self.d_model} is not divisible by encoder_attention_heads "
                             f"{self.encoder_attention_heads}")
        if self.d_model % 2:
            raise ValueError(f"audio d_model {self.d_model} must be even for the sinusoidal positions")
        if self.n_window < 1:
            raise ValueError(f"audio n_window {self.n_window} must be positive")
        if self.n_window_infer // (2 * self.n_window) < 1:
            raise ValueError(f"audio n_window_infer {self.n_window_infer} must be at least 2 * n_window "
                             f"({2 * self.n_window})")
        activation(self.activation_function)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.encoder_attention_heads

    @property
    def chunk_frames(self) -> int:
        return 2 * self.n_window

    @property
    def chunks_per_window(self) -> int:
        """The most chunks one attention window covers."""
        return self.n_window_infer // (2 * self.n_window)

    @property
    def chunk_tokens(self) -> int:
        """Token positions of one full chunk after the three stride-2 convolutions."""
        return _conv_length(_conv_length(_conv_length(self.chunk_frames)))

    @property
    def mel_after_convs(self) -> int:
        """Mel bins left after the three stride-2 convolutions."""
        return (((self.num_mel_bins + 1) // 2 + 1) // 2 + 1) // 2


# ---------------------------------------------------------------------------------------------------------------
# Host-side (Python / numpy) helpers.


def _conv_length(n):
    """Length after one Conv2d(kernel 3, stride 2, padding 1); n an int or an integer numpy / jax array."""
    return (n - 1) // 2 + 1


def sinusoid_positions(length: int, channels: int, max_timescale: float = 10000.0) -> np.ndarray:
    """[length, channels] float32: sin of position * inv_timescales, then cos (``SinusoidsPositionEmbedding``)."""
    increment = np.log(max_timescale) / (channels // 2 - 1)
    inv = np.exp(np.float32(-increment) * np.arange(channels // 2, dtype=np.float32)).astype(np.float32)
    scaled = np.arange(length, dtype=np.float32)[:, None] * inv[None, :]
    return np.concatenate([np.sin(scaled), np.cos(scaled)], axis=1).astype(np.float32)


# ---------------------------------------------------------------------------------------------------------------
# Modules.


class StridedConv2d(nnx.Module):
    """Conv2d(kernel 3, stride 2, padding 1) on [B, C, Y, X]; kernel kept in torch's [O, I, 3, 3] layout."""

    def __init__(self, in_channels: int, out_channels: int, *, rngs: nnx.Rngs):
        self.kernel = param(rngs, (out_channels, in_channels, 3, 3), ("audio_conv", None, None, None))
        self.bias = nnx.Param(jnp.zeros((out_channels,)), axes=("audio_conv",))

    def __call__(self, x_BCYX: jax.Array) -> jax.Array:
        y = jax.lax.conv_general_dilated(x_BCYX, self.kernel[...].astype(x_BCYX.dtype), window_strides=(2, 2),
                                         padding=((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return y + self.bias[...].astype(y.dtype)[None, :, None, None]


class QwenAudioAttention(MultiHeadProjections):
    """Multi-head self-attention with biases within each window block over its valid tokens;
    x [B, L, D] (B window blocks) -> [B, L, D]."""

    def __init__(self, cfg: QwenAudioConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg.d_model, cfg.encoder_attention_heads, "audio_embed", "audio_heads", rngs=rngs)

    def __call__(self, x_BLD: jax.Array, valid_BL: jax.Array) -> jax.Array:
        return super().__call__(x_BLD, lambda q, k, v: attention(q, k, v, valid_BL, scale=self.head_dim ** -0.5))


def qwen_audio_encoder_layer(cfg: QwenAudioConfig, *, rngs: nnx.Rngs) -> PreLNBlock:
    """Pre-LN block: x + attn(norm1(x), valid), then x + fc2(act(fc1(norm2(x)))); [B, L, D] -> [B, L, D]."""
    d = cfg.d_model
    return PreLNBlock(d, cfg.layer_norm_eps, "audio_embed", QwenAudioAttention(cfg, rngs=rngs),
                      FeedForward(d, cfg.encoder_ffn_dim, cfg.activation_function, "audio_embed", "audio_mlp",
                                  rngs=rngs))


def check_chunk_tokens(cfg: QwenAudioConfig) -> None:
    """The reference counts ``audio_tokens_from_frames`` tokens per chunk, which equals the convolutions' output
    length only for 100-frame chunks (n_window 50); its positions must fit ``max_source_positions``."""
    if any(audio_tokens_from_frames(c, cfg.n_window) != _conv_length(_conv_length(_conv_length(c)))
           for c in range(1, cfg.chunk_frames + 1)):
        raise ValueError(f"audio n_window {cfg.n_window} is not supported: the reference's token count per chunk "
                         f"assumes 100-frame chunks (n_window 50)")
    if cfg.chunk_tokens > cfg.max_source_positions:
        raise ValueError(f"audio chunks of {cfg.chunk_frames} frames need {cfg.chunk_tokens} positions, more than "
                         f"max_source_positions {cfg.max_source_positions}")


class QwenAudioTower(nnx.Module):
    """Chunked convolutions, per-chunk sinusoidal positions, windowed encoder layers, output head. ``encode`` takes
    window blocks."""

    def __init__(self, cfg: QwenAudioConfig, *, rngs: nnx.Rngs):
        cfg.validate()
        check_chunk_tokens(cfg)
        self.cfg = cfg
        c, d = cfg.downsample_hidden_size, cfg.d_model
        self.conv2d1 = StridedConv2d(1, c, rngs=rngs)
        self.conv2d2 = StridedConv2d(c, c, rngs=rngs)
        self.conv2d3 = StridedConv2d(c, c, rngs=rngs)
        self.conv_out = Linear(c * cfg.mel_after_convs, d, axes=(None, "audio_embed"), rngs=rngs)
        self.layers = nnx.List([qwen_audio_encoder_layer(cfg, rngs=rngs) for _ in range(cfg.encoder_layers)])
        self.ln_post = LayerNorm(d, eps=cfg.layer_norm_eps, axis_name="audio_embed")
        self.proj = FeedForward(d, d, cfg.activation_function, "audio_embed", "audio_mlp", rngs=rngs,
                                out_dim=cfg.output_dim, axes_out="embed")

    def encode(self, features_BUML: jax.Array, chunk_frames_BU: jax.Array,
               padded_frames: jax.Array) -> tuple[jax.Array, jax.Array]:
        """B window blocks of U chunk slots (preprocess/qwen3_omni/audio_batch.py) -> (tokens [B*U*chunk_tokens,
        output_dim], valid [B*U*chunk_tokens] bool). features [B, U, M, 2*n_window] (frames past a chunk's
        ``chunk_frames`` are ignored), chunk_frames [B, U] int, padded_frames [] int: the batch's longest chunk."""
        cfg = self.cfg
        w, c = chunk_frames_BU.shape
        if features_BUML.shape != (w, c, cfg.num_mel_bins, cfg.chunk_frames):
            raise ValueError(f"expected audio chunk blocks [{w}, {c}, {cfg.num_mel_bins}, {cfg.chunk_frames}], got "
                             f"{tuple(features_BUML.shape)}")
        dtype = self.conv_out.kernel[...].dtype
        frames = chunk_frames_BU.reshape(w * c, 1, 1, 1)
        x = features_BUML.reshape(w * c, 1, cfg.num_mel_bins, cfg.chunk_frames).astype(dtype)
        x = jnp.where(jnp.arange(cfg.chunk_frames) < frames, x, jnp.zeros((), dtype))

        # Convolutions; outputs past the padded length's are the reference's zero padding of the next layer.
        gelu = lambda y: jax.nn.gelu(y, approximate=False)  # noqa: E731
        length = padded_frames
        for conv in (self.conv2d1, self.conv2d2, self.conv2d3):
            x = gelu(conv(x))
            length = _conv_length(length)
            x = jnp.where(jnp.arange(x.shape[-1]) < length, x, jnp.zeros((), x.dtype))
        n, ch, f, t = x.shape  # [chunks, C, mel_after_convs, chunk_tokens]
        x = self.conv_out(jnp.transpose(x, (0, 3, 1, 2)).reshape(n, t, ch * f))
        x = x + jnp.asarray(sinusoid_positions(t, cfg.d_model), x.dtype)[None]
        valid = jnp.arange(t) < _conv_length(_conv_length(_conv_length(chunk_frames_BU)))[..., None]

        # Windowed encoder layers: one block per window.
        x = x.reshape(w, c * t, cfg.d_model)
        valid = valid.reshape(w, c * t)
        for layer in self.layers:
            x = layer(x, valid)
        return self.proj(self.ln_post(x)).reshape(w * c * t, -1), valid.reshape(-1)


def qwen_audio_weight_map(cfg: QwenAudioConfig,
                          key_prefix: str = "thinker.audio_tower.") -> dict[ParamPath, TensorSpec]:
    """Every parameter of ``QwenAudioTower`` -> its checkpoint tensor. ``key_prefix``: ``thinker.audio_tower.`` in
    a full Qwen3-Omni checkpoint, ``audio_tower.`` in a thinker-only one."""
    p = key_prefix
    m: dict[ParamPath, TensorSpec] = {("conv_out", "kernel"): linear(f"{p}conv_out")}
    for conv in ("conv2d1", "conv2d2", "conv2d3"):
        m[(conv, "kernel")] = plain(f"{p}{conv}.weight")
        m[(conv, "bias")] = plain(f"{p}{conv}.bias")
    m.update(feed_forward_map(("proj",), f"{p}proj1", f"{p}proj2"))
    m.update(layer_norm_map(("ln_post",), f"{p}ln_post"))
    for i in range(cfg.encoder_layers):
        lp = f"{p}layers.{i}."
        m.update(pre_ln_block_norms_map(("layers", i), f"{lp}self_attn_layer_norm", f"{lp}final_layer_norm"))
        m.update(multi_head_projections_map(("layers", i, "attn"), f"{lp}self_attn"))
        m.update(feed_forward_map(("layers", i, "mlp"), f"{lp}fc1", f"{lp}fc2"))
    return m
