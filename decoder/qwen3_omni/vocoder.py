"""The convolutional half of Qwen3-Omni's code2wav: transposed-convolution upsamplers, ConvNeXt blocks, SnakeBeta
activations and causal residual units, from transformer states [B, T, D] at the codec frame rate to a waveform.

Layouts: activations are channels-last [B, T, C]; weights keep torch's layouts (Conv1d [out, in / groups, k],
ConvTranspose1d [in, out, k]). Time mixes only inside the convolutions, and each takes ``start``: the first valid
sample at its input's rate. Samples before it are zeroed first, which is exactly the zero history a decode that
began at ``start`` sees (a causal convolution pads with zeros; a transposed one reads no earlier input): a window
holding left context decodes its valid part as a decode from the window's first valid frame would.

Lengths, as transformers computes them: a causal convolution keeps the length; a transposed one of kernel k and
stride s gives L * s - (k - s) samples (it drops k - s at each end: the decoder blocks' kernel 2s loses s samples,
the upsamplers' kernel s none), so a decode of T frames yields T * total_upsample - ``lost_samples`` samples.
Output sample t depends only on frames up to (t + lost) / total_upsample: decoding a prefix gives the same samples.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from omnijax.common.linear import Linear, param
from omnijax.common.norms import LayerNorm

KERNEL = 7  # the causal convolutions' kernel (residual units, ConvNeXt, the first and last convolution)
DILATIONS = (1, 3, 9)  # the residual units of a decoder block


def valid_from(x_BTC: jax.Array, start: jax.Array) -> jax.Array:
    """``x`` with the samples before ``start`` zeroed."""
    t = jnp.arange(x_BTC.shape[1], dtype=jnp.int32)[None, :, None]
    return jnp.where(t >= start, x_BTC, jnp.zeros((), x_BTC.dtype))


class CausalConv(nnx.Module):
    """Conv1d of stride 1 padded on the left by (k - 1) * dilation zeros (transformers' CausalConvNet)."""

    def __init__(self, cin: int, cout: int, kernel: int, *, dilation: int = 1, groups: int = 1, rngs: nnx.Rngs):
        self.weight = param(rngs, (cout, cin // groups, kernel), (None, None, None))
        self.bias = nnx.Param(jnp.zeros((cout,)), axes=(None,))
        self.dilation, self.groups, self.kernel = dilation, groups, kernel

    def __call__(self, x_BTC: jax.Array, start: jax.Array) -> jax.Array:
        pad = (self.kernel - 1) * self.dilation
        y = jax.lax.conv_general_dilated(
            valid_from(x_BTC, start), self.weight[...].astype(x_BTC.dtype), window_strides=(1,),
            padding=[(pad, 0)], rhs_dilation=(self.dilation,), dimension_numbers=("NWC", "OIW", "NWC"),
            feature_group_count=self.groups)
        return y + self.bias[...].astype(y.dtype)


class TransposedConv(nnx.Module):
    """ConvTranspose1d of kernel k and stride s, trimmed by k - s samples at each end (transformers'
    CausalTransConvNet): L frames -> L * s - (k - s) samples. Computed as s output phases: phase p of step t
    reads inputs t - j with kernel taps j * s + p."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, *, rngs: nnx.Rngs):
        self.weight = param(rngs, (cin, cout, kernel), (None, None, None))
        self.bias = nnx.Param(jnp.zeros((cout,)), axes=(None,))
        self.kernel, self.stride = kernel, stride

    def __call__(self, x_BTC: jax.Array, start: jax.Array) -> jax.Array:
        k, s = self.kernel, self.stride
        taps = -(-k // s)  # inputs per output phase
        w = jnp.pad(self.weight[...].astype(x_BTC.dtype), ((0, 0), (0, 0), (0, taps * s - k)))
        w = w.reshape(w.shape[0], w.shape[1], taps, s)  # [in, out, j, p]
        x = jnp.pad(valid_from(x_BTC, start), ((0, 0), (taps - 1, taps - 1), (0, 0)))
        steps = x.shape[1] - taps + 1  # L + taps - 1
        shifted = jnp.stack([x[:, taps - 1 - j:taps - 1 - j + steps] for j in range(taps)], axis=2)  # [B, T', j, in]
        y = jnp.einsum("btji,iojp->btpo", shifted, w).reshape(x.shape[0], steps * s, -1)
        trim, raw = k - s, (x_BTC.shape[1] - 1) * s + k  # torch's untrimmed length
        return y[:, trim:raw - trim] + self.bias[...].astype(y.dtype)


class SnakeBeta(nnx.Module):
    """x + sin(x * exp(alpha))^2 / (exp(beta) + 1e-9), per channel."""

    def __init__(self, channels: int, *, rngs: nnx.Rngs):
        self.alpha = nnx.Param(jnp.zeros((channels,)), axes=(None,))
        self.beta = nnx.Param(jnp.zeros((channels,)), axes=(None,))

    def __call__(self, x_BTC: jax.Array) -> jax.Array:
        alpha = jnp.exp(self.alpha[...].astype(x_BTC.dtype))
        beta = jnp.exp(self.beta[...].astype(x_BTC.dtype))
        return x_BTC + (1.0 / (beta + 1e-9)) * jnp.square(jnp.sin(x_BTC * alpha))


class ConvNeXtBlock(nnx.Module):
    """x + gamma * pwconv2(gelu(pwconv1(norm(dwconv(x))))) with a causal depthwise convolution."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs):
        self.dwconv = CausalConv(dim, dim, KERNEL, groups=dim, rngs=rngs)
        self.norm = LayerNorm(dim, eps=1e-6)
        self.pwconv1 = Linear(dim, 4 * dim, axes=(None, None), use_bias=True, rngs=rngs)
        self.pwconv2 = Linear(4 * dim, dim, axes=(None, None), use_bias=True, rngs=rngs)
        self.gamma = nnx.Param(jnp.ones((dim,)), axes=(None,))

    def __call__(self, x_BTC: jax.Array, start: jax.Array) -> jax.Array:
        h = self.pwconv2(jax.nn.gelu(self.pwconv1(self.norm(self.dwconv(x_BTC, start))), approximate=False))
        return x_BTC + self.gamma[...].astype(h.dtype) * h


class ResidualUnit(nnx.Module):
    """x + conv2(snake(conv1(snake(x)))) with a dilated causal kernel-7 conv1 and a pointwise conv2."""

    def __init__(self, dim: int, dilation: int, *, rngs: nnx.Rngs):
        self.act1 = SnakeBeta(dim, rngs=rngs)
        self.conv1 = CausalConv(dim, dim, KERNEL, dilation=dilation, rngs=rngs)
        self.act2 = SnakeBeta(dim, rngs=rngs)
        self.conv2 = CausalConv(dim, dim, 1, rngs=rngs)

    def __call__(self, x_BTC: jax.Array, start: jax.Array) -> jax.Array:
        return x_BTC + self.conv2(self.act2(self.conv1(self.act1(x_BTC), start)), start)


class DecoderBlock(nnx.Module):
    """snake, a transposed convolution (kernel 2r, stride r) from ``cin`` to ``cout`` channels, three residual
    units."""

    def __init__(self, cin: int, cout: int, rate: int, *, rngs: nnx.Rngs):
        self.act = SnakeBeta(cin, rngs=rngs)
        self.up = TransposedConv(cin, cout, 2 * rate, rate, rngs=rngs)
        self.units = nnx.List([ResidualUnit(cout, d, rngs=rngs) for d in DILATIONS])
        self.rate = rate

    def __call__(self, x_BTC: jax.Array, start: jax.Array) -> jax.Array:
        x = self.up(self.act(x_BTC), start)
        for unit in self.units:
            x = unit(x, start * self.rate)
        return x


class Vocoder(nnx.Module):
    """Transformer states [B, T, hidden] -> waveform [B, T * total_upsample - lost_samples] in [-1, 1].

    upsampling_ratios: the upsamplers (a transposed convolution of kernel = stride = f and a ConvNeXt block each,
    at ``hidden`` channels); upsample_rates: the decoder blocks, channels ``decoder_dim`` halving at each."""

    def __init__(self, hidden: int, decoder_dim: int, upsampling_ratios: tuple[int, ...],
                 upsample_rates: tuple[int, ...], *, rngs: nnx.Rngs):
        self.ratios, self.rates = tuple(upsampling_ratios), tuple(upsample_rates)
        self.upsamplers = nnx.List([TransposedConv(hidden, hidden, f, f, rngs=rngs) for f in self.ratios])
        self.convnexts = nnx.List([ConvNeXtBlock(hidden, rngs=rngs) for _ in self.ratios])
        self.conv_in = CausalConv(hidden, decoder_dim, KERNEL, rngs=rngs)
        self.blocks = nnx.List([DecoderBlock(decoder_dim // 2**i, decoder_dim // 2**(i + 1), r, rngs=rngs)
                                for i, r in enumerate(self.rates)])
        out = decoder_dim // 2**len(self.rates)
        self.act_out = SnakeBeta(out, rngs=rngs)
        self.conv_out = CausalConv(out, 1, KERNEL, rngs=rngs)

    def __call__(self, h_BTD: jax.Array, start_frame: jax.Array | int = 0) -> jax.Array:
        """Waveform [B, T * total_upsample - lost_samples]; frames before ``start_frame`` are not decoded (the
        samples before start_frame * total_upsample are meaningless)."""
        start = jnp.asarray(start_frame, jnp.int32)
        x = h_BTD
        for up, block in zip(self.upsamplers, self.convnexts):
            x = up(x, start)
            start = start * up.stride
            x = block(x, start)
        x = self.conv_in(x, start)
        for block in self.blocks:
            x = block(x, start)
            start = start * block.rate
        x = self.conv_out(self.act_out(x), start)
        return jnp.clip(x[..., 0], -1.0, 1.0)


def total_upsample(upsampling_ratios, upsample_rates) -> int:
    """Samples per codec frame."""
    return math.prod(upsampling_ratios) * math.prod(upsample_rates)


def lost_samples(upsample_rates) -> int:
    """How many samples a decode yields fewer than frames x total_upsample: each decoder block drops its rate r
    (at its output rate), and every later block multiplies that by its own rate."""
    return sum(r * math.prod(upsample_rates[i + 1:]) for i, r in enumerate(upsample_rates))


def context_frames(upsampling_ratios, upsample_rates) -> int:
    """Frames of left context after which a sample no longer depends on earlier frames (the convolutions'
    receptive field, rounded up, plus one frame for the transposed convolutions' flooring), and at least enough
    to cover the ``lost_samples`` a chunk's kept samples reach back."""
    reach, rate = 0.0, 1
    for f in upsampling_ratios:
        reach += (f - 1) / (f * rate)  # a transposed convolution reads input floor(t / f)
        rate *= f
        reach += (KERNEL - 1) / rate  # the ConvNeXt block's causal depthwise convolution
    reach += (KERNEL - 1) / rate  # conv_in
    for r in upsample_rates:
        reach += (r - 1) / (r * rate)
        rate *= r
        reach += sum((KERNEL - 1) * d for d in DILATIONS) / rate
    reach += (KERNEL - 1) / rate  # conv_out
    lost = lost_samples(upsample_rates)
    return max(math.ceil(reach) + 1, -(-lost // rate))
