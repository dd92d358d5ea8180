"""Gemma 4 audio conformer pieces: the convolutional subsampling front end, the half-step feed-forward, the light
(depthwise causal) convolution and the conformer layer, matching ``modeling_gemma4.py``'s ``Gemma4Audio*`` classes.

Parameter trees (paths relative to each module) <- checkpoint names:

    Subsampling     ("conv0" | "conv1", "kernel") [O, I, 3, 3] OIHW  <- layer0 | layer1 .conv.weight
                    ("norm0" | "norm1", "weight") [O]                <- layer0 | layer1 .norm.weight
                    ("proj", "kernel") [D, M'' * C1]                 <- input_proj_linear.weight
    HalfFeedForward ("pre_norm" | "post_norm", "weight"), ("fc1" | "fc2", ClippableLinear)
                    <- pre_layer_norm | post_layer_norm, ffw_layer_1 | ffw_layer_2
    LightConv       ("pre_norm" | "conv_norm", "weight"), ("linear_start" | "linear_end", ClippableLinear),
                    ("depthwise", "kernel") [D, 1, conv_kernel_size] <- depthwise_conv1d.weight
    ConformerLayer  ("ffn1" | "ffn2"), ("attn"), ("lconv"), ("norm_pre_attn" | "norm_post_attn" | "norm_out",
                    "weight") <- feed_forward1 | feed_forward2, self_attn, lconv1d, ...
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from omnijax.common.activations import activation
from omnijax.common.linear import Linear, param
from omnijax.common.norms import RMSNorm
from omnijax.common.weights import ParamPath, TensorSpec, linear, plain
from omnijax.encoders.gemma4.audio_attention import Gemma4AudioAttention, attention_map
from omnijax.encoders.gemma4.audio_config import FIXED_NORM_EPS, Gemma4AudioEncoderConfig
from omnijax.encoders.gemma4.clippable_linear import ClippableLinear, clippable_linear_map


def clip_bound(cfg: Gemma4AudioEncoderConfig, dtype) -> float:
    """The reference's ``min(gradient_clipping, finfo(dtype).max)``."""
    return min(cfg.gradient_clipping, float(jnp.finfo(dtype).max))


def _clamp(x: jax.Array, cfg: Gemma4AudioEncoderConfig) -> jax.Array:
    bound = clip_bound(cfg, x.dtype)
    return jnp.clip(x, -bound, bound)


def conv_output_length(n: int) -> int:
    """Length after a kernel-3, stride-2, padding-1 convolution: ``(n + 2 - 3) // 2 + 1``."""
    return (n - 1) // 2 + 1


class Kernel(nnx.Module):
    """A module holding one weight tensor ``kernel`` in torch layout (convolution kernels)."""

    def __init__(self, rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str | None, ...]):
        self.kernel = param(rngs, shape, axes)


class BiasFreeLayerNorm(nnx.Module):
    """torch ``nn.LayerNorm(dim, bias=False)`` over the last axis, in float32."""

    def __init__(self, dim: int, eps: float, axis_name: str | None):
        self.eps = eps
        self.weight = nnx.Param(jnp.ones((dim,)), axes=(axis_name,))

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        mean = jnp.mean(xf, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
        y = (xf - mean) * jax.lax.rsqrt(var + self.eps) * self.weight[...].astype(jnp.float32)
        return y.astype(x.dtype)


class Subsampling(nnx.Module):
    """Two [conv 3x3 stride 2 (no bias) -> LayerNorm over channels -> ReLU] over (time, mel), frames zeroed where
    invalid before each conv, then a linear over (mel', channel) per time step.

    features [B, L, M], frame validity [B, L] -> ([B, L'', D], validity [B, L'']) with L'' = ceil(ceil(L/2)/2)
    (M'' = ceil(ceil(M/2)/2) mel bins, C1 channels) and validity ``valid[:, ::2][:, ::2]``."""

    def __init__(self, cfg: Gemma4AudioEncoderConfig, *, rngs: nnx.Rngs):
        c0, c1 = cfg.subsampling_conv_channels
        self.cfg = cfg
        self.conv0 = Kernel(rngs, (c0, 1, 3, 3), ("audio_conv", None, None, None))
        self.norm0 = BiasFreeLayerNorm(c0, cfg.rms_norm_eps, "audio_conv")
        self.conv1 = Kernel(rngs, (c1, c0, 3, 3), ("audio_conv", None, None, None))
        self.norm1 = BiasFreeLayerNorm(c1, cfg.rms_norm_eps, "audio_conv")
        self.proj = Linear(cfg.subsampled_mel_bins * c1, cfg.hidden_size, axes=(None, "audio_embed"), rngs=rngs)

    @staticmethod
    def _block(x_BCLM, valid_BL, kernel, norm: BiasFreeLayerNorm):
        x_BCLM = x_BCLM * valid_BL[:, None, :, None].astype(x_BCLM.dtype)
        y = jax.lax.conv_general_dilated(x_BCLM, kernel.astype(x_BCLM.dtype), window_strides=(2, 2),
                                         padding=((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW"))
        y = jnp.moveaxis(jax.nn.relu(norm(jnp.moveaxis(y, 1, -1))), -1, 1)
        return y, valid_BL[:, ::2]

    def __call__(self, features_BLM: jax.Array, valid_BL: jax.Array) -> tuple[jax.Array, jax.Array]:
        mels = features_BLM.shape[-1]
        if conv_output_length(conv_output_length(mels)) != self.cfg.subsampled_mel_bins:
            raise ValueError(f"audio features have {mels} mel bins; the subsampling projection of this checkpoint "
                             f"expects {self.cfg.subsampled_mel_bins} after two stride-2 convolutions "
                             f"(subsampling_conv_channels[0] // 4)")
        x = features_BLM.astype(self.proj.kernel[...].dtype)[:, None]  # [B, 1, L, M]
        x, valid_BL = self._block(x, valid_BL, self.conv0.kernel[...], self.norm0)
        x, valid_BL = self._block(x, valid_BL, self.conv1.kernel[...], self.norm1)
        b, c, t, f = x.shape
        x = jnp.transpose(x, (0, 2, 3, 1)).reshape(b, t, f * c)
        return self.proj(x), valid_BL


class HalfFeedForward(nnx.Module):
    """x + residual_weight * post_norm(clamp(fc2(act(fc1(pre_norm(clamp(x))))))); [..., D] -> [..., D]."""

    def __init__(self, cfg: Gemma4AudioEncoderConfig, *, rngs: nnx.Rngs):
        d, clipped = cfg.hidden_size, cfg.use_clipped_linears
        self.cfg = cfg
        self.pre_norm = RMSNorm(d, eps=FIXED_NORM_EPS, axis_name="audio_embed")
        self.fc1 = ClippableLinear(d, 4 * d, clipped=clipped, axes=("audio_embed", "audio_mlp"), rngs=rngs)
        self.fc2 = ClippableLinear(4 * d, d, clipped=clipped, axes=("audio_mlp", "audio_embed"), rngs=rngs)
        self.post_norm = RMSNorm(d, eps=FIXED_NORM_EPS, axis_name="audio_embed")

    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.cfg
        y = self.fc2(activation(cfg.hidden_act)(self.fc1(self.pre_norm(_clamp(x, cfg)))))
        return x + self.post_norm(_clamp(y, cfg)) * cfg.residual_weight


class LightConv(nnx.Module):
    """x + linear_end(act(conv_norm(clamp(causal_depthwise_conv(glu(linear_start(pre_norm(x)))))))); [B, L, D]."""

    def __init__(self, cfg: Gemma4AudioEncoderConfig, *, rngs: nnx.Rngs):
        d, clipped = cfg.hidden_size, cfg.use_clipped_linears
        self.cfg = cfg
        self.pre_norm = RMSNorm(d, eps=cfg.rms_norm_eps, axis_name="audio_embed")
        self.linear_start = ClippableLinear(d, 2 * d, clipped=clipped, axes=("audio_embed", "audio_mlp"), rngs=rngs)
        self.depthwise = Kernel(rngs, (d, 1, cfg.conv_kernel_size), ("audio_mlp", None, None))
        self.conv_norm = RMSNorm(d, eps=cfg.rms_norm_eps, axis_name="audio_embed")
        self.linear_end = ClippableLinear(d, d, clipped=clipped, axes=("audio_mlp", "audio_embed"), rngs=rngs)

    def __call__(self, x_BLD: jax.Array) -> jax.Array:
        cfg = self.cfg
        a, gate = jnp.split(self.linear_start(self.pre_norm(x_BLD)), 2, axis=-1)
        y = a * jax.nn.sigmoid(gate)
        # Causal depthwise conv: output t sees inputs t - (K - 1) .. t (left zero padding of K - 1).
        kernel = self.depthwise.kernel[...][:, 0, :].astype(y.dtype)  # [D, conv_kernel_size]
        k_size, t = cfg.conv_kernel_size, y.shape[1]
        y_pad = jnp.pad(y, ((0, 0), (k_size - 1, 0), (0, 0)))
        y = sum(y_pad[:, j : j + t, :] * kernel[:, j] for j in range(k_size))
        y = activation(cfg.hidden_act)(self.conv_norm(_clamp(y, cfg)))
        return x_BLD + self.linear_end(y)


class ConformerLayer(nnx.Module):
    """ffn1 (half step) -> attention block (clamp, norm, attention, clamp, norm, residual) -> light conv -> ffn2
    (half step) -> clamp -> norm_out; [B, L, D] -> [B, L, D]."""

    def __init__(self, cfg: Gemma4AudioEncoderConfig, *, rngs: nnx.Rngs):
        d = cfg.hidden_size
        self.cfg = cfg
        self.ffn1 = HalfFeedForward(cfg, rngs=rngs)
        self.norm_pre_attn = RMSNorm(d, eps=FIXED_NORM_EPS, axis_name="audio_embed")
        self.attn = Gemma4AudioAttention(cfg, rngs=rngs)
        self.norm_post_attn = RMSNorm(d, eps=FIXED_NORM_EPS, axis_name="audio_embed")
        self.lconv = LightConv(cfg, rngs=rngs)
        self.ffn2 = HalfFeedForward(cfg, rngs=rngs)
        self.norm_out = RMSNorm(d, eps=FIXED_NORM_EPS, axis_name="audio_embed")

    def __call__(self, x_BLD: jax.Array, key_valid_BL: jax.Array, rel_pos: jax.Array) -> jax.Array:
        cfg = self.cfg
        x = self.ffn1(x_BLD)
        attended = self.attn(self.norm_pre_attn(_clamp(x, cfg)), key_valid_BL, rel_pos)
        x = x + self.norm_post_attn(_clamp(attended, cfg))
        x = self.ffn2(self.lconv(x))
        return self.norm_out(_clamp(x, cfg))


# ---------------------------------------------------------------------------------------------------------------
# Weight maps


def _norm(path: ParamPath, key: str) -> dict[ParamPath, TensorSpec]:
    return {path + ("weight",): plain(f"{key}.weight")}


def subsampling_map(path: ParamPath, key: str) -> dict[ParamPath, TensorSpec]:
    """``Subsampling`` at ``path`` <- ``{key}.*`` (``subsample_conv_projection``)."""
    m: dict[ParamPath, TensorSpec] = {path + ("proj", "kernel"): linear(f"{key}.input_proj_linear")}
    for i in (0, 1):
        m[path + (f"conv{i}", "kernel")] = plain(f"{key}.layer{i}.conv.weight")
        m.update(_norm(path + (f"norm{i}",), f"{key}.layer{i}.norm"))
    return m


def half_feed_forward_map(path: ParamPath, key: str, clipped: bool) -> dict[ParamPath, TensorSpec]:
    m = {**_norm(path + ("pre_norm",), f"{key}.pre_layer_norm"),
         **_norm(path + ("post_norm",), f"{key}.post_layer_norm")}
    m.update(clippable_linear_map(path + ("fc1",), f"{key}.ffw_layer_1", clipped))
    m.update(clippable_linear_map(path + ("fc2",), f"{key}.ffw_layer_2", clipped))
    return m


def light_conv_map(path: ParamPath, key: str, clipped: bool) -> dict[ParamPath, TensorSpec]:
    m = {**_norm(path + ("pre_norm",), f"{key}.pre_layer_norm"), **_norm(path + ("conv_norm",), f"{key}.conv_norm")}
    m.update(clippable_linear_map(path + ("linear_start",), f"{key}.linear_start", clipped))
    m.update(clippable_linear_map(path + ("linear_end",), f"{key}.linear_end", clipped))
    m[path + ("depthwise", "kernel")] = plain(f"{key}.depthwise_conv1d.weight")
    return m


def conformer_layer_map(path: ParamPath, key: str, cfg: Gemma4AudioEncoderConfig) -> dict[ParamPath, TensorSpec]:
    """``ConformerLayer`` at ``path`` <- ``{key}.*`` (``layers.{i}``)."""
    clipped = cfg.use_clipped_linears
    m = {**half_feed_forward_map(path + ("ffn1",), f"{key}.feed_forward1", clipped),
         **half_feed_forward_map(path + ("ffn2",), f"{key}.feed_forward2", clipped),
         **attention_map(path + ("attn",), f"{key}.self_attn", cfg),
         **light_conv_map(path + ("lconv",), f"{key}.lconv1d", clipped)}
    for name in ("norm_pre_attn", "norm_post_attn", "norm_out"):
        m.update(_norm(path + (name,), f"{key}.{name}"))
    return m
