"""Qwen3-Omni audio tower, matching Hugging Face ``Qwen3OmniMoeAudioEncoder``.

Input: log-mel features [n_mels, total_frames] of all clips concatenated along time (as the reference takes them)
and the clips' frame counts ``lengths`` as a static tuple. Output: [total_audio_tokens, output_dim], the clips'
tokens back to back; clip i contributes ``audio_output_length(lengths[i])`` tokens.

Pipeline (all grid-dependent indexing is numpy at trace time):
  1. each clip is cut into chunks of 2 * n_window frames (the last one shorter), every chunk is zero-padded to the
     longest chunk of the whole batch (the padded length changes the convolution outputs near a short chunk's end,
     so it is reproduced exactly);
  2. three Conv2d(3x3, stride 2, padding 1) + GELU (erf) over (mel, time), then ``conv_out`` over (channel, mel);
  3. sinusoidal positions restarting at 0 in every chunk; each chunk keeps its first
     ``audio_output_length(chunk_frames)`` positions;
  4. pre-LN encoder layers whose attention is restricted to windows of
     ``max_chunk_tokens * (n_window_infer // (2 * n_window))`` tokens within each clip (the last window of a clip
     shorter), the reference's ``cu_seqlens``;
  5. ln_post -> proj1 -> activation -> proj2.

Parameter tree (paths in the NNX state) and logical axes::

    ("conv2d1" | "conv2d2" | "conv2d3", "kernel")   [O, I, 3, 3] torch OIHW layout  ("audio_conv", None, None, None)
    ("conv2d1" | "conv2d2" | "conv2d3", "bias")     [O]  ("audio_conv",)
    ("conv_out", "kernel")                          [d_model, C * F]  ("audio_embed", None), no bias
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

from common.weights import ParamPath, TensorSpec, linear, plain
from common.linear import Linear, param
from common.activations import activation
from common.norms import LayerNorm
from common.config_values import config_getter
from encoders.blocks import (FeedForward, MultiHeadProjections, PreLNBlock, feed_forward_map, layer_norm_map,
                             multi_head_projections_map, pre_ln_block_norms_map)
from encoders.qwen3_omni_vision import segment_attention


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
    def mel_after_convs(self) -> int:
        """Mel bins left after the three stride-2 convolutions."""
        return (((self.num_mel_bins + 1) // 2 + 1) // 2 + 1) // 2


# ---------------------------------------------------------------------------------------------------------------
# Static (Python / numpy) helpers.


def audio_output_length(num_frames: int, n_window: int = 50) -> int:
    """Tokens the tower emits for a clip (or chunk) of ``num_frames`` frames: ``_get_feat_extract_output_lengths``.
    Works elementwise on numpy integer arrays too."""
    chunk = n_window * 2
    leave = num_frames % chunk
    feat = (leave - 1) // 2 + 1
    return ((feat - 1) // 2 + 1 - 1) // 2 + 1 + (num_frames // chunk) * 13


def _conv_length(n: int) -> int:
    """Length after one Conv2d(kernel 3, stride 2, padding 1)."""
    return (n - 1) // 2 + 1


def check_lengths(lengths) -> tuple[int, ...]:
    try:
        out = tuple(int(n) for n in lengths)
    except (TypeError, ValueError):
        raise ValueError(f"audio lengths must be a sequence of frame counts, got {lengths!r}") from None
    if not out:
        raise ValueError("audio lengths are empty: at least one clip is needed")
    if any(n < 1 for n in out):
        raise ValueError(f"audio lengths {out} must all be positive")
    return out


def audio_chunk_lengths(lengths: tuple[int, ...], n_window: int) -> tuple[int, ...]:
    """Frames of every chunk of every clip, in order: full chunks of 2 * n_window frames, then the remainder
    (``chunk_and_pad_features``)."""
    chunk = 2 * n_window
    out: list[int] = []
    for n in lengths:
        out += [chunk] * (n // chunk)
        if n % chunk:
            out.append(n % chunk)
    return tuple(out)


def audio_attention_seqlens(lengths: tuple[int, ...], n_window: int, n_window_infer: int) -> tuple[int, ...]:
    """Attention window lengths in tokens, in order (``get_audio_cu_seqlens`` differenced): each clip's tokens are
    cut into windows of ``max_chunk_tokens * (n_window_infer // (2 * n_window))`` tokens, the last one shorter,
    where ``max_chunk_tokens`` is the most tokens any chunk of the batch yields."""
    chunk_tokens = [audio_output_length(c, n_window) for c in audio_chunk_lengths(lengths, n_window)]
    window = max(chunk_tokens) * (n_window_infer // (2 * n_window))
    if window < 1:
        raise ValueError(f"audio attention window is empty (n_window {n_window}, n_window_infer {n_window_infer})")
    out: list[int] = []
    for n in lengths:
        tokens = audio_output_length(n, n_window)
        out += [window] * (tokens // window)
        if tokens % window:
            out.append(tokens % window)
    return tuple(out)


def sinusoid_positions(length: int, channels: int, max_timescale: float = 10000.0) -> np.ndarray:
    """[length, channels] float32: sin of position * inv_timescales, then cos (``SinusoidsPositionEmbedding``)."""
    increment = np.log(max_timescale) / (channels // 2 - 1)
    inv = np.exp(np.float32(-increment) * np.arange(channels // 2, dtype=np.float32)).astype(np.float32)
    scaled = np.arange(length, dtype=np.float32)[:, None] * inv[None, :]
    return np.concatenate([np.sin(scaled), np.cos(scaled)], axis=1).astype(np.float32)


# ---------------------------------------------------------------------------------------------------------------
# Modules.


class StridedConv2d(nnx.Module):
    """Conv2d(kernel 3, stride 2, padding 1) on [N, C, H, W]; kernel kept in torch's [O, I, 3, 3] layout."""

    def __init__(self, in_channels: int, out_channels: int, *, rngs: nnx.Rngs):
        self.kernel = param(rngs, (out_channels, in_channels, 3, 3), ("audio_conv", None, None, None))
        self.bias = nnx.Param(jnp.zeros((out_channels,)), axes=("audio_conv",))

    def __call__(self, x_NCHW: jax.Array) -> jax.Array:
        y = jax.lax.conv_general_dilated(x_NCHW, self.kernel[...].astype(x_NCHW.dtype), window_strides=(2, 2),
                                         padding=((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return y + self.bias[...].astype(y.dtype)[None, :, None, None]


class QwenAudioAttention(MultiHeadProjections):
    """Multi-head self-attention with biases, restricted to the attention windows ``seqlens``; [S, D] -> [S, D]."""

    def __init__(self, cfg: QwenAudioConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg.d_model, cfg.encoder_attention_heads, "audio_embed", "audio_heads", rngs=rngs)

    def __call__(self, x_SD: jax.Array, seqlens: tuple[int, ...]) -> jax.Array:
        return super().__call__(x_SD, lambda q, k, v: segment_attention(q, k, v, seqlens, self.head_dim ** -0.5))


def qwen_audio_encoder_layer(cfg: QwenAudioConfig, *, rngs: nnx.Rngs) -> PreLNBlock:
    """Pre-LN block: x + attn(norm1(x), seqlens), then x + fc2(act(fc1(norm2(x)))); [S, D] -> [S, D]."""
    d = cfg.d_model
    return PreLNBlock(d, cfg.layer_norm_eps, "audio_embed", QwenAudioAttention(cfg, rngs=rngs),
                      FeedForward(d, cfg.encoder_ffn_dim, cfg.activation_function, "audio_embed", "audio_mlp",
                                  rngs=rngs))


class QwenAudioTower(nnx.Module):
    def __init__(self, cfg: QwenAudioConfig, *, rngs: nnx.Rngs):
        cfg.validate()
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

    def __call__(self, features: jax.Array, lengths) -> jax.Array:
        """features [n_mels, sum(lengths)], lengths static (frames per clip) -> [total_tokens, output_dim]."""
        cfg = self.cfg
        lengths = check_lengths(lengths)
        total = sum(lengths)
        if features.ndim != 2 or features.shape != (cfg.num_mel_bins, total):
            raise ValueError(f"expected audio features [{cfg.num_mel_bins}, {total}] for clip lengths {lengths}, "
                             f"got {tuple(features.shape)}")
        chunks = audio_chunk_lengths(lengths, cfg.n_window)
        max_len = max(chunks)
        t_out = _conv_length(_conv_length(_conv_length(max_len)))
        chunk_tokens = [audio_output_length(c, cfg.n_window) for c in chunks]
        if any(n != _conv_length(_conv_length(_conv_length(c))) for n, c in zip(chunk_tokens, chunks)):
            raise ValueError(f"audio n_window {cfg.n_window} is not supported: the reference's token count per "
                             f"chunk assumes 100-frame chunks (n_window 50)")
        if t_out > cfg.max_source_positions:
            raise ValueError(f"audio chunks of {max_len} frames need {t_out} positions, more than "
                             f"max_source_positions {cfg.max_source_positions}")

        # 1. chunk and zero-pad: gather [n_chunks, max_len] frame indices, index `total` is an all-zero column.
        starts = np.concatenate([[0], np.cumsum(chunks)[:-1]])
        frame = starts[:, None] + np.arange(max_len)[None, :]
        frame = np.where(np.arange(max_len)[None, :] < np.asarray(chunks)[:, None], frame, total).astype(np.int32)
        dtype = self.conv_out.kernel[...].dtype
        padded = jnp.concatenate([features.astype(dtype), jnp.zeros((cfg.num_mel_bins, 1), dtype)], axis=1)
        x = jnp.transpose(padded[:, frame], (1, 0, 2))[:, None]  # [n_chunks, 1, n_mels, max_len]

        # 2. convolutions, then (channel, mel) -> d_model per time step.
        gelu = lambda y: jax.nn.gelu(y, approximate=False)  # noqa: E731
        x = gelu(self.conv2d3(gelu(self.conv2d2(gelu(self.conv2d1(x))))))  # [n_chunks, C, F, t_out]
        n, c, f, t = x.shape
        x = self.conv_out(jnp.transpose(x, (0, 3, 1, 2)).reshape(n, t, c * f))

        # 3. per-chunk positions, keep each chunk's valid tokens.
        x = x + jnp.asarray(sinusoid_positions(t, cfg.d_model), x.dtype)[None]
        valid = np.concatenate([i * t + np.arange(k) for i, k in enumerate(chunk_tokens)]).astype(np.int32)
        x = x.reshape(n * t, cfg.d_model)[valid]

        # 4. windowed encoder layers.
        seqlens = audio_attention_seqlens(lengths, cfg.n_window, cfg.n_window_infer)
        for layer in self.layers:
            x = layer(x, seqlens)

        # 5. output head.
        return self.proj(self.ln_post(x))


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
